"""The builder helper of `dist.broadcast`."""

from __future__ import annotations

from xdsl.ir import SSAValue

from distir.ir.building import (
    GroupRef,
    Value,
    located,
)
from distir.ops.broadcast.ir import BroadcastOp


@located
def broadcast(x: Value, root: int | Value = 0, group: GroupRef = None) -> SSAValue:
    """Every rank gets `x` of group rank `root` (an int, or an index value)."""
    return BroadcastOp(x, root, group).result
