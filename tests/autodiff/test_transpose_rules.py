"""Every transpose rule against finite differences of the whole SPMD
computation, in the reference simulator.

For a program and P ranks' inputs, the global function is
F(x) = Σ_r <dy_r, y_r(x)> over every rank's float results (the simulator
computes y for all ranks at once). The backward program, run in the
simulator on the cotangents dy, must give ∂F/∂x_r on every rank: checked
along random directions v (Σ_r <dx_r, v_r> against a central difference of
F, exact for the at most quadratic programs here up to rounding).
Hypothesis draws the op family, shapes, P in 2..5 and counts with zeros.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spmd_gradcheck import Inputs, check_gradients
from spmd_gradcheck import floats as _floats
from strategies import examples

import distir
from distir.errors import NotDifferentiable, UnsupportedOpError
from distir.passes.vjp import is_float
from distir.runtime.autograd import simulate_vjp
from distir.runtime.inputs import synthesize_inputs


def _t(shape, element: str = "f64") -> str:
    return "tensor<" + "".join(("?" if d is None else str(d)) + "x" for d in shape) + element + ">"


# -- program families -------------------------------------------------------------


def sum_and_local_ops(draw, P: int, seed: int) -> tuple[str, Inputs]:
    shape = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    t = _t(shape)
    generic = draw(st.booleans())
    reduce = (
        f"%s = dist.all_reduce %p commutative : {t} combine(%a, %b) {{\n"
        f"    %c = arith.addf %a, %b : {t}\n    dist.yield %c : {t}\n  }}"
        if generic
        else f"%s = dist.all_reduce sum %p : {t}"
    )
    text = f"""
func.func @main(%x: {t}, %w: {t}) -> ({t}, {t}) {{
  %p = arith.mulf %x, %w : {t}
  {reduce}
  %q = arith.subf %s, %x : {t}
  %d = arith.divf %q, %w : {t}
  %n = arith.negf %d : {t}
  func.return %n, %s : {t}, {t}
}}"""
    inputs = [[_floats(shape, seed + r), _floats(shape, seed + 50 + r, 1.0, 2.0)] for r in range(P)]
    return text, inputs


def broadcast(draw, P: int, seed: int) -> tuple[str, Inputs]:
    shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=2))
    root = draw(st.integers(0, P - 1))
    t = _t(shape)
    if draw(st.booleans()):
        text = f"""
func.func @main(%x: {t}, %r: index) -> {t} {{
  %y = dist.broadcast %x root %r : {t}
  %z = arith.mulf %y, %x : {t}
  func.return %z : {t}
}}"""
        return text, [[_floats(shape, seed + r), torch.tensor(root)] for r in range(P)]
    text = f"""
func.func @main(%x: {t}) -> {t} {{
  %y = dist.broadcast %x root {root} : {t}
  func.return %y : {t}
}}"""
    return text, [[_floats(shape, seed + r)] for r in range(P)]


def gather_even(draw, P: int, seed: int) -> tuple[str, Inputs]:
    shape = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    axis = draw(st.integers(0, len(shape) - 1))
    out = list(shape)
    out[axis] = None
    text = f"""
func.func @main(%x: {_t(shape)}) -> {_t(out)} {{
  %y = dist.all_gather %x axis {axis} : {_t(shape)} -> {_t(out)}
  func.return %y : {_t(out)}
}}"""
    return text, [[_floats(shape, seed + r)] for r in range(P)]


def reduce_scatter(draw, P: int, seed: int) -> tuple[str, Inputs]:
    """Native sum or an addf region, even or uneven counts, any axis; the
    part is multiplied by itself so that the cotangent reaching the
    reduce-scatter differs by rank."""
    shape = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    axis = draw(st.integers(0, len(shape) - 1))
    out = list(shape)
    if draw(st.booleans()):
        counts = draw(st.lists(st.integers(0, 3), min_size=P, max_size=P))
        shape[axis] = sum(counts)
        out[axis] = None
        split = f" counts [{', '.join(map(str, counts))}]"
    else:
        shape[axis] *= P
        split = ""
    t, to = _t(shape), _t(out)
    if draw(st.booleans()):
        op = (f"dist.reduce_scatter %x{split} axis {axis} : {t} -> {to} combine(%a, %b) {{\n"
              f"    %c = arith.addf %a, %b : {t}\n    dist.yield %c : {t}\n  }}")  # fmt: skip
    else:
        op = f"dist.reduce_scatter sum %x{split} axis {axis} : {t} -> {to}"
    text = f"""
