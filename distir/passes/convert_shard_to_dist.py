"""convert-shard-to-dist: run MLIR `shard` programs as `dist` programs.

A `shard` program (after upstream's partitioning: SPMD, one shard per
process) names processes by their coordinates in a static device grid and
communicates within the groups that `grid_axes` picks out: two processes are
in the same group when their coordinates agree on every axis *not* listed.
Inside a group, a process's index is its coordinates along the listed axes,
linearised row-major in the order the axes are listed; a process's rank in
the world is its row-major linear index in the grid.

Every group a program uses becomes one module-level `dist.group` that
partitions the grid's ranks (`@grid0_axes_1`), so group membership is data
fixed at compile time, and the world size must equal the grid's size
(distir-run checks it before any rank starts). dist numbers a group's ranks
in ascending order; where `grid_axes` lists axes in another order, the
conversion reorders the pieces an order-sensitive op moves. Each
communication op becomes the dist ops with the same meaning, and each index
op arithmetic on the process's rank; docs/shard.md lists them op by op, with
what is refused and why (each refusal an error naming the op and its
location).

Shapes may be dynamic except along a dimension the group cuts into equal
pieces (dist's ops take sizes at run time). Memrefs, as upstream's
ShardToMPI tests pass them, become tensors first where a value means the
same as upstream's buffer (`_memrefs_as_values`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from xdsl.context import Context
from xdsl.dialects import arith, func, tensor
from xdsl.dialects.builtin import (
    AnyFloat,
    DenseIntOrFPElementsAttr,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    NoneAttr,
    SymbolRefAttr,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import DiagnosticException

from distir.ir import shard, tensor_arith
from distir.ir.attributes import ReductionKind
from distir.ir.dialect import (
    AllGatherOp,
    AllReduceOp,
    BroadcastOp,
    GroupOp,
    RankOp,
    RecvOp,
    ReduceScatterOp,
    ReduceToRootOp,
    SendOp,
    VariableAllToAllOp,
    YieldOp,
)
from distir.ir.dialect import GatherOp as DistGatherOp
from distir.ir.dialect import ScatterOp as DistScatterOp
from distir.ir.dialect import ShiftOp as DistShiftOp
from distir.ir.parsing import describe_op
from distir.passes._rewrite_utils import with_location


class ShardConversionError(DiagnosticException):
    """A shard program distir cannot run, naming the op and its location."""


_KINDS: dict[shard.ReductionKind, ReductionKind] = {
    shard.ReductionKind.SUM: ReductionKind.SUM,
    shard.ReductionKind.AVERAGE: ReductionKind.SUM,
    shard.ReductionKind.MAX: ReductionKind.MAX,
    shard.ReductionKind.MIN: ReductionKind.MIN,
    shard.ReductionKind.PRODUCT: ReductionKind.PROD,
    shard.ReductionKind.BITWISE_AND: ReductionKind.BAND,
    shard.ReductionKind.BITWISE_OR: ReductionKind.BOR,
    shard.ReductionKind.BITWISE_XOR: ReductionKind.BXOR,
}


def _fail(op: Operation, why: str) -> ShardConversionError:
    return ShardConversionError(f"{describe_op(op)}: {why}")


@dataclass(frozen=True)
class Grid:
    """A static device grid: its name and extent along each axis."""

    name: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return prod(self.shape)

    def strides(self) -> tuple[int, ...]:
        """Row-major: the last axis varies fastest."""
        return tuple(prod(self.shape[a + 1 :]) for a in range(len(self.shape)))

    def coordinates(self, rank: int) -> tuple[int, ...]:
        return tuple(rank // s % n for s, n in zip(self.strides(), self.shape))

    def groups(self, axes: Sequence[int]) -> list[list[int]]:
        """The partition of the grid's ranks that `axes` defines, each group
        in ascending rank order (row-major over `axes` sorted: dist's order)."""
        parts: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.size):
            c = self.coordinates(rank)
            rest = tuple(c[a] for a in range(len(self.shape)) if a not in axes)
            parts.setdefault(rest, []).append(rank)
        return [members for _, members in sorted(parts.items())]

    def listed_order(self, axes: Sequence[int]) -> tuple[int, ...]:
        """For each dist rank r in a group of `axes` (ascending), the in-group
        index shard gives it (row-major over `axes` *as listed*): the identity
        when the axes are listed in ascending order."""
        members = self.groups(axes)[0]
        extents = [self.shape[a] for a in axes]
        order = []
        for rank in members:
            c = self.coordinates(rank)
            index = 0
            for a, n in zip(axes, extents):
                index = index * n + c[a]
            order.append(index)
        return tuple(order)


