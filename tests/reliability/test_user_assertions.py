"""User assertions the IR can check are checked: a `commutative` marker on a
combine whose result provably depends on the order is refused by the
verifier (`ir.analysis.non_commutative_witness`), and every pass option
accepts exactly the values its field declares (`passes.option`)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

import distir
from distir.errors import CompileError
from distir.passes import DISTIR_PASSES, PipelineError, kebab, parse_pipeline

#: element type -> arith ops that may appear in a generated region
OPS = {
    "i64": ["addi", "subi", "muli", "maxsi", "minsi", "andi", "ori", "xori"],
    "i8": ["addi", "subi", "muli", "maxsi", "minsi", "xori"],
    "ui8": ["addi", "subi", "muli", "maxui", "minui"],
    "f32": ["addf", "subf", "mulf", "divf", "maximumf", "minimumf", "maxnumf"],
    "f64": ["addf", "subf", "mulf", "divf", "minimumf"],
    "bf16": ["addf", "subf", "mulf", "maximumf"],
}
COMMUTATIVE_OPS = {"addi", "muli", "maxsi", "minsi", "andi", "ori", "xori", "maxui", "minui",
                   "addf", "mulf", "maximumf", "minimumf", "maxnumf"}  # fmt: skip
CONSTANTS = {"i64": [1, 3, -2], "i8": [1, 3], "ui8": [1, 3], "f32": [1.0, 0.5, -2.0],
             "f64": [1.0, 3.0], "bf16": [1.0, 2.0]}  # fmt: skip
N = 64


@st.composite
def expressions(draw, element: str, depth: int = 3) -> str:
    """A region body as nested (op, lhs, rhs) tuples over "a", "b" and constants."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(
            st.sampled_from(["a", "b", ("const", draw(st.sampled_from(CONSTANTS[element])))])
        )
    op = draw(st.sampled_from(OPS[element]))
    return (op, draw(expressions(element, depth - 1)), draw(expressions(element, depth - 1)))


def region(expr, element: str, swap: bool = False) -> tuple[list[str], str]:
    """(lines, value name) computing `expr` (with a, b exchanged if `swap`)."""
    t = f"tensor<{N}x{element}>"
    lines: list[str] = []

    def emit(e) -> str:
        if e in ("a", "b"):
            return "%" + ({"a": "b", "b": "a"}[e] if swap else e)
        if e[0] == "const":
            name = f"%v{len(lines)}"
            literal = repr(float(e[1])) if element.startswith(("f", "bf")) else str(e[1])
            lines.append(f"{name} = arith.constant dense<{literal}> : {t}")
            return name
        lhs, rhs = emit(e[1]), emit(e[2])
        name = f"%v{len(lines)}"
        lines.append(f"{name} = arith.{e[0]} {lhs}, {rhs} : {t}")
        return name

    return lines, emit(expr)


def program(lines: list[str], value: str, element: str, commutative: bool) -> str:
    t = f"tensor<{N}x{element}>"
    if value in ("%a", "%b"):  # a bare argument: copy it through one op
        lines = [*lines, f"%v = arith.{OPS[element][3]} {value}, {value} : {t}"]
        value = "%v"
    body = "\n".join(f"    {line}" for line in lines)
    marker = " commutative" if commutative else ""
    return (
        f"func.func @main(%x: {t}) -> {t} {{\n"
        f"  %y = dist.all_reduce %x{marker} : {t} combine(%a, %b) {{\n{body}\n"
        f"    dist.yield {value} : {t}\n  }}\n  func.return %y : {t}\n}}"
    )


def refusal(source: str) -> str | None:
    try:
        distir.compile(source)
    except CompileError as e:
        return str(e)
    return None


def witness_inputs(why: str, element: str) -> list[list[torch.Tensor]]:
    """Two ranks' inputs holding the pair the refusal names: rank 0 all a,
    rank 1 all b (`combine(a, b) = ... while combine(b, a) = ...`)."""
    from tests.transport.dtype_cases import DTYPES

    a, b = re.search(r"combine\(([^,]+), ([^)]+)\) = ", why).groups()
    return [[torch.full((N,), float(v)).to(DTYPES[element])] for v in (a, b)]


