"""What a new user meets on the first day, each said plainly and early: a
typo in a reduction kind or an op name, a point-to-point deadlock for the
ranks asked for, one rank, and a launch script without the `__main__` guard."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_run import Spawned, no_launch, run_here  # noqa: F401 (fixture)

import distir
from distir.errors import CompileError

ROOT = Path(__file__).resolve().parents[2]

ALL_REDUCE = """\
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce KIND %x : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
"""


@pytest.mark.usefixtures("no_launch")
def test_a_misspelt_reduction_kind_lists_the_kinds(capsys, tmp_path) -> None:
    path = tmp_path / "p.mlir"
    path.write_text(ALL_REDUCE.replace("KIND", "summ"))
    status, err = run_here(capsys, str(path))
    assert status == 1
    assert err.splitlines() == [
        f"distir-run: error: {path}:2:24: 'summ' is not a reduction kind (the kinds are sum, "
        "prod, min, max, band, bor, bxor), nor an operand; did you mean 'sum'?",
        "  %y = dist.all_reduce summ %x : tensor<4xi64>",
        "                       ^^^^",
    ]


@pytest.mark.parametrize(
    ("op", "hint"),
    [
        ("dist.all_reduc sum", "; did you mean 'dist.all_reduce'?"),
        ("dist.allreduce sum", "; did you mean 'dist.all_reduce'?"),
        ("arith.addd", "; did you mean 'arith.addi'?"),
        ("memref.alloca sum", " (a dist program may use the dialects builtin, func, arith, "
         "math, tensor, scf, linalg, dist, shard)"),
    ],
)  # fmt: skip
def test_a_misspelt_op_name_gets_a_hint_and_the_caret_on_the_name(op, hint) -> None:
    text = ALL_REDUCE.replace("dist.all_reduce KIND", op)
    with pytest.raises(CompileError) as info:
        distir.compile(text)
    name = op.split()[0]
    lines = str(info.value).splitlines()
    assert (
        lines[0] == f"parse error: <program>:2:8: error: Operation {name} is not registered{hint}"
    )
    assert lines[2] == "       " + "^" * len(name)


TWO_RANK_EXCHANGE = """\
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = dist.rank : index
  %zero = arith.constant 0 : index
  %is0 = arith.cmpi eq, %r, %zero : index
  %y = scf.if %is0 -> (tensor<4xf32>) {
    dist.send %x to 1 : tensor<4xf32>
    %a = dist.recv from 1 : tensor<4xf32>
    scf.yield %a : tensor<4xf32>
  } else {
    %b = dist.recv from 0 : tensor<4xf32>
    dist.send %x to 0 : tensor<4xf32>
    scf.yield %b : tensor<4xf32>
  }
  func.return %y : tensor<4xf32>
}
"""


@pytest.mark.usefixtures("no_launch")
def test_distir_run_checks_point_to_point_for_its_nproc_before_spawning(capsys, tmp_path) -> None:
    path = tmp_path / "p.mlir"
    path.write_text(TWO_RANK_EXCHANGE)
    distir.compile(path)  # fine for 2 ranks: compile cannot know the size
    status, err = run_here(capsys, str(path), "--nproc", "3")
    assert status == 1
    assert err == (
        f"distir-run: error: point-to-point deadlock with 3 ranks: rank 2 waits at "
        f"'dist.recv' at {path}:10:5 for rank 0, which has finished without sending it. "
        "Every dist.recv needs a dist.send from its source\n"
    )
    with pytest.raises(Spawned):  # with 2 ranks it gets as far as starting them
        run_here(capsys, str(path), "--nproc", "2")


@pytest.mark.usefixtures("no_launch")
def test_one_rank_is_one_rank(capsys, tmp_path) -> None:
    path = tmp_path / "p.mlir"
    path.write_text("dist.mesh @infer [2] ranks [4, 5]\n" + ALL_REDUCE.replace("KIND", "sum"))
    status, err = run_here(capsys, str(path), "--nproc", "1")
    assert status == 1
    assert err.endswith("but the program runs on 1 rank\n"), err


NO_GUARD = """\
import distir

def worker(ctx):
    return ctx.rank

print(distir.launch(worker, 2, pass_context=True))
"""


@pytest.mark.multirank
def test_a_launch_script_without_the_main_guard_is_told_in_one_line(tmp_path) -> None:
    script = tmp_path / "no_guard.py"
    script.write_text(NO_GUARD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=100, env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "distir.runtime.launch.LaunchError: distir.launch ran again inside every rank, which "
        'imports the script that calls it: put the call under `if __name__ == "__main__":`'
    )
    # multiprocessing's own page per rank is gone.
    assert "bootstrapping phase" not in done.stderr
    assert done.stderr.count("Traceback") == 1