class _Converter:
    """Converts one module: grids, the groups it needs, then op by op."""

    def __init__(self, module: ModuleOp):
        self.module = module
        self.grids: dict[str, Grid] = {}
        self.group_names: dict[tuple[str, tuple[int, ...]], str] = {}
        self.declarations: list[GroupOp] = []

    # -- grids and groups ---------------------------------------------------

    def read_grids(self) -> None:
        for op in list(self.module.ops):
            if isinstance(op, shard.GridOp):
                shape = tuple(op.shape.get_values())
                if any(n < 0 for n in shape):
                    raise _fail(op, f"grid @{op.sym_name.data} has a dynamic shape; "
                                "distir runs static grids only")
                self.grids[op.sym_name.data] = Grid(op.sym_name.data, shape)

    def grid_of(self, op: Operation) -> Grid:
        ref = op.properties["grid"]
        name = ref.root_reference.data  # type: ignore[attr-defined]
        if name not in self.grids:
            raise _fail(op, f"refers to @{name}, which is no shard.grid of this module")
        return self.grids[name]

    def axes_of(self, op: Operation, grid: Grid, prop: str = "grid_axes") -> tuple[int, ...]:
        attr = op.properties.get(prop)
        axes = tuple(attr.get_values()) if attr is not None else ()  # type: ignore[attr-defined]
        for a in axes:
            if not 0 <= a < len(grid.shape):
                raise _fail(op, f"names grid axis {a}, but grid @{grid.name} has "
                            f"{len(grid.shape)} axes (0 to {len(grid.shape) - 1})")
        if len(set(axes)) != len(axes):
            raise _fail(op, f"lists a grid axis twice: {list(axes)}")
        return axes

    def group(self, grid: Grid, axes: tuple[int, ...]) -> str:
        """The name of the dist.group for `axes` of `grid`, declared once."""
        axes = tuple(sorted(axes))
        key = (grid.name, axes)
        if key not in self.group_names:
            name = f"{grid.name}_axes_{'_'.join(map(str, axes))}" if axes else f"{grid.name}_self"
            if axes == tuple(range(len(grid.shape))):
                name = grid.name
            self.group_names[key] = name
            self.declarations.append(GroupOp(name, grid.groups(axes)))
        return self.group_names[key]

    # -- the conversion -----------------------------------------------------

    def run(self) -> None:
        self.read_grids()
        for function in list(self.module.walk()):
            if isinstance(function, func.FuncOp) and not function.is_declaration:
                _memrefs_as_values(function)
        for op in list(self.module.walk()):
            if op.dialect_name() != "shard" or isinstance(op, shard.GridOp):
                continue
            if isinstance(op, shard.ShardOp):
                raise _fail(op, "is a sharding annotation: distir runs partitioned (SPMD) "
                            "programs; partition it first (mlir-opt --shard-partition)")
            if isinstance(op, shard.ShardingOp):
                continue  # read by shard_shape; erased once unused
            self.convert(op)
        for op in list(self.module.walk()):
            if isinstance(op, shard.ShardingOp):
                if any(op.result.uses):
                    raise _fail(next(iter(op.result.uses)).operation,
                                "uses a sharding distir cannot convert")
                Rewriter.erase_op(op)
        grids = [op for op in self.module.ops if isinstance(op, shard.GridOp)]
        first = grids[0] if grids else self.module.body.block.first_op
        for declaration in self.declarations:
            if first is None:
                self.module.body.block.add_op(declaration)
            else:
                Rewriter.insert_op(declaration, InsertPoint.before(first))
        for op in grids:
            Rewriter.erase_op(op)

    def convert(self, op: Operation) -> None:
        lowering = _LOWERINGS.get(type(op))
        if lowering is None:
            raise _fail(op, "has no conversion to dist")
        built = _Builder(op)
        results = lowering(self, op, built)
        with_location(built.ops, op.location)
        for new in built.ops:
            Rewriter.insert_op(new, InsertPoint.before(op))
        for old, new in zip(op.results, results, strict=True):
            old.replace_all_uses_with(new)
        Rewriter.erase_op(op)


#: the shard ops upstream's tests run on memrefs. Upstream's MPI lowering
#: gives all_reduce, all_gather and reduce_scatter a fresh buffer and leaves
#: the input as it was: a value. update_halo writes the destination in place
#: and returns it, which is a value too while nothing reads the old buffer.
_MEMREF_OPS = (shard.AllReduceOp, shard.AllGatherOp, shard.ReduceScatterOp, shard.UpdateHaloOp)

_MEMREF_RULE = ("distir runs a memref as a value only where it passes between the "
                "function's arguments, shard.all_reduce, all_gather, reduce_scatter, "
                "update_halo and func.return")


def _memrefs_as_values(function: func.FuncOp) -> None:
    """Retype `function`'s memrefs as tensors of the same shape, where that
    keeps the program's meaning (see `_MEMREF_OPS`); refuse the rest, each
    refusal naming the op and its location."""
    values = [*function.args, *(r for op in function.walk() for r in op.results)]
    memrefs = [v for v in values if isinstance(v.type, MemRefType)]
    for value in memrefs:
        _check_memref(function, value)
    for value in memrefs:
        t = value.type
        assert isinstance(t, MemRefType)
        Rewriter.replace_value_with_new_type(value, TensorType(t.element_type, t.get_shape()))
    if memrefs:
        function.update_function_type()


def _check_memref(function: func.FuncOp, value: SSAValue) -> None:
    t = value.type
    assert isinstance(t, MemRefType)
    if isinstance(value, BlockArgument):
        if value.block is not function.body.blocks[0]:
            raise _fail(value.block.parent_op() or function,
                        f"takes a memref block argument ({t}); {_MEMREF_RULE}")
    elif not isinstance(value.owner, _MEMREF_OPS):
        raise _fail(value.owner, f"defines a memref ({t}); {_MEMREF_RULE}")
    if not isinstance(t.layout, NoneAttr) or not isinstance(t.memory_space, NoneAttr):
        owner = value.owner if isinstance(value.owner, Operation) else function
        raise _fail(owner, f"has {t}, a memref with a layout or memory space; distir "
                    "reads memrefs as plain row-major values only")
    for use in value.uses:
        user = use.operation
        if isinstance(user, func.ReturnOp) or isinstance(user, _MEMREF_OPS) and use.index == 0:
            continue
        raise _fail(user, f"uses a memref ({t}); {_MEMREF_RULE}")
    for use in value.uses:
        if isinstance(use.operation, shard.UpdateHaloOp):
            _check_in_place(use.operation, value)