func.func @main(%x: {t}) -> {to} {{
  %y = {op}
  %z = arith.mulf %y, %y : {to}
  func.return %z : {to}
}}"""
    return text, [[_floats(shape, seed + r)] for r in range(P)]


def gather_uneven(draw, P: int, seed: int) -> tuple[str, Inputs]:
    counts = draw(st.lists(st.integers(0, 3), min_size=P, max_size=P))
    cols = draw(st.integers(1, 3))
    t = _t([None, cols])
    c = _t([P], "i64")
    text = f"""
func.func @main(%x: {t}, %c: {c}) -> {t} {{
  %y = dist.all_gather %x counts(%c : {c}) axis 0 : {t} -> {t}
  func.return %y : {t}
}}"""
    return text, [[_floats([counts[r], cols], seed + r), torch.tensor(counts)] for r in range(P)]


def rooted_gather_scatter(draw, P: int, seed: int) -> tuple[str, Inputs]:
    """`dist.gather` or `dist.scatter` to/from a drawn root, even along any
    axis or uneven (counts with zeros), then a square (a nonlinear use)."""
    op = draw(st.sampled_from(["gather", "scatter"]))
    root = draw(st.integers(0, P - 1))
    if draw(st.booleans()):
        shape = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
        axis = draw(st.integers(0, len(shape) - 1))
        whole = list(shape)
        whole[axis] *= P
        t_in, t_out = (shape, whole) if op == "gather" else (whole, shape)
        text = f"""
func.func @main(%x: {_t(t_in)}) -> {_t(t_out)} {{
  %y = dist.{op} %x axis {axis} root {root} : {_t(t_in)} -> {_t(t_out)}
  %z = arith.mulf %y, %y : {_t(t_out)}
  func.return %z : {_t(t_out)}
}}"""
        return text, [[_floats(t_in, seed + r)] for r in range(P)]
    counts = draw(st.lists(st.integers(0, 3), min_size=P, max_size=P))
    cols = draw(st.integers(1, 3))
    t = _t([None, cols])
    c = _t([P], "i64")
    text = f"""
func.func @main(%x: {t}, %c: {c}) -> {t} {{
  %y = dist.{op} %x counts(%c : {c}) axis 0 root {root} : {t} -> {t}
  %z = arith.mulf %y, %y : {t}
  func.return %z : {t}
}}"""
    rows = [counts[r] if op == "gather" else sum(counts) for r in range(P)]
    return text, [[_floats([rows[r], cols], seed + r), torch.tensor(counts)] for r in range(P)]


def rooted_reduce(draw, P: int, seed: int) -> tuple[str, Inputs]:
    """A sum `dist.reduce` to a drawn root, then a product with the input (a
    nonlinear use on every rank, the zeros off the root included)."""
    shape = draw(st.lists(st.integers(0, 3), min_size=0, max_size=3))
    root = draw(st.integers(0, P - 1))
    t = _t(shape)
    text = f"""
func.func @main(%x: {t}) -> {t} {{
  %y = dist.reduce sum %x root {root} : {t}
  %z = arith.mulf %y, %x : {t}
  func.return %z : {t}
}}"""
    return text, [[_floats(shape, seed + r)] for r in range(P)]


def shift(draw, P: int, seed: int) -> tuple[str, Inputs]:
    """`dist.shift` by a drawn offset, cyclic or with open ends, then a
    product with the input."""
    shape = draw(st.lists(st.integers(0, 3), min_size=0, max_size=2))
    offset = draw(st.integers(-P - 1, P + 1))
    ring = " rotate" if draw(st.booleans()) else ""
    t = _t(shape)
    text = f"""
