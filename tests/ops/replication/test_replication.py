"""Replication-aware gradients (`dist.pvary`, `dist.psum`, `{dist.replicated}`
arguments): every gradient is that of the sum over ranks of every rank's
objective, in which a replicated value is one value, counted once.

The oracle shares no code with distir: P copies of the computation in one
process, in plain torch autograd, where a replicated value is *one* tensor
that every copy reads (so torch sums what each copy sends back) and a
varying value is P tensors; the objective is the sum over outputs of
<cotangent, output>, once for a replicated output and over every copy for a
varying one. Drawn programs are checked against it on the simulator
(hypothesis) and on gloo ranks at P = 2 and 3 (seeded draws, one launch
per P).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.errors import DistirError, NotDifferentiable
from distir.ir.parsing import parse_module
from distir.passes.vjp import add_vjp
from distir.runtime.autograd import simulate_vjp
from distir.runtime.launch import launch

# -- the Megatron MLP of the issue: f and g, and the natural attempt -----------------

BATCH, D_IN, HIDDEN, D_OUT = 4, 3, 4, 2


def _model() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    return tuple(
        torch.randn(*shape, generator=g, dtype=torch.float64)
        for shape in ((BATCH, D_IN), (BATCH, D_OUT), (D_IN,), (D_IN, HIDDEN), (HIDDEN, D_OUT))
    )


def _reference() -> list[torch.Tensor]:
    """One process: the gradients of (scale, w1, w2) of the whole model."""
    x, target, scale, w1, w2 = (t.clone().requires_grad_(True) for t in _model())
    y = torch.relu((x * scale) @ w1) @ w2
    ((y - target) ** 2).mean().backward()
    return [scale.grad, w1.grad, w2.grad]


def _megatron_worker(ctx, natural: bool) -> list[torch.Tensor]:
    """Rank r holds columns r of w1 and rows r of w2; `scale` (a replicated
    parameter, as a layer norm's) is the same on every rank."""
    P, r = ctx.world_size, ctx.rank
    x, target, scale, w1, w2 = _model()
    cols = torch.tensor_split(torch.arange(HIDDEN), P)[r]
    scale = scale.clone().requires_grad_(True)
    w1 = w1[:, cols].clone().requires_grad_(True)
    w2 = w2[cols, :].clone().requires_grad_(True)
    h = x * scale
    if natural:  # what main allowed: f as a mean all-reduce, g as a sum, loss / P
        h = distir.all_reduce(h, "sum") / P
        y = distir.all_reduce(torch.relu(h @ w1) @ w2, "sum")
        (((y - target) ** 2).mean() / P).backward()
    else:
        y = distir.psum(torch.relu(distir.pvary(h) @ w1) @ w2)
        ((y - target) ** 2).mean().backward()
    return [scale.grad, w1.grad, w2.grad, cols]


@pytest.mark.timeout(120)
def test_f_and_g_give_every_parameter_the_single_process_gradient():
    """Fails on main (no `distir.pvary`/`distir.psum`), where the natural
    attempt below was all a user could write."""
    ref_scale, ref_w1, ref_w2 = _reference()
    for rank, (scale, w1, w2, cols) in enumerate(
        launch(_megatron_worker, 2, False, pass_context=True, timeout=100)
    ):
        torch.testing.assert_close(scale, ref_scale, msg=f"rank {rank}: replicated scale")
        torch.testing.assert_close(w1, ref_w1[:, cols], msg=f"rank {rank}: w1")
        torch.testing.assert_close(w2, ref_w2[cols, :], msg=f"rank {rank}: w2")


@pytest.mark.timeout(120)
def test_the_natural_attempt_divides_the_replicated_gradient_by_P():
    """Why f and g exist: with only the sum all-reduce (a varying result,
    its transpose another sum) the shards' gradients come out right and the
    replicated parameter's is 1/P of it."""
    ref_scale, ref_w1, _ = _reference()
    for scale, w1, _, cols in launch(_megatron_worker, 2, True, pass_context=True, timeout=100):
        torch.testing.assert_close(w1, ref_w1[:, cols])
        torch.testing.assert_close(scale, ref_scale / 2)


# -- the rules, on the simulator ------------------------------------------------------


def _grads(text: str, inputs, cotangents) -> list[list[torch.Tensor | None]]:
    return simulate_vjp(distir.compile(text), inputs, cotangents)[1]


def test_pvary_sums_the_cotangent_and_psum_passes_it_on():
    text = """
func.func @main(%x: tensor<2xf64>, %p: tensor<2xf64>) -> (tensor<2xf64>, tensor<2xf64>) {
  %y = dist.pvary %x : tensor<2xf64>
  %z = dist.psum %p : tensor<2xf64>
  func.return %y, %z : tensor<2xf64>, tensor<2xf64>
}"""
    x = [torch.ones(2, dtype=torch.float64)] * 3
    dy = [torch.tensor([1.0, 2.0], dtype=torch.float64) * (r + 1) for r in range(3)]
    dz = torch.tensor([5.0, -1.0], dtype=torch.float64)
    grads = _grads(text, [[x[r], x[r]] for r in range(3)], [[dy[r], dz] for r in range(3)])
    for dx, dp in grads:
        torch.testing.assert_close(dx, dy[0] + dy[1] + dy[2])
        torch.testing.assert_close(dp, dz)


def test_a_replicated_results_cotangent_must_be_the_same_on_every_rank():
    text = """
func.func @main(%p: tensor<2xf64>) -> tensor<2xf64> {
  %z = dist.psum %p : tensor<2xf64>
  func.return %z : tensor<2xf64>
}"""
    p = [[torch.ones(2, dtype=torch.float64)] for _ in range(2)]
    seeds = [[torch.ones(2, dtype=torch.float64) * (r + 1)] for r in range(2)]
    with pytest.raises(DistirError, match="assert_uniform"):
        _grads(text, p, seeds)


def test_a_replicated_scalar_result_is_refused_by_name():
    text = """
func.func @main(%p: tensor<2xf64>) -> f64 {
  %z = dist.psum %p : tensor<2xf64>
  %i = arith.constant 0 : index
  %s = tensor.extract %z[%i] : tensor<2xf64>
  func.return %s : f64
}"""
    with pytest.raises(NotDifferentiable, match="'tensor.extract' at .* replicated scalar"):
        add_vjp(parse_module(text))


def test_the_backward_sums_a_replicated_values_varying_uses_once():
    """Two varying uses of a replicated argument: one sum all-reduce of their
    summed cotangents, not one per use."""
    text = """
func.func @main(%b: tensor<2xf64> {dist.replicated}, %w: tensor<2xf64>) -> tensor<2xf64> {
  %u = arith.mulf %b, %w : tensor<2xf64>
  %v = arith.addf %b, %u : tensor<2xf64>
  func.return %v : tensor<2xf64>
}"""
    backward = str(distir.compile(text, "vjp")).split("@main_bwd")[1]
    assert backward.count("dist.all_reduce sum") == 1


# -- drawn programs against the simulated-ranks oracle ---------------------------------

SHAPE = (3,)
LOCAL = {
    "addf": lambda a, b: a + b,
    "subf": lambda a, b: a - b,
    "mulf": lambda a, b: a * b,
}


@dataclass(frozen=True)
class Drawn:
    """A program, which arguments are replicated, and every rank's inputs and
    cotangents (a replicated argument's and output's are the same on every
    rank)."""

    ops: list[tuple]  # (name, operand indices)
    replicated_args: list[bool]
    outputs: list[int]
    P: int
    inputs: list[list[torch.Tensor]]  # per rank
    cotangents: list[list[torch.Tensor]]  # per rank

    def text(self) -> str:
        t = f"tensor<{SHAPE[0]}xf64>"
        args = ", ".join(
            f"%v{i}: {t}" + (" {dist.replicated}" if rep else "")
            for i, rep in enumerate(self.replicated_args)
        )
        lines, n = [], len(self.replicated_args)
        for k, (name, operands) in enumerate(self.ops):
            used = ", ".join(f"%v{i}" for i in operands)
            if name in ("pvary", "psum"):
                lines.append(f"  %v{n + k} = dist.{name} {used} : {t}")
            elif name == "all_reduce":
                lines.append(f"  %v{n + k} = dist.all_reduce sum {used} : {t}")
            elif name == "tanh":
                lines.append(f"  %v{n + k} = math.tanh {used} : {t}")
            else:
                lines.append(f"  %v{n + k} = arith.{name} {used} : {t}")
        outs = ", ".join(f"%v{i}" for i in self.outputs)
        types = ", ".join([t] * len(self.outputs))
        body = "\n".join(lines)
        return (
            f"func.func @main({args}) -> ({types}) {{\n{body}\n  func.return {outs} : {types}\n}}"
        )


def draw_program(choose: Callable[[int], int], number: Callable[[], float], P: int) -> Drawn:
    """A straight-line program over the world group. `choose(n)` picks in
    range(n); pvary only reads replicated values (as JAX requires)."""
    replicated = [bool(choose(2)) for _ in range(1 + choose(3))]
    kinds = list(replicated)  # per value: replicated?
    ops = []
    for _ in range(1 + choose(6)):
        name = ["pvary", "psum", "all_reduce", "addf", "subf", "mulf", "tanh"][choose(7)]
        if name == "pvary":
            candidates = [i for i, rep in enumerate(kinds) if rep]
            if not candidates:
                name = "psum"
        if name == "pvary":
            operands = [candidates[choose(len(candidates))]]
            kinds.append(False)
        elif name in ("psum", "all_reduce", "tanh"):
            operands = [choose(len(kinds))]
            kinds.append(name == "psum" or (name == "tanh" and kinds[operands[0]]))
        else:
            operands = [choose(len(kinds)), choose(len(kinds))]
            kinds.append(kinds[operands[0]] and kinds[operands[1]])
        ops.append((name, operands))
    n_args = len(replicated)
    outputs = [n_args + choose(len(ops)) for _ in range(1 + choose(2))]

    def tensor() -> torch.Tensor:
        return torch.tensor([number() for _ in range(SHAPE[0])], dtype=torch.float64)

    shared_inputs = [tensor() if rep else None for rep in replicated]
    inputs = [[s if s is not None else tensor() for s in shared_inputs] for _ in range(P)]
    shared_seeds = [tensor() if kinds[o] else None for o in outputs]
    cotangents = [[s if s is not None else tensor() for s in shared_seeds] for _ in range(P)]
    return Drawn(ops, replicated, outputs, P, inputs, cotangents)


def oracle(d: Drawn) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    """Every rank's results and gradient of every argument, from P copies in
    plain torch (a replicated value is one tensor, a varying value a list of P)."""
    leaves: list = []
    values: list = []
    for i, rep in enumerate(d.replicated_args):
        if rep:
            leaf = d.inputs[0][i].clone().requires_grad_(True)
            leaves.append(leaf)
            values.append(leaf)
        else:
            per_rank = [d.inputs[r][i].clone().requires_grad_(True) for r in range(d.P)]
            leaves.append(per_rank)
            values.append(per_rank)

    def copies(v) -> list[torch.Tensor]:
        return v if isinstance(v, list) else [v] * d.P

    for name, operands in d.ops:
        args = [values[i] for i in operands]
        if name == "pvary":
            values.append(copies(args[0]))  # every copy reads the one value
        elif name == "psum":
            total = copies(args[0])[0]
            for c in copies(args[0])[1:]:
                total = total + c
            values.append(total)  # one value
        elif name == "all_reduce":
            total = copies(args[0])[0]
            for c in copies(args[0])[1:]:
                total = total + c
            values.append([total * 1 for _ in range(d.P)])  # P values
        elif name == "tanh":
            a = args[0]
            values.append(torch.tanh(a) if not isinstance(a, list) else [torch.tanh(c) for c in a])
        else:
            f = LOCAL[name]
            if not any(isinstance(a, list) for a in args):
                values.append(f(*args))
            else:
                a, b = (copies(x) for x in args)
                values.append([f(a[r], b[r]) for r in range(d.P)])
    objective = torch.zeros((), dtype=torch.float64)
    for k, o in enumerate(d.outputs):
        v = values[o]
        if isinstance(v, list):
            for r in range(d.P):
                objective = objective + (d.cotangents[r][k] * v[r]).sum()
        else:
            objective = objective + (d.cotangents[0][k] * v).sum()
    objective.backward()
    results = [
        [(values[o][r] if isinstance(values[o], list) else values[o]).detach() for o in d.outputs]
        for r in range(d.P)
    ]

    def grad(t: torch.Tensor) -> torch.Tensor:
        return t.grad if t.grad is not None else torch.zeros(SHAPE, dtype=torch.float64)

    grads = [
        [grad(leaf[r] if isinstance(leaf, list) else leaf) for leaf in leaves] for r in range(d.P)
    ]
    return results, grads


def _check(d: Drawn, results, got: list[list[torch.Tensor | None]]) -> None:
    expected_results, expected = oracle(d)
    for r in range(d.P):
        for k, (y, e) in enumerate(zip(results[r], expected_results[r])):
            torch.testing.assert_close(
                y, e, rtol=1e-12, atol=1e-12, msg=f"rank {r} result {k}\n{d.text()}"
            )
    for r in range(d.P):
        for i, (g, e) in enumerate(zip(got[r], expected[r])):
            g = torch.zeros(SHAPE, dtype=torch.float64) if g is None else g
            torch.testing.assert_close(
                g, e, rtol=1e-9, atol=1e-9, msg=f"rank {r} arg {i}\n{d.text()}"
            )


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.data(), st.sampled_from([2, 3]))
def test_drawn_programs_on_the_simulator_match_the_oracle(data, P):
    d = draw_program(
        lambda n: data.draw(st.integers(0, n - 1)),
        lambda: data.draw(st.floats(-2, 2, allow_nan=False, width=64)),
        P,
    )
    results, grads = simulate_vjp(distir.compile(d.text()), d.inputs, d.cotangents)
    _check(d, results, grads)


