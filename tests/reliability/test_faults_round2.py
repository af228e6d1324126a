"""Faults that used to end in a hang, a crash or a silently wrong result.

Each scenario starts fresh gloo ranks, makes one rank misbehave and checks
what every rank sees. The rule under test: any exception on a rank during a
run poisons its domain before it propagates, peers stop within the deadline
plus 2 s with an error that names the cause, and no exchange of one rank is
ever matched with another rank's different exchange.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from datetime import timedelta

import pytest
import torch

import distir
from distir.runtime.launch import LaunchError, launch

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(120)]

DEADLINE_S = 2.0

#: a local op (tensor.extract) before a generic all-reduce
EXTRACT_THEN_REDUCE = """
func.func @main(%x: tensor<4xi64>, %i: index) -> tensor<4xi64> {
  %e = tensor.extract %x[%i] : tensor<4xi64>
  %s = tensor.splat %e : tensor<4xi64>
  %y = dist.all_reduce %s commutative : tensor<4xi64> combine(%a, %b) {
    %r = arith.maxsi %a, %b : tensor<4xi64>
    dist.yield %r : tensor<4xi64>
  }
  func.return %y : tensor<4xi64>
}
"""

#: a generic all-reduce whose combine reads an extra operand
WITH_EXTRA = """
func.func @main(%x: tensor<4xi64>, %m: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce %x, %m commutative : tensor<4xi64>, tensor<4xi64> combine(%a, %b, %mod) {
    %s = arith.addi %a, %b : tensor<4xi64>
    %r = arith.remsi %s, %mod : tensor<4xi64>
    dist.yield %r : tensor<4xi64>
  }
  func.return %y : tensor<4xi64>
}
"""

CIPHERTEXT = """
func.func @main(%ct: tensor<2x3x8xi64>, %q: tensor<3xi64>) -> tensor<2x3x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x8xi64>, tensor<3xi64>
  func.return %y : tensor<2x3x8xi64>
}
"""

#: every lowering of the ciphertext sum must keep its moduli check
CIPHERTEXT_PIPELINES = [
    "",
    "lower-ciphertext-add",
    "lower-ciphertext-add,select-all-reduce-algorithm",
    "lower-ciphertext-add,select-all-reduce-algorithm{commutative=gather-fold}",
    "defer-modular-reduction{max-group-size=8}",
]

GROUPS_AB = "dist.group @a [[0], [1]]\ndist.group @b [[0, 1]]\n"
GROUPS_BA = "dist.group @b [[0, 1]]\ndist.group @a [[0], [1]]\n"
USES_GROUPS = """
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce sum %x group @b : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
"""

MESH_BEYOND = """
dist.mesh @src [2] ranks [0, 1]
dist.mesh @far [2] ranks [4, 5]
func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> {
  %y = dist.transfer %x from @src [0] to @far [0] global [4] : tensor<?xf32> -> tensor<?xf32>
  func.return %y : tensor<?xf32>
}
"""


def _attempt(program: distir.Program, inputs: list[torch.Tensor]) -> dict:
    start = time.monotonic()
    try:
        value = program.run(*inputs)
        outcome = {"error": None, "message": "", "value": value}
    except Exception as e:  # recorded for the parent to assert on
        outcome = {"error": type(e).__name__, "message": str(e), "value": None}
    outcome["seconds"] = time.monotonic() - start
    return outcome


def _moduli(rank: int, differ: bool) -> torch.Tensor:
    q = [(1 << 60) - 93, (1 << 60) - 173, (1 << 59) - 55]
    if differ and rank == 1:
        q[1] = (1 << 60) - 233
    return torch.tensor(q)


def scenario_worker(ctx, scenario: str, pipeline: str = "") -> dict:
    bad = ctx.rank == ctx.world_size - 1
    source, inputs = "", []
    if scenario == "local-op-fails":
        source = EXTRACT_THEN_REDUCE
        inputs = [torch.arange(4), torch.tensor(9 if bad else 1)]
    elif scenario == "extras-differ":
        source = WITH_EXTRA
        inputs = [torch.arange(4), torch.full((4,), 7 + int(bad))]
    elif scenario == "moduli-differ":
        source = CIPHERTEXT
        q = _moduli(ctx.rank, differ=True)
        ct = torch.remainder(torch.arange(48).reshape(2, 3, 8) * 1_000_003, q.view(-1, 1))
        inputs = [ct, q]
    elif scenario == "group-order-differs":
        source = (GROUPS_BA if bad else GROUPS_AB) + USES_GROUPS
        inputs = [torch.arange(4)]
    elif scenario == "group-beyond-world-on-one-rank":
        groups = "dist.group @a [[0], [1]]\ndist.group @b [[0, 5]]\n" if bad else GROUPS_AB
        source = groups + USES_GROUPS
        inputs = [torch.arange(4)]
    elif scenario == "group-beyond-world":
        source = "dist.group @a [[0], [1]]\ndist.group @b [[0, 5]]\n" + USES_GROUPS
        inputs = [torch.arange(4)]
    elif scenario == "mesh-beyond-world":
        source = MESH_BEYOND
        inputs = [torch.ones(2)]
    program = distir.compile(source, pipeline, deadline=DEADLINE_S)
    first = _attempt(program, inputs)
    second = _attempt(program, inputs)
    # The failed rank stays up until its peers are done: they must stop at
    # their deadline (not because the connection closed) and name the cause.
    store = torch.distributed.distributed_c10d._get_default_store()
    if scenario == "local-op-fails" and not bad:
        store.set(f"done/{ctx.rank}", b"1")
    if scenario == "local-op-fails" and bad:
        store.wait([f"done/{r}" for r in range(ctx.world_size - 1)], timedelta(seconds=30))
    return {"first": first, "second": second}


def _run(scenario: str, pipeline: str = "", nproc: int = 2) -> dict[int, dict]:
    start = time.monotonic()
    try:
        results = launch(scenario_worker, nproc, scenario, pipeline, pass_context=True,
                         timeout=60)
    except LaunchError as e:  # a rank that crashes (SIGABRT) fails the test here
        raise AssertionError(f"a rank did not finish: {e}") from None
    assert time.monotonic() - start < 60
    assert multiprocessing.active_children() == [], "a rank process survived"
    return dict(enumerate(results))


def _assert_poisoned_after(report: dict) -> None:
    assert report["second"]["error"] == "Poisoned", report
    # A retry that entered a collective would wait for its whole deadline.
    assert report["second"]["seconds"] < DEADLINE_S, report


def test_a_local_op_failure_stops_its_peers_and_a_retry_never_enters_a_collective():
    reports = _run("local-op-fails")
    bad, good = reports[1], reports[0]
    assert bad["first"]["error"] == "OpError", bad
    assert "'tensor.extract' at <program>:3:" in bad["first"]["message"]
    # The retry does not reach the network: its peer may still be waiting in
    # the all-reduce, and the two exchanges must never be matched.
    _assert_poisoned_after(bad)
    assert good["first"]["value"] is None, "a peer of a failed rank returned a result"
    assert good["first"]["error"] == "DeadlineExceeded", good
    assert good["first"]["seconds"] < DEADLINE_S + 2
    # It names the cause the failed rank published.
    assert "rank 1 failed first: OpError: 'tensor.extract'" in good["first"]["message"], good
    _assert_poisoned_after(good)


def test_combine_extras_that_differ_are_named_on_every_rank_before_the_payload():
    reports = _run("extras-differ")
    for rank in (0, 1):
        first = reports[rank]["first"]
        assert first["error"] == "CollectiveMismatchError", first
        assert "'dist.all_reduce' at <program>:3:3" in first["message"]
        assert "ranks pass different extra operand #0" in first["message"]
        assert first["seconds"] < 2
        _assert_poisoned_after(reports[rank])


@pytest.mark.parametrize("pipeline", CIPHERTEXT_PIPELINES)
def test_different_moduli_are_named_on_every_rank_whatever_the_lowering(pipeline):
    reports = _run("moduli-differ", pipeline)
    for rank in (0, 1):
        first = reports[rank]["first"]
        assert first["error"] == "CollectiveMismatchError", (pipeline, first)
        # The op that carries the moduli after the pipeline, and its name for them.
        lowered = pipeline.startswith("lower-ciphertext-add")
        op = "dist.all_reduce" if lowered else "dist.all_reduce_add_ciphertext"
        what = "extra operand #0" if lowered else "moduli"
        q0, q1 = _moduli(0, differ=True).tolist(), _moduli(1, differ=True).tolist()
        assert first["message"] == (
            f"'{op}' at <program>:3:3: ranks pass different {what} (rank 0: {q0}; rank 1: {q1})"
        ), (pipeline, first)
        assert first["seconds"] < 2
        _assert_poisoned_after(reports[rank])


@pytest.mark.parametrize(
    "scenario", ["group-order-differs", "group-beyond-world-on-one-rank"]
)
def test_group_declarations_that_differ_are_named_before_any_group_is_created(scenario):
    reports = _run(scenario)
    for rank in (0, 1):
        first = reports[rank]["first"]
        assert first["error"] == "ProgramMismatch", first
        assert "ranks run different programs" in first["message"]
        assert first["seconds"] < 2
        _assert_poisoned_after(reports[rank])


def test_a_group_beyond_the_world_is_named_on_every_rank_at_once():
    reports = _run("group-beyond-world")
    for rank in (0, 1):
        first = reports[rank]["first"]
        assert first["error"] == "DistirError", first
        assert "group @b names rank 5 but the program runs on 2 ranks" in first["message"]
        assert first["seconds"] < 2


def test_a_mesh_beyond_the_world_is_named_on_every_rank_at_once():
    reports = _run("mesh-beyond-world")
    for rank in (0, 1):
        first = reports[rank]["first"]
        assert first["error"] == "DistirError", first
        assert "mesh @far names ranks 4, 5 but the program runs on 2 ranks" in first["message"]
        assert first["seconds"] < 2


def leak_worker(ctx, programs: int) -> dict:
    """Compiles and runs `programs` programs that declare groups; returns the
    thread and fd counts after the first 20 and at the end."""
    text = GROUPS_AB + USES_GROUPS
    x = torch.arange(4)

    def usage() -> tuple[int, int]:
        return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))

    marks = {}
    for i in range(programs):
        program = distir.compile(text)
        assert torch.equal(program.run(x), x * ctx.world_size)
        if i == 19:
            marks["early"] = usage()
    marks["late"] = usage()
    return marks


def test_a_thousand_programs_with_groups_leak_no_threads_or_fds():
    results = launch(leak_worker, 2, 1000, pass_context=True, timeout=100)
    for marks in results:
        (threads0, fds0), (threads1, fds1) = marks["early"], marks["late"]
        assert threads1 - threads0 <= 2, marks
        assert fds1 - fds0 <= 4, marks
