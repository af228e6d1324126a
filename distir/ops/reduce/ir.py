"""`dist.reduce`: the reduction of every rank's `x`, on the root.

`y_root = x_0 ⊕ x_1 ⊕ … ⊕ x_{P-1}` (folded in rank order, a native kind:
`sum`, `max`, ...), and zeros of the same shape on every other rank (a
defined value, as a gather's non-root result is). It is the transpose of
the broadcast (and the broadcast is its transpose): a sum reduce moves the
cotangents to the root once where an all-reduce sends every rank the sum.

The verifier refuses what the types already decide: a static root outside
the group, a bitwise kind on floats, a result type that is not the input's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects.builtin import I64, IntegerAttr, TensorType, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def, traits_def
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import CollectiveEffect, ReductionKind, ReductionKindAttr
from distir.ir.collectives import CollectiveOp, is_integer_tensor, verify_same_type
from distir.ir.facts import EveryRankEnters, OperandRole
from distir.ir.syntax import GroupRef, SharedType
from distir.ir.transpose import Cotangents, NoDerivative, Transposable, Transposer
from distir.ops.broadcast.ir import BroadcastOp
from distir.ops.groups.ir import GroupName, group_property


@irdl_op_definition
class ReduceToRootOp(CollectiveOp, Transposable):
    """`y = x_0 ⊕ … ⊕ x_{P-1}` on the root, zeros on every other rank.

    `%y = dist.reduce sum %x root 0 : tensor<4xf32>`: rank 0 holds the sum
    of every rank's `x`. Every rank's `x` has the same shape.
    """

    name = "dist.reduce"

    # Not UniformResults: only the root holds the reduction.
    traits = traits_def(CollectiveEffect(), EveryRankEnters())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.PAYLOAD}

    input = operand_def(TensorType)
    kind = prop_def(ReductionKindAttr)
    root = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$kind $input `root` $root custom<GroupRef>($group) attr-dict "
        "`:` custom<SharedType>(type($input), type($result))"
    )
    custom_directives = (GroupRef, SharedType)

    def __init__(
        self,
        input: SSAValue | Operation,
        *,
        kind: ReductionKind,
        root: int,
        group: GroupName = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {
            "kind": ReductionKindAttr(kind),
            "root": IntegerAttr(root, i64),
        }
        group_property(props, group)
        super().__init__(operands=[input], result_types=[input.type], properties=props)

    def verify_(self) -> None:
        self.verify_group()
        self.verify_static_rank("root", self.root.value.data)
        verify_same_type(self, "input", self.result.type, self.input.type)
        if self.kind.facts.integer_only and not is_integer_tensor(self.input.type):
            raise VerifyException(
                f"'dist.reduce' kind {self.kind.data} needs an integer element type, "
                f"got {self.input.type}"
            )

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """A sum reduce transposes to the broadcast of the root's cotangent
        (every rank's input reached the root's result; the zeros elsewhere
        depend on no input); other kinds are not linear."""
        (ct,) = cotangents
        assert ct is not None
        if self.kind.data is not ReductionKind.SUM:
            raise NoDerivative(
                f"the native {self.kind.data.value} reduce has no derivative (only a sum is linear)"
            )
        return [t.emit(BroadcastOp(ct, self.root.value.data, self.group)).results[0]]  # type: ignore[arg-type]


def sum_reduce(value: SSAValue, root: int, group: GroupName) -> ReduceToRootOp:
    """The native sum reduce of `value` to `root` (what a broadcast with a
    static root transposes its cotangent with)."""
    return ReduceToRootOp(value, kind=ReductionKind.SUM, root=root, group=group)
