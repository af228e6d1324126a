"""The builder's machinery: what every helper of `distir.ir.builder` shares.

`located` wraps a helper so the ops it builds carry the Python call site
(the line of the program that called it) and its operand errors become a
`BuilderError` naming the call; `as_values`, the value and type helpers and
the local ops of a combine (`arith`, `cmpf` / `cmpi`, `select`, `cast`,
`math`, `concat` / `extract_slice`) live here. Each op family's helpers are
in its folder (`distir/ops/<family>/build.py`); `distir.ir.builder` is the
public surface that gathers them.
"""

from __future__ import annotations

import difflib
import functools
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from xdsl import builder as _xdsl_builder
from xdsl.dialects import arith as _arith
from xdsl.dialects import math as _math
from xdsl.dialects import tensor
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    DenseIntOrFPElementsAttr,
    FileLineColLoc,
    IndexType,
    IntAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    UnknownLoc,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from distir.errors import DistirError
from distir.ir.attributes import ReductionKind
from distir.ir.element_types import BY_SPELLING
from distir.ir.tensor_arith import (
    CMPF_COMPARISON_OPERATIONS,
    CMPI_COMPARISON_OPERATIONS,
    TENSOR_ARITH_OPS,
    CmpfOp,
    CmpiOp,
    SelectOp,
    like,
)

Value = SSAValue | Operation
GroupRef = SymbolRefAttr | str | None
Peer = int | Value
Body = Callable[..., Value | Sequence[Value] | None]


class BuilderError(DistirError, ValueError):
    """A builder helper was called with operands it cannot build an op from;
    the message names the call and the line that made it."""

    located = False


_THIS_FILE = str(Path(__file__).resolve())
_IR = Path(_THIS_FILE).parent
#: the builder's own files: this one, the facade, and each family's helpers
_BUILDER_FILES = frozenset({_THIS_FILE, str(_IR / "builder.py")})
_FAMILY_HELPERS = (str(_IR.parent / "ops") + "/", "/build.py")

#: files whose frames are never a program's source: this one, and the
#: modules that build programs on a caller's behalf (`located_at_callers_of`)
_LIBRARY_FILES = {_THIS_FILE}


def located_at_callers_of(filename: str) -> None:
    """Ops built from code in `filename` (a module building programs for its
    callers, as `distir.all_reduce` does) take the location of the line that
    called into it, not a line of its own."""
    _LIBRARY_FILES.add(str(Path(filename).resolve()))


def _is_library(filename: str) -> bool:
    """Whether frames of `filename` build ops on a caller's behalf."""
    prefix, suffix = _FAMILY_HELPERS
    return (
        filename in _BUILDER_FILES
        or filename in _LIBRARY_FILES
        or (filename.startswith(prefix) and filename.endswith(suffix))
    )


def call_site() -> FileLineColLoc | None:
    """The location ops built now get: the innermost frame outside the
    builder, the library files and xDSL."""
    return _call_site()


def _call_site() -> FileLineColLoc | None:
    """The location of the innermost frame outside the library files and xDSL."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_library(filename) and "/xdsl/" not in filename:
            # The column of the call being executed (Python >= 3.11).
            positions = list(frame.f_code.co_positions())
            col = positions[frame.f_lasti // 2][2] if frame.f_lasti // 2 < len(positions) else None
            column = 1 if col is None else col + 1
            return FileLineColLoc(StringAttr(filename), IntAttr(frame.f_lineno), IntAttr(column))
        frame = frame.f_back
    return None


def _stamp_new_ops(location: FileLineColLoc | None) -> None:
    """Give the ops just appended to the current insertion block (those
    still without a location) the caller's location."""
    current = _xdsl_builder._current_builder.builder
    if location is None or current is None:
        return
    op = current.insertion_point.block.last_op
    while op is not None and isinstance(op.location, UnknownLoc):
        op.location = location
        for nested in op.walk():
            if isinstance(nested.location, UnknownLoc):
                nested.location = location
        op = op.prev_op


def _describe_call(helper: Callable, args: tuple, kwargs: dict) -> str:
    def show(value: object) -> str:
        if isinstance(value, Operation) and value.results:
            value = value.results[0]
        if isinstance(value, SSAValue):
            return str(value.type)
        return repr(value) if not callable(value) else getattr(value, "__name__", "<callback>")

    shown = [show(a) for a in args] + [f"{k}={show(v)}" for k, v in kwargs.items()]
    return f"{helper.__name__}({', '.join(shown)})"


