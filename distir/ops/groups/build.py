"""The builder helpers of the group family: `declare_group`, `rank`, `group_size`."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.ir import SSAValue

from distir.ir.building import (
    GroupRef,
    located,
)
from distir.ops.groups.ir import GroupOp, GroupSizeOp, RankOp


@located
def declare_group(name: str, subgroups: Sequence[Sequence[int]]) -> str:
    """`dist.group @name [[...], ...]` (subgroups of global ranks) at the
    current insertion point, which must be a module body; returns `name`,
    for the ops' `group=` argument. `build_program(groups=...)` calls it."""
    GroupOp(name, subgroups)
    return name


@located
def rank(group: GroupRef = None) -> SSAValue:
    """This rank within `group` (the world by default), as an index."""
    return RankOp(group).result


@located
def group_size(group: GroupRef = None) -> SSAValue:
    """The number of ranks in `group`, as an index."""
    return GroupSizeOp(group).result
