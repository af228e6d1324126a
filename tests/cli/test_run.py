"""`distir-run`: run an example on local gloo ranks and print one block per rank.

Each run is a subprocess (`python -m distir.cli.run`) that spawns its ranks,
a few seconds apiece, so examples that run on two ranks run on two, and only
two examples run on four. Every printed result line is checked against the
reference simulator fed the inputs distir-run synthesises for that rank.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import distir
from distir.cli.run import summarize
from distir.errors import DistirError
from distir.ir.dialect import AllGatherOp, GroupOp, VariableAllToAllOp
from distir.runtime.inputs import synthesize_inputs

pytestmark = pytest.mark.multirank

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.mlir"))
#: examples that need four ranks and are worth the time of a four-rank run
RUN_TIMEOUT_S = 150


def required_world_size(path: Path) -> int | None:
    """The world size an example's IR pins down, if any: declared group and
    mesh ranks, and static per-rank counts of world-group ops."""
    text = path.read_text()
    needed = 0
    for line in text.splitlines():
        if line.strip().startswith("dist.mesh") and "ranks" in line:
            ranks = re.findall(r"\d+", line.split("ranks", 1)[1])
            needed = max(needed, *(int(r) + 1 for r in ranks))
    try:
        program = distir.compile(path)
    except DistirError:
        return needed or None
    for op in program.module.walk():
        if isinstance(op, GroupOp):
            needed = max(needed, max(max(part) for part in op.rank_lists) + 1)
        counts = None
        if isinstance(op, AllGatherOp) and op.group is None and op.counts is not None:
            counts = op.counts.type
        if isinstance(op, VariableAllToAllOp) and op.group is None:
            counts = op.send_counts.type
        if counts is not None and counts.get_shape()[0] > 0:
            needed = max(needed, counts.get_shape()[0])
    return needed or None


def _example_params():
    params = []
    for path in EXAMPLES:
        needed = required_world_size(path)
        # Every example runs, at the smallest world size it supports.
        nproc = 2 if needed is None or needed <= 2 else needed
        params.append(pytest.param(path, nproc, id=f"{path.name}-nproc{nproc}"))
    return params


def distir_run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distir.cli.run", *args],
        cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )


def rank_blocks(stdout: str) -> dict[int, list[str]]:
    """rank -> its `result #i: ...` lines, in printed order."""
    blocks: dict[int, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        header = re.match(r"rank (\d+): run ", line)
        if header:
            current = int(header.group(1))
            assert current not in blocks, f"rank {current} printed twice"
            blocks[current] = []
        elif line.startswith("  result #"):
            assert current is not None, line
            blocks[current].append(line)
    return blocks


def expected_lines(path: Path, world_size: int) -> list[list[str]]:
    """What each rank must print: the simulator's results on the inputs
    distir-run synthesises (seed 0, dynamic size 4)."""
    program = distir.compile(path)
    inputs = [synthesize_inputs(program.function, r, world_size, 0, 4) for r in range(world_size)]
    results = program.simulate(inputs, timeout=30)
    lines = []
    for result in results:
        values = result if isinstance(result, tuple) else (result,)
        lines.append([f"  result #{i}: {summarize(v)}" for i, v in enumerate(values)])
    return lines


def assert_clean_failure(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.stderr.startswith("distir-run: error: "), proc.stderr


# Examples ------------------------------------------------------------------------------


def test_examples_exist() -> None:
    assert EXAMPLES, "examples/*.mlir not found"


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize(("path", "nproc"), _example_params())
def test_example_runs_and_prints_one_block_per_rank(path: Path, nproc: int) -> None:
    proc = distir_run(str(path.relative_to(ROOT)), "--nproc", str(nproc))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    blocks = rank_blocks(proc.stdout)
    assert sorted(blocks) == list(range(nproc)), proc.stdout
    n_outputs = len(distir.compile(path).output_types)
    expected = expected_lines(path, nproc)
    for rank, lines in blocks.items():
        assert [line.split(":")[0] for line in lines] == [
            f"  result #{i}" for i in range(n_outputs)
        ]
        assert lines == expected[rank], f"rank {rank}"


# Inputs from a file ----------------------------------------------------------------------


INPUTS_PY = """\
import torch


