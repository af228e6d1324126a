"""`distir-run`: run a program on local gloo ranks and print one block per rank.

Runs are subprocesses (`python -m distir.cli.run`) that spawn their ranks, a
few seconds apiece, so each example runs at the smallest world size its IR
allows. Every printed result line is checked against the reference simulator
fed the inputs distir-run synthesises for that rank. What distir-run checks
before it starts a rank is tested in-process, with `launch` replaced by a
function that fails the test if it is called.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch
from runtime_support import example_pipeline

import distir
from distir.cli import run as cli
from distir.cli.report import checksum, summarize
from distir.ir.parsing import make_context, parse_file
from distir.passes import apply_pipeline
from distir.runtime import inputs as cli_inputs
from distir.runtime.inputs import synthesize_inputs
from distir.runtime.requirements import world_size_range

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.mlir"))
RUN_TIMEOUT_S = 150
multirank = pytest.mark.multirank

pytestmark = pytest.mark.slow  # it starts processes (left out by --fast)


def smallest_world_size(path: Path, pipeline: str = "") -> int:
    """The smallest world size an example runs on, at least 2 (one rank
    shows nothing about a collective)."""
    module = parse_file(path)
    if pipeline:
        apply_pipeline(make_context(), module, pipeline)
    low, high = world_size_range(module)
    assert high is None or low <= high, f"{path} runs on no world size"
    return max(low, 2) if high is None or high >= 2 else low


def _example_params():
    return [
        pytest.param(path, n, id=f"{path.name}-nproc{n}")
        for path in EXAMPLES
        for n in [smallest_world_size(path, example_pipeline(path))]
    ]


def distir_run(*args: str, cwd: Path = ROOT, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distir.cli.run", *args],
        cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, **kwargs,
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


def expected_lines(
    path: Path, world_size: int, entry: str = "main", pipeline: str = ""
) -> list[list[str]]:
    """What each rank must print: the simulator's results on the inputs
    distir-run synthesises (seed 0, dynamic size 4)."""
    program = distir.compile(path, pipeline, entry=entry)
    inputs = [synthesize_inputs(program.function, r, world_size, 0, 4) for r in range(world_size)]
    results = program.simulate(inputs, timeout=30)
    lines = []
    for result in results:
        values = result if isinstance(result, tuple) else (result,)
        lines.append([f"  result #{i}: {summarize(v)}" for i, v in enumerate(values)])
    return lines


def assert_clean_failure(proc: subprocess.CompletedProcess, status: int = 1) -> None:
    assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.stderr.startswith("distir-run: error: "), proc.stderr


class Spawned(AssertionError):
    pass


@pytest.fixture
def no_launch(monkeypatch):
    """distir-run in this process, where starting a rank fails the test."""

    def launch(*args, **kwargs):
        raise Spawned("distir-run started ranks")

    monkeypatch.setattr("distir.runtime.launch.launch", launch)
    for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def run_here(capsys, *args: str) -> tuple[int, str]:
    """(exit status, stderr) of distir-run called in this process."""
    try:
        status = cli.main(list(args))
    except SystemExit as e:  # argparse
        status = e.code
    return status, capsys.readouterr().err


# Examples ------------------------------------------------------------------------------


def test_examples_exist() -> None:
    assert EXAMPLES, "examples/*.mlir not found"


@multirank
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize(("path", "nproc"), _example_params())
def test_example_runs_and_prints_one_block_per_rank(
    path: Path, nproc: int, capsys, monkeypatch
) -> None:
    # In this process (its ranks start from the worker's fork server, warm):
    # the console script itself is run as a subprocess by the tests below.
    pipeline = example_pipeline(path)
    monkeypatch.chdir(ROOT)
    try:
        status = cli.main([str(path.relative_to(ROOT)), "--nproc", str(nproc), "-p", pipeline])
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    assert status == 0, out.err
    assert "Traceback" not in out.err
    blocks = rank_blocks(out.out)
    assert sorted(blocks) == list(range(nproc)), out.out
    n_outputs = len(distir.compile(path, pipeline).output_types)
    expected = expected_lines(path, nproc, pipeline=pipeline)
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


@multirank
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_inputs_from_a_python_file(tmp_path, run_cli) -> None:
    inputs = tmp_path / "my_inputs.py"
    inputs.write_text(INPUTS_PY)
    proc = run_cli("examples/all_reduce.mlir", "--nproc", "2", "--inputs", str(inputs))
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


def test_a_program_that_does_not_verify(tmp_path, run_cli) -> None:
    path = tmp_path / "bad.mlir"
    path.write_text(BAD_ROOT)
    proc = run_cli(str(path), "--nproc", "2")
    assert_clean_failure(proc)
    assert f"'dist.broadcast' at {path}:3:3" in proc.stderr
    assert "rank 0:" not in proc.stdout, "no rank may start for a bad program"


def test_a_parse_error(tmp_path, run_cli) -> None:
    path = tmp_path / "typo.mlir"
    path.write_text(BAD_ROOT.replace("dist.broadcast %x root 2", "dist.broadcast %x rot 2"))
    proc = run_cli(str(path), "--nproc", "2")
    assert_clean_failure(proc)
    assert f"{path}:3:" in proc.stderr


def test_a_missing_program_file(tmp_path, run_cli) -> None:
    proc = run_cli(str(tmp_path / "nowhere.mlir"), "--nproc", "2")
    assert_clean_failure(proc)
    assert "nowhere.mlir" in proc.stderr


def test_an_unknown_pass(tmp_path, run_cli) -> None:
    proc = run_cli("examples/all_reduce.mlir", "--nproc", "2", "-p", "no-such-pass")
    assert_clean_failure(proc)
    assert "no-such-pass" in proc.stderr


def test_a_type_error_caught_while_parsing(tmp_path, run_cli) -> None:
    # (arith.extui on i1 tensors is a valid cast since the combine language
    # grew tensor casts; an operand used at two types is still a parse error.)
    path = tmp_path / "mistyped.mlir"
    path.write_text("""\
