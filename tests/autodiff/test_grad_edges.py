"""The edges of autograd through programs, on real gloo ranks:

- a result edited in place after the run, through any channel (autograd's
  own `y += 1`, or around it: `.data`, `.detach()`, `torch.no_grad()`,
  `.numpy()`, `torch.inference_mode()`), never changes the gradient: it is
  the gradient of the values the forward computed, or torch's in-place error;
- `create_graph=True` is a named error on every rank, before any collective
  of the backward, and a peer that did not ask for it hears it in time.

The oracle is plain torch on one process: every rank rebuilds every rank's
inputs from their seeds, computes the collective with torch ops, applies the
same edit out of place, and differentiates the sum of every rank's loss.
Every (program, edit) pair is listed: none is left to a draw.
"""

from __future__ import annotations

import itertools
import multiprocessing
import time

import pytest
import torch

import distir
from distir.errors import DistirError
from distir.runtime.launch import LaunchError, launch

P = 2
N = 5


def _sum(xs):
    return torch.stack(xs).sum(0)


def _max(xs):
    """The maximum, its gradient to the lowest rank holding it (distir's
    documented tie rule; torch's `amax` would split it)."""
    stacked = torch.stack(xs)
    return stacked.gather(0, stacked.argmax(0, keepdim=True)).squeeze(0)


# name -> (program text or "eager", inputs per rank requiring grad, oracle on
# every rank's inputs -> every rank's results)
PROGRAMS = {
    "max": (
        f"""
func.func @main(%x: tensor<{N}xf32>) -> tensor<{N}xf32> {{
  %y = dist.all_reduce max %x : tensor<{N}xf32>
  func.return %y : tensor<{N}xf32>
}}""",
        1,
        lambda xs: [(_max([x for (x,) in xs]),)] * P,
    ),
    "sum over b": (
        f"""
func.func @main(%a: tensor<{N}xf32>, %b: tensor<{N}xf32>) -> tensor<{N}xf32> {{
  %s = dist.all_reduce sum %a : tensor<{N}xf32>
  %q = arith.divf %s, %b : tensor<{N}xf32>
  func.return %q : tensor<{N}xf32>
}}""",
        2,
        lambda xs: [(_sum([a for a, _ in xs]) / b,) for _, b in xs],
    ),
    "square returned with its root": (
        f"""
func.func @main(%a: tensor<{N}xf32>) -> (tensor<{N}xf32>, tensor<{N}xf32>) {{
  %s = dist.all_reduce sum %a : tensor<{N}xf32>
  %q = arith.mulf %s, %s : tensor<{N}xf32>
  func.return %s, %q : tensor<{N}xf32>, tensor<{N}xf32>
}}""",
        1,
        lambda xs: [(_sum([a for (a,) in xs]), _sum([a for (a,) in xs]) ** 2)] * P,
    ),
    "eager max": ("eager", 1, lambda xs: [(_max([x for (x,) in xs]),)] * P),
}


def _edit_add(y):
    y.add_(1.0)


def _edit_iadd(y):
    y += 1.0


def _edit_data(y):
    y.data.add_(1.0)


def _edit_detach(y):
    y.detach().add_(1.0)


def _edit_no_grad(y):
    with torch.no_grad():
        y.add_(1.0)


def _edit_numpy(y):
    y.detach().numpy()[...] += 1.0


def _edit_inference(y):
    with torch.inference_mode():
        y.add_(1.0)


EDITS = {
    "add_": _edit_add,
    "+=": _edit_iadd,
    ".data": _edit_data,
    ".detach()": _edit_detach,
    "no_grad": _edit_no_grad,
    ".numpy()": _edit_numpy,
    "inference_mode": _edit_inference,
}

CASES = list(itertools.product(PROGRAMS, EDITS))


def _inputs(name: str, case: int, rank: int) -> list[torch.Tensor]:
    """Rank `rank`'s inputs: small integers (ties for max included), b away from 0."""
    g = torch.Generator().manual_seed(1000 * case + rank)
    count = PROGRAMS[name][1]
    xs = [torch.randint(-3, 4, (N,), generator=g).float() for _ in range(count)]
    if name == "sum over b":
        xs[1] = torch.randint(1, 4, (N,), generator=g).float() * (1 - 2 * (rank % 2))
    return xs