def _check_in_place(op: shard.UpdateHaloOp, buffer: SSAValue) -> None:
    """Upstream updates the halos in the buffer itself: a read of `buffer`
    after the op sees the new halos, which a value cannot give, and an unused
    result means the program meant the write into its caller's buffer, which
    distir never makes (it does not write inputs)."""
    block = op.parent_block()
    for use in buffer.uses:
        other = use.operation
        if other is op:
            continue
        before = other.parent_block() is block and block is not None and \
            block.get_operation_index(other) < block.get_operation_index(op)
        if not before:
            raise _fail(op, f"updates the halos of {buffer.type} in place, and the buffer is "
                        f"used again after it (by '{other.name}'); distir reads memrefs as "
                        "values: use the op's result")
    if not any(op.result.uses):
        raise _fail(op, f"updates the halos of {buffer.type} in place and its result is "
                    "unused; distir computes the update as a new value (it never writes a "
                    "caller's buffer): use the op's result")


class _Builder:
    """Collects the ops a lowering emits, in order."""

    def __init__(self, source: Operation):
        self.source = source
        self.ops: list[Operation] = []

    def emit(self, op: Operation) -> Operation:
        self.ops.append(op)
        return op

    def value(self, op: Operation) -> SSAValue:
        return self.emit(op).results[0]

    def index(self, n: int) -> SSAValue:
        return self.value(arith.ConstantOp(IntegerAttr(n, IndexType())))

    def i64_tensor(self, values: Sequence[int]) -> SSAValue:
        t = TensorType(i64, [len(values)])
        return self.value(arith.ConstantOp(DenseIntOrFPElementsAttr.from_list(t, list(values))))


# -- helpers shared by the lowerings -----------------------------------------


def _tensor(op: Operation, value: SSAValue) -> TensorType:
    """The op's ranked tensor operand. Its dimensions may be dynamic: dist's
    ops take the size at run time, and ranks whose sizes differ get dist's
    named mismatch error; `_static_axis` asks for the ones the group splits."""
    t = value.type
    if not isinstance(t, TensorType):
        raise _fail(op, f"takes {t}; distir converts tensors (and memrefs used as values)")
    return t


def _axis(op: Operation, prop: str, t: TensorType) -> int:
    axis = op.properties[prop].value.data  # type: ignore[attr-defined]
    if not 0 <= axis < t.get_num_dims():
        raise _fail(op, f"{prop} {axis} is out of range for {t}")
    return axis


def _static_axis(op: Operation, prop: str, t: TensorType) -> int:
    """`_axis`, for a dimension the group splits into equal pieces: its size
    must be known when converting, to check it divides and to cut it."""
    axis = _axis(op, prop, t)
    if t.get_shape()[axis] < 0:
        raise _fail(op, f"takes {t}, dynamic along {prop} {axis}; the group splits that "
                    "dimension into equal pieces, so distir needs its size when converting")
    return axis


def _dims(shape: Sequence[int]) -> str:
    return "x".join("?" if d < 0 else str(d) for d in shape)


def _check_result(op: Operation, expected: Sequence[int], element: Attribute | None = None) -> None:
    t = op.results[0].type
    if not isinstance(t, TensorType) or tuple(t.get_shape()) != tuple(expected):
        raise _fail(op, f"result type {t} disagrees with the group: expected shape "
                    f"{_dims(expected)}")
    if element is not None and t.element_type != element:
        raise _fail(op, f"result element type {t.element_type} differs from the input's {element}")


def _group_size(grid: Grid, axes: Sequence[int]) -> int:
    return prod(grid.shape[a] for a in axes)


def _cast(b: _Builder, value: SSAValue, target: TensorType) -> SSAValue:
    """`value` converted to `target`'s element type (upstream's accumulation type)."""
    source = value.type
    assert isinstance(source, TensorType)
    s, t = source.element_type, target.element_type
    if s == t:
        return value
    to = TensorType(t, source.get_shape())
    if isinstance(s, AnyFloat) and isinstance(t, AnyFloat):
        wider = t.bitwidth > s.bitwidth
        return b.value((tensor_arith.ExtFOp if wider else tensor_arith.TruncFOp)(value, to))
    if isinstance(s, IntegerType) and isinstance(t, IntegerType):
        wider = t.width.data > s.width.data
        return b.value((tensor_arith.ExtSIOp if wider else tensor_arith.TruncIOp)(value, to))
    if isinstance(s, IntegerType) and isinstance(t, AnyFloat):
        return b.value(tensor_arith.SIToFPOp(value, to))
    raise _fail(b.source, f"cannot accumulate {s} in {t}")


def _divide_by(b: _Builder, value: SSAValue, n: int) -> SSAValue:
    """`value / n` elementwise (average): divf for floats, divsi for integers."""
    t = value.type
    assert isinstance(t, TensorType)
    e = t.element_type
    floating = isinstance(e, AnyFloat)
    if t.has_static_shape():
        divisor = b.value(arith.ConstantOp(
            DenseIntOrFPElementsAttr.from_list(t, [float(n) if floating else n])))
    else:  # a splat of the scalar, sized like `value`
        scalar = b.value(arith.ConstantOp(
            FloatAttr(float(n), e) if floating else IntegerAttr(n, e)))  # type: ignore[arg-type]
        sizes = [b.value(tensor.DimOp(value, b.index(d)))
                 for d, size in enumerate(t.get_shape()) if size < 0]
        divisor = b.value(tensor.SplatOp(scalar, sizes, t))
    return b.value((arith.DivfOp if floating else arith.DivSIOp)(value, divisor))


@dataclass(frozen=True)
class _Reduction:
    """How an op reduces: a native kind (and whether it is the average), or
    the combine region of a `generic` reduction."""

    kind: ReductionKind | None
    average: bool = False
    combine: Region | None = None

    def all_reduce(self, value: SSAValue, group: str) -> AllReduceOp:
        if self.combine is not None:
            return AllReduceOp(value, combine=self.combine, group=group)
        return AllReduceOp(value, kind=self.kind, group=group)


