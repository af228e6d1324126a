"""`distir-opt` as a user runs it: located errors and exit status 1 on bad
input, never a Python traceback; examples print back as a fixed point.

Each subprocess pays for importing the package, so every command the tests
need is started at once by one module-scoped fixture and the tests read its
results. Details are then checked in-process through `main()`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from distir.cli.opt import main
from distir.ir.parsing import parse_module

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


# Generic form: a broadcast with no root, which the custom printer cannot print.
BROADCAST_WITHOUT_ROOT = """\
func.func @main(%x: tensor<4xf32>) {
  %y = "dist.broadcast"(%x) : (tensor<4xf32>) -> tensor<4xf32>
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


def _examples_joined() -> str:
    return SEPARATOR.join(path.read_text() for path in EXAMPLES)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    tmp = tmp_path_factory.mktemp("opt")
    for name, text in {"valid": VALID, "syntax": SYNTAX_ERROR, "verify": VERIFY_ERROR}.items():
        (tmp / f"{name}.mlir").write_text(text)
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
        "unverified": (["--disable-verify"], BROADCAST_WITHOUT_ROOT),
    }
    procs = {
        key: subprocess.Popen(
            [sys.executable, "-m", "distir.cli.opt", *args],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
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
    assert f"{path}:5:3: error:" in err and "out of range" in err


def test_unknown_file_extension(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "prog.txt"
    path.write_text(VALID)
    assert "Unrecognized file extension 'txt'" in _main_fails([str(path)], capsys)
