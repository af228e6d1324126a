"""Survival under torchrun (issue 39): what works and what the agent does.

`torchrun --standalone` (here `python -m torch.distributed.run`, the same
entry point) starts 3 workers; their store is the agent's, which outlives
them. A frozen worker (SIGSTOP) is fenced: the others recover to a group of
two, agree on where to resume, and the woken worker hears `Excluded`. A
worker that dies is torchrun's to handle: its agent stops every worker and
the job fails (no restart budget given), which the docs state.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(240)]

WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    from datetime import timedelta
    import torch
    import distir
    from distir.errors import DistirError, Excluded
    from distir.runtime.launch import init_from_environment

    how = sys.argv[1]
    ctx = init_from_environment("gloo", timeout=60)
    store = torch.distributed.distributed_c10d._get_default_store()
    program = distir.compile('''
    func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
      %y = dist.all_reduce sum %x : tensor<4xi64>
      func.return %y : tensor<4xi64>
    }
    ''', deadline=2.0)
    x = torch.full((4,), ctx.rank + 1, dtype=torch.int64)
    # The first run lines the workers up: torchrun starts them at different
    # times, by seconds on a loaded machine, which the 2 s deadline is not for.
    program.run(x, deadline=60)
    if ctx.rank == 2:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        store.set("t/pid", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
        try:
            program.run(x)
            print("rank 2: ran", flush=True)
        except Excluded as e:
            print(f"rank 2: Excluded at epoch {e.epoch}", flush=True)
        store.set("t/woke", "1")
        sys.exit(0)
    try:
        while True:
            program.run(x)
    except DistirError:
        pass
    m = distir.recover(deadline=8.0, progress=1)
    y = program.run(x, group=m.group)
    print(f"rank {ctx.rank}: epoch {m.epoch} ranks {m.ranks} completed {m.completed} "
          f"sum {y.tolist()}", flush=True)
    if m.rank == 0:
        os.kill(int(store.get("t/pid")), signal.SIGCONT)
    store.wait(["t/woke"], timedelta(seconds=60))
    """
)


def _torchrun(tmp_path, how: str) -> subprocess.CompletedProcess:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", "3", "--max-restarts", "0", str(script), how,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=200)


def test_a_frozen_worker_is_fenced_under_torchrun(tmp_path) -> None:
    run = _torchrun(tmp_path, "freeze")
    assert run.returncode == 0, run.stderr[-3000:]
    # The workers share torchrun's stdout, so one worker's line can land inside
    # another's: look for each report in the whole output, not line by line.
    for rank in (0, 1):
        assert f"rank {rank}: epoch 1 ranks (0, 1) completed 1 sum [3, 3, 3, 3]" in run.stdout, (
            run.stdout
        )
    assert "rank 2: Excluded at epoch 1" in run.stdout, run.stdout
    assert "rank 2: ran" not in run.stdout, run.stdout


def test_a_dead_worker_ends_a_torchrun_job_without_restarts(tmp_path) -> None:
    run = _torchrun(tmp_path, "kill")
    assert run.returncode != 0
    assert "epoch 1" not in run.stdout  # the agent stopped the survivors
    assert "Signal 9 (SIGKILL) received by PID" in run.stderr or "SIGKILL" in run.stderr, (
        run.stderr[-3000:]
    )
