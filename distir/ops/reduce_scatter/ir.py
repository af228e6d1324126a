"""`dist.reduce_scatter`: the reduction of every rank's `x`, split along an
axis, rank r keeping part r.

`y_r = slice_r(x_0 ⊕ x_1 ⊕ … ⊕ x_{P-1})` where `slice_r` takes rows
`[r·n/P, (r+1)·n/P)` of the axis (n the input's rows there, a multiple of
P). It is the transpose of the even all-gather (and that one's of it): a
sum reduce-scatter moves N·(P-1)/P bytes per rank where an all-reduce and a
slice move twice that.

This form takes a native reduction kind (`sum`, `max`, ...) and an even
split; the verifier refuses what the types already decide (an axis out of
range, rows that do not split into P equal parts, a result whose shape is
not the input's with the axis divided by P).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects.builtin import I64, IntegerAttr, TensorType, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def, traits_def
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import CollectiveEffect, ReductionKind, ReductionKindAttr
from distir.ir.collectives import (
    CollectiveOp,
    is_integer_tensor,
    verify_axis,
    verify_same_except_axis,
)
from distir.ir.facts import EveryRankEnters, OperandRole
from distir.ir.syntax import GroupRef
from distir.ir.transpose import Cotangents, NoDerivative, Transposable, Transposer
from distir.ops.all_gather.ir import AllGatherOp
from distir.ops.groups.ir import GroupName, group_property


@irdl_op_definition
class ReduceScatterOp(CollectiveOp, Transposable):
    """`y = slice_rank(x_0 ⊕ … ⊕ x_{P-1})` along `axis`, an even split.

    `%y = dist.reduce_scatter sum %x axis 0 : tensor<8xf32> -> tensor<2xf32>`
    on a group of 4: rank r holds rows [2r, 2r+2) of the sum of every
    rank's `x`. Every rank's `x` has the same shape.
    """

    name = "dist.reduce_scatter"

    # Not UniformResults: every rank holds another part.
    traits = traits_def(CollectiveEffect(), EveryRankEnters())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.PAYLOAD}

    input = operand_def(TensorType)
    kind = prop_def(ReductionKindAttr)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$kind $input `axis` $axis custom<GroupRef>($group) attr-dict "
        "`:` type($input) `->` type($result)"
    )
    custom_directives = (GroupRef,)

    def __init__(
        self,
        input: SSAValue | Operation,
        result_type: TensorType,
        *,
        kind: ReductionKind,
        axis: int = 0,
        group: GroupName = None,
    ):
        props: dict[str, Attribute] = {
            "kind": ReductionKindAttr(kind),
            "axis": IntegerAttr(axis, i64),
        }
        group_property(props, group)
        super().__init__(
            operands=[SSAValue.get(input)], result_types=[result_type], properties=props
        )

    def verify_(self) -> None:
        self.verify_group()
        t_in, t_out = self.input.type, self.result.type
        assert isinstance(t_in, TensorType) and isinstance(t_out, TensorType)
        axis = self.axis.value.data
        verify_axis(self, axis, t_in)
        verify_same_except_axis(self, axis, t_in, t_out)
        if self.kind.facts.integer_only and not is_integer_tensor(t_in):
            raise VerifyException(
                f"'dist.reduce_scatter' kind {self.kind.data} needs an integer element type, "
                f"got {t_in}"
            )
        rows_in, rows_out = t_in.get_shape()[axis], t_out.get_shape()[axis]
        if (
            rows_in >= 0
            and rows_out >= 0
            and (
                rows_out == 0
                and rows_in > 0
                or rows_out > 0
                and (rows_in == 0 or rows_in % rows_out)
            )
        ):
            raise VerifyException(
                f"'dist.reduce_scatter' result rows ({rows_out}) on axis {axis} must be "
                f"the input rows ({rows_in}) divided by the group size"
            )
        size = self.static_group_size()
        if size is None or rows_in < 0:
            return
        if rows_in % size:
            raise VerifyException(
                f"'dist.reduce_scatter' input has {rows_in} rows on axis {axis}, "
                f"which do not split evenly over a group of size {size}"
            )
        if rows_out >= 0 and rows_out != rows_in // size:
            raise VerifyException(
                f"'dist.reduce_scatter' result has {rows_out} rows on axis {axis}, "
                f"expected {rows_in} / {size} = {rows_in // size}"
            )

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """A sum reduce-scatter transposes to the even all-gather of the
        cotangent (every rank's input reached every part); other kinds are
        not linear."""
        (ct,) = cotangents
        assert ct is not None
        if self.kind.data is not ReductionKind.SUM:
            raise NoDerivative(
                f"the native {self.kind.data.value} reduce-scatter has no derivative "
                "(only a sum is linear)"
            )
        gathered = AllGatherOp(ct, self.input.type, axis=self.axis.value.data, group=self.group)  # type: ignore[arg-type]
        return [t.emit(gathered).results[0]]


def sum_reduce_scatter(
    value: SSAValue, result_type: TensorType, axis: int, group: GroupName
) -> ReduceScatterOp:
    """The native sum reduce-scatter of `value` along `axis` (what the even
    all-gather's transpose reduces its cotangent with)."""
    return ReduceScatterOp(value, result_type, kind=ReductionKind.SUM, axis=axis, group=group)
