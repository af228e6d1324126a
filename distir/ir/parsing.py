"""Parsing dist programs with source locations on every operation.

xDSL leaves an op's location unknown unless the text spells `loc(...)`. Errors
raised long after parsing (a verifier, a backend, a rank mismatch) must still
point at the source, so this parser records `file:line:col` of every op it
parses.
"""

from __future__ import annotations

from pathlib import Path

from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import Builtin, FileLineColLoc, IntAttr, ModuleOp, StringAttr, UnknownLoc
from xdsl.dialects.func import Func
from xdsl.dialects.linalg import Linalg
from xdsl.dialects.scf import Scf
from xdsl.dialects.tensor import Tensor
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.utils.exceptions import DiagnosticException, ParseError

from distir.ir.dialect import Dist


class LocatedParser(Parser):
    """A Parser that stamps `FileLineColLoc` on each op lacking a location,
    and reports an op it cannot build as a located parse error.

    Some ops only fail when their constructor runs (an integer that does not
    fit in i64, a type constraint checked while resolving operands); xDSL
    raises those as VerifyException with no location.
    """

    line_offset: int = 0

    def parse_operation(self) -> Operation:
        start = self._current_token.span
        try:
            op = super().parse_operation()
        except ParseError:
            raise
        except (DiagnosticException, ValueError) as e:
            raise ParseError(start, str(e)) from e
        if isinstance(op.location, UnknownLoc):
            where = start.get_location()
            op.location = FileLineColLoc(
                StringAttr(where.file), IntAttr(where.line + self.line_offset), IntAttr(where.col)
            )
        return op


def make_context(*, allow_unregistered: bool = False) -> Context:
    """A context with every dialect a dist program may use."""
    ctx = Context(allow_unregistered=allow_unregistered)
    for dialect in (Builtin, Func, Arith, Tensor, Scf, Linalg, Dist):
        ctx.load_dialect(dialect)
    return ctx


def parse_module(
    text: str, filename: str = "<string>", ctx: Context | None = None
) -> ModuleOp:
    """Parse and return a module (top-level ops are wrapped in one)."""
    return LocatedParser(ctx or make_context(), text, filename).parse_module()


def parse_file(path: str | Path, ctx: Context | None = None) -> ModuleOp:
    path = Path(path)
    return parse_module(path.read_text(), str(path), ctx)


def format_location(op: Operation) -> str:
    """`file:line:col` of an op, or `<unknown location>`."""
    loc = op.location
    if isinstance(loc, FileLineColLoc):
        return f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"
    return "<unknown location>"


def describe_op(op: Operation) -> str:
    """`'dist.broadcast' at prog.mlir:4:8`: how errors name an op."""
    return f"'{op.name}' at {format_location(op)}"