func.func @main(%x: {t}) -> {t} {{
  %y = dist.shift %x offset {offset}{ring} : {t}
  %z = arith.mulf %y, %x : {t}
  func.return %z : {t}
}}"""
    return text, [[_floats(shape, seed + r)] for r in range(P)]


def all_to_all(draw, P: int, seed: int) -> tuple[str, Inputs]:
    sends = [draw(st.lists(st.integers(0, 2), min_size=P, max_size=P)) for _ in range(P)]
    cols = draw(st.integers(1, 3))
    t = _t([None, cols])
    c = _t([P], "i64")
    text = f"""
func.func @main(%x: {t}, %s: {c}) -> ({t}, {c}) {{
  %y, %r = dist.variable_all_to_all %x, %s axis 0 : {t}, {c} -> {t}
  %z = arith.mulf %y, %y : {t}
  func.return %z, %r : {t}, {c}
}}"""
    inputs = [[_floats([sum(sends[r]), cols], seed + r), torch.tensor(sends[r])] for r in range(P)]
    return text, inputs


def ring_shift(draw, P: int, seed: int) -> tuple[str, Inputs]:
    shift = draw(st.integers(1, P - 1))
    t = _t([3])
    text = f"""
func.func @main(%x: {t}) -> {t} {{
  %n = dist.group_size : index
  %r = dist.rank : index
  %k = arith.constant {shift} : index
  %a = arith.addi %r, %k : index
  %next = arith.remui %a, %n : index
  %b = arith.addi %r, %n : index
  %c = arith.subi %b, %k : index
  %prev = arith.remui %c, %n : index
  %y = dist.sendrecv %x to %next from %prev : {t} -> {t}
  %z = arith.mulf %y, %x : {t}
  func.return %z : {t}
}}"""
    return text, [[_floats([3], seed + r)] for r in range(P)]


def wave(draw, P: int, seed: int) -> tuple[str, Inputs]:
    root = draw(st.integers(0, P - 1))
    t = _t([4])
    text = f"""
func.func @main(%x: {t}, %z: {t}) -> ({t}, {t}) {{
  %a, %b = dist.wave {{
    %s = dist.all_reduce sum %x : {t}
    %u = dist.broadcast %z root {root} : {t}
    dist.yield %s, %u : {t}, {t}
  }} : {t}, {t}
  %m = arith.mulf %a, %b : {t}
  func.return %m, %a : {t}, {t}
}}"""
    return text, [[_floats([4], seed + r), _floats([4], seed + 9 + r)] for r in range(P)]


def transfer(draw, P: int, seed: int) -> tuple[str, Inputs]:
    rows, cols = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    layouts = draw(
        st.sampled_from(
            [
                "[0, *] to @m [*, 0]",  # rows sharded -> columns sharded
                "[0, *] to @m [*, *]",  # sharded -> replicated (an all-gather)
                "[*, *] partial [0] to @m [0, *]",  # partial sums -> rows sharded
                "[*, 0] partial [] to @m [0, *]",
            ]
        )
    )
    ranks = ", ".join(str(r) for r in range(P))
    t = _t([None, None])
    text = f"""
dist.mesh @m [{P}] ranks [{ranks}]
func.func @main(%x: {t}) -> {t} {{
  %y = dist.transfer %x from @m {layouts} global [{rows}, {cols}] : {t} -> {t}
  func.return %y : {t}
}}""".replace(" partial []", "")
    program = distir.compile(text)
    inputs = [
        [x.to(torch.float64) * 2 - 1 for x in synthesize_inputs(program.function, r, P, seed=seed)]
        for r in range(P)
    ]
    return text, inputs


def extract_insert(draw, P: int, seed: int) -> tuple[str, Inputs]:
    i, j = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    t = _t([4])
    text = f"""