def _reduction(c: _Converter, op: Operation, accumulate: TensorType) -> _Reduction:
    """The op's reduction. `generic` is a bare enum upstream: distir takes its
    combine from a function the op names, `{combine = @f}`, with `f` taking
    two `accumulate` tensors and returning their combination (folded in the
    group's ascending rank order, so it need not commute)."""
    reduction = op.properties.get("reduction")
    kind = reduction.data if reduction is not None else shard.ReductionKind.SUM  # type: ignore[attr-defined]
    if kind is not shard.ReductionKind.GENERIC:
        return _Reduction(_KINDS[kind], kind is shard.ReductionKind.AVERAGE)
    ref = op.attributes.get("combine")
    if not isinstance(ref, SymbolRefAttr):
        raise _fail(op, "has reduction 'generic' and names no combine: give one as "
                    "{combine = @f}, a function of two tensors that returns their combination")
    name = ref.root_reference.data
    function = next((f for f in c.module.ops
                     if isinstance(f, func.FuncOp) and f.sym_name.data == name), None)
    if function is None or not function.body.blocks:
        raise _fail(op, f"names combine @{name}, which is no function of this module")
    inputs, outputs = function.function_type.inputs.data, function.function_type.outputs.data
    if list(inputs) != [accumulate, accumulate] or list(outputs) != [accumulate]:
        raise _fail(op, f"names combine @{name} of type {function.function_type}; a "
                    f"'generic' reduction here needs ({accumulate}, {accumulate}) -> {accumulate}")
    block = Block(arg_types=[accumulate, accumulate])
    mapping: dict[SSAValue, SSAValue] = {}
    for old, new in zip(function.body.block.args, block.args):
        mapping[old] = new
    for inner in function.body.block.ops:
        if isinstance(inner, func.ReturnOp):
            block.add_op(YieldOp(*(mapping[v] for v in inner.arguments)))
        else:
            block.add_op(inner.clone(value_mapper=mapping))
    return _Reduction(None, combine=Region(block))


def _in_group_rank(b: _Builder, c: _Converter, op: Operation, grid: Grid,
                   axes: Sequence[int], static: Sequence[int],
                   dynamic: Sequence[SSAValue], what: str) -> int | SSAValue:
    """The in-group rank of a multi-index over `axes` (static where it can be)."""
    if len(static) != len(axes):
        raise _fail(op, f"{what} has {len(static)} coordinates for {len(axes)} grid axes")
    dyn = iter(dynamic)
    by_axis: dict[int, int | SSAValue] = {}
    for a, value in zip(axes, static):
        n = grid.shape[a]
        if value == DYNAMIC:
            by_axis[a] = next(dyn)
        elif not 0 <= value < n:
            raise _fail(op, f"{what} coordinate {value} is outside the grid axis of size {n}")
        else:
            by_axis[a] = value
    # dist numbers a group's members in ascending global rank: row-major
    # over the group's axes in ascending order, whatever order shard lists.
    extents = [grid.shape[a] for a in sorted(by_axis)]
    terms = [by_axis[a] for a in sorted(by_axis)]
    if all(isinstance(v, int) for v in terms):
        rank = 0
        for v, n in zip(terms, extents):
            rank = rank * n + v  # type: ignore[operator]
        return rank
    acc: SSAValue = b.index(0)
    for v, n in zip(terms, extents):
        scaled = b.value(arith.MuliOp(acc, b.index(n)))
        acc = b.value(arith.AddiOp(scaled, v if isinstance(v, SSAValue) else b.index(v)))
    return acc


DYNAMIC = -(2**63)


def _slice(b: _Builder, value: SSAValue, axis: int, offset: int | SSAValue, size: int) -> SSAValue:
    """`value[..., offset:offset+size, ...]` along `axis`."""
    t = value.type
    assert isinstance(t, TensorType)
    shape = list(t.get_shape())
    offsets: list[int | SSAValue] = [0] * len(shape)
    offsets[axis] = offset
    # a dynamic dimension other than `axis` is taken whole: its size at run time
    sizes: list[int | SSAValue] = [
        size if d == axis else b.value(tensor.DimOp(value, b.index(d))) if n < 0 else n
        for d, n in enumerate(shape)
    ]
    result = TensorType(t.element_type, [size if d == axis else n for d, n in enumerate(shape)])
    return b.value(tensor.ExtractSliceOp(value, offsets, sizes, [1] * len(shape), result))


def _inverse(order: Sequence[int]) -> tuple[int, ...]:
    inverse = [0] * len(order)
    for position, index in enumerate(order):
        inverse[index] = position
    return tuple(inverse)


def _permute(b: _Builder, value: SSAValue, axis: int, order: Sequence[int]) -> SSAValue:
    """`value`'s len(order) equal pieces along `axis`, piece k taken from
    piece order[k] (no op for the identity)."""
    if list(order) == sorted(order):
        return value
    t = value.type
    assert isinstance(t, TensorType)
    size = t.get_shape()[axis] // len(order)
    return _concat(b, [_slice(b, value, axis, k * size, size) for k in order], axis)


def _concat(b: _Builder, values: Sequence[SSAValue], axis: int) -> SSAValue:
    if len(values) == 1:
        return values[0]
    first = values[0].type
    assert isinstance(first, TensorType)
    shape = list(first.get_shape())
    lengths = [v.type.get_shape()[axis] for v in values]  # type: ignore[attr-defined]
    shape[axis] = DYNAMIC if any(n < 0 for n in lengths) else sum(lengths)
    return b.value(tensor.ConcatOp(list(values), axis, TensorType(first.element_type, shape)))


