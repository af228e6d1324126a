"""The `dist` dialect, its parser with source locations, and a Python builder.

Every op, attribute and fact of the dialect is importable from here and from
`distir.ir.dialect`; the builder is `distir.ir.builder`.
"""

from distir.ir.dialect import *  # noqa: F403
from distir.ir.dialect import __all__ as _dialect_names
from distir.ir.parsing import describe_op, format_location, make_context, parse_file, parse_module

__all__ = [
    *_dialect_names,
    "describe_op",
    "format_location",
    "make_context",
    "parse_file",
    "parse_module",
]
