"""distir's passes, one module per pass, and the registry of pass names.

`get_all_passes()` maps every pass name usable in a pipeline (`distir-opt -p`,
`distir.compile(pipeline=...)`) to a factory returning the pass class: xDSL's
own passes (canonicalize, cse, dce, ...) plus distir's. Factories import
lazily so that listing passes stays cheap.

`build_pipeline` turns a pipeline spec into passes and reports every mistake
with the names users type (`max-group-size`, not the field `max_group_size`)
as a `PipelineError`; `pass_options` describes a pass's options for help
texts. A pass declares the values an option accepts on its field
(`distir.passes.options.option(default, minimum=..., choices=...)`);
`check_options` enforces them, for pipelines and for passes built in Python.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib
import inspect
import textwrap
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline, PassPipelineCallbackType
from xdsl.utils.arg_spec import ArgSpec, ArgSpecParseError
from xdsl.utils.arg_spec import parse_pipeline as parse_pipeline_specs
from xdsl.utils.hints import isa

from distir.passes.options import (
    CHOICES,
    check_options,
    kebab,
    option_fields,
    spelled,
)

PassFactory = Callable[[], type[ModulePass]]


#: distir's passes by pipeline name: (module of `distir.passes`, class),
#: imported only when a pipeline asks for the pass (tests/test_layers.py
#: reads this table as imports of `distir.passes`)
PASS_CLASSES: dict[str, tuple[str, str]] = {
    "convert-shard-to-dist": ("convert_shard_to_dist", "ConvertShardToDistPass"),
    "lower-ciphertext-add": ("lower_ciphertext_add", "LowerCiphertextAddPass"),
    "defer-modular-reduction": ("defer_modular_reduction", "DeferModularReductionPass"),
    "recognize-native-reductions": ("recognize_native_reductions", "RecognizeNativeReductionsPass"),
    "select-all-reduce-algorithm": ("select_all_reduce_algorithm", "SelectAllReduceAlgorithmPass"),
    "bucket-all-reduces": ("bucket_all_reduces", "BucketAllReducesPass"),
    "verify-spmd": ("verify_spmd", "VerifySPMDPass"),
    "print-transfer-maps": ("print_transfer_maps", "PrintTransferMapsPass"),
    "vjp": ("vjp", "VJPPass"),
}


def _lazy(module: str, name: str) -> PassFactory:
    return lambda: getattr(importlib.import_module(f"distir.passes.{module}"), name)


DISTIR_PASSES: dict[str, PassFactory] = {
    name: _lazy(module, cls) for name, (module, cls) in PASS_CLASSES.items()
}


def get_all_passes() -> dict[str, PassFactory]:
    """xDSL's passes and distir's, by pipeline name."""
    from xdsl.transforms import get_all_passes as xdsl_passes

    passes = dict(xdsl_passes())
    passes.update(DISTIR_PASSES)
    return passes


class PipelineError(ValueError):
    """A pipeline spec that names an unknown pass, gives a pass an option it
    does not have or a value of the wrong type, or is malformed; the message
    uses the pass and option names as users type them."""


@dataclass(frozen=True)
class PassOption:
    """One option of a pass, as a pipeline spells it."""

    name: str
    """Kebab-case, as in `-p 'pass{max-op-bytes=4096}'`."""
    type: str
    """The value's type: `int`, `bool`, `str`, `float`, `int,...` for a tuple."""
    default: str | None
    """The default as a pipeline would spell it; None when unset or required."""
    required: bool
    doc: str | None
    """The field's docstring (the string literal after the field), if any."""


def _without_none(hint: Any) -> tuple[Any, bool]:
    """`hint` without a top-level `| None`, and whether it had one."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) < len(get_args(hint)):
            return (args[0] if len(args) == 1 else Union[tuple(args)]), True  # noqa: UP007
    return hint, False


def _type_name(hint: Any) -> str:
    hint, _ = _without_none(hint)
    if get_origin(hint) is tuple:
        return ",".join(_type_name(a) for a in get_args(hint))
    if get_origin(hint) in (Union, types.UnionType):
        return "|".join(_type_name(a) for a in get_args(hint))
    if hint is ...:
        return "..."
    return getattr(hint, "__name__", str(hint))


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """Docstrings of dataclass fields (the string literal that follows a
    field), which Python does not keep at run time: read from the source."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass.__module__.startswith("xdsl."):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, following in zip(body, body[1:]):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(inspect.cleandoc(following.value.value).split())
    return docs


