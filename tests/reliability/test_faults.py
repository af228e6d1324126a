"""Fault tests: every way a rank can go wrong ends in a prompt, named error.

Each scenario starts fresh gloo ranks (a poisoned group is not reused), makes
one rank misbehave, and checks on every surviving rank:
- the first run raises the named error within a bound (deadline + 2 s);
- a second run on the same domain raises `Poisoned` at once;
- no process is left behind.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
import torch

import distir
from distir.runtime.launch import LaunchError, launch

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(90)]

DEADLINE_S = 2.0

SUM4 = """
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce sum %x : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
"""
MAX4 = SUM4.replace("sum", "max")
SUM_DYNAMIC = SUM4.replace("tensor<4xi64>", "tensor<?xi64>")
BROADCAST_DYNAMIC_ROOT = """
func.func @main(%x: tensor<4xi64>, %root: index) -> tensor<4xi64> {
  %y = dist.broadcast %x root %root : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
"""
UNEVEN_GATHER = """
func.func @main(%x: tensor<?xi64>, %counts: tensor<2xi64>) -> tensor<?xi64> {
  %y = dist.all_gather %x counts(%counts : tensor<2xi64>) axis 0 : tensor<?xi64> -> tensor<?xi64>
  func.return %y : tensor<?xi64>
}
"""


def _attempt(program: distir.Program, inputs: list[torch.Tensor]) -> dict:
    start = time.monotonic()
    try:
        program.run(*inputs)
        outcome = {"error": None, "message": ""}
    except Exception as e:  # recorded for the parent to assert on
        outcome = {"error": type(e).__name__, "message": str(e)}
    outcome["seconds"] = time.monotonic() - start
    return outcome


def scenario_worker(ctx, scenario: str) -> dict:
    """One rank of a fault scenario; the last rank is the one that misbehaves."""
    bad = ctx.rank == ctx.world_size - 1
    deadline = timedelta(seconds=DEADLINE_S)
    source, inputs = SUM4, [torch.arange(4) + ctx.rank]
    if scenario == "exit" and bad:
        os._exit(3)
    if scenario == "sleep" and bad:
        time.sleep(DEADLINE_S + 2.5)
    if scenario == "different-program" and bad:
        source = MAX4
    if scenario == "different-shape" and bad:
        inputs = [torch.arange(5)]
    if scenario == "different-dynamic-shape":
        source = SUM_DYNAMIC
        inputs = [torch.arange(5 if bad else 4)]
    if scenario == "different-counts":
        source = UNEVEN_GATHER
        counts = [1, 2] if not bad else [2, 2]
        inputs = [torch.arange(counts[ctx.rank]), torch.tensor(counts)]
    if scenario == "root-out-of-range":
        source = BROADCAST_DYNAMIC_ROOT
        inputs = [torch.arange(4), torch.tensor(7 if bad else 0)]
    program = distir.compile(source, deadline=deadline)
    first = _attempt(program, inputs)
    second = _attempt(program, inputs)
    return {"first": first, "second": second}


def _run_scenario(scenario: str, nproc: int = 2) -> tuple[dict[int, dict], dict[int, str]]:
    start = time.monotonic()
    try:
        results = launch(scenario_worker, nproc, scenario, pass_context=True, timeout=60)
        failures: dict[int, str] = {}
        reports = dict(enumerate(results))
    except LaunchError as e:
        reports, failures = e.results, e.failures
    assert time.monotonic() - start < 60
    assert multiprocessing.active_children() == [], "a rank process survived"
    return reports, failures


def _assert_poisoned_after(report: dict) -> None:
    assert report["second"]["error"] == "Poisoned", report
    # A retry that entered a collective would wait for its whole deadline.
    assert report["second"]["seconds"] < DEADLINE_S, report


def test_a_rank_that_exits_fails_its_peers_fast():
    reports, failures = _run_scenario("exit")
    assert "exited with code 3" in failures[1]
    survivor = reports[0]
    assert survivor["first"]["error"] in ("CollectiveFailed", "DeadlineExceeded"), survivor
    assert survivor["first"]["seconds"] < DEADLINE_S + 2
    assert "@main (program agreement)" in survivor["first"]["message"]
    _assert_poisoned_after(survivor)


def test_a_late_rank_hits_the_deadline_on_every_waiting_rank():
    reports, _ = _run_scenario("sleep")
    waiting = reports[0]
    assert waiting["first"]["error"] == "DeadlineExceeded", waiting
    assert DEADLINE_S - 0.1 <= waiting["first"]["seconds"] < DEADLINE_S + 2
    assert "2 s deadline" in waiting["first"]["message"]
    assert "group world" in waiting["first"]["message"]
    _assert_poisoned_after(waiting)
    # The late rank fails too, and never hangs: told by the store, or by its own deadline.
    late = reports[1]
    assert late["first"]["error"] in ("Poisoned", "DeadlineExceeded", "CollectiveFailed"), late
    assert late["first"]["seconds"] < DEADLINE_S + 2


def test_different_programs_raise_program_mismatch_on_every_rank():
    reports, _ = _run_scenario("different-program")
    for rank in (0, 1):
        first = reports[rank]["first"]
        assert first["error"] == "ProgramMismatch", first
        assert "ranks run different programs" in first["message"]
        assert "ranks [0]" in first["message"] and "ranks [1]" in first["message"]
        assert first["seconds"] < 2
        _assert_poisoned_after(reports[rank])


def test_a_rank_with_a_wrong_static_shape_is_named_on_every_rank():
    reports, _ = _run_scenario("different-shape")
    # The rank with the wrong input raises its own input error; its peer is
    # told which rank rejected what, before any payload moves.
    assert reports[1]["first"]["error"] == "ProgramInputError", reports[1]
    assert reports[0]["first"]["error"] == "ProgramMismatch", reports[0]
    for rank in (0, 1):
        first = reports[rank]["first"]
        assert "@main input #0 must be tensor<4xi64>" in first["message"]
        assert first["seconds"] < 2
        _assert_poisoned_after(reports[rank])


def test_different_dynamic_shapes_are_caught_before_the_payload():
    reports, _ = _run_scenario("different-dynamic-shape")
    for rank in (0, 1):
        first = reports[rank]["first"]
        assert first["error"] == "CollectiveMismatchError", first
        assert "'dist.all_reduce' at <program>:3:3" in first["message"]
        assert "rank 0: int64[4]; rank 1: int64[5]" in first["message"]
        _assert_poisoned_after(reports[rank])


def test_different_counts_are_caught_before_the_payload():
    reports, _ = _run_scenario("different-counts")
    # Rank 1 holds 2 rows and says counts[1] = 2 (its own check passes), but
    # the ranks' counts vectors differ: both must see it.
    for rank in (0, 1):
        first = reports[rank]["first"]
        assert first["error"] == "CollectiveMismatchError", first
        assert "'dist.all_gather'" in first["message"]
        assert "ranks pass different counts (rank 0: [1, 2]; rank 1: [2, 2])" in first["message"]
        _assert_poisoned_after(reports[rank])


def test_a_root_out_of_range_on_one_rank_fails_every_rank_promptly():
    reports, _ = _run_scenario("root-out-of-range")
    bad, good = reports[1]["first"], reports[0]["first"]
    assert bad["error"] == "OpError" and "root 7 is outside the group (size 2)" in bad["message"]
    assert good["error"] == "CollectiveMismatchError", good
    assert "rank(s) [1] of group world rejected their inputs" in good["message"]
    assert good["seconds"] < 2
    for rank in (0, 1):
        _assert_poisoned_after(reports[rank])


def test_distir_run_reports_failures_and_exits_nonzero(tmp_path):
    program = tmp_path / "bad_root.mlir"
    program.write_text(
        "func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {\n"
        "  %y = dist.broadcast %x root 3 : tensor<4xi64>\n"
        "  func.return %y : tensor<4xi64>\n"
        "}\n"
    )
    # Ranks inherit the environment: the marker finds this run's own ranks
    # (even once re-parented), never another job's.
    marker = f"distir-test-{uuid.uuid4().hex}"
    proc = subprocess.run(
        [sys.executable, "-m", "distir.cli.run", str(program), "--nproc", "2", "--timeout", "60"],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "DISTIR_TEST_MARKER": marker},
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "2 of 2 ranks failed" in proc.stderr
    assert f"'dist.broadcast' at {program}:2:3: root 3 is outside the group (size 2)" in proc.stderr
    assert processes_with_marker(marker) == [], "a rank of distir-run survived"


def processes_with_marker(marker: str) -> list[int]:
    """Live processes whose environment holds DISTIR_TEST_MARKER=marker."""
    wanted = f"DISTIR_TEST_MARKER={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # exited meanwhile, or not ours to read
            continue
    return found


def test_the_leftover_check_sees_a_marked_process_and_only_it():
    marker = f"distir-test-{uuid.uuid4().hex}"
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        env={**os.environ, "DISTIR_TEST_MARKER": marker},
    )
    try:
        assert processes_with_marker(marker) == [child.pid]
        assert processes_with_marker(marker + "x") == []
    finally:
        child.kill()
        child.wait()
    assert processes_with_marker(marker) == []
