"""`dist.shift`: every rank's `x` moves `offset` ranks along the group.

`y_r = x_{r - offset}`: rank r sends its `x` to rank `r + offset`, as
MLIR's `shard.shift` moves a device's value `offset` positions along its
shift axis. With `rotate` the ranks form a ring (`y_r = x_{(r - offset) mod
P}`: ring attention, a ring pipeline); without it the ends are open
(pipeline stages, halos), and a rank with no source gets zeros. MLIR leaves
that result undefined; distir declares it, so the op is linear and a
program never reads a value the op did not define.

It is the transpose of the shift by `-offset` with the same `rotate` (the
cotangent travels back along the edge its value came by; the zeros depend
on no input). The result has the input's type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects.builtin import I64, IntegerAttr, TensorType, UnitAttr, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)

from distir.ir.attributes import CollectiveEffect
from distir.ir.collectives import CollectiveOp, verify_same_type
from distir.ir.facts import EveryRankEnters, OperandRole
from distir.ir.syntax import GroupRef, SharedType
from distir.ir.transpose import Cotangents, Transposable, Transposer
from distir.ops.groups.ir import GroupName, group_property


@irdl_op_definition
class ShiftOp(CollectiveOp, Transposable):
    """`y_r = x_{r - offset}` (modulo P with `rotate`; zeros where rank
    `r - offset` is outside the group otherwise).

    `%y = dist.shift %x offset 1 rotate : tensor<4xf32>` on a group of 4:
    rank 0 gets rank 3's `x`, rank r > 0 gets rank r-1's. Every rank's `x`
    has the same shape.
    """

    name = "dist.shift"

    # Not UniformResults: every rank gets another rank's value.
    traits = traits_def(CollectiveEffect(), EveryRankEnters())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.PAYLOAD}

    input = operand_def(TensorType)
    offset = prop_def(IntegerAttr[I64])
    rotate = opt_prop_def(UnitAttr)
    result = result_def(TensorType)

    assembly_format = (
        "$input `offset` $offset (`rotate` $rotate^)? custom<GroupRef>($group) attr-dict "
        "`:` custom<SharedType>(type($input), type($result))"
    )
    custom_directives = (GroupRef, SharedType)

    def __init__(
        self,
        input: SSAValue | Operation,
        *,
        offset: int,
        rotate: bool = False,
        group: GroupName = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {"offset": IntegerAttr(offset, i64)}
        if rotate:
            props["rotate"] = UnitAttr()
        group_property(props, group)
        super().__init__(operands=[input], result_types=[input.type], properties=props)

    @property
    def rotates(self) -> bool:
        return self.rotate is not None

    def verify_(self) -> None:
        self.verify_group()
        verify_same_type(self, "input", self.result.type, self.input.type)

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """The shift of the cotangent by `-offset`, the same `rotate`."""
        ct = t.or_zeros(cotangents[0], self.result)
        back = ShiftOp(ct, offset=-self.offset.value.data, rotate=self.rotates, group=self.group)  # type: ignore[arg-type]
        return [t.emit(back).results[0]]


def shift_source(rank: int, size: int, offset: int, rotate: bool) -> int | None:
    """The group rank whose `x` rank `rank` receives (None: zeros)."""
    source = rank - offset
    if rotate:
        return source % size
    return source if 0 <= source < size else None
