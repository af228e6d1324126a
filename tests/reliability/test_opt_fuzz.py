"""Fuzzing distir-opt with mutated IR, byte-level garbage and deep nesting:
never a traceback, always exit 0 or 1, a reason on failure, and a bounded
time per input."""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

from distir.cli.opt import main as opt_main

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.mlir"))
SEEDS = [p.read_text() for p in EXAMPLES]

TOKENS = [
    "%",
    "%x",
    "@",
    "@g",
    ":",
    ",",
    "(",
    ")",
    "{",
    "}",
    "<",
    ">",
    "[",
    "]",
    "->",
    "=",
    "tensor<",
    "tensor<?x",
    "xi64>",
    "xf32>",
    "index",
    "i1",
    "dist.all_reduce",
    "dist.yield",
    "dist.broadcast",
    "dist.all_gather",
    "dist.variable_all_to_all",
    "dist.group",
    "dist.all_reduce_add_ciphertext",
    "sum",
    "max",
    "bxor",
    "combine",
    "commutative",
    "axis",
    "root",
    "counts",
    "group",
    "basis",
    "max_modulus_bits",
    "-1",
    "0",
    "7",
    "99999999999999999999",
    '"',
    "// -----",
    "\n",
    "^bb0",
    "func.return",
    "arith.addi",
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


SECONDS_PER_INPUT = 10.0
"""Each input here takes well under a second; a bound that catches a parser
gone quadratic or a hang, not a slow machine."""


@st.composite
def garbage_bytes(draw: st.DrawFn) -> bytes:
    """Random bytes, or an example damaged byte-wise: NUL and control bytes,
    UTF-8 cut inside a character, invalid bytes at random places."""
    kind = draw(st.sampled_from(["random", "damaged", "truncated-utf8", "nul"]))
    if kind == "random":
        return draw(st.binary(min_size=0, max_size=2048))
    data = bytearray(draw(st.sampled_from(SEEDS)).encode())
    if kind == "truncated-utf8":
        # Non-ASCII text (2-4 byte characters), cut before its last byte.
        chars = st.characters(min_codepoint=0x80, exclude_categories=["Cs"])  # no surrogates
        piece = draw(st.text(chars, min_size=1, max_size=4))
        at = draw(st.integers(0, len(data)))
        return (
            bytes(data[:at]) + piece.encode()[:-1] + draw(st.sampled_from([b"", bytes(data[at:])]))
        )
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(data)))
        byte = (
            draw(st.integers(0, 255)) if kind == "damaged" else draw(st.sampled_from([0, 0x1B, 7]))
        )
        data[at:at] = bytes([byte])
    return bytes(data)


OPENERS = {
    # How each kind of nesting opens and closes one level.
    "scf.if": ("scf.if %c {\n", "}\n"),
    "generic scf.if": (
        '"scf.if"(%c) ({\n',
        '"scf.yield"() : () -> ()\n}, {\n"scf.yield"() : () -> ()\n}) : (i1) -> ()\n',
    ),
    "array attribute": ("[", "]"),
    "nested type": ("tensor<", ">"),
    "parenthesis": ("(", ")"),
    "brace": ("{", "}"),
}


@st.composite
def deeply_nested(draw: st.DrawFn) -> str:
    """Regions, attributes or brackets nested around the limit and beyond,
    closed or left open."""
    kind = draw(st.sampled_from(sorted(OPENERS)))
    depth = draw(st.integers(90, 400))
    opener, closer = OPENERS[kind]
    closed = draw(st.booleans())
    if kind.endswith("scf.if"):
        body = opener * depth + "%y = dist.all_reduce sum %x : tensor<4xf32>\n"
        body += closer * depth if closed else ""
        return (
            "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
            f"%c = arith.constant true\n{body}func.return %x : tensor<4xf32>\n}}\n"
        )
    inner = "f32" if kind == "nested type" else ""
    attribute = opener * depth + inner + (closer * depth if closed else "")
    return f'func.func @main() {{\n  "func.return"() {{a = {attribute}}} : () -> ()\n}}\n'


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
    max_examples=examples(1.5),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    text=mutated_programs(),
    passes=st.sampled_from(["", "lower-ciphertext-add", "canonicalize,cse", "verify-spmd"]),
)
def test_mutated_ir_never_crashes_distir_opt(tmp_path_factory, text: str, passes: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "mutant.mlir"
    path.write_text(text)
    check_run(path, *(["-p", passes] if passes else []))


def check_run(path: Path, *extra: str) -> None:
    start = time.perf_counter()
    code, output = run_opt(path, *extra)
    elapsed = time.perf_counter() - start
    assert code in (0, 1), output
    assert "Traceback" not in output
    if code == 1:
        assert output.strip(), "a failure must say why"
    assert elapsed < SECONDS_PER_INPUT, f"{elapsed:.1f} s for one input"


@pytest.mark.timeout(120)
@settings(
    max_examples=examples(1.2),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=garbage_bytes(), split=st.booleans())
def test_byte_garbage_never_crashes_distir_opt(tmp_path_factory, data: bytes, split: bool) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "garbage.mlir"
    path.write_bytes(data)
    check_run(path, *(["--split-input-file"] if split else []))


@pytest.mark.timeout(120)
@settings(
    max_examples=examples(0.4),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=deeply_nested(), generic=st.booleans())
def test_deep_nesting_never_crashes_distir_opt(tmp_path_factory, text: str, generic: bool) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "deep.mlir"
    path.write_text(text)
    check_run(path, *(["--print-op-generic"] if generic else []))
