"""MLIR's `shard` dialect, as distir reads it.

`shard` is upstream MLIR's dialect of partitioned SPMD programs: a device
grid (`shard.grid @g(shape = 2x4)`), shardings, and communication ops over
groups of the grid given by `grid_axes`. distir runs such programs by
converting them to `dist` (`convert-shard-to-dist`); this module only
declares the ops so that the parser reads them with upstream's syntax.

xDSL ships part of the dialect (the grid, the shardings and eight of the
thirteen communication ops); the ops it lacks are declared here with
upstream's assembly formats, and `Shard` is the dialect of both. The op
definitions carry no run-time meaning: the conversion says what each op
computes, and checks what upstream leaves to its verifiers (a grid that
exists and is static, axes in range, shapes that divide), each failure an
error naming the op and its location.
"""

from __future__ import annotations

from abc import ABC
from typing import ClassVar

from xdsl.dialects import shard as xdsl_shard
from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    FlatSymbolRefAttr,
    IndexType,
    IndexTypeConstr,
    IntegerAttr,
    MemRefType,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.dialects.shard import (  # noqa: F401  (re-exported: the whole dialect in one place)
    AllReduceOp,
    BroadcastOp,
    CollectiveCommunicationOp,
    GatherOp,
    GridOp,
    RecvOp,
    ReduceOp,
    ReductionKind,
    ReductionKindAttr,
    ScatterOp,
    SendOp,
    ShardAxesArrayAttr,
    ShardAxesAttr,
    ShardingOp,
    ShardingType,
    ShardOp,
)
from xdsl.dialects.utils import DynamicIndexList
from xdsl.ir import Dialect
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.irdl.declarative_assembly_format import (
    AttributeVariable,
    CustomDirective,
    ParsingState,
    PrintingState,
    irdl_custom_directive,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import Pure

_INDEX_ATTR = IntegerAttr.constr(IndexTypeConstr)

#: a tensor, or a memref where upstream's ShardToMPI tests pass one
#: (all_gather, reduce_scatter; xDSL's all_reduce takes both already)
_TENSOR_OR_MEMREF = TensorType.constr() | MemRefType.constr()


@irdl_op_definition
class AllGatherOp(CollectiveCommunicationOp):
    """Concatenates the group's tensors along `gather_axis`, in in-group
    index order, and gives every member the result."""

    name = "shard.all_gather"

    input = operand_def(_TENSOR_OR_MEMREF)
    gather_axis = prop_def(_INDEX_ATTR)
    result = result_def(_TENSOR_OR_MEMREF)
    traits = traits_def(Pure())

    assembly_format = (
        "$input `on` $grid (`grid_axes` `=` $grid_axes^)? `gather_axis` `=` $gather_axis "
        "attr-dict `:` type($input) `->` type($result)"
    )


@irdl_op_definition
class AllSliceOp(CollectiveCommunicationOp):
    """Each member keeps the slice of its input along `slice_axis` that its
    in-group index names; no communication."""

    name = "shard.all_slice"

    input = operand_def(TensorType)
    slice_axis = prop_def(_INDEX_ATTR)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = (
        "$input `on` $grid (`grid_axes` `=` $grid_axes^)? `slice_axis` `=` $slice_axis "
        "attr-dict `:` type($input) `->` type($result)"
    )


@irdl_op_definition
class AllToAllOp(CollectiveCommunicationOp):
    """Each member splits its input along `split_axis`, sends piece j to the
    member of in-group index j, and concatenates what it receives along
    `concat_axis`, in in-group index order."""

    name = "shard.all_to_all"

    input = operand_def(TensorType)
    split_axis = prop_def(_INDEX_ATTR)
    concat_axis = prop_def(_INDEX_ATTR)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = (
        "$input `on` $grid (`grid_axes` `=` $grid_axes^)? `split_axis` `=` $split_axis "
        "`concat_axis` `=` $concat_axis attr-dict `:` type($input) `->` type($result)"
    )


@irdl_custom_directive
class ScatterAxis(CustomDirective):
    """`scatter_axis = N`, also read in the older spelling `scatter_dim = N`
    (upstream's ShardToMPI tests still write it); printed as `scatter_axis`."""

    axis: AttributeVariable

    def parse(self, parser: Parser, state: ParsingState) -> None:
        parser.parse_keyword_in(("scatter_axis", "scatter_dim"))
        parser.parse_punctuation("=")
        self.axis.set(state, IntegerAttr(parser.parse_integer(allow_boolean=False), IndexType()))

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        state.print_whitespace(printer)
        axis = self.axis.get(op)
        assert isinstance(axis, IntegerAttr)
        printer.print_string(f"scatter_axis = {axis.value.data}")


@irdl_op_definition
class ReduceScatterOp(CollectiveCommunicationOp):
    """Reduces the group's tensors elementwise, then gives member j the j-th
    piece of the result along `scatter_axis`."""

    name = "shard.reduce_scatter"

    input = operand_def(_TENSOR_OR_MEMREF)
    reduction = prop_def(
        ReductionKindAttr, default_value=ReductionKindAttr(ReductionKind.SUM)
    )
    scatter_axis = prop_def(_INDEX_ATTR)
    result = result_def(_TENSOR_OR_MEMREF)
    traits = traits_def(Pure())

    assembly_format = (
        "$input `on` $grid (`grid_axes` `=` $grid_axes^)? (`reduction` `=` $reduction^)? "
        "custom<ScatterAxis>($scatter_axis) attr-dict `:` type($input) `->` type($result)"
    )
    custom_directives = (ScatterAxis,)


@irdl_op_definition
class UpdateHaloOp(IRDLOperation):
    """Refreshes the halo regions of each shard from its neighbours along
    the grid axes in `split_axes`; `halo_sizes` holds (low, high) per split
    tensor dimension."""

    name = "shard.update_halo"

    T: ClassVar = VarConstraint("T", base(TensorType) | base(MemRefType))
    destination = operand_def(T)
    grid = prop_def(FlatSymbolRefAttr)
    split_axes = prop_def(ShardAxesArrayAttr)
    halo_sizes = var_operand_def(I64)
    static_halo_sizes = prop_def(
        DenseArrayBase[I64], default_value=DenseArrayBase.from_list(i64, [])
    )
    result = result_def(T)
    traits = traits_def(Pure())

    assembly_format = (
        "$destination `on` $grid `split_axes` `=` $split_axes "
        "(`halo_sizes` `=` custom<DynamicIndexList>($halo_sizes, $static_halo_sizes)^)? "
        "attr-dict `:` type($result)"
    )
    custom_directives = (DynamicIndexList,)


@irdl_op_definition
class ShiftOp(CollectiveCommunicationOp):
    """Within each group, moves every member's input `offset` places along
    grid axis `shift_axis` (one of `grid_axes`); with `rotate` the move wraps
    around the axis. (xDSL declares `rotate` required; upstream makes it
    optional, as here.)"""

    name = "shard.shift"

    input = operand_def(TensorType)
    shift_axis = prop_def(_INDEX_ATTR)
    offset = prop_def(IntegerAttr[I64])
    rotate = opt_prop_def(UnitAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    assembly_format = (
        "$input `on` $grid (`grid_axes` `=` $grid_axes^)? `shift_axis` `=` $shift_axis "
        "`offset` `=` $offset (`rotate` $rotate^)? attr-dict `:` type($input) `->` type($result)"
    )


class _GridQueryOp(IRDLOperation, ABC):
    grid = prop_def(FlatSymbolRefAttr)


@irdl_op_definition
class GridShapeOp(_GridQueryOp):
    """The grid's extent along `axes` (every axis when empty)."""

    name = "shard.grid_shape"

    axes = prop_def(ShardAxesAttr, default_value=xdsl_shard.ShardAxesAttr(
        xdsl_shard.i16, xdsl_shard.BytesAttr(b"")))
    result = var_result_def(IndexType)
    traits = traits_def(Pure())

    assembly_format = "$grid (`axes` `=` $axes^)? attr-dict `:` type($result)"


@irdl_op_definition
class ProcessMultiIndexOp(_GridQueryOp):
    """This process's coordinates along `axes` (every axis when empty)."""

    name = "shard.process_multi_index"

    axes = prop_def(ShardAxesAttr, default_value=xdsl_shard.ShardAxesAttr(
        xdsl_shard.i16, xdsl_shard.BytesAttr(b"")))
    result = var_result_def(IndexType)
    traits = traits_def(Pure())

    assembly_format = "`on` $grid (`axes` `=` $axes^)? attr-dict `:` type($result)"


@irdl_op_definition
class ProcessLinearIndexOp(_GridQueryOp):
    """This process's row-major linear index in the grid."""

    name = "shard.process_linear_index"

    result = result_def(IndexType)
    traits = traits_def(Pure())

    assembly_format = "`on` $grid attr-dict `:` type($result)"


@irdl_op_definition
class NeighborsLinearIndicesOp(_GridQueryOp):
    """The linear indices of the previous and next process of the device at
    multi-index `device` along `split_axes`; -1 where there is none."""

    name = "shard.neighbors_linear_indices"

    device = var_operand_def(IndexType)
    split_axes = prop_def(ShardAxesAttr)
    neighbor_down = result_def(IndexType)
    neighbor_up = result_def(IndexType)
    traits = traits_def(Pure())

    assembly_format = (
        "`on` $grid `[` $device `]` `split_axes` `=` $split_axes attr-dict `:` type(results)"
    )


@irdl_op_definition
class ShardShapeOp(IRDLOperation):
    """The shape of the shard that the device at multi-index `device` holds
    of a tensor of shape `dims` sharded by `sharding`."""

    name = "shard.shard_shape"

    dims = prop_def(DenseArrayBase[I64])
    dims_dynamic = var_operand_def(IndexType)
    sharding = operand_def(ShardingType)
    device = prop_def(DenseArrayBase[I64])
    device_dynamic = var_operand_def(IndexType)
    result = var_result_def(IndexType)
    traits = traits_def(Pure())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    assembly_format = (
        "`dims` `=` custom<DynamicIndexList>($dims_dynamic, $dims) "
        "`sharding` `=` $sharding "
        "`device` `=` custom<DynamicIndexList>($device_dynamic, $device) "
        "attr-dict `:` type(results)"
    )
    custom_directives = (DynamicIndexList,)


#: the communication ops (upstream's thirteen)
COMMUNICATION_OPS: tuple[type[IRDLOperation], ...] = (
    AllGatherOp, AllReduceOp, AllSliceOp, AllToAllOp, BroadcastOp, GatherOp, RecvOp,
    ReduceOp, ReduceScatterOp, ScatterOp, SendOp, ShiftOp, UpdateHaloOp,
)  # fmt: skip

#: the ops that ask about the grid
INDEX_OPS: tuple[type[IRDLOperation], ...] = (
    GridShapeOp, ProcessMultiIndexOp, ProcessLinearIndexOp, NeighborsLinearIndicesOp,
    ShardShapeOp,
)  # fmt: skip

Shard = Dialect(
    "shard",
    [GridOp, ShardingOp, ShardOp, *COMMUNICATION_OPS, *INDEX_OPS],
    [ShardAxesArrayAttr, ReductionKindAttr, ShardingType],
)