# -- the lowerings -------------------------------------------------------------


def _all_reduce(c: _Converter, op: shard.AllReduceOp | shard.ReduceOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid)
    t = _tensor(op, op.input)
    result_t = op.result.type
    root = None
    if isinstance(op, shard.ReduceOp):
        root = _in_group_rank(b, c, op, grid, axes, op.root.get_values(), op.root_dynamic, "root")
    _check_result(op, t.get_shape())
    reduction = _reduction(c, op, result_t)  # type: ignore[arg-type]
    value = _cast(b, op.input, result_t)  # type: ignore[arg-type]
    if not axes:
        return [value]
    group = c.group(grid, axes)
    if isinstance(root, int) and reduction.kind is not None:
        # to a static root: dist.reduce (zeros elsewhere; upstream: undefined)
        reduced = b.value(ReduceToRootOp(value, kind=reduction.kind, root=root, group=group))
    else:  # a dynamic root or a combine: everyone reduces, the root's copy is the result
        reduced = b.value(reduction.all_reduce(value, group))
    return [_divide_by(b, reduced, _group_size(grid, axes)) if reduction.average else reduced]


def _all_gather(c: _Converter, op: shard.AllGatherOp | shard.GatherOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid)
    t = op.input.type
    axis = op.gather_axis.value.data
    if isinstance(t, TensorType) and 0 <= axis < t.get_num_dims() and t.get_shape()[axis] < 0:
        return [_uneven_gather(c, op, b, grid, axes, t, axis)]
    t = _tensor(op, op.input)
    axis = _axis(op, "gather_axis", t)
    root = None
    if isinstance(op, shard.GatherOp):
        root = _in_group_rank(b, c, op, grid, axes, op.root.get_values(), op.root_dynamic, "root")
    n = _group_size(grid, axes)
    shape = list(t.get_shape())
    shape[axis] *= n
    _check_result(op, shape, t.element_type)
    if not axes:
        return [op.input]
    group = c.group(grid, axes)
    if isinstance(root, int):  # to a static root: dist.gather (zeros elsewhere)
        gathered = b.value(DistGatherOp(op.input, op.result.type, root=root, axis=axis, group=group))  # type: ignore[arg-type]
    else:
        gathered = b.value(AllGatherOp(op.input, op.result.type, axis=axis, group=group))  # type: ignore[arg-type]
    return [_permute(b, gathered, axis, _inverse(grid.listed_order(axes)))]


def _uneven_gather(c: _Converter, op: shard.AllGatherOp | shard.GatherOp, b: _Builder,
                   grid: Grid, axes: tuple[int, ...], t: TensorType, axis: int) -> SSAValue:
    """A gather whose pieces differ in length along `axis` (a dynamic
    dimension: uneven shards). The members first gather their lengths, then
    the pieces with those counts; where `grid_axes` are not listed in
    ascending order, the pieces are put back in the listed order by offsets
    computed from the counts."""
    shape = t.get_shape()
    root = None
    if isinstance(op, shard.GatherOp):
        root = _in_group_rank(b, c, op, grid, axes, op.root.get_values(), op.root_dynamic, "root")
    result = op.result.type
    if not isinstance(result, TensorType) or result.element_type != t.element_type or [
        d for i, d in enumerate(result.get_shape()) if i != axis
    ] != [d for i, d in enumerate(shape) if i != axis] or result.get_shape()[axis] >= 0:
        raise _fail(op, f"result type {result} disagrees with the group: expected {t.element_type} "
                    f"elements, dynamic along gather_axis {axis}, the input's other dimensions")
    if not axes:
        return b.value(tensor.CastOp(op.input, result)) if result != t else op.input
    n = _group_size(grid, axes)
    group = c.group(grid, axes)
    length = b.value(tensor.DimOp(op.input, b.index(axis)))
    mine = b.value(tensor.FromElementsOp(b.value(arith.IndexCastOp(length, i64)),
                                         result_type=TensorType(i64, [1])))
    counts = b.value(AllGatherOp(mine, TensorType(i64, [n]), axis=0, group=group))
    if isinstance(root, int):  # to a static root: an uneven dist.gather (zeros elsewhere)
        gathered = b.value(DistGatherOp(op.input, result, root=root, axis=axis, counts=counts,
                                        group=group))
    else:
        gathered = b.value(AllGatherOp(op.input, result, axis=axis, counts=counts, group=group))
    order = grid.listed_order(axes)
    if list(order) == list(range(n)):
        return gathered
    # offsets[r]: where dist rank r's piece starts (prefix sums of the counts)
    sizes = [
        b.value(arith.IndexCastOp(b.value(tensor.ExtractOp(counts, [b.index(r)], i64)), IndexType()))
        for r in range(n)
    ]
    offsets: list[SSAValue] = [b.index(0)]
    for size in sizes[:-1]:
        offsets.append(b.value(arith.AddiOp(offsets[-1], size)))
    pieces = []
    for r in _inverse(order):  # shard index j is dist rank inverse[j]'s piece
        starts: list[int | SSAValue] = [0] * len(shape)
        lengths: list[int | SSAValue] = [
            b.value(tensor.DimOp(gathered, b.index(d))) if n < 0 else n for d, n in enumerate(shape)
        ]
        starts[axis], lengths[axis] = offsets[r], sizes[r]
        pieces.append(b.value(tensor.ExtractSliceOp(gathered, starts, lengths, [1] * len(shape), result)))
    return b.value(tensor.ConcatOp(pieces, axis, result))


def _coordinate(b: _Builder, grid: Grid, rank: SSAValue, axis: int) -> SSAValue:
    """The coordinate along `axis` of the process of linear index `rank`."""
    stride = grid.strides()[axis]
    return b.value(arith.RemUIOp(b.value(arith.DivUIOp(rank, b.index(stride))),
                                 b.index(grid.shape[axis])))


