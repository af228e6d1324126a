"""`distir.all_reduce(x, ...)`: one collective without a program, compiled
once per signature and cached, on real gloo ranks."""

from __future__ import annotations

import pytest
import torch

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


def test_without_a_process_group_it_says_how_to_get_one() -> None:
    with pytest.raises(DistirError, match="init_process_group"):
        distir.all_reduce(torch.ones(2), "sum")


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
