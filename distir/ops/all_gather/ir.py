"""The all-gather op: every rank's tensor, concatenated along an axis in rank order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects import arith, tensor
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    I64,
    IndexType,
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
from distir.ir.collectives import (
    CollectiveOp,
    verify_axis,
    verify_counts_type,
    verify_same_except_axis,
)
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
from distir.ops.groups.ir import GroupName, RankOp, group_property


@irdl_op_definition
class AllGatherOp(CollectiveOp, Transposable, ImpliesGroupSize):
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
        self.verify_group()
        t_in, t_out = self.input.type, self.result.type
        assert isinstance(t_in, TensorType) and isinstance(t_out, TensorType)
        axis = self.axis.value.data
        verify_axis(self, axis, t_in)
        verify_same_except_axis(self, axis, t_in, t_out)
        size = self.static_group_size()
        if self.counts is not None:
            verify_counts_type(self, "counts", self.counts.type)
            assert isinstance(self.counts.type, TensorType)
            n = self.counts.type.get_shape()[0]
            if size is not None and n >= 0 and n != size:
                raise VerifyException(
                    f"'dist.all_gather' counts has {n} entries for a group of size {size}"
                )
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
        """Even: the sum reduce-scatter of the cotangent (this rank's part of
        the sum, N·(P-1)/P bytes per rank). Uneven: the summed cotangent,
        then this rank's slice of it (after the counts of the lower ranks)."""
        (ct,) = cotangents
        assert ct is not None
        x = self.input
        axis = self.axis.value.data
        if self.counts is None:
            return [t.reduce_scatter_sum(ct, x.type, axis, self.group), None]
        total = t.all_reduce_sum(ct, self.group)
        me = t.emit(RankOp(self.group)).results[0]
        sizes = t.shape_of(x, primal=True)
        offset = self._rows_before(t, me)
        offsets: list[SSAValue | int] = [0] * len(sizes)
        offsets[axis] = offset
        sliced = tensor.ExtractSliceOp(total, offsets, sizes, [1] * len(sizes), x.type)
        return [t.emit(sliced).results[0], None]

    def _rows_before(self, t: Transposer, me: SSAValue) -> SSAValue:
        """Σ_{j < rank} counts[j], unrolled over the counts' static length."""
        counts_type = self.counts.type  # type: ignore[union-attr]
        assert isinstance(counts_type, TensorType)
        (n,) = counts_type.get_shape()
        if n == DYNAMIC_INDEX:
            raise NoDerivative(
                "the backward of an uneven all-gather needs counts of static length (tensor<Pxi64>)"
            )
        counts = t.primal(self.counts)  # type: ignore[arg-type]
        element = counts_type.element_type
        total = t.emit(arith.ConstantOp(IntegerAttr(0, element))).results[0]  # type: ignore[arg-type]
        zero = total
        for j in range(n):
            count = t.emit(tensor.ExtractOp(counts, [t.index(j)], element)).results[0]
            lower = t.emit(arith.CmpiOp(t.index(j), me, "ult")).results[0]
            kept = t.emit(arith.SelectOp(lower, count, zero)).results[0]
            total = t.binary(arith.AddiOp, total, kept)
        return t.emit(arith.IndexCastOp(total, IndexType())).results[0]

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
