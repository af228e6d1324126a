"""The builder helper of `dist.reduce`."""

from __future__ import annotations

from xdsl.ir import SSAValue

from distir.ir.attributes import ReductionKind
from distir.ir.building import GroupRef, Value, located, native_kind
from distir.ops.reduce.ir import ReduceToRootOp


@located
def reduce(
    x: Value, kind: ReductionKind | str = "sum", root: int = 0, *, group: GroupRef = None
) -> SSAValue:
    """Native reduce: `root` gets the reduction of every rank's `x` (the other
    ranks get zeros)."""
    return ReduceToRootOp(x, kind=native_kind(kind), root=root, group=group).result
