"""Process-group resources: what an implementation needs to talk to a group.

Ranks in IR are ranks of the op's group; `global_rank` converts one to a
global rank for the few PyTorch calls that still want one. The groups a
module declares are created here, on every rank, in manifest order.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from distir.errors import DistirError
from distir.ir.dialect import GroupOp


class ProcessGroupResource:
    """One initialised process group (`None` means the default group)."""

    def __init__(self, group: dist.ProcessGroup | None = None, name: str = "world"):
        if not dist.is_initialized():
            raise DistirError(
                "torch.distributed is not initialised: call distir.launch, run under "
                "distir-run or torchrun, or init_process_group first"
            )
        self.group = group
        self.name = name
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        self._global = [
            dist.get_global_rank(group, r) if group is not None else r
            for r in range(self.size)
        ]

    def global_rank(self, group_rank: int) -> int:
        return self._global[group_rank]

    @property
    def global_ranks(self) -> tuple[int, ...]:
        return tuple(self._global)

    def __repr__(self) -> str:
        return f"<group {self.name}: rank {self.rank} of {self.size}>"


class NonMemberResource:
    """A declared group this rank belongs to no subgroup of."""

    def __init__(self, name: str, rank: int):
        self.name = name
        self.base_rank = rank

    def __getattr__(self, item: str):
        raise DistirError(
            f"rank {self.base_rank} is in no subgroup of group @{self.name}, so it "
            "cannot run collectives on it"
        )


def create_declared_groups(
    declarations: Sequence[GroupOp],
    base: ProcessGroupResource,
    timeout: timedelta | None = None,
) -> dict[str | None, ProcessGroupResource | NonMemberResource]:
    """Create every declared (sub)group, on every rank, in manifest order.

    Declared ranks are ranks of the base group (the world unless the program
    runs on a subgroup). On the world, every rank creates every subgroup, as
    torch.distributed requires; on a smaller base group, members create
    their own subgroup with local synchronisation.
    """
    resources: dict[str | None, ProcessGroupResource | NonMemberResource] = {None: base}
    on_world = base.group is None
    for decl in declarations:
        name = decl.sym_name.data
        mine: ProcessGroupResource | NonMemberResource = NonMemberResource(name, base.rank)
        for part in decl.rank_lists:
            if max(part) >= base.size:
                raise DistirError(
                    f"group @{name} names rank {max(part)} but the program runs on "
                    f"{base.size} ranks"
                )
            global_ranks = [base.global_rank(r) for r in part]
            member = base.rank in part
            if on_world:
                pg = dist.new_group(global_ranks, timeout=timeout)
            elif member:
                pg = dist.new_group(
                    global_ranks, timeout=timeout, use_local_synchronization=True
                )
            else:
                continue
            if member:
                mine = ProcessGroupResource(pg, name)
        resources[name] = mine
    return resources
