"""A group that recovery (or growth) replaced is gone from every program, not
only from the next one that runs: a program that ran on the old group and
never runs again kept the group, its threads and its sockets, for the life
of the process (found by benchmarks/elastic_trials.py: a rank's threads and
fds grew by one group after each membership change).

A group whose forming failed (a joiner died while connecting) lived on the
same way until the next garbage collection: the error of a bounded call
(`call_bounded`, which runs every store and group-creation step of the
protocol) held its own frame, which held the error, and the frames of the
failed creation held the half-made group. The unit test below needs no
ranks: what a failed call's frames held is freed when its error is.

Each round moves to a new membership of the same ranks (`recover` with no
failure) and runs a drawn subset of a few programs on it; after every round
the rank's threads and open file descriptors (read from /proc, the oracle)
are those after the first round.
"""

from __future__ import annotations

import gc
import os
import random
import weakref

import pytest
import torch

import distir
from distir.errors import DistirError
from distir.runtime.launch import launch
from distir.transport.domain import call_bounded

pytestmark = pytest.mark.timeout(120)

ROUNDS = 5
#: programs (eager all-reduces of distinct shapes: one compiled program each)
PROGRAMS = 4


def _usage() -> tuple[int, int]:
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def worker(seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)  # the same draws on every rank
    usage = []
    for _ in range(ROUNDS):
        m = distir.recover(deadline=20)
        ran = [p for p in range(PROGRAMS) if rng.random() < 0.5] or [rng.randrange(PROGRAMS)]
        for p in ran:
            got = distir.all_reduce(torch.ones(p + 1), "sum", group=m.group, deadline=20)
            assert got.tolist() == [float(m.size)] * (p + 1)
        usage.append(_usage())
    return usage


@pytest.mark.multirank
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
@pytest.mark.parametrize("seed", [0, 1])
def test_a_replaced_group_leaves_no_thread_or_socket_behind(seed: int):
    for usage in launch(worker, 2, seed, timeout=90):
        first = usage[0]
        assert all(u == first for u in usage), usage


class _Held:
    """Stands for a half-made process group in a failed call's frames."""


@pytest.mark.parametrize("error", [RuntimeError, ValueError, DistirError, KeyboardInterrupt])
def test_a_failed_bounded_call_frees_what_its_frames_held(error: type[BaseException]):
    held: list[weakref.ref] = []

    def fails() -> None:
        group = _Held()
        held.append(weakref.ref(group))
        raise error("creating the group failed")

    gc.disable()  # freed by reference counting, not by a later collection
    try:
        try:
            call_bounded(fails, 5.0, "creating the group")
        except error:
            pass
        assert held and held[0]() is None
    finally:
        gc.enable()
