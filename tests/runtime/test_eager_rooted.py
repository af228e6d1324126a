"""`distir.reduce`, `distir.gather`, `distir.scatter` and `distir.shift`:
one collective without a program, on real gloo ranks, values and gradients
against plain torch on every rank's input (every rank can make every
rank's), and bad arguments refused at the caller's line."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.errors import DistirError


def _input(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(7000 + rank)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _grad(op, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """d(sum(op(x) * weight))/dx, through distir's backward."""
    x = x.clone().requires_grad_(True)
    (op(x) * weight).sum().backward()
    return x.grad


def rooted_worker(ctx) -> dict:
    n, r = ctx.world_size, ctx.rank
    shape = (6, 3)
    xs = [_input(k, shape) for k in range(n)]
    x = xs[r]
    ws = [_input(100 + k, shape) for k in range(n)]  # every rank's cotangent weight
    checks = {}
    zeros = torch.zeros(shape, dtype=torch.float64)
    # reduce: the sum on the root, zeros elsewhere; grad = the root's weight
    total = distir.reduce(x, "sum", root=2)
    expected = sum(xs[1:], xs[0]) if r == 2 else zeros
    checks["reduce sum"] = torch.allclose(total, expected, rtol=0, atol=1e-12)
    biggest = torch.stack(xs).amax(0) if r == 0 else zeros
    checks["reduce max"] = torch.equal(distir.reduce(x, "max"), biggest)
    checks["reduce grad"] = torch.equal(_grad(lambda v: distir.reduce(v, root=2), x, ws[r]), ws[2])
    # gather along each axis; grad = rank r's part of the root's weight
    for axis in (0, -1):
        whole = torch.cat(xs, dim=axis)
        got = distir.gather(x, root=1, axis=axis)
        checks[f"gather {axis}"] = torch.equal(got, whole if r == 1 else torch.zeros_like(whole))
    wide = [_input(200 + k, (6, 3 * n)) for k in range(n)]
    checks["gather grad"] = torch.equal(
        _grad(lambda v: distir.gather(v, root=1, axis=1), x, wide[r]),
        wide[1].narrow(1, 3 * r, 3),
    )
    # uneven gather: rank k gives k + 1 rows
    counts = [k + 1 for k in range(n)]
    ragged = [_input(300 + k, (k + 1, 2)) for k in range(n)]
    got = distir.gather(ragged[r], root=0, counts=counts)
    whole = torch.cat(ragged)
    checks["gather counts"] = torch.equal(got, whole if r == 0 else torch.zeros_like(whole))
    # scatter: rank r's part of the root's x; the root's grad is every weight
    part = distir.scatter(x, root=2)
    checks["scatter"] = torch.equal(part, xs[2].narrow(0, 2 * r, 2))
    narrow = [_input(400 + k, (2, 3)) for k in range(n)]
    root_grad = torch.cat(narrow) if r == 2 else zeros
    checks["scatter grad"] = torch.equal(
        _grad(lambda v: distir.scatter(v, root=2), x, narrow[r]), root_grad
    )
    uneven = distir.scatter(x, root=0, counts=[3, 0, 3])
    checks["scatter counts"] = torch.equal(uneven, torch.split(xs[0], [3, 0, 3])[r])
    # shift: rank r - offset's x; open ends get zeros; grad travels back
    ring = distir.shift(x, 1, rotate=True)
    checks["shift ring"] = torch.equal(ring, xs[(r - 1) % n])
    open_end = distir.shift(x, -1)
    checks["shift open"] = torch.equal(open_end, xs[r + 1] if r + 1 < n else zeros)
    back = ws[r - 1] if r >= 1 else zeros  # d/dx_r of sum_k w_k * x_{k+1}
    checks["shift grad"] = torch.equal(_grad(lambda v: distir.shift(v, -1), x, ws[r]), back)
    checks["x untouched"] = torch.equal(x, _input(r, shape))
    return checks


CHECKS = [
    "reduce sum", "reduce max", "reduce grad", "gather 0", "gather -1", "gather grad",
    "gather counts", "scatter", "scatter grad", "scatter counts", "shift ring", "shift open",
    "shift grad", "x untouched",
]  # fmt: skip


@pytest.mark.multirank
def test_eager_reduce_gather_scatter_shift_values_and_gradients_on_three_ranks() -> None:
    results = distir.launch(rooted_worker, 3, pass_context=True, timeout=150)
    for checks in results:
        assert checks == dict.fromkeys(CHECKS, True)


@pytest.mark.parametrize(
    ("op", "call", "message"),
    [
        ("reduce", lambda: distir.reduce(torch.ones(2), root=1), "root 1 is outside the group \\(size 1\\)"),
        ("reduce", lambda: distir.reduce(torch.ones(2), "mean"), "no native reduction 'mean'"),
        ("gather", lambda: distir.gather(torch.ones(2), root=-1), "root -1 is outside the group"),
        ("gather", lambda: distir.gather(torch.ones(2, 3), axis=2), "axis 2 is out of range for a tensor of 2 dims"),
        ("gather", lambda: distir.gather(torch.ones(2), counts=[2, 1]), "counts \\[2, 1\\] is not 1 sizes >= 0"),
        ("gather", lambda: distir.gather(torch.ones(2), counts=[3]), "this rank's x has 2 rows along axis 0, counts say 3"),
        ("scatter", lambda: distir.scatter(torch.ones(2), root=3), "root 3 is outside the group"),
        ("scatter", lambda: distir.scatter(torch.ones(2), axis=-2), "axis -2 is out of range"),
        ("scatter", lambda: distir.scatter(torch.ones(4), counts=[3]), "counts \\[3\\] sum to 3, but x has 4 rows along axis 0"),
        ("shift", lambda: distir.shift(torch.ones(2), 1.5), "offset must be an integer, got 1.5"),
    ],
)  # fmt: skip
def test_bad_arguments_are_named_at_the_callers_line(one_rank_world, op, call, message) -> None:
    """Refused before anything runs, at the line of the call; the world still runs."""
    line = call.__code__.co_firstlineno
    with pytest.raises(
        DistirError, match=rf"^'dist.{op}' at .*test_eager_rooted\.py:{line}:\d+: {message}"
    ):
        call()
    assert distir.shift(torch.ones(2), 1, rotate=True).tolist() == [1.0, 1.0]


@settings(max_examples=20, deadline=None)
@given(
    offset=st.integers(-3, 3),
    rotate=st.booleans(),
    root=st.integers(0, 0),
    shape=st.lists(st.integers(0, 3), min_size=1, max_size=2),
)
def test_one_rank_every_eager_form_is_the_identity_or_zeros(
    one_rank_world, offset, rotate, root, shape
) -> None:
    """A group of one: the reduce, gather and scatter give x; the shift gives
    x when it rotates or does not move, zeros otherwise."""
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    assert torch.equal(distir.reduce(x, root=root), x)
    assert torch.equal(distir.gather(x, root=root), x)
    assert torch.equal(distir.scatter(x, root=root), x)
    kept = rotate or offset == 0
    assert torch.equal(distir.shift(x, offset, rotate=rotate), x if kept else torch.zeros_like(x))