def _slice_of_rank(c: _Converter, op: Operation, b: _Builder, value: SSAValue, grid: Grid,
                   axes: tuple[int, ...], axis: int) -> SSAValue:
    """The slice of `value` along `axis` that this process's in-group rank names."""
    t = value.type
    assert isinstance(t, TensorType)
    n = _group_size(grid, axes)
    size, rest = divmod(t.get_shape()[axis], n)
    if rest:
        raise _fail(op, f"dimension {axis} of {t} does not divide among the {n} processes "
                    f"of grid @{grid.name} axes {list(axes)}")
    if n == 1:
        return value
    if list(grid.listed_order(axes)) == list(range(n)):
        index = b.value(RankOp(group=c.group(grid, axes)))
    else:  # the in-group index over the axes as listed, from the grid coordinates
        everyone = b.value(RankOp(group=c.group(grid, tuple(range(len(grid.shape))))))
        index = b.index(0)
        for a in axes:
            coordinate = _coordinate(b, grid, everyone, a)
            index = b.value(arith.AddiOp(b.value(arith.MuliOp(index, b.index(grid.shape[a]))), coordinate))
    offset = b.value(arith.MuliOp(index, b.index(size)))
    return _slice(b, value, axis, offset, size)


def _all_slice(c: _Converter, op: shard.AllSliceOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid)
    t = _tensor(op, op.input)
    axis = _static_axis(op, "slice_axis", t)
    result = _slice_of_rank(c, op, b, op.input, grid, axes, axis)
    _check_result(op, result.type.get_shape(), t.element_type)  # type: ignore[attr-defined]
    return [result]


def _scatter(c: _Converter, op: shard.ScatterOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid)
    t = _tensor(op, op.input)
    axis = _static_axis(op, "scatter_axis", t)
    root = _in_group_rank(b, c, op, grid, axes, op.root.get_values(), op.root_dynamic, "root")
    if axes and isinstance(root, int):
        # dist.scatter gives dist rank r piece r: put piece listed_order[r] there
        n = _group_size(grid, axes)
        if t.get_shape()[axis] % n:
            raise _fail(op, f"dimension {axis} of {t} does not divide among the {n} processes "
                        f"of grid @{grid.name} axes {list(axes)}")
        pieces = _permute(b, op.input, axis, grid.listed_order(axes))
        shape = list(t.get_shape())
        shape[axis] //= n
        result = b.value(DistScatterOp(pieces, TensorType(t.element_type, shape), root=root,
                                       axis=axis, group=c.group(grid, axes)))
    elif axes:  # a dynamic root: broadcast its tensor, each keeps its piece
        value = b.value(BroadcastOp(op.input, root, group=c.group(grid, axes)))
        result = _slice_of_rank(c, op, b, value, grid, axes, axis)
    else:
        result = op.input
    _check_result(op, result.type.get_shape(), t.element_type)  # type: ignore[attr-defined]
    return [result]


def _broadcast(c: _Converter, op: shard.BroadcastOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid)
    t = _tensor(op, op.input)
    root = _in_group_rank(b, c, op, grid, axes, op.root.get_values(), op.root_dynamic, "root")
    _check_result(op, t.get_shape(), t.element_type)
    if not axes:
        return [op.input]
    return [b.value(BroadcastOp(op.input, root, group=c.group(grid, axes)))]


def _reduce_scatter(c: _Converter, op: shard.ReduceScatterOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid)
    t = _tensor(op, op.input)
    axis = _static_axis(op, "scatter_axis", t)
    n = _group_size(grid, axes)
    shape = list(t.get_shape())
    if shape[axis] % n:
        raise _fail(op, f"dimension {axis} of {t} does not divide among the {n} processes "
                    f"of grid @{grid.name} axes {list(axes)}")
    shape[axis] //= n
    _check_result(op, shape)
    accumulate = TensorType(op.result.type.element_type, t.get_shape())  # type: ignore[attr-defined]
    reduction = _reduction(c, op, accumulate)
    value = _cast(b, op.input, accumulate)
    if not axes:
        return [value]
    if reduction.combine is not None:
        # dist.reduce_scatter takes native kinds: reduce everywhere, keep a piece
        reduced = b.value(reduction.all_reduce(value, c.group(grid, axes)))
        return [_slice_of_rank(c, op, b, reduced, grid, axes, axis)]
    value = _permute(b, value, axis, grid.listed_order(axes))
    scattered = b.value(ReduceScatterOp(value, op.result.type, kind=reduction.kind, axis=axis,  # type: ignore[arg-type]
                                        group=c.group(grid, axes)))
    return [_divide_by(b, scattered, n) if reduction.average else scattered]


def _all_to_all(c: _Converter, op: shard.AllToAllOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid)
    t = _tensor(op, op.input)
    split = _static_axis(op, "split_axis", t)
    concat = _axis(op, "concat_axis", t)
    n = _group_size(grid, axes)
    shape = list(t.get_shape())
    if shape[split] % n:
        raise _fail(op, f"split_axis {split} of {t} does not divide among the {n} processes "
                    f"of grid @{grid.name} axes {list(axes)}")
    piece = shape.copy()
    piece[split] //= n
    out = piece.copy()
    out[concat] = out[concat] * n if out[concat] >= 0 else DYNAMIC
    _check_result(op, out, t.element_type)
    if n == 1:
        return [op.input]
    # Send block r of the split axis to dist rank r (whose shard index is
    # order[r]), every block the same size; the blocks arrive in dist rank
    # order along the split axis, and are laid side by side along
    # concat_axis in shard index order.
    order = grid.listed_order(axes)
    blocks = _permute(b, op.input, split, order)
    counts = b.i64_tensor([piece[split]] * n)
    exchange = VariableAllToAllOp(blocks, counts, t, axis=split, group=c.group(grid, axes))
    received = b.emit(exchange).results[0]
    pieces = [_slice(b, received, split, r * piece[split], piece[split])
              for r in _inverse(order)]  # shard index j came from dist rank inverse[j]
    return [_concat(b, pieces, concat)]


