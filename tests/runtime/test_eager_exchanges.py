"""`distir.reduce_scatter` with `counts=` and `combine=`, and
`distir.all_to_all` (even, and variable with per-rank `send_counts`): one
collective without a program, on 3 real gloo ranks, values and gradients
against plain torch on every rank's input (every rank can make every
rank's), and bad arguments refused at the caller's line."""

from __future__ import annotations

import pytest
import torch

import distir
from distir.errors import DistirError
from distir.ir.builder import arith, cmpf, math, select

P = 3
COUNTS = [1, 2, 3]


def _input(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(9000 + seed)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _abs_max(a, b):  # a tie takes maximumf: commutative on every value
    bigger = cmpf("ogt", math("absf", a), math("absf", b))
    smaller = cmpf("olt", math("absf", a), math("absf", b))
    return select(bigger, a, select(smaller, b, arith("maximumf", a, b)))


def _add(a, b):  # recognised as a sum: differentiable
    return arith("addf", a, b)


def _first(a, b):  # associative, not commutative: rank 0's value
    return a


def _grad(op, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """d(sum(op(x) * weight))/dx, through distir's backward."""
    x = x.clone().requires_grad_(True)
    (op(x) * weight).sum().backward()
    return x.grad


def _all_to_all_oracle(xs, counts, axis, weights):
    """Every rank's received rows and the gradient of sum_j <w_j, y_j> for
    every rank's x, in plain torch (all ranks' x as leaves of one graph)."""
    leaves = [x.clone().requires_grad_(True) for x in xs]
    blocks = [torch.split(x, c, dim=axis) for x, c in zip(leaves, counts)]
    ys = [torch.cat([blocks[k][j] for k in range(P)], dim=axis) for j in range(P)]
    sum((w * y).sum() for w, y in zip(weights, ys)).backward()
    return [y.detach() for y in ys], [leaf.grad for leaf in leaves]


def exchanges_worker(ctx) -> dict:
    r = ctx.rank
    checks = {}
    # -- reduce_scatter: uneven counts along each axis, native and combines
    for axis, shape in ((0, (6, 2)), (-1, (2, 6))):
        xs = [_input(k, shape) for k in range(P)]
        stacked = torch.stack(xs)
        mine = torch.split(stacked.sum(0), COUNTS, dim=axis)[r]
        got = distir.reduce_scatter(xs[r], counts=COUNTS, axis=axis)
        checks[f"sum counts {axis}"] = torch.allclose(got, mine, rtol=0, atol=1e-12)
        biggest = torch.split(stacked.amax(0), COUNTS, dim=axis)[r]
        got = distir.reduce_scatter(xs[r], "max", axis, counts=COUNTS)
        checks[f"max counts {axis}"] = torch.equal(got, biggest)
        winner = stacked.abs().argmax(0, keepdim=True)
        largest = torch.split(stacked.gather(0, winner)[0], COUNTS, dim=axis)[r]
        got = distir.reduce_scatter(
            xs[r], axis=axis, counts=COUNTS, combine=_abs_max, commutative=True
        )
        checks[f"abs_max counts {axis}"] = torch.equal(got, largest)
        got = distir.reduce_scatter(xs[r], axis=axis, counts=COUNTS, combine=_first)
        checks[f"first counts {axis}"] = torch.equal(got, torch.split(xs[0], COUNTS, dim=axis)[r])
        # gradient: every rank's cotangent (weight), concatenated along the axis
        weights = [_input(100 + k, tuple(c if d == axis % 2 else 2 for d in range(2)))
                   for k, c in enumerate(COUNTS)]  # fmt: skip
        expected = torch.cat(weights, dim=axis)
        for name, combine in (("sum", None), ("addf", _add)):
            grad = _grad(
                lambda v: distir.reduce_scatter(v, axis=axis, counts=COUNTS, combine=combine),  # noqa: B023
                xs[r],
                weights[r],
            )
            checks[f"{name} counts grad {axis}"] = torch.equal(grad, expected)
    even = [_input(200 + k, (6, 2)) for k in range(P)]
    got = distir.reduce_scatter(even[r], combine=_abs_max, commutative=True)
    stacked = torch.stack(even)
    winner = stacked.abs().argmax(0, keepdim=True)
    checks["abs_max even"] = torch.equal(got, stacked.gather(0, winner)[0].chunk(P)[r])
    # -- all_to_all: even, then per-rank send counts (rank k sends k + j rows to j)
    for axis, shape in ((0, (6, 2)), (1, (2, 6))):
        xs = [_input(300 + k, shape) for k in range(P)]
        counts = [[shape[axis] // P] * P for _ in range(P)]
        weights = [_input(400 + k, shape) for k in range(P)]
        ys, grads = _all_to_all_oracle(xs, counts, axis, weights)
        checks[f"all_to_all even {axis}"] = torch.equal(distir.all_to_all(xs[r], axis=axis), ys[r])
        got = _grad(lambda v: distir.all_to_all(v, axis=axis), xs[r], weights[r])  # noqa: B023
        checks[f"all_to_all even grad {axis}"] = torch.equal(got, grads[r])
    for axis in (0, -1):
        counts = [[k + j for j in range(P)] for k in range(P)]
        xs = [
            _input(500 + k, (sum(counts[k]), 2) if axis == 0 else (2, sum(counts[k])))
            for k in range(P)
        ]
        received = sum(counts[k][r] for k in range(P))
        w_shapes = [(sum(c[j] for c in counts), 2) for j in range(P)]
        weights = [
            _input(600 + j, s if axis == 0 else (s[1], s[0])) for j, s in enumerate(w_shapes)
        ]
        ys, grads = _all_to_all_oracle(xs, counts, axis, weights)
        y, got_counts = distir.all_to_all(xs[r], counts[r], axis, return_counts=True)
        checks[f"all_to_all counts {axis}"] = (
            torch.equal(y, ys[r]) and got_counts == [counts[k][r] for k in range(P)]
            and y.shape[axis] == received
        )  # fmt: skip
        got = _grad(lambda v: distir.all_to_all(v, counts[r], axis), xs[r], weights[r])  # noqa: B023
        checks[f"all_to_all counts grad {axis}"] = torch.equal(got, grads[r])
    return checks


CHECKS = [
    *(f"{name} counts {axis}" for axis in (0, -1) for name in ("sum", "max", "abs_max", "first")),
    *(f"{name} counts grad {axis}" for axis in (0, -1) for name in ("sum", "addf")),
    "abs_max even",
    *(f"all_to_all even{g} {axis}" for axis in (0, 1) for g in ("", " grad")),
    *(f"all_to_all counts{g} {axis}" for axis in (0, -1) for g in ("", " grad")),
]


@pytest.mark.multirank
@pytest.mark.timeout(200)
def test_eager_reduce_scatter_with_counts_and_combines_and_all_to_all_on_three_ranks() -> None:
    """Fails on old main: `distir.reduce_scatter` took no counts or combine,
    and there was no `distir.all_to_all`."""
    results = distir.launch(exchanges_worker, P, pass_context=True, timeout=180)
    for rank, checks in enumerate(results):
        assert checks == dict.fromkeys(CHECKS, True), f"rank {rank}: {checks}"


@pytest.mark.parametrize(
    ("op", "call", "message"),
    [
        ("reduce_scatter", lambda: distir.reduce_scatter(torch.ones(4), counts=[3]), "counts \\[3\\] sum to 3, but x has 4 rows along axis 0"),
        ("reduce_scatter", lambda: distir.reduce_scatter(torch.ones(4), counts=[2, 2]), "counts \\[2, 2\\] is not 1 sizes >= 0"),
        ("reduce_scatter", lambda: distir.reduce_scatter(torch.ones(4), counts=[4], axis=1), "axis 1 is out of range"),
        ("variable_all_to_all", lambda: distir.all_to_all(torch.ones(4), [3]), "send counts \\[3\\] sum to 3, but x has 4 rows along axis 0"),
        ("variable_all_to_all", lambda: distir.all_to_all(torch.ones(4), [-1]), "counts \\[-1\\] is not 1 sizes >= 0"),
        ("variable_all_to_all", lambda: distir.all_to_all(torch.ones(4), axis=-2), "axis -2 is out of range"),
    ],
)  # fmt: skip
def test_bad_arguments_are_named_at_the_callers_line(one_rank_world, op, call, message) -> None:
    """Refused before anything runs, at the line of the call; the world still runs."""
    line = call.__code__.co_firstlineno
    with pytest.raises(
        DistirError, match=rf"^'dist.{op}' at .*test_eager_exchanges\.py:{line}:\d+: {message}"
    ):
        call()
    assert distir.all_to_all(torch.ones(2), [2]).tolist() == [1.0, 1.0]


def test_a_kind_and_a_combine_together_are_refused(one_rank_world) -> None:
    with pytest.raises(DistirError, match="takes `kind` or `combine`, not both"):
        distir.reduce_scatter(torch.ones(2), "sum", combine=_add)


def _different_counts_worker(ctx) -> str:
    counts = [2, 1] if ctx.rank == 0 else [1, 2]
    try:
        distir.reduce_scatter(torch.ones(3), counts=counts, deadline=20.0)
    except DistirError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_ranks_passing_different_counts_all_get_a_named_error() -> None:
    for rank, message in enumerate(
        distir.launch(_different_counts_worker, 2, pass_context=True, timeout=100)
    ):
        assert (
            "ranks run different programs" in message and "'dist.reduce_scatter' at" in message
        ), f"rank {rank}: {message}"