def same(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.is_floating_point():
        kept = ~x.isnan()  # ±0 differ (their signs), any NaN is the same NaN
        return (
            torch.equal(x.isnan(), y.isnan())
            and torch.equal(x[kept], y[kept])
            and torch.equal(x[kept].signbit(), y[kept].signbit())
        )
    return torch.equal(x, y)


@settings(max_examples=examples(0.6), deadline=None)
@given(st.data())
def test_a_refused_commutative_marker_is_one_the_kernels_refute(data):
    """Soundness: whenever the verifier refuses, the reference itself gives
    combine(a, b) != combine(b, a) (two ranks, then the same ranks swapped)."""
    element = data.draw(st.sampled_from(sorted(OPS)))
    expr = data.draw(expressions(element))
    lines, value = region(expr, element)
    why = refusal(program(lines, value, element, commutative=True))
    if why is not None:
        assert "is marked commutative but its combine is not" in why
        assert "'dist.all_reduce' at <program>:2:3" in why
        plain = distir.compile(program(lines, value, element, commutative=False))
        inputs = witness_inputs(why, element)
        forward = distir.simulate(plain, inputs)[0]
        backward = distir.simulate(plain, inputs[::-1])[0]
        assert not same(forward, backward), why


@settings(max_examples=examples(0.4), deadline=None)
@given(st.data())
def test_a_region_symmetric_by_construction_is_never_refused(data):
    """combine(a, b) = g(a, b) ⊕ g(b, a) with ⊕ commutative."""
    element = data.draw(st.sampled_from(sorted(OPS)))
    expr = data.draw(expressions(element))
    join = data.draw(st.sampled_from([o for o in OPS[element] if o in COMMUTATIVE_OPS]))
    lines, left = region(expr, element)
    more, right = region(expr, element, swap=True)
    more = [line.replace("%v", "%w") for line in more]
    right = right.replace("%v", "%w")
    t = f"tensor<{N}x{element}>"
    source = program(
        [*lines, *more, f"%s = arith.{join} {left}, {right} : {t}"], "%s", element, True
    )
    assert refusal(source) is None


@pytest.mark.parametrize(
    "op, element",
    [
        ("subf", "f32"),
        ("subi", "i64"),
        ("divf", "f32"),
        ("subi", "ui8"),
        ("divf", "bf16"),
        ("subf", "f64"),
    ],  # fmt: skip
)
def test_the_issue_examples_are_refused(op, element):
    """Before, `commutative` on these compiled and the ring folded them in
    another order than the reference (on large tensors)."""
    t = f"tensor<4096x{element}>"
    source = program([f"%d = arith.{op} %a, %b : {t}"], "%d", element, True).replace(
        f"tensor<{N}x", "tensor<4096x"
    )
    why = refusal(source)
    assert why is not None and "is marked commutative but its combine is not" in why, why
    assert refusal(source.replace(" commutative", "")) is None


# Pass options -----------------------------------------------------------------


def declared_options():
    """(pass name, option, constraint metadata) of every constrained option."""
    found = []
    for name, factory in DISTIR_PASSES.items():
        for f in dataclasses.fields(factory()):
            if f.metadata:
                found.append((name, kebab(f.name), dict(f.metadata)))
    return found


def test_the_issue_options_are_constrained():
    constrained = {(p, o) for p, o, _ in declared_options()}
    assert {
        ("select-all-reduce-algorithm", "commutative"),
        ("select-all-reduce-algorithm", "ordered"),
        ("select-all-reduce-algorithm", "whole"),
        ("select-all-reduce-algorithm", "group-size"),
        ("bucket-all-reduces", "min-ops"),
        ("defer-modular-reduction", "max-group-size"),
    } <= constrained


@settings(max_examples=examples(1.5), deadline=None)
@given(st.data())
def test_every_option_accepts_exactly_its_declared_values(data):
    name, option, metadata = data.draw(st.sampled_from(declared_options()))
    choices = metadata.get("distir.choices")
    if choices:
        value = data.draw(
            st.one_of(
                st.sampled_from(choices),
                st.sampled_from(["ring", "gather-fold", "bogus", "Ring", "tree"]),
            )
        )
        valid = value in choices
    else:
        value = data.draw(st.integers(-10, 10))
        valid = value >= metadata["distir.minimum"]
    spec = f"{name}{{{option}={value}}}"
    if valid:
        parse_pipeline(spec)
    else:
        with pytest.raises(PipelineError, match=f"option '{option}' must be"):
            parse_pipeline(spec)
        with pytest.raises(CompileError, match=f"option '{option}' must be"):
            distir.compile("func.func @main() {\n  func.return\n}", spec)


@pytest.mark.parametrize(
    "t, constant",
    [("tensor<0xi64>", "dense<> : tensor<0xi64>"), ("tensor<4xf32>", "dense<0x7F800000> : tensor<4xf32>"),
     ("tensor<4xf32>", "dense<0x7FC00000> : tensor<4xf32>"), ("tensor<4xi64>", "dense<64> : tensor<4xi64>")],
)  # fmt: skip
def test_regions_the_evaluator_cannot_decide_are_trusted_not_crashed_on(t, constant):
    """Empty tensors, infinite and NaN constants, shifts past the width."""
    op = "addf" if "f32" in t else "shli"
    source = (
        f"func.func @main(%x: {t}) -> {t} {{\n"
        f"  %y = dist.all_reduce %x commutative : {t} combine(%a, %b) {{\n"
        f"    %c = arith.constant {constant}\n"
        f"    %s = arith.{op} %a, %c : {t}\n"
        f"    %r = arith.{'addf' if 'f32' in t else 'addi'} %s, %b : {t}\n"
        f"    dist.yield %r : {t}\n  }}\n  func.return %y : {t}\n}}"
    )
    why = refusal(source)
    assert why is None or "is marked commutative but its combine is not" in why, why


# -- sign-dependent combines: the witnesses cover the whole value domain ----------------

F6 = "tensor<6xf32>"
SIGN_DEPENDENT = {
    # a tie of x and -x keeps the left operand: (2, -2)
    "abs-max keeping a on ties": [
        f"%p = math.absf %a : {F6}",
        f"%q = math.absf %b : {F6}",
        f"%w = arith.cmpf oge, %p, %q : {F6}",
        f"%r = arith.select %w, %a, %b : tensor<6xi1>, {F6}",
    ],
    # +0 and -0 compare equal: the left one is kept
    "max by select": [
        f"%w = arith.cmpf oge, %a, %b : {F6}",
        f"%r = arith.select %w, %a, %b : tensor<6xi1>, {F6}",
    ],
    # a NaN loses every ordered comparison: kept only on the right
    "max by ogt": [
        f"%w = arith.cmpf ogt, %a, %b : {F6}",
        f"%r = arith.select %w, %a, %b : tensor<6xi1>, {F6}",
    ],
    # inf - inf is NaN: differs only at infinity
    "a - a + b": [f"%d = arith.subf %a, %a : {F6}", f"%r = arith.addf %d, %b : {F6}"],
}

ABS_MAX = [
    f"%p = math.absf %a : {F6}",
    f"%q = math.absf %b : {F6}",
    f"%bigger = arith.cmpf ogt, %p, %q : {F6}",
    f"%smaller = arith.cmpf olt, %p, %q : {F6}",
    f"%tie = arith.maximumf %a, %b : {F6}",
    f"%s = arith.select %smaller, %b, %tie : tensor<6xi1>, {F6}",
    f"%r = arith.select %bigger, %a, %s : tensor<6xi1>, {F6}",
]


def _combine(lines: list[str], commutative: bool) -> str:
    body = "\n".join(f"    {line}" for line in lines)
    marker = " commutative" if commutative else ""
    return (
        f"func.func @main(%x: {F6}) -> {F6} {{\n"
        f"  %y = dist.all_reduce %x{marker} : {F6} combine(%a, %b) {{\n{body}\n"
        f"    dist.yield %r : {F6}\n  }}\n  func.return %y : {F6}\n}}"
    )


@pytest.mark.parametrize("name", sorted(SIGN_DEPENDENT))
def test_a_sign_dependent_combine_marked_commutative_is_refuted(name):
    why = refusal(_combine(SIGN_DEPENDENT[name], commutative=True))
    assert why is not None and "is marked commutative but its combine is not" in why, why
    # and the kernels agree: the named pair, swapped, gives another result
    plain = distir.compile(_combine(SIGN_DEPENDENT[name], commutative=False))
    a, b = re.search(r"combine\(([^,]+), ([^)]+)\) = ", why).groups()
    inputs = [[torch.full((6,), float(v))] for v in (a, b)]
    forward = distir.simulate(plain, inputs)[0]
    backward = distir.simulate(plain, inputs[::-1])[0]
    assert not same(forward, backward), why


SPECIALS = [0.0, -0.0, 2.0, -2.0, math.inf, -math.inf, math.nan, 3.4e38, -3.4e38, 1e-45]


def test_the_readme_abs_max_is_commutative_on_every_pair_of_special_values():
    """Accepted by the verifier, and on three ranks in every order the
    simulator gives one result, the numpy oracle's."""
    assert refusal(_combine(ABS_MAX, commutative=True)) is None
    plain = distir.compile(_combine(ABS_MAX, commutative=False))
    rows = list(itertools.product(SPECIALS, repeat=3))
    for start in range(0, len(rows), 6):
        chunk = rows[start : start + 6]
        chunk += [chunk[-1]] * (6 - len(chunk))
        ranks = [torch.tensor([row[r] for row in chunk], dtype=torch.float32) for r in range(3)]
        oracle = _abs_max_oracle(np.stack([x.numpy() for x in ranks]))
        for order in itertools.permutations(range(3)):
            got = distir.simulate(plain, [[ranks[r]] for r in order])[0]
            assert same(got, torch.from_numpy(oracle)), (order, chunk, got, oracle)


def _abs_max_oracle(stacked: np.ndarray) -> np.ndarray:
    """Per column: NaN if any; else the largest |x|, ties to the larger x."""
    out = []
    for column in stacked.T:
        if np.isnan(column).any():
            out.append(np.float32(np.nan))
            continue
        out.append(max(column.tolist(), key=lambda v: (abs(v), v, math.copysign(1, v))))
    return np.array(out, dtype=np.float32)
