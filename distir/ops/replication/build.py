"""The builder helpers of `dist.pvary` and `dist.psum`."""

from __future__ import annotations

from xdsl.ir import SSAValue

from distir.ir.building import GroupRef, Value, located
from distir.ops.replication.ir import PsumOp, PvaryOp


@located
def pvary(x: Value, *, group: GroupRef = None) -> SSAValue:
    """Megatron's `f`: `x` (replicated over the group) unchanged, as a
    varying value; the gradient of `x` is the sum over ranks of the
    result's cotangent."""
    return PvaryOp(x, group).result


@located
def psum(x: Value, *, group: GroupRef = None) -> SSAValue:
    """Megatron's `g`: the sum of every rank's `x`, replicated over the
    group; the gradient of `x` is the result's cotangent, unchanged."""
    return PsumOp(x, group).result
