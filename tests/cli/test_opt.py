"""`distir-opt` as a user runs it: located errors and exit status 1 on bad
input, never a Python traceback; examples print back as a fixed point.

Each subprocess pays for importing the package, so every command the tests
need is started at once by one module-scoped fixture and the tests read its
results. Details are then checked in-process through `main()`.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from distir.cli.opt import main
from distir.ir.parsing import MAX_NESTING_DEPTH, parse_module
from distir.passes import DISTIR_PASSES, PipelineError, parse_pipeline, pass_summary

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.mlir"))
# One example per op family, written exactly as distir-opt prints them.
OP_FAMILY_EXAMPLES = [
    "all_gather.mlir",
    "all_reduce.mlir",
    "broadcast.mlir",
    "ciphertext_add.mlir",
    "custom_combine.mlir",
    "point_to_point.mlir",
    "subgroups.mlir",
    "variable_all_to_all.mlir",
    "wave.mlir",
]
SEPARATOR = "// -----\n"

# `canonicalize` folds `%i + 0` and deletes the unused rank query, and must
# keep both collectives (the broadcast is unused, but every rank enters it).
VALID = """\
func.func @main(%x: tensor<4xi64>, %i: i64) -> (tensor<4xi64>, i64) {
  %c = arith.constant 0 : i64
  %z = arith.addi %i, %c : i64
  %r = dist.rank : index
  %b = dist.broadcast %x root 0 : tensor<4xi64>
  %y = dist.all_reduce sum %x : tensor<4xi64>
  func.return %y, %z : tensor<4xi64>, i64
}
"""

# The `:` before the type is missing: xDSL reports line 3, column 33.
SYNTAX_ERROR = """\
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = dist.broadcast %x root 0 : tensor<4xf32>
  %y = dist.all_reduce sum %a   tensor<4xf32>
  func.return %y : tensor<4xf32>
}
"""

# Line 3, column 3: a bitwise reduction of floats.
VERIFY_ERROR = """\
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = dist.broadcast %x root 0 : tensor<4xf32>
  %y = dist.all_reduce bor %a : tensor<4xf32>
  func.return %y : tensor<4xf32>
}
"""

pytestmark = pytest.mark.slow  # it starts processes (left out by --fast)


# Generic form: an all-reduce with neither a kind nor a combine region, which
# the custom printer cannot print (it reads the region's block).
UNPRINTABLE_ALL_REDUCE = """\
func.func @main(%x: tensor<4xf32>) {
  %y = "dist.all_reduce"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  func.return
}
"""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def nested(levels: int) -> str:
    """A program whose deepest op sits `levels` regions deep (the function
    body is level 1, each `scf.if` adds one)."""
    lines = ["func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {", "  %c = arith.constant true"]
    lines += ["  " * (i + 1) + "scf.if %c {" for i in range(levels - 1)]
    lines.append("  " * levels + "%y = dist.all_reduce sum %x : tensor<4xf32>")
    lines += ["  " * (i + 1) + "}" for i in reversed(range(levels - 1))]
    return "\n".join([*lines, "  func.return %x : tensor<4xf32>", "}", ""])


def _examples_joined() -> str:
    return SEPARATOR.join(path.read_text() for path in EXAMPLES)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    tmp = tmp_path_factory.mktemp("opt")
    for name, text in {"valid": VALID, "syntax": SYNTAX_ERROR, "verify": VERIFY_ERROR}.items():
        (tmp / f"{name}.mlir").write_text(text)
    (tmp / "garbage.mlir").write_bytes(random.Random(0).randbytes(4096))
    (tmp / "deep.mlir").write_text(nested(150))
    out_file = tmp / "out.mlir"
    commands: dict[str, tuple[list[str], str | None]] = {
        "syntax": ([str(tmp / "syntax.mlir")], None),
        "verify": ([str(tmp / "verify.mlir")], None),
        "unknown_pass": ([str(tmp / "valid.mlir"), "-p", "no-such-pass"], None),
        "canonicalize_to_file": (
            [str(tmp / "valid.mlir"), "-p", "canonicalize", "-o", str(out_file)],
            None,
        ),
        "examples": (["--split-input-file"], _examples_joined()),
        # Runs in a subprocess: --disable-verify switches off attribute
        # verification for the whole Python process.
        "unverified": (["--disable-verify"], UNPRINTABLE_ALL_REDUCE),
        "garbage": ([str(tmp / "garbage.mlir")], None),
        # 150 nested scf.if: a RecursionError with ~1,000 frames once.
        "deep": ([str(tmp / "deep.mlir")], None),
        "help": (["--help"], None),
    }
    procs = {
        key: subprocess.Popen(
            [sys.executable, "-m", "distir.cli.opt", *args],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "COLUMNS": "80"},
        )
        for key, (args, stdin) in commands.items()
    }
    results = {}
    for key, proc in procs.items():
        out, err = proc.communicate(commands[key][1], timeout=120)
        results[key] = Result(proc.returncode, out, err)
    results["output_file"] = Result(0, out_file.read_text() if out_file.exists() else "", "")
    return results


def _no_traceback(result: Result) -> None:
    assert "Traceback" not in result.output


def test_syntax_error_is_located_and_exits_1(runs: dict[str, Result]) -> None:
    r = runs["syntax"]
    assert r.returncode == 1
    _no_traceback(r)
    assert "syntax.mlir:3:33: error: Expected ':'" in r.stderr
    assert "%y = dist.all_reduce sum %a   tensor<4xf32>" in r.stderr  # the source line
    assert r.stdout == ""


def test_verifier_error_is_located_and_exits_1(runs: dict[str, Result]) -> None:
    r = runs["verify"]
    assert r.returncode == 1
    _no_traceback(r)
    assert (
        "verify.mlir:3:3: error: 'dist.all_reduce' kind bor needs an integer element "
        "type, got tensor<4xf32>"
    ) in r.stderr
    assert '"dist.all_reduce"(%a) <{kind = #dist<kind bor>}>' in r.stderr  # the offending op
    assert r.stdout == ""


def test_unknown_pass_exits_1(runs: dict[str, Result]) -> None:
    r = runs["unknown_pass"]
    assert r.returncode == 1
    _no_traceback(r)
    assert "no-such-pass" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_printing_unverified_invalid_ir_is_an_error_not_a_crash(runs: dict[str, Result]) -> None:
    r = runs["unverified"]
    assert r.returncode == 1
    _no_traceback(r)
    assert "--print-op-generic" in r.stderr


def test_canonicalize_writes_the_output_file(runs: dict[str, Result]) -> None:
    r = runs["canonicalize_to_file"]
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""  # the program went to -o, not stdout
    assert (
        runs["output_file"].stdout.strip()
        == """\