def _seeded(P: int, count: int) -> list[Drawn]:
    rng = random.Random(1000 + P)
    return [
        draw_program(lambda n: rng.randrange(n), lambda: rng.uniform(-2, 2), P)
        for _ in range(count)
    ]


def ranks_worker(ctx, count: int) -> list[tuple]:
    out = []
    for d in _seeded(ctx.world_size, count):
        program = distir.compile(d.text(), deadline=30.0)
        inputs = [x.clone().requires_grad_(True) for x in d.inputs[ctx.rank]]
        results = program.run(*inputs)
        results = results if isinstance(results, tuple) else (results,)
        torch.autograd.backward(results, d.cotangents[ctx.rank])
        out.append(([y.detach() for y in results], [x.grad for x in inputs]))
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("P", [2, 3])
def test_drawn_programs_on_gloo_ranks_match_the_oracle(P):
    count = 25
    per_rank = launch(ranks_worker, P, count, pass_context=True, timeout=200)
    for k, d in enumerate(_seeded(P, count)):
        _check(d, [per_rank[r][k][0] for r in range(P)], [per_rank[r][k][1] for r in range(P)])


def test_a_replicated_value_read_in_a_branch_and_in_a_wave_gets_the_sum_over_ranks():
    """Uses inside an scf.if (rank-dependent) and inside a wave are varying:
    the sum over ranks is taken once, after the region, on every rank."""
    text = """
func.func @main(%b: tensor<2xf64> {dist.replicated}, %w: tensor<2xf64>, %c: i1) -> (tensor<2xf64>, tensor<2xf64>) {
  %y = scf.if %c -> (tensor<2xf64>) {
    %u = arith.mulf %b, %w : tensor<2xf64>
    scf.yield %u : tensor<2xf64>
  } else {
    scf.yield %w : tensor<2xf64>
  }
  %s, %t = dist.wave {
    %s1 = dist.all_reduce sum %b : tensor<2xf64>
    %t1 = dist.broadcast %w root 0 : tensor<2xf64>
    dist.yield %s1, %t1 : tensor<2xf64>, tensor<2xf64>
  } : tensor<2xf64>, tensor<2xf64>
  %z = arith.addf %s, %t : tensor<2xf64>
  func.return %y, %z : tensor<2xf64>, tensor<2xf64>
}"""
    P = 3
    b = torch.tensor([1.5, -2.0], dtype=torch.float64)
    w = [torch.tensor([r + 1.0, 2.0 - r], dtype=torch.float64) for r in range(P)]
    c = [torch.tensor(r != 1) for r in range(P)]
    dy = [torch.tensor([0.5, r - 1.0], dtype=torch.float64) for r in range(P)]
    dz = [torch.tensor([r * 2.0, 1.0], dtype=torch.float64) for r in range(P)]
    grads = _grads(text, [[b, w[r], c[r]] for r in range(P)], [[dy[r], dz[r]] for r in range(P)])
    # b's: each rank taking the branch sends dy * w; the all-reduce of the
    # one b (P b on every rank) sends P times the sum of every dz
    expected = sum(dy[r] * w[r] for r in range(P) if c[r]) + P * sum(dz)
    for db, _, _ in grads:
        torch.testing.assert_close(db, expected)


