"""The builder helper of `dist.shift`."""

from __future__ import annotations

from xdsl.ir import SSAValue

from distir.ir.building import GroupRef, Value, located
from distir.ops.shift.ir import ShiftOp


@located
def shift(x: Value, offset: int = 1, *, rotate: bool = False, group: GroupRef = None) -> SSAValue:
    """Neighbour exchange: rank r gets rank r-offset's `x` (modulo the group
    size with `rotate`; zeros where there is no such rank otherwise)."""
    return ShiftOp(x, offset=offset, rotate=rotate, group=group).result