func.func @main(%x: {t}, %w: {t}) -> ({t}, f64) {{
  %s = dist.all_reduce sum %x : {t}
  %i = arith.constant {i} : index
  %j = arith.constant {j} : index
  %e = tensor.extract %s[%i] : {t}
  %f = arith.mulf %e, %e : f64
  %y = tensor.insert %f into %w[%j] : {t}
  %c = tensor.cast %y : {t} to {_t([None])}
  %d = tensor.cast %c : {_t([None])} to {t}
  func.return %d, %e : {t}, f64
}}"""
    return text, [[_floats([4], seed + r), _floats([4], seed + 20 + r)] for r in range(P)]


def send_recv_in_branches(draw, P: int, seed: int) -> tuple[str, Inputs]:
    t = _t([3])
    text = f"""
func.func @main(%x: {t}, %w: {t}) -> {t} {{
  %r = dist.rank : index
  %zero = arith.constant 0 : index
  %one = arith.constant 1 : index
  %first = arith.cmpi eq, %r, %zero : index
  %second = arith.cmpi eq, %r, %one : index
  %y = scf.if %first -> ({t}) {{
    %sq = arith.mulf %x, %x : {t}
    dist.send %sq to 1 : {t}
    scf.yield %w : {t}
  }} else {{
    %z = scf.if %second -> ({t}) {{
      %got = dist.recv from 0 : {t}
      scf.yield %got : {t}
    }} else {{
      scf.yield %x : {t}
    }}
    scf.yield %z : {t}
  }}
  %out = arith.mulf %y, %w : {t}
  func.return %out : {t}
}}"""
    return text, [[_floats([3], seed + r), _floats([3], seed + 30 + r)] for r in range(P)]


def slices(draw, P: int, seed: int) -> tuple[str, Inputs]:
    n = draw(st.integers(1, 4))
    row = draw(st.integers(0, n - 1))
    rows = draw(st.integers(0, n - row))
    col, cols = draw(st.integers(0, 2)), 1
    dynamic = draw(st.booleans())
    t, r = _t([None if dynamic else n, 3]), _t([rows, cols])
    offset = "%o" if dynamic else str(row)
    text = f"""
func.func @main(%x: {t}, %o: index) -> {r} {{
  %s = dist.all_reduce sum %x : {t}
  %e = tensor.extract_slice %s[{offset}, {col}] [{rows}, {cols}] [1, 1] : {t} to {r}
  %m = arith.mulf %e, %e : {r}
  func.return %m : {r}
}}"""
    return text, [[_floats([n, 3], seed + q), torch.tensor(row)] for q in range(P)]


def concat_and_casts(draw, P: int, seed: int) -> tuple[str, Inputs]:
    a, b = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    ta, tb, tc = _t([None, 2]), _t([b, 2]), _t([None, 2])
    t32 = _t([None, 2], "f32")
    text = f"""
func.func @main(%x: {ta}, %y: {tb}) -> ({tc}, index) {{
  %c = tensor.concat dim(0) %x, %y : ({ta}, {tb}) -> {tc}
  %s = dist.all_reduce sum %c : {tc}
  %h = arith.truncf %s : {tc} to {t32}
  %w = arith.extf %h : {t32} to {tc}
  %m = arith.mulf %w, %c : {tc}
  %zero = arith.constant 0 : index
  %n = tensor.dim %m, %zero : {tc}
  func.return %m, %n : {tc}, index
}}"""
    # values on a grid of 1/8 (and the finite differences too, see STEPS):
    # the round trip through f32 is exact, as its derivative (identity) says
    inputs = [
        [
            torch.randint(-8, 8, (a, 2), generator=torch.Generator().manual_seed(seed + r)) / 8.0,
            torch.randint(-8, 8, (b, 2), generator=torch.Generator().manual_seed(seed + 9 + r))
            / 8.0,
        ]
        for r in range(P)
    ]
    return text, [[x.double() for x in xs] for xs in inputs]


def extremum(draw, P: int, seed: int) -> tuple[str, Inputs]:
    """max/min all-reduce, alone or in a wave with the other (continuous
    draws: no ties, where the derivative exists; ties and NaN are checked
    exactly below)."""
    shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=2))
    kind = draw(st.sampled_from(["max", "min"]))
    other = "min" if kind == "max" else "max"
    t = _t(shape)
    reduce = (
        f"""%y, %v = dist.wave {{
    %a = dist.all_reduce {kind} %p : {t}
    %b = dist.all_reduce {other} %w : {t}
    dist.yield %a, %b : {t}, {t}
  }} : {t}, {t}"""
        if draw(st.booleans())
        else f"%y = dist.all_reduce {kind} %p : {t}\n  %v = arith.addf %w, %w : {t}"
    )
    text = f"""
