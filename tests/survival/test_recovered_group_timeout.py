"""The group `distir.recover()` forms waits as long as the job's collectives.

Forming it uses a short timeout (a member that died before publishing its
address must not hold recovery up), but that timeout must not stay the
group's: a plain `dist.*` collective on the recovered group, with one rank
a few seconds late, would fail after 2 s.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import distir
from distir.runtime.launch import launch

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(120)]

#: the job's collective timeout, and how late one rank comes to a collective
#: on the recovered group: longer than forming's 2 s, far below the job's
JOB_TIMEOUT_S = 60.0
LATE_S = 4.0


def late_all_reduce(ctx) -> tuple[float, float]:
    m = distir.recover(deadline=30)
    if ctx.rank == 0:
        time.sleep(LATE_S)
    x = torch.tensor([ctx.rank + 1.0])
    start = time.monotonic()
    dist.all_reduce(x, group=m.group)  # plain torch.distributed, no distir deadline
    return float(x.item()), time.monotonic() - start


def test_a_collective_on_the_recovered_group_waits_as_long_as_the_jobs() -> None:
    outcome = launch(
        late_all_reduce, 2, pass_context=True, timeout=100, collective_timeout=JOB_TIMEOUT_S
    )
    for rank in (0, 1):
        total, _ = outcome[rank]
        assert total == 3.0
    # rank 1 waited for the late rank 0 past forming's 2 s timeout
    assert outcome[1][1] >= LATE_S - 1.0
