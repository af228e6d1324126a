"""Fuzzing distir-opt with mutated IR: never a traceback, always exit 0 or 1."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distir.cli.opt import main as opt_main

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.mlir"))
SEEDS = [p.read_text() for p in EXAMPLES]

TOKENS = [
    "%", "%x", "@", "@g", ":", ",", "(", ")", "{", "}", "<", ">", "[", "]", "->", "=",
    "tensor<", "tensor<?x", "xi64>", "xf32>", "index", "i1", "dist.all_reduce", "dist.yield",
    "dist.broadcast", "dist.all_gather", "dist.variable_all_to_all", "dist.group",
    "dist.all_reduce_add_ciphertext", "sum", "max", "bxor", "combine", "commutative",
    "axis", "root", "counts", "group", "basis", "max_modulus_bits", "-1", "0", "7",
    "99999999999999999999", "\"", "// -----", "\n", "^bb0", "func.return", "arith.addi",
]


@st.composite
def mutated_programs(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "duplicate-line", "swap-lines"]))
        if kind == "delete" and text:
            i = draw(st.integers(0, len(text) - 1))
            j = draw(st.integers(i, min(len(text), i + 12)))
            text = text[:i] + text[j:]
        elif kind == "insert":
            i = draw(st.integers(0, len(text)))
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        else:
            lines = text.splitlines(keepends=True)
            if len(lines) >= 2:
                a = draw(st.integers(0, len(lines) - 1))
                b = draw(st.integers(0, len(lines) - 1))
                if kind == "duplicate-line":
                    lines.insert(b, lines[a])
                else:
                    lines[a], lines[b] = lines[b], lines[a]
                text = "".join(lines)
    return text


def run_opt(path: Path, *extra: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            opt_main([str(path), *extra])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue() + err.getvalue()


@pytest.mark.timeout(120)
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=mutated_programs(), passes=st.sampled_from(["", "lower-ciphertext-add",
                                                        "canonicalize,cse", "verify-spmd"]))
def test_mutated_ir_never_crashes_distir_opt(tmp_path_factory, text: str, passes: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "mutant.mlir"
    path.write_text(text)
    code, output = run_opt(path, *(["-p", passes] if passes else []))
    assert code in (0, 1), output
    assert "Traceback" not in output
    if code == 1:
        assert output.strip(), "a failure must say why"