def _builder_error(
    helper: Callable, args: tuple, kwargs: dict, site: FileLineColLoc | None, message: str
) -> BuilderError:
    where = f" at {site.filename.data}:{site.line.data}:{site.column.data}" if site else ""
    one_line = " ".join(message.split())
    error = BuilderError(f"{_describe_call(helper, args, kwargs)}{where}: {one_line}")
    error.located = True
    return error


def located(helper: Callable) -> Callable:
    """Stamps the ops `helper` builds with its caller's location, and turns
    xDSL's exceptions about its operands into a `BuilderError` naming the
    call."""

    @functools.wraps(helper)
    def build(*args, **kwargs):
        site = _call_site()
        try:
            result = helper(*args, **kwargs)
        except BuilderError as e:
            if e.located:
                raise
            raise _builder_error(helper, args, kwargs, site, str(e)) from None
        except DistirError:
            raise
        except (DiagnosticException, AttributeError, TypeError, ValueError, KeyError) as e:
            raise _builder_error(helper, args, kwargs, site, str(e)) from None
        _stamp_new_ops(site)
        return result

    return build


def as_values(out: Value | Sequence[Value] | None) -> list[SSAValue]:
    if out is None:
        return []
    if isinstance(out, Sequence):
        return [SSAValue.get(v) for v in out]
    return [SSAValue.get(out)]


###############################################################################
# Types and constants
###############################################################################

#: the builder's spellings: every element type distir runs
_ELEMENT_TYPES: dict[str, Attribute] = BY_SPELLING


def element_type(element: str | Attribute) -> Attribute:
    """`element_type("f32")` is `f32`; types pass through."""
    if not isinstance(element, str):
        return element
    if element not in _ELEMENT_TYPES:
        raise BuilderError(
            f"no element type {element!r}; known: {', '.join(_ELEMENT_TYPES)} (or an xDSL type)"
        )
    return _ELEMENT_TYPES[element]


def tensor_type(element: str | Attribute, shape: Sequence[int | None]) -> TensorType:
    """`tensor_type("f32", [None, 4])` is `tensor<?x4xf32>`."""
    return TensorType(element_type(element), [DYNAMIC_INDEX if d is None else d for d in shape])


def with_dynamic_axis(t: Attribute, axis: int) -> TensorType:
    assert isinstance(t, TensorType)
    shape = list(t.get_shape())
    shape[axis] = DYNAMIC_INDEX
    return TensorType(t.element_type, shape)


@located
def constant_index(value: int) -> SSAValue:
    """`arith.constant 3 : index`, e.g. a peer or root computed at run time."""
    return _arith.ConstantOp(IntegerAttr(value, IndexType())).result


@located
def constant_tensor(
    values: Sequence[int | float] | int | float,
    element: str | Attribute = "i64",
    shape: Sequence[int] | None = None,
) -> SSAValue:
    """A constant tensor: `constant_tensor([1, 2, 3])` is
    `arith.constant dense<[1, 2, 3]> : tensor<3xi64>`. `values` is flat, in
    row-major order, with `shape` (default: one dim of `len(values)`); one
    value with a `shape` is splat (`constant_tensor(0.0, "f32", [4])`)."""
    flat = [values] if isinstance(values, int | float) else list(values)
    t = tensor_type(element, shape if shape is not None else [len(flat)])
    return _arith.ConstantOp(DenseIntOrFPElementsAttr.from_list(t, flat)).result


_ARITH_OPS: dict[str, type[Operation]] = {
    op.name.removeprefix("arith."): TENSOR_ARITH_OPS.get(op, op) for op in _arith.Arith.operations
}
#: the casts, built from an operand and an element type
_CASTS = ("extsi", "extui", "trunci", "sitofp", "uitofp", "fptosi", "fptoui", "extf",
          "truncf", "bitcast", "index_cast")  # fmt: skip
_MATH_OPS: dict[str, type[Operation]] = {
    op.name.removeprefix("math."): op for op in _math.Math.operations
}


def _typed(name: str, operands: Sequence[Value]) -> list[SSAValue]:
    values = [SSAValue.get(v) for v in operands]
    types = {str(v.type) for v in values}
    if len(types) > 1:
        raise BuilderError(
            f"{name} needs operands of one type, got {', '.join(map(str, (v.type for v in values)))}"
        )
    return values


def _verified(op: Operation) -> Operation:
    op.verify()
    return op