def pass_options(cls: type[ModulePass]) -> list[PassOption]:
    """The options of pass `cls` (its dataclass fields), in declaration order."""
    hints = get_type_hints(cls)
    docs = _field_docs(cls)
    required = cls.required_fields()
    options = []
    for f in option_fields(cls):
        if f.default is not dataclasses.MISSING:
            default = None if f.default is None else spelled(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = spelled(f.default_factory())
        else:
            default = None
        option_type = "|".join(f.metadata.get(CHOICES, ())) or _type_name(hints[f.name])
        doc = docs.get(f.name)
        options.append(PassOption(kebab(f.name), option_type, default, f.name in required, doc))
    return options


def pass_summary(cls: type[ModulePass]) -> str:
    """The first sentence of the pass's docstring, on one line."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    if doc.startswith(f"{cls.__name__}("):  # dataclass's stand-in for a missing docstring
        return ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[: end + 1]


def _accepts(value: tuple[Any, ...], hint: Any) -> bool:
    """Whether xDSL's conversion of option `value` to `hint` succeeds, with
    `true`/`false` accepted only where the option is a bool."""
    inner, optional = _without_none(hint)
    if not value:
        return optional
    if any(isinstance(v, bool) for v in value) and not _admits_bool(inner):
        return False
    return (len(value) == 1 and isa(value[0], hint)) or isa(value, hint)


def _admits_bool(hint: Any) -> bool:
    if hint is bool:
        return True
    return any(_admits_bool(a) for a in get_args(hint) if a is not ...)


def _an(type_name: str) -> str:
    return f"an {type_name}" if type_name[:1] in "aeiou" else f"a {type_name}"


def build_pass(name: str, cls: type[ModulePass], spec: ArgSpec) -> ModulePass:
    """Pass `cls` configured by `spec`; a `PipelineError` names the option as
    written and says what it expects."""
    fields = {f.name: f for f in option_fields(cls)}
    options = pass_options(cls)
    known = ", ".join(o.name for o in options)
    for given in spec.parameters:
        if given.replace("-", "_") not in fields:
            hint = f"its options are {known}" if options else "it takes no options"
            close = difflib.get_close_matches(given, [o.name for o in options], n=1, cutoff=0.7)
            also = f"; did you mean '{close[0]}'?" if close else ""
            raise PipelineError(f"pass '{name}' has no option '{given}' ({hint}){also}")
    hints = get_type_hints(cls)
    by_field = {o.name.replace("-", "_"): o for o in options}
    given_fields = {k.replace("-", "_"): (k, v) for k, v in spec.parameters.items()}
    for field_name in cls.required_fields():
        if field_name not in given_fields:
            option = by_field[field_name]
            raise PipelineError(
                f"pass '{name}' needs option '{option.name}' "
                f"(-p '{name}{{{option.name}=<{option.type}>}}')"
            )
    for field_name, (written, value) in given_fields.items():
        if not _accepts(value, hints[field_name]):
            option = by_field[field_name]
            got = f"'{spelled(value)}'" if value else "no value"
            raise PipelineError(
                f"pass '{name}': option '{written}' expects {_an(option.type)}, got {got}"
            )
    try:
        built = cls.from_spec(spec)
        check_options(built)  # also for passes whose __post_init__ does not
        return built
    except ValueError as e:  # the declared constraints and the pass's own checks
        message = str(e)
        prefix = f"{name}: "
        message = message[len(prefix) :] if message.startswith(prefix) else message
        raise PipelineError(f"pass '{name}': {message}") from None


def build_pipeline(
    available: Mapping[str, PassFactory],
    spec: str,
    callback: PassPipelineCallbackType | None = None,
) -> PassPipeline:
    """The pipeline `spec` (`distir-opt -p` syntax) over the passes of
    `available`; every error is a `PipelineError`."""
    try:
        specs = list(parse_pipeline_specs(spec))
    except ArgSpecParseError as e:  # a BaseException in xDSL 0.74: make it a ValueError
        context = str(e).split("\n", 1)[1] if "\n" in str(e) else str(e)
        raise PipelineError(f"malformed pipeline {spec!r}:\n{context.rstrip()}") from None
    passes = []
    for pass_spec in specs:
        if pass_spec.name not in available:
            close = difflib.get_close_matches(pass_spec.name, list(available), n=1, cutoff=0.7)
            also = f"; did you mean '{close[0]}'?" if close else ""
            raise PipelineError(
                f"unknown pass '{pass_spec.name}'{also} (distir-opt --help lists the passes)"
            )
        passes.append(build_pass(pass_spec.name, available[pass_spec.name](), pass_spec))
    return PassPipeline(tuple(passes), callback)


def parse_pipeline(spec: str) -> PassPipeline:
    """A pipeline from `distir-opt -p` syntax; the module is verified after
    every pass. Raises `PipelineError` (a ValueError)."""

    def verify_after(_prev: ModulePass | None, module: ModuleOp, _next: ModulePass | None) -> None:
        module.verify()

    return build_pipeline(get_all_passes(), spec, callback=verify_after)


def apply_pipeline(ctx: Context, module: ModuleOp, spec: str) -> None:
    """Applies `spec` and verifies the result (the pipeline callback only
    runs between passes)."""
    if spec.strip():
        parse_pipeline(spec).apply(ctx, module)
        module.verify()