func.func @main(%x: {t}, %w: {t}) -> ({t}, {t}) {{
  %p = arith.mulf %x, %w : {t}
  {reduce}
  %z = arith.mulf %y, %x : {t}
  func.return %z, %v : {t}, {t}
}}"""
    return text, [[_floats(shape, seed + r), _floats(shape, seed + 40 + r)] for r in range(P)]


def elementwise_select(draw, P: int, seed: int) -> tuple[str, Inputs]:
    shape = draw(st.lists(st.integers(0, 4), min_size=1, max_size=2))
    t, b = _t(shape), _t(shape, "i1")
    text = f"""
func.func @main(%x: {t}, %w: {t}) -> {t} {{
  %s = dist.all_reduce sum %x : {t}
  %c = arith.cmpf olt, %s, %w : {t}
  %y = arith.select %c, %s, %w : {b}, {t}
  %z = arith.mulf %y, %x : {t}
  func.return %z : {t}
}}"""
    return text, [[_floats(shape, seed + r), _floats(shape, seed + 60 + r)] for r in range(P)]


def broadcast_and_reduce(draw, P: int, seed: int) -> tuple[str, Inputs]:
    """`linalg.broadcast` (transpose: a sum over the added dimensions),
    `linalg.reduce` summing (transpose: a broadcast) and `tensor.splat` of a
    float (transpose: a sum over every dimension)."""
    rank = draw(st.integers(1, 3))
    full = draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
    added = sorted(draw(st.sets(st.integers(0, rank - 1), max_size=rank)))
    kept = [d for i, d in enumerate(full) if i not in added]
    dims = ", ".join(map(str, added))
    t, k = _t(full), _t(kept)
    text = f"""
func.func @main(%x: {k}, %w: {t}, %a: f64) -> ({k}, {t}) {{
  %e = tensor.empty() : {t}
  %b = linalg.broadcast ins(%x : {k}) outs(%e : {t}) dimensions = [{dims}]
  %m = arith.mulf %b, %w : {t}
  %s = dist.all_reduce sum %m : {t}
  %i = tensor.splat %a : {k}
  %r = linalg.reduce ins(%s : {t}) outs(%i : {k}) dimensions = [{dims}]
    (%p: f64, %q: f64) {{
      %y = arith.addf %p, %q : f64
      linalg.yield %y : f64
    }}
  %o = arith.mulf %r, %x : {k}
  func.return %o, %m : {k}, {t}
}}"""
    inputs = [
        [_floats(kept, seed + r), _floats(full, seed + 70 + r), _floats([], seed + 90 + r)]
        for r in range(P)
    ]
    return text, inputs


def static_loop(draw, P: int, seed: int) -> tuple[str, Inputs]:
    """`scf.for` of a static trip count (zero included), its induction
    variable read, a collective per iteration and an outer loop around it."""
    lower, trips, step = draw(st.integers(0, 2)), draw(st.integers(0, 3)), draw(st.integers(1, 2))
    outer = draw(st.integers(1, 2))
    t = _t([3])
    text = f"""
