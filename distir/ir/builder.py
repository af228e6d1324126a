"""Building dist programs from Python.

Every helper creates one op at the current insertion point (xDSL's
`ImplicitBuilder`) and returns its result values, so a program reads like the
text it prints:

    def body(x):
        total = all_reduce(x, "sum")
        return all_reduce(total, combine=lambda a, b: arith.MaxSIOp(a, b).result,
                          commutative=True)

    module = build_program(body, [tensor_type("i64", [8])])

A combine region comes from a Python callback that receives the block
arguments `(lhs, rhs, extra...)` and returns the combined value; the helper
appends the `dist.yield`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    ModuleOp,
    SymbolRefAttr,
    TensorType,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from distir.ir.dialect import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AllReduceOp,
    BroadcastOp,
    GroupOp,
    GroupSizeOp,
    RankOp,
    ReductionKind,
    VariableAllToAllOp,
    YieldOp,
)

Value = SSAValue | Operation
GroupRef = SymbolRefAttr | str | None

_ELEMENT_TYPES: dict[str, Attribute] = {
    "i1": IntegerType(1),
    "i8": IntegerType(8),
    "i16": IntegerType(16),
    "i32": IntegerType(32),
    "i64": IntegerType(64),
    "f16": Float16Type(),
    "f32": Float32Type(),
    "f64": Float64Type(),
}


def tensor_type(element: str | Attribute, shape: Sequence[int | None]) -> TensorType:
    """`tensor_type("f32", [None, 4])` is `tensor<?x4xf32>`."""
    elem = _ELEMENT_TYPES[element] if isinstance(element, str) else element
    return TensorType(elem, [DYNAMIC_INDEX if d is None else d for d in shape])


def _with_dynamic_axis(t: Attribute, axis: int) -> TensorType:
    assert isinstance(t, TensorType)
    shape = list(t.get_shape())
    shape[axis] = DYNAMIC_INDEX
    return TensorType(t.element_type, shape)


def rank(group: GroupRef = None) -> SSAValue:
    return RankOp(group).result


def group_size(group: GroupRef = None) -> SSAValue:
    return GroupSizeOp(group).result


def broadcast(x: Value, root: int | Value = 0, group: GroupRef = None) -> SSAValue:
    return BroadcastOp(x, root, group).result


def make_combine_region(
    arg_types: Sequence[Attribute],
    combine: Callable[..., Value | Sequence[Value]],
) -> Region:
    """A single-block region whose body `combine(*block_args)` builds."""
    block = Block(arg_types=arg_types)
    with ImplicitBuilder(block):
        out = combine(*block.args)
        values = list(out) if isinstance(out, Sequence) else [out]
        YieldOp(*[SSAValue.get(v) for v in values])
    return Region(block)


def all_reduce(
    x: Value,
    kind: ReductionKind | str | None = None,
    *,
    combine: Callable[..., Value | Sequence[Value]] | None = None,
    extras: Sequence[Value] = (),
    commutative: bool = False,
    group: GroupRef = None,
) -> SSAValue:
    """Native (`kind`) or generic (`combine` callback) all-reduce."""
    if (kind is None) == (combine is None):
        raise ValueError("all_reduce needs exactly one of `kind` and `combine`")
    if kind is not None:
        return AllReduceOp(x, kind=ReductionKind(kind), group=group).result
    x_type = SSAValue.get(x).type
    region = make_combine_region(
        [x_type, x_type, *(SSAValue.get(e).type for e in extras)], combine
    )
    return AllReduceOp(
        x, combine=region, extras=extras, commutative=commutative, group=group
    ).result


def all_reduce_add_ciphertext(
    ciphertext: Value,
    moduli: Value,
    *,
    modulus_basis: str = "Q",
    max_modulus_bits: int | None = None,
    group: GroupRef = None,
) -> SSAValue:
    return AllReduceAddCiphertextOp(
        ciphertext,
        moduli,
        modulus_basis=modulus_basis,
        max_modulus_bits=max_modulus_bits,
        group=group,
    ).result


def all_gather(
    x: Value,
    *,
    axis: int = 0,
    counts: Value | None = None,
    result_type: TensorType | None = None,
    group: GroupRef = None,
) -> SSAValue:
    """Even (or, with `counts`, uneven) all-gather; the gathered axis is
    dynamic unless `result_type` says otherwise."""
    t = result_type or _with_dynamic_axis(SSAValue.get(x).type, axis)
    return AllGatherOp(x, t, axis=axis, counts=counts, group=group).result


def variable_all_to_all(
    x: Value,
    send_counts: Value,
    *,
    axis: int = 0,
    result_type: TensorType | None = None,
    group: GroupRef = None,
) -> tuple[SSAValue, SSAValue]:
    """Returns `(received rows, recv_counts)`."""
    t = result_type or _with_dynamic_axis(SSAValue.get(x).type, axis)
    op = VariableAllToAllOp(x, send_counts, t, axis=axis, group=group)
    return op.result, op.recv_counts


def build_program(
    body: Callable[..., Value | Sequence[Value] | None],
    arg_types: Sequence[Attribute],
    *,
    name: str = "main",
    groups: Mapping[str, Sequence[Sequence[int]]] | None = None,
) -> ModuleOp:
    """A module holding the group declarations and `func.func @name` whose
    body is built by `body(*args)`; what `body` returns is returned."""
    module = ModuleOp([])
    for sym, parts in (groups or {}).items():
        module.body.block.add_op(GroupOp(sym, parts))
    block = Block(arg_types=arg_types)
    for i, arg in enumerate(block.args):
        arg.name_hint = f"arg{i}"
    with ImplicitBuilder(block):
        out = body(*block.args)
        if out is None:
            values: list[SSAValue] = []
        elif isinstance(out, Sequence):
            values = [SSAValue.get(v) for v in out]
        else:
            values = [SSAValue.get(out)]
        func.ReturnOp(*values)
    fn = func.FuncOp(
        name, (list(arg_types), [v.type for v in values]), Region(block)
    )
    module.body.block.add_op(fn)
    module.verify()
    return module