def test_an_argument_replicated_over_a_group_is_summed_over_that_group():
    text = """
dist.group @pairs [[0, 1], [2, 3]]
func.func @main(%b: tensor<2xf64> {dist.replicated = @pairs}, %w: tensor<2xf64>) -> tensor<2xf64> {
  %u = arith.mulf %b, %w : tensor<2xf64>
  func.return %u : tensor<2xf64>
}"""
    b = torch.tensor([1.0, 2.0], dtype=torch.float64)
    w = [torch.tensor([r + 1.0, -r], dtype=torch.float64) for r in range(4)]
    dy = [torch.tensor([1.0, r + 0.5], dtype=torch.float64) for r in range(4)]
    grads = _grads(text, [[b, w[r]] for r in range(4)], [[dy[r]] for r in range(4)])
    for r, (db, dw) in enumerate(grads):
        pair = (r // 2) * 2
        torch.testing.assert_close(db, dy[pair] * w[pair] + dy[pair + 1] * w[pair + 1])
        torch.testing.assert_close(dw, dy[r] * b)


@pytest.mark.parametrize("value", ["3 : i64", "@nowhere", '"pairs"'])
def test_a_replicated_argument_names_a_declared_group_or_nothing(value):
    text = f"""
dist.group @pairs [[0, 1], [2, 3]]
func.func @main(%b: tensor<2xf64> {{dist.replicated = {value}}}) -> tensor<2xf64> {{
  func.return %b : tensor<2xf64>
}}"""
    with pytest.raises(NotDifferentiable, match="argument #0 is marked dist.replicated"):
        add_vjp(parse_module(text))


def test_psum_under_rank_dependent_control_flow_is_refused_at_compile_time():
    text = """
func.func @main(%x: tensor<2xf64>) -> tensor<2xf64> {
  %r = dist.rank : index
  %zero = arith.constant 0 : index
  %first = arith.cmpi eq, %r, %zero : index
  %y = scf.if %first -> (tensor<2xf64>) {
    %s = dist.psum %x : tensor<2xf64>
    scf.yield %s : tensor<2xf64>
  } else {
    scf.yield %x : tensor<2xf64>
  }
  func.return %y : tensor<2xf64>
}"""
    with pytest.raises(DistirError, match="dist.psum"):
        distir.compile(text)


def _uneven_seed_worker(ctx) -> str:
    y = distir.psum(torch.ones(3, requires_grad=True), deadline=20.0)
    try:
        (y * (ctx.rank + 1)).sum().backward()  # a different cotangent per rank
    except DistirError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


@pytest.mark.timeout(120)
def test_ranks_passing_different_cotangents_for_a_psum_all_get_a_named_error():
    for rank, message in enumerate(launch(_uneven_seed_worker, 2, pass_context=True, timeout=100)):
        assert "dist.assert_uniform" in message, f"rank {rank}: {message}"
