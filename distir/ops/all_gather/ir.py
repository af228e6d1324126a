"""The all-gather op: every rank's tensor, concatenated along an axis in rank order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects import arith, tensor
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    I64,
    IntegerAttr,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import (
    CollectiveEffect,
)
from distir.ir.collectives import AlongAxisOp, verify_counts
from distir.ir.facts import (
    EveryRankEnters,
    ImpliesGroupSize,
    OperandRole,
    UniformResults,
)
from distir.ir.syntax import (
    GroupRef,
)
from distir.ir.transpose import Cotangents, NoDerivative, Transposable, Transposer
from distir.ops.all_to_all.ir import VariableAllToAllOp
from distir.ops.groups.ir import GroupName, group_property


@irdl_op_definition
class AllGatherOp(AlongAxisOp, Transposable, ImpliesGroupSize):
    """Concatenation along `axis` of every rank's `x`, in rank order.

    Even form: every rank contributes the same shape. Uneven form
    (`counts(%c : tensor<Pxi64>)`): rank r contributes `counts[r]` rows along
    the axis, and `counts` must be the same on every rank.
    """

    name = "dist.all_gather"

    traits = traits_def(CollectiveEffect(), EveryRankEnters(), UniformResults())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "counts": OperandRole.GATHER_COUNTS,
    }

    input = operand_def(TensorType)
    counts = opt_operand_def(TensorType)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input (`counts` `(` $counts^ `:` type($counts) `)`)? `axis` $axis "
        "custom<GroupRef>($group) attr-dict `:` type($input) `->` type($result)"
    )
    custom_directives = (GroupRef,)

    def __init__(
        self,
        input: SSAValue | Operation,
        result_type: TensorType,
        *,
        axis: int = 0,
        counts: SSAValue | Operation | None = None,
        group: GroupName = None,
    ):
        props: dict[str, Attribute] = {"axis": IntegerAttr(axis, i64)}
        group_property(props, group)
        super().__init__(
            operands=[SSAValue.get(input), [] if counts is None else [SSAValue.get(counts)]],
            result_types=[result_type],
            properties=props,
        )

    def verify_(self) -> None:
        t_in, t_out, axis = self.verify_along_axis()
        size = self.static_group_size()
        if self.counts is not None:
            verify_counts(self, "counts", self.counts.type, size)
            return
        rows_in, rows_out = t_in.get_shape()[axis], t_out.get_shape()[axis]
        if rows_in < 0 or rows_out < 0:
            return
        if size is not None and rows_out != size * rows_in:
            raise VerifyException(
                f"'dist.all_gather' result has {rows_out} rows on axis {axis}, "
                f"expected {size} x {rows_in}"
            )
        if rows_in == 0 and rows_out != 0 or rows_in and rows_out % rows_in:
            raise VerifyException(
                f"'dist.all_gather' result rows ({rows_out}) on axis {axis} "
                f"must be a multiple of the input rows ({rows_in})"
            )

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """The sum reduce-scatter of the cotangent: this rank's part of the
        sum, N·(P-1)/P bytes per rank (even), or N less this rank's part
        (uneven). Uneven, the counts are known at run time only, so it is
        written as the direct reduce-scatter: a variable all-to-all sends
        part j of the cotangent (`counts[j]` rows) to rank j, and the P
        parts received are summed in rank order."""
        (ct,) = cotangents
        assert ct is not None
        x = self.input
        axis = self.axis.value.data
        if self.counts is None:
            return [t.reduce_scatter_sum(ct, x.type, axis, self.group), None]
        return [self._uneven_reduce_scatter(t, ct), None]

    def _uneven_reduce_scatter(self, t: Transposer, ct: SSAValue) -> SSAValue:
        counts_type = self.counts.type  # type: ignore[union-attr]
        assert isinstance(counts_type, TensorType)
        (n,) = counts_type.get_shape()
        if n == DYNAMIC_INDEX:
            raise NoDerivative(
                "the backward of an uneven all-gather needs counts of static length (tensor<Pxi64>)"
            )
        x_type = self.input.type
        assert isinstance(x_type, TensorType)
        axis = self.axis.value.data
        shape = list(x_type.get_shape())
        shape[axis] = DYNAMIC_INDEX
        exchange = VariableAllToAllOp(
            ct,
            t.primal(self.counts),  # type: ignore[arg-type]
            TensorType(x_type.element_type, shape),
            axis=axis,
            group=self.group,  # type: ignore[arg-type]
        )
        parts = t.emit(exchange).results[0]  # n parts of counts[rank] rows each
        sizes: list[SSAValue | int] = []
        for d, size in enumerate(x_type.get_shape()):
            if size != DYNAMIC_INDEX:
                sizes.append(size)
                continue
            dim = t.emit(tensor.DimOp(parts, t.index(d))).results[0]
            if d == axis:
                dim = t.emit(arith.DivUIOp(dim, t.index(n))).results[0]
            sizes.append(dim)
        total: SSAValue | None = None
        for j in range(n):
            offsets: list[SSAValue | int] = [0] * len(sizes)
            rows = sizes[axis]
            offsets[axis] = (
                j * rows if isinstance(rows, int)
                else t.emit(arith.MuliOp(rows, t.index(j))).results[0]
            )  # fmt: skip
            part = tensor.ExtractSliceOp(parts, offsets, sizes, [1] * len(sizes), x_type)
            value = t.emit(part).results[0]
            total = value if total is None else t.binary(arith.AddfOp, total, value)
        assert total is not None
        return total

    def implied_group_size(self) -> tuple[str, int | None] | None:
        if self.counts is not None:
            return None
        axis = self.axis.value.data
        t_in, t_out = self.input.type, self.result.type
        if isinstance(t_in, TensorType) and isinstance(t_out, TensorType):
            rows_in, rows_out = t_in.get_shape()[axis], t_out.get_shape()[axis]
            if rows_in > 0 and rows_out >= 0:
                size, rest = divmod(rows_out, rows_in)
                why = (
                    f"gathers {t_in} into {t_out} "
                    f"({rows_out} rows along axis {axis} from {rows_in} per rank)"
                )
                return why, None if rest else size
        return None