builtin.module {
  func.func @main(%x: tensor<4xi64>, %i: i64) -> (tensor<4xi64>, i64) {
    %b = dist.broadcast %x root 0 : tensor<4xi64>
    %y = dist.all_reduce sum %x : tensor<4xi64>
    func.return %y, %i : tensor<4xi64>, i64
  }
}"""
    )


def test_examples_print_back_as_a_fixed_point(
    runs: dict[str, Result], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """print(parse(print(parse(f)))) == print(parse(f)) for every example."""
    first = runs["examples"]
    assert first.returncode == 0, first.stderr
    _no_traceback(first)
    assert len(first.stdout.split(SEPARATOR)) == len(EXAMPLES) >= len(OP_FAMILY_EXAMPLES)
    printed = tmp_path / "printed.mlir"
    printed.write_text(first.stdout)
    main([str(printed), "--split-input-file"])
    assert capsys.readouterr().out == first.stdout


def test_bad_pass_option_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "valid.mlir"
    path.write_text(VALID)
    err = _main_fails([str(path), "-p", "canonicalize{bogus=1}"], capsys)
    assert "bogus" in err and len(err.strip().splitlines()) == 1


def test_missing_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _main_fails([str(tmp_path / "missing.mlir")], capsys)
    assert "missing.mlir" in err and "No such file" in err


def test_unknown_op_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    text = "func.func @f() {\n  dist.frobnicate\n  func.return\n}\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    err = _main_fails([], capsys)
    assert re.match(r"stdin:\d+:\d+: error: Operation dist.frobnicate is not registered", err)


@pytest.mark.parametrize("name", OP_FAMILY_EXAMPLES)
def test_example_prints_back_unchanged(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each example is written as it prints: only its comments go away."""
    path = ROOT / "examples" / name
    main([str(path)])
    printed = capsys.readouterr().out
    source = "".join(
        line for line in path.read_text().splitlines(keepends=True) if not line.startswith("//")
    )
    assert printed.strip() == source.strip()
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("// ") and "distir-opt examples/" in first_line
    assert str(parse_module(printed)) == printed.strip()