func.func @main(%x: {t}, %w: {t}) -> {t} {{
  %lo = arith.constant {lower} : index
  %hi = arith.constant {lower + trips * step} : index
  %step = arith.constant {step} : index
  %three = arith.constant 3 : index
  %zero = arith.constant 0 : index
  %one = arith.constant 1 : index
  %n = arith.constant {outer} : index
  %z = scf.for %k = %zero to %n step %one iter_args(%c = %x) -> ({t}) {{
    %y = scf.for %i = %lo to %hi step %step iter_args(%acc = %c) -> ({t}) {{
      %j = arith.remui %i, %three : index
      %e = tensor.extract %w[%j] : {t}
      %v = tensor.splat %e : {t}
      %m = arith.mulf %acc, %v : {t}
      %s = dist.all_reduce sum %m : {t}
      %q = arith.addf %s, %acc : {t}
      scf.yield %q : {t}
    }}
    scf.yield %y : {t}
  }}
  %o = arith.mulf %z, %w : {t}
  func.return %o : {t}
}}"""
    return text, [
        [_floats([3], seed + r, -0.5, 0.5), _floats([3], seed + 80 + r)] for r in range(P)
    ]


FAMILIES = {
    f.__name__: f
    for f in (
        sum_and_local_ops, broadcast, gather_even, reduce_scatter, gather_uneven, all_to_all, ring_shift,
        rooted_gather_scatter, rooted_reduce, shift,
        wave, transfer, extract_insert, send_recv_in_branches, concat_and_casts,
        slices, extremum, elementwise_select, broadcast_and_reduce, static_loop,
    )
}  # fmt: skip


#: families checked with a larger, exact step (their programs are polynomial)
STEPS = {"concat_and_casts": 0.125}


@st.composite
def cases(draw, family: str | None = None):
    name = family or draw(st.sampled_from(list(FAMILIES)))
    P = draw(st.integers(2, 5))
    seed = draw(st.integers(0, 10_000))
    text, inputs = FAMILIES[name](draw, P, seed)
    return name, text, inputs, seed


@settings(max_examples=examples(0.3), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_backward_program_gives_the_gradient_of_the_whole_spmd_computation(case):
    name, text, inputs, seed = case
    check_gradients(text, inputs, seed, STEPS.get(name, 1e-4))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_family_at_least_once(data):
    for family in FAMILIES:
        _, text, inputs, seed = data.draw(cases(family))
        check_gradients(text, inputs, seed, STEPS.get(family, 1e-4))


def test_float_types_carry_gradients_and_integers_do_not():
    from xdsl.dialects.builtin import IndexType, TensorType, f32, f64, i1, i64

    assert is_float(TensorType(f32, [2])) and is_float(f64)
    assert not is_float(TensorType(i64, [2])) and not is_float(IndexType()) and not is_float(i1)


REFUSED = {
    "native prod": ("dist.all_reduce prod %x : tensor<3xf64>", "native prod reduction"),
    "reduce_scatter max": (
        "dist.reduce_scatter max %x counts [2, 1] axis 0 : tensor<3xf64> -> tensor<?xf64>",
        "native max reduce-scatter has no derivative",
    ),
    "reduce_scatter generic max": (
        "dist.reduce_scatter %x counts [2, 1] axis 0 : tensor<3xf64> -> tensor<?xf64> combine(%a, %b) {\n"
        "    %m = arith.maximumf %a, %b : tensor<3xf64>\n    dist.yield %m : tensor<3xf64>\n  }",
        "only a combine recognised as a sum",
    ),
    "reduce max": ("dist.reduce max %x root 0 : tensor<3xf64>", "native max reduce"),
    "generic max": (
        "dist.all_reduce %x : tensor<3xf64> combine(%a, %b) {\n"
        "    %m = arith.maximumf %a, %b : tensor<3xf64>\n    dist.yield %m : tensor<3xf64>\n  }",
        "only a combine recognised as a sum",
    ),
}


def test_a_loop_carrying_floats_without_a_static_trip_count_is_named():
    text = """
func.func @main(%x: tensor<3xf64>) -> tensor<3xf64> {
  %hi = dist.group_size : index
  %lo = arith.constant 0 : index
  %step = arith.constant 1 : index
  %y = scf.for %i = %lo to %hi step %step iter_args(%acc = %x) -> (tensor<3xf64>) {
    %s = dist.all_reduce sum %acc : tensor<3xf64>
    scf.yield %s : tensor<3xf64>
  }
  func.return %y : tensor<3xf64>
}"""
    program = distir.compile(text)
    x = [[torch.ones(3, dtype=torch.float64)] for _ in range(2)]
    with pytest.raises(NotDifferentiable, match=r"'scf.for' at <program>:6:.*static trip count"):
        simulate_vjp(program, x, x)


def test_a_reduce_other_than_a_sum_has_no_kernel_and_is_named():
    text = """
