"""User assertions the IR can check are checked: a `commutative` marker on a
combine whose result provably depends on the order is refused by the
verifier (`ir.analysis.non_commutative_witness`), and every pass option
accepts exactly the values its field declares (`passes.option`)."""

from __future__ import annotations

import dataclasses

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


def witness_inputs(element: str, seed: int) -> list[list[torch.Tensor]]:
    from tests.backends.dtype_cases import DTYPES

    g = torch.Generator().manual_seed(seed)
    pairs = [(2, 5), (0, 3), (1, 2), (6, 3), (1, 0)]
    low = torch.tensor([p[0] for p in pairs] + torch.randint(0, 9, (N - 5,), generator=g).tolist())
    high = torch.tensor([p[1] for p in pairs] + torch.randint(0, 9, (N - 5,), generator=g).tolist())
    return [[low.to(DTYPES[element])], [high.to(DTYPES[element])]]


def same(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.is_floating_point():
        return torch.equal(x.isnan(), y.isnan()) and torch.equal(x[~x.isnan()], y[~y.isnan()])
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
    plain = distir.compile(program(lines, value, element, commutative=False))
    inputs = witness_inputs(element, 0)
    forward = distir.simulate(plain, inputs)[0]
    backward = distir.simulate(plain, inputs[::-1])[0]
    if why is not None:
        assert "is marked commutative but its combine is not" in why
        assert "'dist.all_reduce' at <program>:2:3" in why
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