def _weights(case: int, rank: int, i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(50_000 + 100 * case + 10 * rank + i)
    return torch.randint(-4, 5, (N,), generator=g).float()


def _expected(name: str, case: int, rank: int) -> list[torch.Tensor]:
    """d(sum over ranks of loss)/d(this rank's inputs), in plain torch; the
    edit applies to the first result, out of place, before the loss."""
    per_rank = [
        [x.clone().requires_grad_(True) for x in _inputs(name, case, r)] for r in range(P)
    ]
    results = PROGRAMS[name][2](per_rank)
    total = 0
    for r, ys in enumerate(results):
        ys = [ys[0] + 1.0, *ys[1:]]
        total = total + sum((y * _weights(case, r, i)).sum() for i, y in enumerate(ys))
    total.backward()
    return [x.grad for x in per_rank[rank]]


def edits_worker(ctx) -> dict:
    out = {}
    programs = {
        name: distir.compile(text, deadline=20.0)
        for name, (text, _, _) in PROGRAMS.items()
        if text != "eager"
    }
    for case, (name, edit) in enumerate(CASES):
        xs = [x.requires_grad_(True) for x in _inputs(name, case, ctx.rank)]
        if name == "eager max":
            ys = (distir.all_reduce(xs[0], "max"),)
        else:
            ys = programs[name].run(*xs)
            ys = ys if isinstance(ys, tuple) else (ys,)
        try:
            EDITS[edit](ys[0])
            loss = sum((y * _weights(case, ctx.rank, i)).sum() for i, y in enumerate(ys))
            loss.backward()
            out[(name, edit)] = ("grad", [x.grad.clone() for x in xs])
        except RuntimeError as e:  # torch's own in-place error, raised before backward runs
            out[(name, edit)] = ("error", str(e))
            # every rank raised the same error (the same edit, SPMD), before
            # any collective of the backward: they stay paired
    return out


@pytest.fixture(scope="module")
def edited():
    results = launch(edits_worker, P, pass_context=True, timeout=110)
    assert multiprocessing.active_children() == []
    return results


@pytest.mark.multirank
@pytest.mark.timeout(150)
@pytest.mark.parametrize("name,edit", CASES)
def test_a_result_edited_in_place_never_changes_the_gradient(edited, name, edit):
    case = CASES.index((name, edit))
    for rank in range(P):
        kind, value = edited[rank][(name, edit)]
        if kind == "error":  # torch's bar: its own in-place error is allowed
            assert "modified by an inplace operation" in value, value
            assert edit in ("add_", "+="), (edit, value)  # the only channels torch sees
            continue
        for got, expected in zip(value, _expected(name, case, rank)):
            assert torch.equal(got, expected), (rank, got, expected)


# -- create_graph=True ---------------------------------------------------------------

DEADLINE_S = 3.0

PROGRAM = """
func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
  %y = dist.all_reduce sum %x : tensor<3xf32>
  %z = arith.mulf %y, %y : tensor<3xf32>
  func.return %z : tensor<3xf32>
}"""


def create_graph_worker(ctx, who: str) -> dict:
    program = distir.compile(PROGRAM, deadline=DEADLINE_S)
    x = torch.full((3,), float(ctx.rank + 1), requires_grad=True)
    z = program.run(x)
    create = who == "every rank" or ctx.rank == 0
    start = time.monotonic()
    try:
        torch.autograd.grad(z.sum(), x, create_graph=create)
        return {"error": None, "seconds": time.monotonic() - start}
    except Exception as e:
        return {
            "error": type(e).__name__,
            "message": str(e),
            "distir": isinstance(e, DistirError),
            "seconds": time.monotonic() - start,
        }


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize("who", ["every rank", "rank 0 only"])
def test_double_backward_is_refused_by_name_on_every_rank(who):
    try:
        reports = dict(enumerate(launch(create_graph_worker, P, who, pass_context=True, timeout=60)))
    except LaunchError as e:
        reports = e.results
    assert multiprocessing.active_children() == []
    assert reports[0]["error"] == "NotDifferentiable", reports[0]
    assert "create_graph=True" in reports[0]["message"]
    if who == "every rank":
        assert reports[1]["error"] == "NotDifferentiable", reports[1]
    else:  # its peer went into the backward's collective: told, not hung
        assert reports[1]["distir"], reports[1]
        assert reports[1]["seconds"] < DEADLINE_S + 2, reports[1]
