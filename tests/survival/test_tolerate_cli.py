"""`distir-run --tolerate K`: a rank killed from outside is reported with
its cause, and the survivors finish their runs on the group they agreed on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(120)]

#: one run moves 16 MiB, so that the runs last long enough to kill a rank
#: in the middle of them
PROGRAM = """\
func.func @main(%x: tensor<2097152xi64>) -> tensor<2097152xi64> {
  %y = dist.all_reduce sum %x : tensor<2097152xi64>
  func.return %y : tensor<2097152xi64>
}
"""


def _children(pid: int) -> dict[str, int]:
    """name -> pid of `pid`'s descendant processes (ranks are children of
    the launcher's fork server, or of the launcher when spawned)."""
    found = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                found[Path(f"/proc/{child}/comm").read_text().strip()] = int(child)
            except OSError:
                pass
            found.update(_children(int(child)))
    return found


def _sockets(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            pass
    return count


def _written(pid: int) -> int:
    """Bytes `pid` has written (sockets included), from /proc/PID/io."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


#: more than start-up writes and more than one run's share of the payload
#: (16 MiB, of which a rank sends about 2/3 in a ring): rank 2 has sent data
#: of at least one run, so it is inside its runs
IN_THE_RUNS = 32 << 20


def _run_and_kill_rank_2(tmp_path, *extra: str) -> tuple[int, str, str]:
    """distir-run on 3 ranks, rank 2 killed (SIGKILL) from outside inside
    its runs; (exit status, stdout, stderr)."""
    program = tmp_path / "big_all_reduce.mlir"
    program.write_text(PROGRAM)
    command = [
        sys.executable,
        "-m",
        "distir.cli.run",
        str(program),
        "--nproc",
        "3",
        "--tolerate",
        "1",
        "--repeat",
        "150",
        "--deadline",
        "3",
        "--timeout",
        "100",
        *extra,
    ]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim = None
        give_up = time.monotonic() + 60
        # Rank 2 is connected to the store and to both peers, and has sent a
        # run's payload: it is inside its runs (an event, not a guessed sleep).
        while victim is None or _sockets(victim) < 3 or _written(victim) < IN_THE_RUNS:
            assert time.monotonic() < give_up and run.poll() is None, "rank 2 never ran"
            victim = _children(run.pid).get("distir-rank-2")
            time.sleep(0.05)
        os.kill(victim, signal.SIGKILL)
        out, err = run.communicate(timeout=90)
    finally:
        run.kill()
    return run.returncode, out, err


def test_distir_run_tolerates_a_rank_killed_from_outside(tmp_path) -> None:
    returncode, out, err = _run_and_kill_rank_2(tmp_path)
    assert returncode == 0, err
    lines = out.splitlines()
    assert "rank 2: lost (killed by SIGKILL without a result)" in lines
    for rank in (0, 1):
        assert f"  recovered: epoch 1, rank {rank} of 2 (ranks 0-1; lost rank 2)" in lines, out
    results = [line for line in lines if line.startswith("  result #0: int64[2097152] crc32")]
    assert len(results) == 2 and results[0] == results[1], out


def test_distir_run_replaces_a_rank_killed_from_outside(tmp_path) -> None:
    returncode, out, err = _run_and_kill_rank_2(tmp_path, "--replace")
    assert returncode == 0, err
    lines = out.splitlines()
    assert "rank 2: lost (killed by SIGKILL without a result (replaced))" in lines, out
    for rank in (0, 1):
        assert f"  recovered: epoch 1, rank {rank} of 2 (ranks 0-1; lost rank 2)" in lines, out
        assert f"  grown: epoch 2, rank {rank} of 3 (ranks 0-2; joined rank 2)" in lines, out
    joined = [line for line in lines if line.startswith("  joined: epoch 2, rank 2 of 3")]
    assert len(joined) == 1, out
    # All three end on the same group, with the same sum of three ranks' inputs.
    results = [line for line in lines if line.startswith("  result #0: int64[2097152] crc32")]
    assert len(results) == 3 and len(set(results)) == 1, out