def _main_fails(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 1
    return capsys.readouterr().err


def test_split_input_file_reports_whole_file_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "split.mlir"
    path.write_text(VALID + SEPARATOR + VERIFY_ERROR)
    err = _main_fails([str(path), "--split-input-file"], capsys)
    line = VALID.count("\n") + 1 + 3  # line 3 of the chunk after the separator
    assert f"{path}:{line}:3: error: 'dist.all_reduce' kind bor" in err


def test_split_input_file_parse_error_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "split.mlir"
    path.write_text(VALID + SEPARATOR + SYNTAX_ERROR)
    line = VALID.count("\n") + 1 + 3
    assert f"{path}:{line}:33: error:" in _main_fails([str(path), "--split-input-file"], capsys)


def test_verify_diagnostics_prints_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.mlir"
    path.write_text(VERIFY_ERROR)
    main([str(path), "--verify-diagnostics"])
    out = capsys.readouterr().out
    assert f"{path}:3:3: error: 'dist.all_reduce' kind bor" in out


def test_parsing_diagnostics_prints_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.mlir"
    path.write_text(SYNTAX_ERROR)
    main([str(path), "--parsing-diagnostics"])
    assert f"{path}:3:33" in capsys.readouterr().out


def test_verification_error_after_a_pass_names_the_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that leaves invalid IR is reported with the op and the pass."""
    from dataclasses import dataclass as frozen_dataclass

    from xdsl.passes import ModulePass

    from distir.ir import ReductionKind, ReductionKindAttr
    from distir.ir.dialect import AllReduceOp

    @frozen_dataclass(frozen=True)
    class BreakKinds(ModulePass):
        name = "break-kinds"

        def apply(self, ctx, op) -> None:
            for inner in op.walk():
                if isinstance(inner, AllReduceOp):
                    inner.properties["kind"] = ReductionKindAttr(ReductionKind.BXOR)

    import distir.passes

    real = distir.passes.get_all_passes
    monkeypatch.setattr(
        distir.passes, "get_all_passes", lambda: {**real(), "break-kinds": lambda: BreakKinds}
    )
    path = tmp_path / "ok.mlir"
    path.write_text(VERIFY_ERROR.replace(" bor ", " max "))
    err = _main_fails([str(path), "-p", "break-kinds"], capsys)
    assert f"{path}:3:3: error: 'dist.all_reduce' kind bxor needs an integer" in err
    assert "after pass 'break-kinds'" in err


def test_integer_too_large_is_a_located_parse_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.mlir"
    path.write_text(VALID.replace("root 0", "root 99999999999999999999"))
    err = _main_fails([str(path)], capsys)
    assert re.search(rf"{re.escape(str(path))}:5:\d+: error:", err) and "out of range" in err


def test_unknown_file_extension(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "prog.txt"
    path.write_text(VALID)
    assert "Unrecognized file extension 'txt'" in _main_fails([str(path)], capsys)


# Hostile input ----------------------------------------------------------------

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def test_binary_garbage_is_one_located_error(runs: dict[str, Result]) -> None:
    r = runs["garbage"]
    assert r.returncode == 1
    _no_traceback(r)
    first, *rest = r.stderr.splitlines()
    assert re.match(r".*garbage\.mlir:1:\d+: error: invalid UTF-8 \(", first)
    assert len(rest) == 2  # the line (cut to a window) and the carets
    assert not CONTROL.search(r.stderr)  # no terminal escapes from the garbage
    assert r.stdout == ""


def test_deep_nesting_is_a_located_error(runs: dict[str, Result]) -> None:
    r = runs["deep"]
    assert r.returncode == 1
    _no_traceback(r)
    assert re.match(r".*deep\.mlir:\d+:\d+: error: nesting deeper than 100 levels", r.stderr)
    assert len(r.stderr.splitlines()) == 3


def test_the_deepest_accepted_program_runs_through_passes_and_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deepest.mlir"
    path.write_text(nested(MAX_NESTING_DEPTH))
    main([str(path), "-p", "canonicalize,cse,bucket-all-reduces,verify-spmd"])
    printed = capsys.readouterr().out
    assert str(parse_module(printed)) == printed.strip()
    main([str(path), "--print-op-generic"])
    assert str(parse_module(capsys.readouterr().out)) == str(parse_module(path.read_text()))


def test_invalid_utf8_in_a_later_chunk_names_its_whole_file_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "split.mlir"
    path.write_bytes((VALID + SEPARATOR).encode() + b"\xc3(\n")
    err = _main_fails([str(path), "--split-input-file"], capsys)
    line = VALID.count("\n") + 2  # the chunk starts on the separator's line
    assert f"{path}:{line}:1: error: invalid UTF-8" in err


def test_a_control_character_is_named_not_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nul.mlir"
    path.write_text(VALID.replace("%y = ", "%y = \x00\x1b[2J"))
    err = _main_fails([str(path)], capsys)
    line = VALID.splitlines().index("  %y = dist.all_reduce sum %x : tensor<4xi64>") + 1
    assert f"{path}:{line}:8: error: Unexpected character: \\x00" in err
    assert not CONTROL.search(err)


def test_a_huge_line_is_shown_as_a_window_around_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "oneline.mlir"
    path.write_text('"func.return"() {a = "' + "x" * 1_000_000 + '", b = ?} : () -> ()\n')
    err = _main_fails([str(path)], capsys)
    assert len(err) < 400
    line, carets = err.splitlines()[1:]
    assert line.startswith("...") and carets.strip() == "^" and line[carets.index("^")] == "?"


# Pipelines -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (
            "bucket-all-reduces{max-group-size=8}",
            "pass 'bucket-all-reduces' has no option 'max-group-size' "
            "(its options are max-op-bytes, bucket-bytes, min-ops)",
        ),
        (
            "defer-modular-reduction{max-group-size=eight}",
            "pass 'defer-modular-reduction': option 'max-group-size' expects an int, got 'eight'",
        ),
        (
            "defer-modular-reduction{remarks=1}",
            "pass 'defer-modular-reduction': option 'remarks' expects a bool, got '1'",
        ),
        (
            "bucket-all-reduces{min-ops}",
            "pass 'bucket-all-reduces': option 'min-ops' expects an int, got no value",
        ),
        (
            "bucket-all-reduces{min-ops=1}",
            "pass 'bucket-all-reduces': option 'min-ops' must be an integer >= 2, got 1",
        ),
        (
            "defer-modular-reduction{max-group-size=0}",
            "pass 'defer-modular-reduction': option 'max-group-size' must be an integer >= 1, "
            "got 0",
        ),
        (
            "select-all-reduce-algorithm{commutative=bogus}",
            "pass 'select-all-reduce-algorithm': option 'commutative' must be one of ring, "
            "halving-doubling, recursive-doubling, gather-fold, got 'bogus'",
        ),
        (
            "select-all-reduce-algorithm{ordered=ring}",  # the ring would reorder the fold
            "pass 'select-all-reduce-algorithm': option 'ordered' must be one of "
            "halving-doubling, recursive-doubling, gather-fold, got 'ring'",
        ),
        (
            "select-all-reduce-algorithm{group-size=0}",
            "pass 'select-all-reduce-algorithm': option 'group-size' must be an integer >= 1, "
            "got 0",
        ),
        (
            "select-all-reduce-algorithm{group-size=-4}",
            "pass 'select-all-reduce-algorithm': option 'group-size' must be an integer >= 1, "
            "got -4",
        ),
        ("lower-ciphertext-add{fast=true}", "pass 'lower-ciphertext-add' has no option 'fast'"),
        (
            "bucket-all-reduces{min-op=3}",
            "pass 'bucket-all-reduces' has no option 'min-op' (its options are max-op-bytes, "
            "bucket-bytes, min-ops); did you mean 'min-ops'?",
        ),
        (
            "bucket-allreduces",
            "unknown pass 'bucket-allreduces'; did you mean 'bucket-all-reduces'?",
        ),
    ],
)
def test_pass_option_errors_name_options_as_users_type_them(
    pipeline: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "valid.mlir"
    path.write_text(VALID)
    err = _main_fails([str(path), "-p", pipeline], capsys)
    assert err.startswith(f"distir-opt: error: {message}")
    assert len(err.strip().splitlines()) == 1 and "_" not in err.split("(")[0]
    with pytest.raises(PipelineError) as info:  # the same words for distir.compile
        parse_pipeline(pipeline)
    assert str(info.value).startswith(message)


def test_p_given_twice_is_an_error_as_in_mlir_opt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """xDSL silently kept only the last -p."""
    path = tmp_path / "valid.mlir"
    path.write_text(VALID)
    with pytest.raises(SystemExit) as info:
        main([str(path), "-p", "canonicalize", "-p", "cse"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert (
        "error: -p given twice ('canonicalize' and 'cse'); join passes with a comma: "
        "-p 'canonicalize,cse'"
    ) in err


# --help -------------------------------------------------------------------------


def test_help_lists_distir_passes_first_with_descriptions_and_options(
    runs: dict[str, Result],
) -> None:
    r = runs["help"]
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    distir_at = lines.index("distir passes (-p 'name{option=value ...},name,...'):")
    xdsl_at = next(i for i, line in enumerate(lines) if line.startswith("xDSL passes ("))
    assert distir_at < xdsl_at
    listed = [
        line.strip()
        for line in lines[distir_at + 1 : xdsl_at]
        if line.startswith("  ") and not line.startswith("   ")
    ]
    assert listed == list(DISTIR_PASSES)
    for name, factory in DISTIR_PASSES.items():
        description = lines[lines.index(f"  {name}") + 1].strip()
        assert pass_summary(factory()).startswith(description)
    bucket = "\n".join(lines[lines.index("  bucket-all-reduces") : xdsl_at])
    assert re.search(
        r"max-op-bytes=<int> +Largest all-reduce \(bytes\) that joins a bucket\.\s+"
        r"\(default: 262144\)",
        bucket,
    )
    assert "min-ops=<int>" in bucket and "(default: 2)" in bucket
    defer = "\n".join(lines[lines.index("  defer-modular-reduction") : xdsl_at])
    assert re.search(r"max-group-size=<int> +Upper bound", defer) and "(default: unset)" in defer
    xdsl = " ".join(lines[xdsl_at + 1 :])
    names = [name.strip() for name in xdsl.split(",")]
    assert {"canonicalize", "cse", "dce"} <= set(names) and "bucket-all-reduces" not in names
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    # The -p help no longer lists every pass in one blob.
    assert "apply-eqsat-pdl" not in "\n".join(lines[:distir_at])


def test_parsing_diagnostics_show_no_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "esc.mlir"
    path.write_text(VALID.replace("%y = ", "%y = \x1b[31m"))
    main([str(path), "--parsing-diagnostics"])
    out = capsys.readouterr().out
    assert "Unexpected character" in out and not CONTROL.search(out)


@pytest.mark.parametrize("text", ["", "\n", "// only a comment\n"])
def test_an_empty_or_comment_only_file_is_an_empty_module(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As mlir-opt: nothing but comments is an empty module, not a parse error."""
    path = tmp_path / "empty.mlir"
    path.write_text(text)
    main([str(path)])
    assert capsys.readouterr().out == "builtin.module {\n}\n\n"  # as for any module


@pytest.mark.slow
def test_a_reader_closing_the_output_early_ends_it_quietly() -> None:
    """`distir-opt -p print-transfer-maps ... | head -1`: no BrokenPipeError
    message, the status a program SIGPIPE ended has (128 + 13)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "mesh_transfer.mlir"
    process = subprocess.Popen(
        [sys.executable, "-m", "distir.cli.opt", "-p", "print-transfer-maps", str(example)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    # The reader is gone before the first write (as `head` is after its
    # lines): every write the program makes meets a closed pipe.
    process.stdout.close()
    error = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, error
    assert "BrokenPipeError" not in error and "Traceback" not in error, error