@located
def arith(name: str, *operands: Value) -> SSAValue:
    """The arith op `name` on `operands`: `arith("addi", a, b)` is
    `arith.addi %a, %b`. For the ops built from their operands alone (the
    binary integer and float ops, `negf`); comparisons, `select` and casts
    have their own helpers."""
    op = _ARITH_OPS.get(name)
    if op is None or name in _CASTS or name in ("cmpf", "cmpi", "constant"):
        others = {"cmpf": "cmpf(...)", "cmpi": "cmpi(...)", "select": "select(...)",
                  "constant": "constant_tensor(...)"}  # fmt: skip
        if name in others or name in _CASTS:
            raise BuilderError(
                f"arith({name!r}, ...): build it with {others.get(name, 'cast(...)')}"
            )
        raise BuilderError(
            f"no arith op {name!r}{_did_you_mean(name, _ARITH_OPS)}; "
            f"known: {', '.join(sorted(_ARITH_OPS))}"
        )
    if op is SelectOp:
        return select(*operands)
    values = _typed(f"arith.{name}", operands)
    _check_arith_element(name, values)
    return _verified(op(*values)).results[0]  # type: ignore[call-arg]


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'sum'?)` for the closest choice, or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: the arith ops of one operand family, and the other family's counterpart
#: (an `addi` on floats is an `addf`): checked before xDSL's verifier, whose
#: wording ("Unexpected attribute f32") names neither the op nor the fix
_FLOAT_ARITH = {"addf": "addi", "subf": "subi", "mulf": "muli", "divf": "divsi",
                "maximumf": "maxsi", "minimumf": "minsi",
                "maxnumf": "maxsi", "minnumf": "minsi", "negf": None}  # fmt: skip
_INT_ARITH = {"addi": "addf", "subi": "subf", "muli": "mulf", "divsi": "divf", "divui": "divf",
              "ceildivsi": None, "ceildivui": None, "floordivsi": None, "remsi": None,
              "remui": None, "andi": None, "ori": None, "xori": None, "shli": None,
              "shrsi": None, "shrui": None, "maxsi": "maximumf", "maxui": "maximumf",
              "minsi": "minimumf", "minui": "minimumf", "addui_extended": None,
              "mulsi_extended": None, "mului_extended": None}  # fmt: skip


def _check_arith_element(name: str, values: Sequence[SSAValue]) -> None:
    if not values:
        return
    t = values[0].type
    element = t.element_type if isinstance(t, TensorType) else t
    is_int = isinstance(element, IntegerType | IndexType)
    if name in _FLOAT_ARITH and is_int:
        family, other = "float", _FLOAT_ARITH[name]
    elif name in _INT_ARITH and not is_int:
        family, other = "integer", _INT_ARITH[name]
    else:
        return
    hint = f"; for {element} use arith({other!r}, ...)" if other else ""
    raise BuilderError(f"arith.{name} takes {family} operands, got {t}{hint}")


@located
def cmpf(predicate: str, lhs: Value, rhs: Value) -> SSAValue:
    """`arith.cmpf`: element-wise float comparison, an `i1` of the operands'
    shape. Predicates: ordered `oeq`, `ogt`, `oge`, `olt`, `ole`, `one`,
    `ord` (false where either is NaN), unordered `ueq` ... `uno` (true
    there), `false`, `true`."""
    return _compare(CmpfOp, CMPF_COMPARISON_OPERATIONS, predicate, lhs, rhs)


@located
def cmpi(predicate: str, lhs: Value, rhs: Value) -> SSAValue:
    """`arith.cmpi`: element-wise integer comparison (`eq`, `ne`, signed
    `slt` ... `sge`, unsigned `ult` ... `uge`), an `i1` of the operands' shape."""
    return _compare(CmpiOp, CMPI_COMPARISON_OPERATIONS, predicate, lhs, rhs)


def _compare(
    op_type: type[CmpfOp | CmpiOp],
    predicates: Sequence[str],
    predicate: str,
    lhs: Value,
    rhs: Value,
) -> SSAValue:
    if predicate not in predicates:
        raise BuilderError(
            f"no {op_type.name.removeprefix('arith.')} predicate {predicate!r}; "
            f"the predicates are {', '.join(predicates)}"
        )
    a, b = _typed(op_type.name, (lhs, rhs))
    return _verified(op_type(a, b, predicate)).results[0]


@located
def select(condition: Value, if_true: Value, if_false: Value) -> SSAValue:
    """`arith.select`: `if_true` where `condition` holds, else `if_false`;
    an `i1` condition picks a whole operand, an `i1` tensor of the operands'
    shape picks element by element."""
    a, b = _typed("arith.select", (if_true, if_false))
    return _verified(SelectOp(SSAValue.get(condition), a, b)).results[0]


@located
def cast(name: str, x: Value, element: str | Attribute) -> SSAValue:
    """The cast `name` (`extsi`, `extui`, `trunci`, `sitofp`, `uitofp`,
    `fptosi`, `fptoui`, `extf`, `truncf`, `bitcast`, `index_cast`) of `x` to
    element type `element`, keeping `x`'s shape: `cast("sitofp", i, "f32")`."""
    if name not in _CASTS:
        raise BuilderError(f"no cast {name!r}; the casts are {', '.join(_CASTS)}")
    value = SSAValue.get(x)
    target = like(value.type, element_type(element))
    return _verified(_ARITH_OPS[name](value, target)).results[0]  # type: ignore[call-arg]


@located
def math(name: str, *operands: Value) -> SSAValue:
    """The `math` op `name` on `operands`, element by element:
    `math("exp", x)`, `math("powf", a, b)`, `math("fma", a, b, c)`."""
    op = _MATH_OPS.get(name)
    if op is None:
        raise BuilderError(f"no math op {name!r}; known: {', '.join(sorted(_MATH_OPS))}")
    return _verified(op(*(SSAValue.get(v) for v in operands))).results[0]  # type: ignore[call-arg]


@located
def concat(values: Sequence[Value], axis: int = 0) -> SSAValue:
    """`tensor.concat` of `values` along `axis` (the packing of a multi-part
    reduction: `concat([maxes, sums])`); the result's size on `axis` is the
    sum of theirs (dynamic if any is), its other dimensions theirs."""
    parts = [SSAValue.get(v) for v in values]
    if not parts:
        raise BuilderError("concat needs at least one value")
    types = [p.type for p in parts]
    if not all(isinstance(t, TensorType) for t in types):
        raise BuilderError(f"concat takes tensors, got {', '.join(map(str, types))}")
    shapes = [list(t.get_shape()) for t in types]  # type: ignore[union-attr]
    rank = len(shapes[0])
    if not -rank <= axis < rank:
        raise BuilderError(f"axis {axis} is out of range for tensors of rank {rank}")
    axis %= rank
    if any(len(s) != rank for s in shapes) or any(
        s[:axis] + s[axis + 1 :] != shapes[0][:axis] + shapes[0][axis + 1 :] for s in shapes
    ):
        raise BuilderError(
            f"concat along axis {axis} needs the other dimensions equal, got "
            f"{', '.join(map(str, types))}"
        )
    sizes = [s[axis] for s in shapes]
    shape = list(shapes[0])
    shape[axis] = DYNAMIC_INDEX if DYNAMIC_INDEX in sizes else sum(sizes)
    result = TensorType(types[0].element_type, shape)  # type: ignore[union-attr]
    return _verified(tensor.ConcatOp(parts, axis, result)).results[0]


@located
def extract_slice(x: Value, offsets: Sequence[int], sizes: Sequence[int]) -> SSAValue:
    """`tensor.extract_slice` of `x` with static `offsets` and `sizes` and
    unit strides (taking a multi-part reduction apart: `extract_slice(v,
    [n], [n])` is its second part of n)."""
    value = SSAValue.get(x)
    t = value.type
    if not isinstance(t, TensorType):
        raise BuilderError(f"extract_slice takes a tensor, got {t}")
    shape = list(t.get_shape())
    if len(offsets) != len(shape) or len(sizes) != len(shape):
        raise BuilderError(
            f"extract_slice of a rank-{len(shape)} tensor needs {len(shape)} offsets and "
            f"sizes, got {len(offsets)} and {len(sizes)}"
        )
    for d, (o, n, extent) in enumerate(zip(offsets, sizes, shape)):
        if o < 0 or n < 0 or (extent != DYNAMIC_INDEX and o + n > extent):
            raise BuilderError(
                f"extract_slice: dimension {d} takes [{o}, {o + n}) of a size {extent}"
            )
    result = TensorType(t.element_type, list(sizes))
    op = tensor.ExtractSliceOp(value, list(offsets), list(sizes), [1] * len(shape), result)
    return _verified(op).results[0]


def native_kind(kind: ReductionKind | str, hint: str = "") -> ReductionKind:
    """`kind` as a native reduction kind, or a `BuilderError` naming the kinds
    (and the nearest, for a typo)."""
    kinds = [k.value for k in ReductionKind]
    if str(kind) not in kinds:
        raise BuilderError(
            f"no native reduction {kind!r}{_did_you_mean(str(kind), kinds)}; the native "
            f"reductions are {', '.join(kinds)}" + (f" ({hint})" if hint else "")
        )
    return ReductionKind(kind)
