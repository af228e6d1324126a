"""Soak: 1,000 small programs back to back on 4 ranks leak nothing.

Memory, threads and open file descriptors (sockets included) are measured on
every rank after a warm-up and again at the end; growth must stay within a
fixed bound, independent of the number of runs.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

import distir
from distir.runtime.launch import launch

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

PROGRAMS = [
    """func.func @main(%x: tensor<16xi64>) -> tensor<16xi64> {
  %y = dist.all_reduce sum %x : tensor<16xi64>
  func.return %y : tensor<16xi64>
}""",
    """func.func @main(%x: tensor<16xi64>) -> tensor<16xi64> {
  %y = dist.broadcast %x root 1 : tensor<16xi64>
  func.return %y : tensor<16xi64>
}""",
    """func.func @main(%x: tensor<16xi64>) -> tensor<?xi64> {
  %y = dist.all_gather %x axis 0 : tensor<16xi64> -> tensor<?xi64>
  func.return %y : tensor<?xi64>
}""",
    """func.func @main(%x: tensor<16xi64>) -> tensor<16xi64> {
  %y = dist.all_reduce %x commutative : tensor<16xi64> combine(%a, %b) {
    %m = arith.maxsi %a, %b : tensor<16xi64>
    dist.yield %m : tensor<16xi64>
  }
  func.return %y : tensor<16xi64>
}""",
]


def _usage() -> dict[str, int]:
    with open("/proc/self/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return {
        "rss_kb": rss_kb,
        "threads": len(os.listdir("/proc/self/task")),
        "python_threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
    }


def soak_expectations(world_size: int) -> list[torch.Tensor]:
    """What every rank must get from each of PROGRAMS when rank r passes
    arange(16) * (r + 1): the sum, rank 1's input, the rank-order
    concatenation, and the largest (the last rank's, as all are >= 0)."""
    inputs = [torch.arange(16) * (r + 1) for r in range(world_size)]
    return [
        torch.arange(16) * (world_size * (world_size + 1) // 2),
        inputs[1],
        torch.cat(inputs),
        inputs[-1],
    ]


def soak_worker(ctx, runs: int, warmup: int) -> dict:
    programs = [distir.compile(text) for text in PROGRAMS]
    x = torch.arange(16) * (ctx.rank + 1)
    expected = soak_expectations(ctx.world_size)
    for i in range(warmup):
        programs[i % len(programs)].run(x)
    before = _usage()
    wrong = 0
    for i in range(runs - warmup):
        k = i % len(programs)
        if not torch.equal(programs[k].run(x), expected[k]):
            wrong += 1
    after = _usage()
    return {"before": before, "after": after, "wrong": wrong}


def test_a_thousand_runs_on_four_ranks_leak_nothing():
    reports = launch(soak_worker, 4, 1000, 100, pass_context=True, timeout=280)
    for rank, report in enumerate(reports):
        before, after = report["before"], report["after"]
        assert report["wrong"] == 0, rank
        assert after["threads"] <= before["threads"], (rank, before, after)
        assert after["python_threads"] <= before["python_threads"], (rank, before, after)
        assert after["fds"] <= before["fds"], (rank, before, after)
        assert after["rss_kb"] - before["rss_kb"] < 32 * 1024, (rank, before, after)
