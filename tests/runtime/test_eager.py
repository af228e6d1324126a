"""`distir.all_reduce(x, ...)`: one collective without a program, compiled
once per signature and cached, on real gloo ranks."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.errors import DistirError
from distir.ir.builder import arith, cmpf, math, select
from distir.runtime import eager


def abs_max(a, b):  # the README's
    bigger = cmpf("ogt", math("absf", a), math("absf", b))
    smaller = cmpf("olt", math("absf", a), math("absf", b))
    return select(bigger, a, select(smaller, b, arith("maximumf", a, b)))


def eager_worker(ctx) -> dict:
    before = eager.cached_programs()
    x = torch.tensor([1.0, -5.0, 2.0]) * (ctx.rank + 1)
    total, again = (distir.all_reduce(x * k, "sum") for k in (1, 2))  # one line: one program
    after_sums = eager.cached_programs()
    largest = distir.all_reduce(x, combine=abs_max, commutative=True)
    ints = distir.all_reduce(torch.arange(4) + ctx.rank, "max")
    return {
        "total": total,
        "again": again,
        "largest": largest,
        "ints": ints,
        "compiled": (after_sums - before, eager.cached_programs() - before),
        "x_untouched": torch.equal(x, torch.tensor([1.0, -5.0, 2.0]) * (ctx.rank + 1)),
    }


@pytest.mark.multirank
def test_eager_all_reduce_on_three_ranks_compiles_once_per_signature() -> None:
    results = distir.launch(eager_worker, 3, pass_context=True, timeout=100)
    for r in results:
        assert r["total"].tolist() == [6.0, -30.0, 12.0]
        assert r["again"].tolist() == [12.0, -60.0, 24.0]
        assert r["largest"].tolist() == [3.0, -15.0, 6.0]
        assert r["ints"].tolist() == [2, 3, 4, 5]
        assert r["compiled"] == (1, 3)
        assert r["x_untouched"]


EVERY_OP = [
    lambda x: distir.all_reduce(x, "sum"),
    lambda x: distir.broadcast(x, root=1),
    lambda x: distir.all_gather(x, axis=3),
    lambda x: distir.reduce_scatter(x, "max"),
]


@pytest.mark.parametrize("call", EVERY_OP)
def test_without_a_process_group_it_says_how_to_get_one(call) -> None:
    """Before any check that needs the group (the root or size against it)."""
    with pytest.raises(DistirError, match="needs an initialised process group.*init_process_group"):
        call(torch.ones(2))


@pytest.mark.parametrize("call", EVERY_OP)
def test_a_non_tensor_is_refused(call) -> None:
    with pytest.raises(DistirError, match="takes a torch.Tensor, got list"):
        call([1.0, 2.0])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: distir.all_reduce(torch.ones(2)), "exactly one of `kind` and `combine`"),
        (lambda: distir.all_reduce([1.0], "sum"), "takes a torch.Tensor, got list"),
    ],
)
def test_bad_calls_are_distir_errors(call, message) -> None:
    with pytest.raises(DistirError, match=message):
        call()


def _not_commutative(a, b):
    return arith("subf", a, b)


def test_an_eager_programs_error_names_the_callers_line(one_rank_world) -> None:
    """Not a line of distir/runtime/eager.py: the line that called it (and
    a second call site gets its own program, located there)."""
    import inspect

    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(DistirError, match=rf"'dist.all_reduce' at .*test_eager\.py:{line}:") as e:
        distir.all_reduce(torch.ones(2), combine=_not_commutative, commutative=True)
    assert "runtime/eager.py" not in str(e.value)
    with pytest.raises(DistirError, match=rf"test_eager\.py:{line + 3}:"):
        distir.all_reduce(torch.ones(2), combine=_not_commutative, commutative=True)


def _input(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Rank `rank`'s input: every rank can make every rank's, for the oracle."""
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _grad(op, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """d(sum(op(x) * weight))/dx."""
    x = x.clone().requires_grad_(True)
    (op(x) * weight).sum().backward()
    return x.grad


def _cat(parts, axis: int) -> torch.Tensor:
    return torch.cat(list(parts), dim=axis)


def other_collectives_worker(ctx) -> dict:
    import warnings

    import torch.distributed.nn.functional as tnn

    # torch.distributed.nn.functional is deprecated, still the autograd oracle
    warnings.simplefilter("ignore", FutureWarning)

    n, r = ctx.world_size, ctx.rank
    shape = (6, 3)
    xs = [_input(k, shape) for k in range(n)]
    x = xs[r]
    checks = {}
    # values, against plain torch on every rank's input
    checks["broadcast"] = torch.equal(distir.broadcast(x, root=1), xs[1])
    for axis in (0, 1, -1):
        checks[f"all_gather {axis}"] = torch.equal(distir.all_gather(x, axis=axis), _cat(xs, axis))
    for axis in (0, -2):
        part = shape[axis] // n
        total = torch.stack(xs).sum(0).narrow(axis, r * part, part)
        checks[f"reduce_scatter sum {axis}"] = torch.allclose(
            distir.reduce_scatter(x, "sum", axis=axis), total, rtol=0, atol=1e-12
        )
    biggest = torch.stack(xs).amax(0).narrow(0, r * 2, 2)
    checks["reduce_scatter max"] = torch.equal(distir.reduce_scatter(x, "max"), biggest)
    checks["x untouched"] = torch.equal(x, _input(r, shape))
    # gradients, against torch.distributed.nn.functional
    w = _input(100 + r, shape)
    checks["broadcast grad"] = torch.allclose(
        _grad(lambda v: distir.broadcast(v, root=2), x, w),
        _grad(lambda v: tnn.broadcast(v, 2), x, w),
    )
    wide = _input(200 + r, (6 * n, 3))
    checks["all_gather grad"] = torch.allclose(
        _grad(lambda v: distir.all_gather(v), x, wide),
        _grad(lambda v: _cat(tnn.all_gather(v), 0), x, wide),
    )
    narrow = _input(300 + r, (2, 3))
    checks["reduce_scatter grad"] = torch.allclose(
        _grad(lambda v: distir.reduce_scatter(v), x, narrow),
        _grad(
            lambda v: tnn.reduce_scatter(torch.empty(2, 3, dtype=v.dtype), list(v.chunk(n))),
            x,
            narrow,
        ),
    )
    # uneven: rank k gives k + 1 columns; the gradient oracle is the
    # cotangents' sum (every rank's weight is known here), sliced at this rank
    ragged = [_input(400 + k, (2, k + 1)) for k in range(n)]
    counts = [k + 1 for k in range(n)]
    checks["all_gather counts"] = torch.equal(
        distir.all_gather(ragged[r], axis=1, counts=counts), _cat(ragged, 1)
    )
    weights = [_input(500 + k, (2, sum(counts))) for k in range(n)]
    checks["all_gather counts grad"] = torch.allclose(
        _grad(lambda v: distir.all_gather(v, axis=-1, counts=counts), ragged[r], weights[r]),
        torch.stack(weights).sum(0).narrow(1, sum(counts[:r]), counts[r]),
    )
    return checks


CHECKS = [
    "broadcast",
    "all_gather 0",
    "all_gather 1",
    "all_gather -1",
    "reduce_scatter sum 0",
    "reduce_scatter sum -2",
    "reduce_scatter max",
    "x untouched",
    "broadcast grad",
    "all_gather grad",
    "reduce_scatter grad",
    "all_gather counts",
    "all_gather counts grad",
]


@pytest.mark.multirank
def test_eager_broadcast_all_gather_reduce_scatter_values_and_gradients_on_three_ranks() -> None:
    results = distir.launch(other_collectives_worker, 3, pass_context=True, timeout=150)
    for checks in results:
        assert checks == dict.fromkeys(CHECKS, True)


def _refusal(call) -> str:
    try:
        call()
    except DistirError as e:
        return str(e)
    return "no error"


def uneven_reduce_scatter_worker(ctx) -> dict:
    import inspect

    line = inspect.currentframe().f_lineno + 1
    refused = _refusal(lambda: distir.reduce_scatter(torch.ones(4, 3)))
    # refused before any exchange, so the group is not poisoned: the next call runs
    return {
        "line": line,
        "refused": refused,
        "after": distir.reduce_scatter(torch.ones(6)).tolist(),
    }


@pytest.mark.multirank
def test_a_reduce_scatter_size_not_divisible_by_the_group_is_named_at_the_callers_line() -> None:
    results = distir.launch(uneven_reduce_scatter_worker, 3, pass_context=True, timeout=100)
    for r in results:
        assert re.fullmatch(
            rf"'dist.reduce_scatter' at .*test_eager\.py:{r['line']}:\d+: axis 0 has 4 elements, "
            "not a multiple of the group size 3",
            r["refused"],
        )
        assert r["after"] == [3.0, 3.0]


@pytest.mark.parametrize(
    ("op", "call", "message"),
    [
        ("broadcast", lambda: distir.broadcast(torch.ones(2), root=1), "root 1 is outside the group \\(size 1\\)"),
        ("broadcast", lambda: distir.broadcast(torch.ones(2), root=-1), "root -1 is outside the group"),
        ("all_gather", lambda: distir.all_gather(torch.ones(2, 3), axis=2), "axis 2 is out of range for a tensor of 2 dims"),
        ("all_gather", lambda: distir.all_gather(torch.ones(2, 3), axis=-3), "axis -3 is out of range"),
        ("all_gather", lambda: distir.all_gather(torch.tensor(1.0)), "axis 0 is out of range for a tensor of 0 dims"),
        ("all_gather", lambda: distir.all_gather(torch.ones(2), counts=[2, 1]), "counts \\[2, 1\\] is not 1 sizes >= 0 \\(one per group rank\\)"),
        ("all_gather", lambda: distir.all_gather(torch.ones(2), counts=[-1]), "counts \\[-1\\] is not 1 sizes"),
        ("all_gather", lambda: distir.all_gather(torch.ones(2, 3), axis=1, counts=[2]), "this rank's x has 3 rows along axis 1, counts say 2"),
        ("reduce_scatter", lambda: distir.reduce_scatter(torch.ones(2), axis=1), "axis 1 is out of range for a tensor of 1 dims"),
        ("reduce_scatter", lambda: distir.reduce_scatter(torch.ones(2), "mean"), "no native reduction 'mean'"),
    ],
)  # fmt: skip
def test_bad_collective_arguments_are_named_at_the_callers_line(
    one_rank_world, op, call, message
) -> None:
    """Refused before anything runs, located at the line of the call (the
    lambda's), and the world still runs afterwards."""
    line = call.__code__.co_firstlineno
    with pytest.raises(
        DistirError, match=rf"^'dist.{op}' at .*test_eager\.py:{line}:\d+: {message}"
    ):
        call()
    assert distir.all_gather(torch.ones(2)).tolist() == [1.0, 1.0]


NRANKS = 3
DTYPES = [torch.int32, torch.int64, torch.float32, torch.float64]


@st.composite
def eager_cases(draw) -> tuple:
    """(op, argument, dtype, shape, axis, seed): an eager call on 3 ranks."""
    op = draw(st.sampled_from(["broadcast", "all_gather", "reduce_scatter"]))
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    if op == "reduce_scatter":
        shape[axis] *= NRANKS * draw(st.integers(1, 2))
    argument = {
        "broadcast": st.integers(0, NRANKS - 1),
        "all_gather": st.none(),
        "reduce_scatter": st.sampled_from(["sum", "max", "min"]),
    }[op]
    return (
        op,
        draw(argument),
        draw(st.sampled_from(DTYPES)),
        tuple(shape),
        axis,
        draw(st.integers(0, 99)),
    )


def _case_input(case: tuple, rank: int) -> torch.Tensor:
    _, _, dtype, shape, _, seed = case
    g = torch.Generator().manual_seed(seed * 10 + rank)
    return torch.randint(-20, 20, shape, generator=g).to(dtype)  # sums exact in every dtype


def _eager_call(case: tuple, x: torch.Tensor) -> torch.Tensor:
    op, argument, _, _, axis, _ = case
    if op == "broadcast":
        return distir.broadcast(x, root=argument)
    if op == "all_gather":
        return distir.all_gather(x, axis=axis)
    return distir.reduce_scatter(x, argument, axis=axis)


def _oracle(case: tuple, rank: int) -> torch.Tensor:
    """Plain torch on every rank's input."""
    op, argument, _, shape, axis, _ = case
    xs = [_case_input(case, k) for k in range(NRANKS)]
    if op == "broadcast":
        return xs[argument]
    if op == "all_gather":
        return torch.cat(xs, dim=axis)
    stacked = torch.stack(xs)
    total = {"sum": stacked.sum(0), "max": stacked.amax(0), "min": stacked.amin(0)}[argument]
    part = shape[axis] // NRANKS
    return total.to(xs[0].dtype).narrow(axis, rank * part, part)


def cases_worker(ctx, cases: list) -> list:
    return [_eager_call(case, _case_input(case, ctx.rank)) for case in cases]


@pytest.mark.multirank
@settings(max_examples=6, deadline=None)
@given(st.lists(eager_cases(), min_size=1, max_size=6))
def test_eager_collectives_match_plain_torch_on_three_ranks(cases) -> None:
    results = distir.launch(cases_worker, NRANKS, cases, pass_context=True, timeout=150)
    for rank, got in enumerate(results):
        for case, y in zip(cases, got, strict=True):
            want = _oracle(case, rank)
            assert y.dtype == want.dtype and torch.equal(y, want), (rank, case)
