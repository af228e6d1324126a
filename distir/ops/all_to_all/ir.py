"""The variable all-to-all op: rows along an axis, sent by counts to every rank."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    IntegerAttr,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import (
    CollectiveEffect,
)
from distir.ir.collectives import AlongAxisOp, verify_count_entries, verify_counts_type
from distir.ir.facts import (
    AgreementRidesWithPayload,
    EveryRankEnters,
    OperandRole,
)
from distir.ir.syntax import (
    GroupRef,
    SharedType,
)
from distir.ir.transpose import Cotangents, Transposable, Transposer
from distir.ops.groups.ir import GroupName, group_property


@irdl_op_definition
class VariableAllToAllOp(AlongAxisOp, Transposable):
    """Exchange of variable-size row blocks along `axis`.

    Rank r splits its `x` along the axis into P blocks of `send_counts[j]`
    rows (in rank order) and sends block j to rank j. `y` concatenates, in
    rank order, the blocks every peer sent to r; `recv_counts[j]` is the
    number of rows received from j. Zero counts are legal, and every rank
    takes part even when it sends and receives nothing.
    """

    name = "dist.variable_all_to_all"

    traits = traits_def(CollectiveEffect(), EveryRankEnters(), AgreementRidesWithPayload())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "send_counts": OperandRole.SEND_COUNTS,
    }

    input = operand_def(TensorType)
    send_counts = operand_def(TensorType)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)
    recv_counts = result_def(TensorType)

    assembly_format = (
        "$input `,` $send_counts `axis` $axis custom<GroupRef>($group) attr-dict `:` "
        "type($input) `,` custom<SharedType>(type($send_counts), type($recv_counts)) "
        "`->` type($result)"
    )
    custom_directives = (GroupRef, SharedType)

    def __init__(
        self,
        input: SSAValue | Operation,
        send_counts: SSAValue | Operation,
        result_type: TensorType,
        *,
        axis: int = 0,
        group: GroupName = None,
    ):
        send_counts = SSAValue.get(send_counts)
        props: dict[str, Attribute] = {"axis": IntegerAttr(axis, i64)}
        group_property(props, group)
        super().__init__(
            operands=[SSAValue.get(input), send_counts],
            result_types=[result_type, send_counts.type],
            properties=props,
        )

    def verify_(self) -> None:
        self.verify_along_axis()
        verify_counts_type(self, "send counts", self.send_counts.type)
        if self.recv_counts.type != self.send_counts.type:
            raise VerifyException(
                f"'dist.variable_all_to_all' recv counts type {self.recv_counts.type}"
                f" must equal the send counts type {self.send_counts.type}"
            )
        verify_count_entries(self, "send counts", self.send_counts.type, self.static_group_size())

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """The reverse exchange: the cotangent sent back with the counts swapped."""
        ct = t.or_zeros(cotangents[0], self.result)
        back = VariableAllToAllOp(
            ct,
            t.primal(self.recv_counts),
            self.input.type,
            axis=self.axis.value.data,
            group=self.group,
        )  # type: ignore[arg-type]
        return [t.emit(back).results[0], None]
