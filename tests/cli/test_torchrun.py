"""distir-run under torchrun, and not fooled by what looks like torchrun.

torchrun's elastic agent sets TORCHELASTIC_RUN_ID for every worker; RANK,
WORLD_SIZE and MASTER_ADDR without it are leftovers of another job, which
distir-run ignores (saying so) instead of waiting for peers that never come.
Across machines, torchrun needs a dynamic (c10d) rendezvous: with the
default static one every node believes it is node 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from test_run import ROOT, expected_lines, rank_blocks, run_here

from distir.cli import run as cli
from distir.runtime.launch import free_port

STALE = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
TORCHRUN_VARIABLES = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                      "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def clean_environment(monkeypatch):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_stale_rendezvous_variables_are_ignored_with_a_note(capsys, clean_environment) -> None:
    calls = []

    def launch(fn, nproc, request, **kwargs):
        calls.append(nproc)
        return []

    clean_environment.setattr("distir.runtime.launch.launch", launch)
    for name, value in STALE.items():
        clean_environment.setenv(name, value)
    status, err = run_here(capsys, "examples/all_reduce.mlir")
    assert status == 0
    assert calls == [cli.DEFAULT_NPROC], "local ranks, not one rank of a phantom job"
    assert err.splitlines() == [
        "distir-run: note: ignoring RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the "
        "environment: TORCHELASTIC_RUN_ID is not set, so this is no torchrun worker; "
        "starting local ranks"
    ]


@pytest.mark.multirank
@pytest.mark.timeout(200)
def test_a_leftover_world_size_does_not_hang_a_local_run() -> None:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    env.update(STALE)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "distir.cli.run", "examples/all_reduce.mlir", "--nproc", "3"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=150,
    )
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 120
    assert "ignoring RANK, WORLD_SIZE" in proc.stderr
    assert sorted(rank_blocks(proc.stdout)) == [0, 1, 2]


def test_nproc_under_torchrun_is_an_error(capsys, clean_environment) -> None:
    for name, value in {"TORCHELASTIC_RUN_ID": "job", "RANK": "1", "WORLD_SIZE": "8",
                        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}.items():
        clean_environment.setenv(name, value)
    status, err = run_here(capsys, "examples/all_reduce.mlir", "--nproc", "4")
    assert status == 1
    assert err == (
        "distir-run: error: --nproc cannot be used under torchrun: torchrun started this "
        "process as rank 1 of 8 (set the number of ranks with torchrun --nproc-per-node and "
        "--nnodes)\n"
    )


def test_under_torchrun_the_world_size_is_checked_before_the_rendezvous(
    capsys, clean_environment
) -> None:
    # MASTER_PORT 1 would fail the rendezvous: the check must come first.
    for name, value in {"TORCHELASTIC_RUN_ID": "job", "RANK": "0", "WORLD_SIZE": "3",
                        "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "1"}.items():
        clean_environment.setenv(name, value)
    status, err = run_here(capsys, "examples/variable_all_to_all.mlir")
    assert status == 1
    assert err.startswith("distir-run: error: this program needs 4 ranks, not 3: ")


def _node(port: int, job: str, output: Path) -> subprocess.Popen:
    """One torchrun "node" of two, with one worker, on this machine."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-id", job,
            "--rdzv-endpoint", f"127.0.0.1:{port}",
            "-m", "distir.cli.run", "examples/all_reduce.mlir", "--output", str(output),
        ],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_two_torchrun_nodes_with_a_c10d_rendezvous(tmp_path) -> None:
    port, job = free_port(), f"distir-{uuid.uuid4().hex[:8]}"
    output = tmp_path / "results.pt"
    nodes = [_node(port, job, output) for _ in range(2)]
    outcomes = []
    try:
        for node in nodes:
            outcomes.append(node.communicate(timeout=240))
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()
    expected = expected_lines(ROOT / "examples/all_reduce.mlir", 2)
    seen = {}
    for node, (out, err) in zip(nodes, outcomes):
        assert node.returncode == 0, err[-3000:]
        assert "Traceback" not in out
        blocks = rank_blocks(out)
        assert len(blocks) == 1, out  # each node prints its own rank
        (rank, lines), = blocks.items()
        assert f"on torchrun rank {rank} of 2 (pipeline: none)" in out
        seen[rank] = lines
    # Which node became rank 0 is the rendezvous' choice; together they are both.
    assert sorted(seen) == [0, 1]
    assert [seen[0], seen[1]] == expected
    saved = torch.load(output)
    assert len(saved) == 2 and all(len(results) == 2 for results in saved)
