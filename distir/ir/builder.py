"""Building dist programs from Python, without importing xDSL.

Every helper creates one op at the current insertion point (xDSL's
`ImplicitBuilder`, which `build_program` sets up) and returns its result
values, so a program reads like the text it prints:

    def body(x):
        total = all_reduce(x, "sum")
        largest = all_reduce(total, combine=lambda a, b: arith("maxsi", a, b),
                             commutative=True)
        return largest, all_gather(x)

    module = build_program(body, [tensor_type("i64", [8])], groups={"pairs": [[0, 1], [2, 3]]})

A combine region (and a wave's body) comes from a Python callback: it
receives the block arguments `(lhs, rhs, extra...)` (a wave's body: none) and
returns the value(s) to yield; the helper appends the `dist.yield`.

`HELPERS` maps every op of the dialect to the helper that builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import arith as _arith
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    Float64Type,
    IndexType,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    SymbolRefAttr,
    TensorType,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from distir.ir.attributes import ReductionKind
from distir.ir.collectives import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AllReduceOp,
    AssertReducedOp,
    AssertUniformOp,
    BroadcastOp,
    VariableAllToAllOp,
    WaveOp,
    YieldOp,
)
from distir.ir.groups import GroupOp, GroupSizeOp, RankOp
from distir.ir.mesh import MeshOp, TransferOp
from distir.ir.p2p import RecvOp, SendOp, SendRecvOp

Value = SSAValue | Operation
GroupRef = SymbolRefAttr | str | None
Peer = int | Value
Body = Callable[..., Value | Sequence[Value] | None]

HELPERS: dict[type[Operation], Callable[..., object]] = {}
"""Op class -> the helper of this module that builds it."""


def _builds(*ops: type[Operation]) -> Callable[[Callable], Callable]:
    def register(helper: Callable) -> Callable:
        for op in ops:
            HELPERS[op] = helper
        return helper

    return register


def _values(out: Value | Sequence[Value] | None) -> list[SSAValue]:
    if out is None:
        return []
    if isinstance(out, Sequence):
        return [SSAValue.get(v) for v in out]
    return [SSAValue.get(out)]


###############################################################################
# Types and constants
###############################################################################

_ELEMENT_TYPES: dict[str, Attribute] = {
    "i1": IntegerType(1),
    "i8": IntegerType(8),
    "i16": IntegerType(16),
    "i32": IntegerType(32),
    "i64": IntegerType(64),
    "f16": Float16Type(),
    "f32": Float32Type(),
    "f64": Float64Type(),
    "index": IndexType(),
}


def element_type(element: str | Attribute) -> Attribute:
    """`element_type("f32")` is `f32`; types pass through."""
    return _ELEMENT_TYPES[element] if isinstance(element, str) else element


def tensor_type(element: str | Attribute, shape: Sequence[int | None]) -> TensorType:
    """`tensor_type("f32", [None, 4])` is `tensor<?x4xf32>`."""
    return TensorType(element_type(element), [DYNAMIC_INDEX if d is None else d for d in shape])


def _with_dynamic_axis(t: Attribute, axis: int) -> TensorType:
    assert isinstance(t, TensorType)
    shape = list(t.get_shape())
    shape[axis] = DYNAMIC_INDEX
    return TensorType(t.element_type, shape)


def constant_index(value: int) -> SSAValue:
    """`arith.constant 3 : index`, e.g. a peer or root computed at run time."""
    return _arith.ConstantOp(IntegerAttr(value, IndexType())).result


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
    op.name.removeprefix("arith."): op for op in _arith.Arith.operations
}


def arith(name: str, *operands: Value) -> SSAValue:
    """The arith op `name` on `operands`: `arith("addi", a, b)` is
    `arith.addi %a, %b`. For the ops built from their operands alone (the
    binary integer and float ops, `negf`, `select`); a combine region is
    usually one or a few of these."""
    op = _ARITH_OPS.get(name)
    if op is None:
        raise ValueError(f"no arith op {name!r}; known: {', '.join(sorted(_ARITH_OPS))}")
    return op(*(SSAValue.get(v) for v in operands)).results[0]  # type: ignore[call-arg]


###############################################################################
# Declarations
###############################################################################


@_builds(GroupOp)
def declare_group(name: str, subgroups: Sequence[Sequence[int]]) -> str:
    """`dist.group @name [[...], ...]` (subgroups of global ranks) at the
    current insertion point, which must be a module body; returns `name`,
    for the ops' `group=` argument. `build_program(groups=...)` calls it."""
    GroupOp(name, subgroups)
    return name


