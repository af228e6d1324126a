"""The broadcast op: every rank gets the root's tensor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    IndexType,
    IntegerAttr,
    TensorType,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    result_def,
    traits_def,
)
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import (
    CollectiveEffect,
)
from distir.ir.collectives import CollectiveOp, verify_same_type
from distir.ir.facts import (
    EveryRankEnters,
    OperandRole,
    UniformResults,
)
from distir.ir.syntax import (
    GroupRef,
    SharedType,
    StaticOrDynamicRank,
)
from distir.ir.transpose import Cotangents, Transposable, Transposer
from distir.ops.groups.ir import GroupName, group_property

###############################################################################
# Broadcast
###############################################################################


@irdl_op_definition
class BroadcastOp(CollectiveOp, Transposable):
    """`y` on every rank equals `x` of group rank `root`.

    The root is a static attribute (`root 0`) or an index operand (`root %r`)
    whose value must agree across ranks. Non-root ranks' `x` only supplies
    the shape and dtype of the message.
    """

    name = "dist.broadcast"

    traits = traits_def(CollectiveEffect(), EveryRankEnters(), UniformResults())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "root_value": OperandRole.ROOT,
    }

    input = operand_def(TensorType)
    root_value = opt_operand_def(IndexType)
    root = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input `root` custom<StaticOrDynamicRank>($root_value, $root) custom<GroupRef>($group) "
        "attr-dict `:` custom<SharedType>(type($input), type($result))"
    )
    custom_directives = (StaticOrDynamicRank, GroupRef, SharedType)

    def __init__(
        self,
        input: SSAValue | Operation,
        root: int | SSAValue | Operation,
        group: GroupName = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {}
        operands = [input, self.rank_operands(root, "root", props)]
        group_property(props, group)
        super().__init__(operands=operands, result_types=[input.type], properties=props)

    def verify_(self) -> None:
        self.verify_group()
        if (self.root is None) == (self.root_value is None):
            raise VerifyException(
                "'dist.broadcast' needs exactly one root: a static `root N` or an "
                "index operand `root %r`"
            )
        verify_same_type(self, "input", self.result.type, self.input.type)
        if self.root is not None:
            self.verify_static_rank("root", self.root.value.data)

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """The summed cotangent, kept on the root (zeros elsewhere): a sum
        `dist.reduce` to a static root (the sum reaches the root only), an
        all-reduce kept on the root for a dynamic one."""
        (ct,) = cotangents
        assert ct is not None
        if self.root is not None:
            return [t.reduce_sum(ct, self.root.value.data, self.group), None]
        total = t.all_reduce_sum(ct, self.group)
        root = t.index(self.root.value.data) if self.root is not None else t.primal(self.root_value)  # type: ignore[arg-type]
        return [t.on_rank(self.group, root, total), None]