def make_inputs(rank, world_size):
    x = torch.arange(8, dtype=torch.int64) * (rank + 1) + world_size
    m = torch.full((8,), 7, dtype=torch.int64)
    return [x, m]
"""


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_inputs_from_a_python_file(tmp_path) -> None:
    inputs = tmp_path / "my_inputs.py"
    inputs.write_text(INPUTS_PY)
    proc = distir_run("examples/all_reduce.mlir", "--nproc", "2", "--inputs", str(inputs))
    assert proc.returncode == 0, proc.stderr
    xs = [torch.arange(8) * (r + 1) + 2 for r in range(2)]
    total = xs[0] + xs[1]
    want = [f"  result #0: {summarize(total)}", f"  result #1: {summarize(total % 7)}"]
    blocks = rank_blocks(proc.stdout)
    assert blocks == {0: want, 1: want}


# Errors: exit 1, located, no traceback ------------------------------------------------------


BAD_ROOT = """\
dist.group @pairs [[0, 1], [2, 3]]
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.broadcast %x root 2 group @pairs : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
"""


def test_a_program_that_does_not_verify(tmp_path) -> None:
    path = tmp_path / "bad.mlir"
    path.write_text(BAD_ROOT)
    proc = distir_run(str(path), "--nproc", "2")
    assert_clean_failure(proc)
    assert f"'dist.broadcast' at {path}:3:3" in proc.stderr
    assert "rank 0:" not in proc.stdout, "no rank may start for a bad program"


def test_a_parse_error(tmp_path) -> None:
    path = tmp_path / "typo.mlir"
    path.write_text(BAD_ROOT.replace("dist.broadcast %x root 2", "dist.broadcast %x rot 2"))
    proc = distir_run(str(path), "--nproc", "2")
    assert_clean_failure(proc)
    assert f"{path}:3:" in proc.stderr


def test_a_missing_program_file(tmp_path) -> None:
    proc = distir_run(str(tmp_path / "nowhere.mlir"), "--nproc", "2")
    assert_clean_failure(proc)
    assert "nowhere.mlir" in proc.stderr


def test_an_unknown_pass(tmp_path) -> None:
    proc = distir_run("examples/all_reduce.mlir", "--nproc", "2", "-p", "no-such-pass")
    assert_clean_failure(proc)
    assert "no-such-pass" in proc.stderr


def test_a_type_error_caught_while_parsing(tmp_path) -> None:
    path = tmp_path / "extui.mlir"
    path.write_text("""\
func.func @main(%a: tensor<4xi1>) -> tensor<4xi64> {
  %e = arith.extui %a : tensor<4xi1> to tensor<4xi64>
  func.return %e : tensor<4xi64>
}
""")
    proc = distir_run(str(path), "--nproc", "2")
    assert_clean_failure(proc)
    assert f"{path}:2:" in proc.stderr


def test_a_malformed_pipeline() -> None:
    proc = distir_run("examples/all_reduce.mlir", "--nproc", "2", "-p", "canonicalize,,")
    assert_clean_failure(proc)


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_inputs_that_every_rank_rejects(tmp_path) -> None:
    # all_gather.mlir declares 4 per-rank counts: on 2 ranks, every rank
    # rejects its counts input before any payload moves.
    inputs = tmp_path / "wrong.py"
    inputs.write_text("""\
import torch


def make_inputs(rank, world_size):
    return [torch.zeros(2, 4), torch.zeros(rank + 1, 4), torch.arange(1, 3)]
""")
    proc = distir_run("examples/all_gather.mlir", "--nproc", "2", "--inputs", str(inputs))
    assert_clean_failure(proc)
    for rank in range(2):
        assert f"rank {rank}:" in proc.stderr
    assert "input #2" in proc.stderr