@_builds(MeshOp)
def declare_mesh(name: str, shape: Sequence[int], ranks: Sequence[int]) -> str:
    """`dist.mesh @name [shape] ranks [...]` (global ranks, row-major) at the
    current insertion point, which must be a module body; returns `name`.
    `build_program(meshes=...)` calls it."""
    MeshOp(name, shape, ranks)
    return name


###############################################################################
# Rank queries and collectives
###############################################################################


@_builds(RankOp)
def rank(group: GroupRef = None) -> SSAValue:
    """This rank within `group` (the world by default), as an index."""
    return RankOp(group).result


@_builds(GroupSizeOp)
def group_size(group: GroupRef = None) -> SSAValue:
    """The number of ranks in `group`, as an index."""
    return GroupSizeOp(group).result


@_builds(BroadcastOp)
def broadcast(x: Value, root: int | Value = 0, group: GroupRef = None) -> SSAValue:
    """Every rank gets `x` of group rank `root` (an int, or an index value)."""
    return BroadcastOp(x, root, group).result


@_builds(YieldOp)
def make_combine_region(arg_types: Sequence[Attribute], combine: Body) -> Region:
    """A single-block region whose body `combine(*block_args)` builds,
    ended by a `dist.yield` of what it returns (`all_reduce(combine=...)`
    calls it; `wave` ends its body the same way)."""
    block = Block(arg_types=arg_types)
    with ImplicitBuilder(block):
        YieldOp(*_values(combine(*block.args)))
    return Region(block)


@_builds(AllReduceOp)
def all_reduce(
    x: Value,
    kind: ReductionKind | str | None = None,
    *,
    combine: Body | None = None,
    extras: Sequence[Value] = (),
    commutative: bool = False,
    group: GroupRef = None,
) -> SSAValue:
    """Native (`kind`: "sum", "max", ...) or generic (`combine` callback on
    `(lhs, rhs, *extras)`) all-reduce."""
    if (kind is None) == (combine is None):
        raise ValueError("all_reduce needs exactly one of `kind` and `combine`")
    if kind is not None:
        return AllReduceOp(x, kind=ReductionKind(kind), group=group).result
    assert combine is not None
    x_type = SSAValue.get(x).type
    region = make_combine_region([x_type, x_type, *(SSAValue.get(e).type for e in extras)], combine)
    return AllReduceOp(
        x, combine=region, extras=extras, commutative=commutative, group=group
    ).result


@_builds(AllReduceAddCiphertextOp)
def all_reduce_add_ciphertext(
    ciphertext: Value,
    moduli: Value,
    *,
    modulus_basis: str = "Q",
    max_modulus_bits: int | None = None,
    group: GroupRef = None,
) -> SSAValue:
    """The per-limb modular sum of RNS ciphertexts `[..., L, N]` with moduli `[L]`."""
    return AllReduceAddCiphertextOp(
        ciphertext,
        moduli,
        modulus_basis=modulus_basis,
        max_modulus_bits=max_modulus_bits,
        group=group,
    ).result


@_builds(AssertReducedOp)
def assert_reduced(limbs: Value, moduli: Value, *, max_modulus_bits: int | None = None) -> None:
    """The local check that every limb is reduced modulo its modulus."""
    AssertReducedOp(limbs, moduli, max_modulus_bits)


@_builds(AssertUniformOp)
def assert_uniform(x: Value, *, group: GroupRef = None) -> None:
    """The collective check that every rank of the group passes the same `x`."""
    AssertUniformOp(x, group)


@_builds(AllGatherOp)
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


