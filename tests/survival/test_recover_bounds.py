"""`recover` on one rank: it forms a new group every time, and a store that
does not answer (its host is frozen) or that is gone ends in
`RecoveryFailed` within the deadline, never a hang or a raw backend error."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from runtime_support import FrozenStore

import distir
from distir.errors import RecoveryFailed
from distir.runtime import membership

pytestmark = pytest.mark.timeout(60)



def test_each_recovery_is_a_new_epoch_and_a_new_group(one_rank_world) -> None:
    first = distir.recover(deadline=5)
    second = distir.recover(deadline=5)
    assert (first.epoch, first.ranks, first.rank, first.lost) == (1, (0,), 0, ())
    assert second.epoch == 2 and second.group is not first.group
    assert distir.membership() == second
    # the replaced group is destroyed; the current one works
    assert first.group not in dist.distributed_c10d._world.pg_map
    x = torch.ones(2)
    dist.all_reduce(x, group=second.group)
    assert x.tolist() == [1.0, 1.0]



class GoneStore:
    def check(self, keys):
        raise dist.DistStoreError("Connection reset by peer")

    set = check

    def compare_set(self, key, expected, desired):
        raise dist.DistStoreError("Connection reset by peer")


@pytest.mark.parametrize("store", [FrozenStore, GoneStore])
def test_a_store_that_does_not_answer_ends_recovery_in_time(
    one_rank_world, monkeypatch, store
) -> None:
    frozen = store()
    monkeypatch.setattr(membership, "default_store", lambda: frozen)
    start = time.monotonic()
    with pytest.raises(RecoveryFailed, match=r"recover: joining"):
        distir.recover(deadline=2)
    assert time.monotonic() - start < 2 + 2
    if isinstance(frozen, FrozenStore):
        frozen.release.set()