func.func @main(%a: tensor<4xi1>) -> tensor<4xi64> {
  %e = arith.addi %a, %a : tensor<4xi64>
  func.return %e : tensor<4xi64>
}
""")
    proc = run_cli(str(path), "--nproc", "2")
    assert_clean_failure(proc)
    assert f"{path}:2:" in proc.stderr


def test_a_malformed_pipeline(run_cli) -> None:
    proc = run_cli("examples/all_reduce.mlir", "--nproc", "2", "-p", "canonicalize,,")
    assert_clean_failure(proc)




# Inputs that are wrong: found once, reported once -------------------------------------------


WRONG_SHAPES = """\
import torch


def make_inputs(rank, world_size):
    return [torch.zeros(8, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)]
"""


@multirank
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_inputs_that_every_rank_rejects_are_reported_once(tmp_path, run_cli) -> None:
    inputs = tmp_path / "wrong.py"
    inputs.write_text(WRONG_SHAPES)
    proc = run_cli("examples/all_reduce.mlir", "--nproc", "2", "--inputs", str(inputs))
    assert_clean_failure(proc)
    assert proc.stderr.splitlines() == [
        "distir-run: error: 2 of 2 ranks failed:",
        f"  ranks 0-1: {inputs}: @main input #1 must be tensor<8xi64> (torch.int64), got "
        "tensor of shape [3] and dtype torch.int64",
    ]


RAISES_ON = """\
def make_inputs(rank, world_size):
    if rank in {ranks}:
        import os, time
        with open(os.path.join(os.path.dirname(__file__), "raised-at"), "w") as f:
            f.write(repr(time.time()))
        raise ValueError("no data for this rank")
    import torch
    return [torch.zeros(8, dtype=torch.int64), torch.ones(8, dtype=torch.int64)]