@_builds(VariableAllToAllOp)
def variable_all_to_all(
    x: Value,
    send_counts: Value,
    *,
    axis: int = 0,
    result_type: TensorType | None = None,
    group: GroupRef = None,
) -> tuple[SSAValue, SSAValue]:
    """Returns `(received rows, recv_counts)`; the received axis is dynamic
    unless `result_type` says otherwise."""
    t = result_type or _with_dynamic_axis(SSAValue.get(x).type, axis)
    op = VariableAllToAllOp(x, send_counts, t, axis=axis, group=group)
    return op.result, op.recv_counts


@_builds(WaveOp)
def wave(body: Callable[[], Value | Sequence[Value] | None]) -> tuple[SSAValue, ...]:
    """`dist.wave`: `body()` builds collectives and point-to-point ops, all
    submitted before any is awaited, and returns the values the wave
    yields; returns the wave's results (one per yielded value)."""
    block = Block()
    with ImplicitBuilder(block):
        values = _values(body())
        YieldOp(*values)
    return tuple(WaveOp(Region(block), [v.type for v in values]).outputs)


###############################################################################
# Point-to-point and mesh transfers
###############################################################################


@_builds(SendOp)
def send(x: Value, dest: Peer, group: GroupRef = None) -> None:
    """Sends `x` to group rank `dest` (an int, or an index value)."""
    SendOp(x, dest, group)


@_builds(RecvOp)
def recv(source: Peer, result_type: TensorType, group: GroupRef = None) -> SSAValue:
    """Receives a tensor of `result_type` from group rank `source`."""
    return RecvOp(source, result_type, group).result


@_builds(SendRecvOp)
def sendrecv(
    x: Value,
    dest: Peer,
    source: Peer,
    *,
    result_type: TensorType | None = None,
    group: GroupRef = None,
) -> SSAValue:
    """Sends `x` to `dest` and receives from `source` in one exchange that
    cannot deadlock; the received type is `x`'s unless `result_type` says."""
    return SendRecvOp(x, dest, source, result_type, group).result


@_builds(TransferOp)
def transfer(
    x: Value,
    *,
    source_mesh: str,
    source_layout: Sequence[int | None],
    dest_mesh: str,
    dest_layout: Sequence[int | None],
    global_shape: Sequence[int],
    source_partial: Sequence[int] = (),
    result_type: TensorType | None = None,
) -> SSAValue:
    """Moves a global tensor of `global_shape` from its layout on one mesh to
    a layout on another. A layout gives, per tensor dim, the mesh axis that
    shards it or None (replicated); `source_partial` lists the source mesh
    axes that hold partial sums. The local shard is fully dynamic
    (`tensor<?x?xf32>`) unless `result_type` says otherwise."""
    element = SSAValue.get(x).type
    assert isinstance(element, TensorType)
    t = result_type or tensor_type(element.element_type, [None] * len(global_shape))
    return TransferOp(
        x,
        source_mesh=source_mesh,
        source_layout=source_layout,
        dest_mesh=dest_mesh,
        dest_layout=dest_layout,
        global_shape=global_shape,
        source_partial=source_partial,
        result_type=t,
    ).result


###############################################################################
# Programs
###############################################################################


def build_program(
    body: Body,
    arg_types: Sequence[Attribute],
    *,
    name: str = "main",
    groups: Mapping[str, Sequence[Sequence[int]]] | None = None,
    meshes: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None,
) -> ModuleOp:
    """A verified module holding the group declarations (name -> subgroups),
    the mesh declarations (name -> (shape, ranks)) and `func.func @name`
    whose body is built by `body(*args)`; what `body` returns is returned."""
    module = ModuleOp([])
    with ImplicitBuilder(module.body.block):
        for sym, parts in (groups or {}).items():
            declare_group(sym, parts)
        for sym, (shape, ranks) in (meshes or {}).items():
            declare_mesh(sym, shape, ranks)
    block = Block(arg_types=arg_types)
    for i, arg in enumerate(block.args):
        arg.name_hint = f"arg{i}"
    with ImplicitBuilder(block):
        values = _values(body(*block.args))
        func.ReturnOp(*values)
    fn = func.FuncOp(name, (list(arg_types), [v.type for v in values]), Region(block))
    module.body.block.add_op(fn)
    module.verify()
    return module