def _send(c: _Converter, op: shard.SendOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid)
    _tensor(op, op.input)
    dest = _in_group_rank(b, c, op, grid, axes, op.destination.get_values(),
                          op.destination_dynamic, "destination")
    if not axes:
        raise _fail(op, "sends within a group of one process (no grid_axes)")
    b.emit(SendOp(op.input, dest, group=c.group(grid, axes)))
    return [op.input]


def _recv(c: _Converter, op: shard.RecvOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid)
    t = _tensor(op, op.input)
    # xDSL reads an absent `source` as an empty one
    if op.source is None or (axes and not op.source.get_values() and not op.source_dynamic):
        raise _fail(op, "has no source: distir receives from a named process only")
    if not axes:
        raise _fail(op, "receives within a group of one process (no grid_axes)")
    source = _in_group_rank(b, c, op, grid, axes, op.source.get_values(),
                            op.source_dynamic, "source")
    _check_result(op, t.get_shape(), t.element_type)
    return [b.value(RecvOp(source, op.result.type, group=c.group(grid, axes)))]  # type: ignore[arg-type]


def _shift_along(c: _Converter, b: _Builder, value: SSAValue, grid: Grid, axis: int,
                  offset: int, rotate: bool) -> SSAValue:
    """`value` moved `offset` places along one grid axis: dist.shift on the
    group of that axis (open ends get zeros unless `rotate`)."""
    group = c.group(grid, (axis,))
    return b.value(DistShiftOp(value, offset=offset, rotate=rotate, group=group))


def _keep_where(b: _Builder, condition: SSAValue, kept: SSAValue, other: SSAValue) -> SSAValue:
    """`kept` where the index condition holds, else `other` (same tensor type)."""
    return b.value(tensor_arith.SelectOp(condition, kept, other))


def _shift(c: _Converter, op: shard.ShiftOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid)
    t = _tensor(op, op.input)
    axis = op.shift_axis.value.data
    if axis not in axes:
        raise _fail(op, f"shift_axis {axis} must be one of grid_axes {list(axes)}")
    _check_result(op, t.get_shape(), t.element_type)
    n = grid.shape[axis]
    offset = op.offset.value.data
    rotate = op.rotate is not None
    if n == 1 and rotate:
        return [op.input]
    # Without rotate, a process whose source lies off the axis gets zeros
    # (dist.shift's declared value; upstream leaves it undefined).
    return [_shift_along(c, b, op.input, grid, axis, offset, rotate)]