"""


@multirank
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_factory_that_raises_on_every_rank_is_one_line(tmp_path, run_cli) -> None:
    inputs = tmp_path / "raises.py"
    inputs.write_text(RAISES_ON.format(ranks="range(99)"))
    proc = run_cli("examples/all_reduce.mlir", "--nproc", "3", "--inputs", str(inputs))
    assert_clean_failure(proc)
    assert proc.stderr.splitlines() == [
        "distir-run: error: 3 of 3 ranks failed:",
        f"  ranks 0-2: {inputs}: make_inputs raised ValueError: no data for this rank "
        f"(at {inputs}:6)",
    ]


@multirank
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_factory_that_raises_on_one_rank_stops_the_others_at_once(tmp_path, run_cli) -> None:
    inputs = tmp_path / "raises.py"
    inputs.write_text(RAISES_ON.format(ranks="{1}"))
    proc = run_cli("examples/all_reduce.mlir", "--nproc", "3", "--inputs", str(inputs))
    # The collective timeout is 60 s: the others must not wait for it. Timed
    # from the raise, not from the launch (starting 3 interpreters on a
    # loaded 2-core machine is not what this bounds).
    raised_at = float((tmp_path / "raised-at").read_text())
    assert time.time() - raised_at < 30
    assert_clean_failure(proc)
    lines = proc.stderr.splitlines()
    assert lines[0] == "distir-run: error: 3 of 3 ranks failed:"
    assert sorted(lines[1:]) == [
        "  rank 1: " + f"{inputs}: make_inputs raised ValueError: no data for this rank "
        f"(at {inputs}:6)",
        "  ranks 0, 2: not run: rank 1 had no inputs",
    ]


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("missing.py", None, "inputs file {path} does not exist"),
        ("missing.pt", None, "inputs file {path} does not exist"),
        ("garbage.pt", b"\x00garbage", "inputs file {path} is not a file torch.save wrote"),
        ("broken.py", b"def make_inputs(:\n", "inputs file {path} does not import: SyntaxError"),
        ("none.py", b"x = 1\n", "{path} must define make_inputs(rank, world_size)"),
        ("inputs.csv", b"1,2\n", "inputs file {path} must be a .py defining make_inputs"),
    ],
)
def test_a_bad_inputs_file_is_refused_before_any_rank_starts(
    tmp_path, capsys, no_launch, name, content, expected
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    status, err = run_here(capsys, "examples/all_reduce.mlir", "--nproc", "2", "--inputs", str(path))
    assert status == 1
    assert err.startswith("distir-run: error: " + expected.format(path=path)), err
    assert err.count("\n") == 1, err


def test_a_pt_file_that_does_not_fit_the_program_names_the_rank(tmp_path, capsys, no_launch):
    path = tmp_path / "inputs.pt"
    torch.save([[torch.zeros(8, dtype=torch.int64)] * 2, [torch.zeros(8)] * 2], path)
    status, err = run_here(capsys, "examples/all_reduce.mlir", "--nproc", "2", "--inputs", str(path))
    assert status == 1
    assert err == (
        f"distir-run: error: {path}, inputs of rank 1: @main input #0 must be tensor<8xi64> "
        "(torch.int64), got tensor of shape [8] and dtype torch.float32\n"
    )


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--nproc", "0"], "argument --nproc: must be >= 1, got 0"),
        (["--nproc", "-2"], "argument --nproc: must be >= 1, got -2"),
        (["--nproc", "two"], "argument --nproc: expected int, got 'two'"),
        (["--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
        (["--deadline", "0"], "argument --deadline: must be a positive number of seconds, got 0"),
        (["--timeout", "nan"], "argument --timeout: must be a positive number of seconds, got nan"),
        (["--dynamic-size", "-1"], "argument --dynamic-size: must be >= 0, got -1"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(capsys, no_launch, flags, expected) -> None:
    status, err = run_here(capsys, "examples/all_reduce.mlir", *flags)
    assert status == 2
    assert err == f"distir-run: error: {expected} (see distir-run --help)\n"


def test_nccl_without_a_gpu_is_refused_before_spawning(capsys, no_launch, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    status, err = run_here(capsys, "examples/all_reduce.mlir", "--nproc", "2", "--backend", "nccl")
    assert status == 1
    assert err == (
        f"distir-run: error: --backend nccl needs a CUDA GPU, and torch {torch.__version__} "
        "sees none (gloo runs on CPU: --backend gloo)\n"
    )


def test_nccl_needs_a_gpu_per_rank(capsys, no_launch, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    status, err = run_here(capsys, "examples/all_reduce.mlir", "--nproc", "2", "--backend", "nccl")
    assert status == 1
    assert "--backend nccl needs one GPU per rank: 2 ranks, 1 GPU(s)" in err


# The program argument is a path --------------------------------------------------------------


def test_a_path_without_its_suffix(capsys, no_launch) -> None:
    status, err = run_here(capsys, "examples/all_reduce", "--nproc", "2")
    assert status == 1
    assert err == (
        "distir-run: error: examples/all_reduce: no such file "
        "(did you mean examples/all_reduce.mlir?)\n"
    )


def test_a_directory(capsys, no_launch) -> None:
    status, err = run_here(capsys, "examples", "--nproc", "2")
    assert (status, err) == (1, "distir-run: error: examples is a directory, not a program file\n")


def test_a_text_file_that_is_not_ir(tmp_path, capsys, no_launch) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("remember to run all_reduce\n")
    status, err = run_here(capsys, str(path), "--nproc", "2")
    assert status == 1
    first, *context = err.splitlines()
    assert re.fullmatch(
        rf"distir-run: error: {re.escape(str(path))}:1:\d+: Operation remember is not "
        r"registered \(a dist program may use the dialects builtin, func, arith, math, tensor, "
        r"scf, linalg, dist, shard\) \(distir-run reads MLIR text, as in a \.mlir file\)",
        first,
    ), first
    assert context[0] == "remember to run all_reduce"


def test_a_file_that_is_not_text(tmp_path, capsys, no_launch) -> None:
    path = tmp_path / "prog.mlir"
    path.write_bytes(b"func.func @main() {\xff\xfe}")
    status, err = run_here(capsys, str(path))
    assert (status, err) == (
        1, f"distir-run: error: {path} is not a text file: byte 19 is not UTF-8\n"
    )


def test_any_file_of_ir_is_a_program_whatever_its_suffix(tmp_path, capsys, monkeypatch) -> None:
    path = tmp_path / "all_reduce.txt"
    path.write_text((ROOT / "examples/all_reduce.mlir").read_text())
    seen = {}

    def launch(fn, nproc, request, **kwargs):
        seen.update(nproc=nproc, request=request)
        return []

    monkeypatch.setattr("distir.runtime.launch.launch", launch)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    status, _ = run_here(capsys, str(path), "--nproc", "3")
    assert status == 0
    assert seen["nproc"] == 3
    assert seen["request"].filename == str(path)
    assert seen["request"].source == path.read_text()


def test_a_dash_reads_the_program_from_stdin(capsys, monkeypatch) -> None:
    text = (ROOT / "examples/all_reduce.mlir").read_text()
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    seen = {}

    def launch(fn, nproc, request, **kwargs):
        seen["request"] = request
        return []

    monkeypatch.setattr("distir.runtime.launch.launch", launch)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    status, _ = run_here(capsys, "-", "--nproc", "2")
    assert status == 0
    assert (seen["request"].source, seen["request"].filename) == (text, "<stdin>")


def test_a_parse_error_on_stdin_is_located_there(capsys, no_launch, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("func.func @main( {\n"))
    status, err = run_here(capsys, "-", "--nproc", "2")
    assert status == 1
    assert err.startswith("distir-run: error: <stdin>:1:"), err


@multirank
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_program_piped_in_runs_like_the_file() -> None:
    path = ROOT / "examples/custom_combine.mlir"
    proc = distir_run("-", "--nproc", "2", input=path.read_text())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("distir-run: <stdin> on 2 local gloo ranks (pipeline: none)\n")
    blocks = rank_blocks(proc.stdout)
    assert [blocks[0], blocks[1]] == expected_lines(path, 2)


# World sizes the IR pins down, checked before spawning -------------------------------------------


def test_a_program_for_four_ranks_on_three_fails_at_once(capsys, no_launch) -> None:
    # "At once": before any rank starts (no_launch fails the test if one
    # does), not a wall-clock bound that a loaded machine breaks.
    status, err = run_here(capsys, "examples/variable_all_to_all.mlir", "--nproc", "3")
    assert status == 1
    assert err == (
        "distir-run: error: this program needs 4 ranks, not 3: 'dist.variable_all_to_all' at "
        "examples/variable_all_to_all.mlir:4:5 takes send counts tensor<4xi64> (one per rank)\n"
    )


@pytest.mark.parametrize(
    ("program", "nproc"),
    [("examples/variable_all_to_all.mlir", "3"), ("examples/mesh_transfer.mlir", "4")],
)
def test_a_wrong_world_size_is_refused_before_torch_loads(program, nproc) -> None:
    # Loading torch takes longer than the whole check: it must not happen.
    code = (
        "import sys\n"
        "from distir.cli import run\n"
        f"status = run.main([{program!r}, '--nproc', {nproc!r}])\n"
        "assert status == 1, status\n"
        "assert 'torch' not in sys.modules, 'torch was loaded'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("distir-run: error: "), proc.stderr


def test_a_mesh_naming_missing_ranks_fails_at_once(capsys, no_launch) -> None:
    status, err = run_here(capsys, "examples/mesh_transfer.mlir", "--nproc", "4")
    assert (status, err) == (
        1, "distir-run: error: mesh @infer names ranks 4, 5 but the program runs on 4 ranks\n"
    )


def test_what_a_pass_assumed_about_the_group_size_is_checked(capsys, no_launch) -> None:
    status, err = run_here(
        capsys, "examples/ciphertext_add.mlir", "--nproc", "9",
        "-p", "defer-modular-reduction{max-group-size=8}",
    )
    assert status == 1
    assert "this program runs on at most 8 ranks, not 9" in err


# Inputs are synthesised from the program as written ---------------------------------------------


@multirank
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 30)
def test_lowered_ciphertext_sums_print_what_the_unlowered_one_computes(run_cli) -> None:
    path = ROOT / "examples/ciphertext_add.mlir"
    expected = expected_lines(path, 3)
    for pipeline in ("lower-ciphertext-add", "defer-modular-reduction{max-group-size=8}"):
        proc = run_cli("examples/ciphertext_add.mlir", "--nproc", "3", "-p", pipeline)
        assert proc.returncode == 0, (pipeline, proc.stderr)
        assert f"(pipeline: {pipeline})" in proc.stdout.splitlines()[0]
        blocks = rank_blocks(proc.stdout)
        assert [blocks[r] for r in range(3)] == expected, pipeline


# Flags -------------------------------------------------------------------------------------


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert re.fullmatch(
        r"distir-run \S+ \(torch \S+, xdsl \S+, Python \d+\.\d+\.\d+\)\n", out
    ), out
    assert torch.__version__ in out


def test_help_shows_every_default_and_what_each_duration_means() -> None:
    text = " ".join(cli.build_parser().format_help().split())
    for shown in (
        "(default: 4;", "(default: main)", "(default: none)", "(default: 0)", "(default: 4)",
        "(default: gloo)", "(default: 1)", "(default: 60)", "(default: 120)",
        "(default: not saved)", "(default: synthesised from the program)",
    ):
        assert shown in text, shown
    assert "--deadline SECONDS seconds every collective may take" in text
    assert "--timeout SECONDS seconds before a hung launch is killed" in text
    assert "- for standard input" in text
    assert "--rdzv-backend c10d" in text


@pytest.mark.parametrize(
    "dtype",
    [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.bool, torch.int8,
     torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64,
     torch.uint64, torch.complex64],
)
def test_the_checksum_is_the_crc32_of_the_bytes_for_every_dtype(dtype) -> None:
    t = (torch.arange(6) % 2).to(dtype).reshape(2, 3)
    raw = t.contiguous().view(torch.uint8).numpy().tobytes()
    assert len(raw) == t.numel() * t.element_size()
    assert checksum(t) == f"{zlib.crc32(raw):08x}"
    assert checksum(t.t()) == checksum(t.t().contiguous())
    summarize(t)  # prints values of every dtype


def test_a_scalar_and_an_empty_tensor_have_checksums() -> None:
    assert checksum(torch.tensor(3, dtype=torch.int64)) == (
        f"{zlib.crc32((3).to_bytes(8, 'little')):08x}"
    )
    assert checksum(torch.zeros(0, 4, dtype=torch.bfloat16)) == f"{zlib.crc32(b''):08x}"


def test_an_entry_that_does_not_exist(capsys, no_launch) -> None:
    status, err = run_here(capsys, "examples/all_reduce.mlir", "--entry", "nope")
    assert (status, err) == (1, "distir-run: error: the module has no entry function @nope\n")


def test_an_output_file_in_a_missing_directory(tmp_path, capsys, no_launch) -> None:
    target = tmp_path / "absent" / "out.pt"
    status, err = run_here(capsys, "examples/all_reduce.mlir", "--nproc", "2", "-o", str(target))
    assert status == 1
    assert f"directory {target.parent} does not exist" in err


@multirank
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_an_output_whose_write_fails_is_one_line_after_the_results() -> None:
    proc = distir_run("examples/all_reduce.mlir", "--nproc", "2", "--output", "/dev/full")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "rank 1:" in proc.stdout  # the run itself completed and was reported
    assert proc.stderr.strip().splitlines()[-1] == (
        "distir-run: error: cannot write --output /dev/full: No space left on device"
    )


@pytest.mark.parametrize("seed", [str(10**30), str(2**64), str(cli_inputs.MAX_SEED + 1)])
def test_a_seed_beyond_the_generators_is_refused_before_any_rank_starts(
    capsys, no_launch, seed
) -> None:
    status, err = run_here(capsys, "examples/all_reduce.mlir", "--random-inputs", seed)
    assert (status, err) == (
        1,
        f"distir-run: error: --random-inputs {seed}: the seed must be at most "
        f"{cli_inputs.MAX_SEED}\n",
    )


def test_the_largest_seed_synthesises_inputs() -> None:
    function = next(iter(parse_file(ROOT / "examples/all_reduce.mlir").ops))
    for rank in range(4):
        synthesize_inputs(function, rank, 4, seed=cli_inputs.MAX_SEED)
    with pytest.raises(ValueError, match="seed must be in"):
        synthesize_inputs(function, 0, 4, seed=cli_inputs.MAX_SEED + 1)


@pytest.mark.parametrize("text", ["", "\n\n", "// only a comment\n", "  // a\n// b"])
def test_an_empty_or_comment_only_file_is_an_empty_module_without_main(
    tmp_path, capsys, no_launch, text
) -> None:
    program = tmp_path / "empty.mlir"
    program.write_text(text)
    status, err = run_here(capsys, str(program), "--nproc", "2")
    assert (status, err) == (1, "distir-run: error: the module has no entry function @main\n")
    for source in (program, str(program), text):
        with pytest.raises(distir.errors.CompileError, match="^the module has no entry function @main$"):
            distir.compile(source)


TWO_ENTRIES = """\
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce sum %x : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
func.func @narrow(%h: tensor<5xbf16>, %u: tensor<3xui8>) -> (tensor<5xbf16>, tensor<3xui8>, tensor<6xui8>) {
  %b = dist.broadcast %h root 1 : tensor<5xbf16>
  %s = dist.all_reduce max %u : tensor<3xui8>
  %g = dist.all_gather %u axis 0 : tensor<3xui8> -> tensor<6xui8>
  func.return %b, %s, %g : tensor<5xbf16>, tensor<3xui8>, tensor<6xui8>
}
"""


@multirank
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_entry_output_and_narrow_types(tmp_path, run_cli) -> None:
    program = tmp_path / "two.mlir"
    program.write_text(TWO_ENTRIES)
    output = tmp_path / "results.pt"
    proc = run_cli(str(program), "--nproc", "2", "--entry", "narrow", "--output", str(output))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    expected = expected_lines(program, 2, entry="narrow")
    blocks = rank_blocks(proc.stdout)
    assert [blocks[0], blocks[1]] == expected
    assert "bfloat16[5]" in expected[0][0] and "uint8[3]" in expected[0][1]
    saved = torch.load(output)
    assert [len(per_rank) for per_rank in saved] == [3, 3]
    assert [t.dtype for t in saved[0]] == [torch.bfloat16, torch.uint8, torch.uint8]
    for rank in range(2):
        assert [f"  result #{i}: {summarize(t)}" for i, t in enumerate(saved[rank])] == (
            expected[rank]
        )


DEADLOCK = """\
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = dist.rank : index
  %peers = arith.constant dense<[1, 0]> : tensor<2xi64>
  %p = tensor.extract %peers[%r] : tensor<2xi64>
  %peer = arith.index_cast %p : i64 to index
  %y = dist.recv from %peer : tensor<4xf32>
  func.return %y : tensor<4xf32>
}
"""


@multirank
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_deadline_bounds_every_collective(tmp_path, run_cli) -> None:
    # Both ranks receive and neither sends: each recv fails at the deadline.
    # (The peers come from a table, which verify-spmd does not evaluate: with
    # peers it can follow, it rejects this program before it runs.)
    program = tmp_path / "deadlock.mlir"
    program.write_text(DEADLOCK)
    proc = run_cli(str(program), "--nproc", "2", "--deadline", "1.5")
    assert_clean_failure(proc)
    for rank in (0, 1):
        assert (
            f"  rank {rank}: DeadlineExceeded: 'dist.recv' at {program}:6:3: did not "
            "complete within its 1.5 s deadline"
        ) in proc.stderr