func.func @main(%x: tensor<2x3xf64>, %i: tensor<3xf64>) -> tensor<3xf64> {
  %r = linalg.reduce ins(%x : tensor<2x3xf64>) outs(%i : tensor<3xf64>) dimensions = [0]
    (%a: f64, %b: f64) {
      %m = arith.mulf %a, %b : f64
      linalg.yield %m : f64
    }
  func.return %r : tensor<3xf64>
}"""
    with pytest.raises(UnsupportedOpError, match=r"'linalg.reduce' at <program>:3:.*arith.addf"):
        distir.compile(text)


def test_ops_without_derivative_are_named_with_their_location():
    for name, (op, words) in REFUSED.items():
        result = "tensor<?xf64>" if "->" in op else "tensor<3xf64>"
        text = f"""
func.func @main(%x: tensor<3xf64>) -> {result} {{
  %y = {op}
  func.return %y : {result}
}}"""
        program = distir.compile(text)
        x = [[torch.ones(3)] for _ in range(2)]
        try:
            simulate_vjp(program, x, x)
        except NotDifferentiable as e:
            where = f"'{op.split()[0]}' at <program>:3:"
            assert words in str(e) and where in str(e), (name, e)
        else:
            raise AssertionError(f"{name}: no NotDifferentiable")


@settings(max_examples=examples(0.25), deadline=None)
@given(
    kind=st.sampled_from(["max", "min"]),
    values=st.integers(2, 5).flatmap(
        lambda P: st.lists(
            st.lists(st.sampled_from([0.0, 1.0, 2.0, float("nan")]), min_size=4, max_size=4),
            min_size=P,
            max_size=P,
        )
    ),
)
def test_an_extremum_gradient_goes_to_the_lowest_rank_holding_it(kind, values):
    """Ties (frequent here) give the whole summed cotangent to the lowest
    rank whose input equals the result; where the result is NaN (the
    reference propagates NaN), to the lowest rank whose input is NaN."""
    P = len(values)
    text = f"""
func.func @main(%x: tensor<4xf64>) -> tensor<4xf64> {{
  %y = dist.all_reduce {kind} %x : tensor<4xf64>
  func.return %y : tensor<4xf64>
}}"""
    xs = [[torch.tensor(v, dtype=torch.float64)] for v in values]
    dys = [[torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64) * (r + 1)] for r in range(P)]
    _, gradients = simulate_vjp(distir.compile(text), xs, dys)
    total = sum(dy[0] for dy in dys)
    for i in range(4):
        column = [v[i] for v in values]
        if any(c != c for c in column):
            holder = next(r for r, c in enumerate(column) if c != c)
        else:
            best = max(column) if kind == "max" else min(column)
            holder = column.index(best)
        for r in range(P):
            expected = float(total[i]) if r == holder else 0.0
            assert float(gradients[r][0][i]) == expected, (i, r, column)


@pytest.mark.parametrize("dims", [[], [0], [1], [0, 2], [0, 1, 2]])
def test_a_sum_reduce_adds_the_listed_dimensions_into_its_init(dims):
    full = [2, 3, 4]
    kept = [d for i, d in enumerate(full) if i not in dims]
    t, k = _t(full), _t(kept)
    text = f"""
func.func @main(%x: {t}, %i: {k}) -> {k} {{
  %r = linalg.reduce ins(%x : {t}) outs(%i : {k}) dimensions = [{", ".join(map(str, dims))}]
    (%a: f64, %b: f64) {{
      %s = arith.addf %b, %a : f64
      linalg.yield %s : f64
    }}
  func.return %r : {k}
}}"""
    x = torch.arange(24, dtype=torch.float64).reshape(full)
    init = torch.full(kept, 0.5, dtype=torch.float64)
    (got,) = distir.compile(text).simulate([[x, init]])
    expected = init + (x.sum(dim=dims) if dims else x)
    assert torch.equal(got, expected) and torch.equal(
        init, torch.full(kept, 0.5, dtype=torch.float64)
    )