def _update_halo(c: _Converter, op: shard.UpdateHaloOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    t = _tensor(op, op.destination)
    if op.halo_sizes:
        raise _fail(op, "has dynamic halo sizes; distir converts static ones only")
    split = [tuple(a.get_values()) for a in op.split_axes.axes.data]
    halos = list(op.static_halo_sizes.get_values())
    split_dims = [d for d, axes in enumerate(split) if axes]
    if len(halos) != 2 * len(split_dims):
        raise _fail(op, f"has {len(halos)} halo sizes for {len(split_dims)} split dimensions "
                    "(two per split dimension)")
    value = op.destination
    for k, dim in enumerate(split_dims):
        axes = split[dim]
        for a in axes:
            if not 0 <= a < len(grid.shape):
                raise _fail(op, f"names grid axis {a}, but grid @{grid.name} has "
                            f"{len(grid.shape)} axes")
        if len(axes) != 1:
            raise _fail(op, f"splits dimension {dim} over grid axes {list(axes)}; distir "
                        "updates halos of dimensions split over one grid axis")
        (axis,) = axes
        low, high = halos[2 * k], halos[2 * k + 1]
        size = t.get_shape()[dim]
        if size < 0:
            raise _fail(op, f"takes {t}, dynamic along split dimension {dim}; distir needs "
                        "the size of a dimension with halos when converting")
        core = size - low - high
        if core < max(low, high) or core <= 0:
            raise _fail(op, f"dimension {dim} of {t} holds {core} rows inside halos of "
                        f"{low} and {high}")
        value = _exchange_halo(c, b, value, grid, axis, dim, low, high)
    return [value]


def _exchange_halo(c: _Converter, b: _Builder, value: SSAValue, grid: Grid, axis: int,
                   dim: int, low: int, high: int) -> SSAValue:
    t = value.type
    assert isinstance(t, TensorType)
    n = grid.shape[axis]
    if n == 1:
        return value
    size = t.get_shape()[dim]
    parts: list[SSAValue] = []
    if low:
        # My low halo is the last `low` core rows of the process below me.
        edge = _slice(b, value, dim, size - high - low, low)
        received = _shift_along(c, b, edge, grid, axis, 1, rotate=False)
        rank = b.value(RankOp(group=c.group(grid, (axis,))))
        old = _slice(b, value, dim, 0, low)
        has_neighbour = b.value(arith.CmpiOp(rank, b.index(0), "ugt"))
        parts.append(_keep_where(b, has_neighbour, received, old))
    parts.append(_slice(b, value, dim, low, size - low - high))
    if high:
        edge = _slice(b, value, dim, low, high)
        received = _shift_along(c, b, edge, grid, axis, -1, rotate=False)
        rank = b.value(RankOp(group=c.group(grid, (axis,))))
        old = _slice(b, value, dim, size - high, high)
        has_neighbour = b.value(arith.CmpiOp(rank, b.index(n - 1), "ult"))
        parts.append(_keep_where(b, has_neighbour, received, old))
    return _concat(b, parts, dim)


def _linear_index(c: _Converter, op: shard.ProcessLinearIndexOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    return [b.value(RankOp(group=c.group(grid, tuple(range(len(grid.shape))))))]


def _multi_index(c: _Converter, op: shard.ProcessMultiIndexOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid, "axes") or tuple(range(len(grid.shape)))
    if len(op.results) != len(axes):
        raise _fail(op, f"has {len(op.results)} results for {len(axes)} grid axes")
    rank = b.value(RankOp(group=c.group(grid, tuple(range(len(grid.shape))))))
    return [_coordinate(b, grid, rank, a) for a in axes]


def _grid_shape(c: _Converter, op: shard.GridShapeOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid, "axes") or tuple(range(len(grid.shape)))
    if len(op.results) != len(axes):
        raise _fail(op, f"has {len(op.results)} results for {len(axes)} grid axes")
    return [b.index(grid.shape[a]) for a in axes]


def _neighbors(c: _Converter, op: shard.NeighborsLinearIndicesOp, b: _Builder) -> list[SSAValue]:
    grid = c.grid_of(op)
    axes = c.axes_of(op, grid, "split_axes")
    if len(axes) != 1:
        raise _fail(op, f"asks for neighbours along grid axes {list(axes)}; distir "
                    "answers for one axis")
    if len(op.device) != len(grid.shape):
        raise _fail(op, f"gives {len(op.device)} coordinates for a grid of "
                    f"{len(grid.shape)} axes")
    (axis,) = axes
    strides = grid.strides()
    linear = b.index(0)
    for coordinate, stride in zip(op.device, strides):
        linear = b.value(arith.AddiOp(linear, b.value(arith.MuliOp(coordinate, b.index(stride)))))
    here = op.device[axis]
    none = b.index(-1)
    at_low = b.value(arith.CmpiOp(here, b.index(0), "eq"))
    at_high = b.value(arith.CmpiOp(here, b.index(grid.shape[axis] - 1), "eq"))
    down = b.value(arith.SubiOp(linear, b.index(strides[axis])))
    up = b.value(arith.AddiOp(linear, b.index(strides[axis])))
    return [b.value(arith.SelectOp(at_low, none, down)), b.value(arith.SelectOp(at_high, none, up))]


def _shard_shape(c: _Converter, op: shard.ShardShapeOp, b: _Builder) -> list[SSAValue]:
    sharding = op.sharding.owner
    if not isinstance(sharding, shard.ShardingOp):
        raise _fail(op, "takes a sharding that is not a shard.sharding op of this function")
    grid = c.grid_of(sharding)
    dims = list(op.dims.get_values())
    if op.dims_dynamic or any(d < 0 for d in dims):
        raise _fail(op, "has dynamic dims; distir computes static shard shapes")
    if sharding.dynamic_sharded_dims_offsets or sharding.dynamic_halo_sizes:
        raise _fail(op, "takes a sharding with dynamic offsets or halos")
    split = [tuple(a.get_values()) for a in sharding.split_axes.axes.data]
    offsets = list(sharding.static_sharded_dims_offsets.get_values())
    halos = list(sharding.static_halo_sizes.get_values())
    device = list(op.device.get_values())
    if op.device_dynamic or any(d < 0 for d in device):
        device = None  # type: ignore[assignment]
    shape: list[int] = []
    cursor = 0
    split_index = 0
    for dim, size in enumerate(dims):
        axes = split[dim] if dim < len(split) else ()
        if not axes:
            shape.append(size)
            continue
        n = _group_size(grid, axes)
        if offsets:
            if device is None:
                raise _fail(op, "asks for the shard shape of a dynamic device under "
                            "uneven offsets; distir needs a static device there")
            index = 0
            for a in axes:
                index = index * grid.shape[a] + device[a]
            starts = offsets[cursor : cursor + n + 1]
            cursor += n + 1
            shape.append(starts[index + 1] - starts[index])
            continue
        if size % n:
            raise _fail(op, f"dimension {dim} of size {size} does not divide among the "
                        f"{n} processes of grid @{grid.name} axes {list(axes)}")
        extra = halos[2 * split_index] + halos[2 * split_index + 1] if halos else 0
        shape.append(size // n + extra)
        split_index += 1
    if len(op.results) != len(shape):
        raise _fail(op, f"has {len(op.results)} results for a {len(shape)}-dimensional shape")
    return [b.index(s) for s in shape]


_LOWERINGS = {
    shard.AllReduceOp: _all_reduce,
    shard.ReduceOp: _all_reduce,
    shard.AllGatherOp: _all_gather,
    shard.GatherOp: _all_gather,
    shard.AllSliceOp: _all_slice,
    shard.ScatterOp: _scatter,
    shard.BroadcastOp: _broadcast,
    shard.ReduceScatterOp: _reduce_scatter,
    shard.AllToAllOp: _all_to_all,
    shard.SendOp: _send,
    shard.RecvOp: _recv,
    shard.ShiftOp: _shift,
    shard.UpdateHaloOp: _update_halo,
    shard.ProcessLinearIndexOp: _linear_index,
    shard.ProcessMultiIndexOp: _multi_index,
    shard.GridShapeOp: _grid_shape,
    shard.NeighborsLinearIndicesOp: _neighbors,
    shard.ShardShapeOp: _shard_shape,
}


@dataclass(frozen=True)
class ConvertShardToDistPass(ModulePass):
    """Convert MLIR `shard` programs (static grids) to `dist`."""

    name = "convert-shard-to-dist"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        _Converter(op).run()
