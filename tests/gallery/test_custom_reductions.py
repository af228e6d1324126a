"""The gallery of custom reductions (examples/custom_reductions.py) equals a
plain torch computation over all ranks' inputs, on real gloo ranks, under
every all-reduce algorithm that may run each combine, and in the simulator
for every group size from 1 to 5."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import pytest

import distir

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Ranks are spawned with this process's sys.path, so they import it too.
sys.path.insert(0, str(EXAMPLES))
import custom_reductions as gallery  # noqa: E402

NAMES = [r.name for r in gallery.GALLERY]


def _reduction(name: str) -> gallery.Reduction:
    return next(r for r in gallery.GALLERY if r.name == name)


def test_the_algorithms_each_combine_may_run_on() -> None:
    every = ("ring", "halving-doubling", "recursive-doubling", "gather-fold")
    whole_tensor = ("recursive-doubling", "gather-fold")
    assert {r.name: gallery.algorithms(r) for r in gallery.GALLERY} == {
        "abs-max": every,  # elementwise and commutative
        "argmax": whole_tensor,  # packed pairs: not elementwise
        "log-sum-exp": whole_tensor,
        "welford": whole_tensor,
    }


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("name", NAMES)
def test_the_simulator_equals_torch(name, size) -> None:
    reduction = _reduction(name)
    inputs = [reduction.inputs(r, size) for r in range(size)]
    expected = reduction.expected(inputs)
    for got in distir.compile(reduction.program).simulate(inputs, timeout=30):
        assert gallery.matches(reduction, got, expected)


@cache
def _launched(size: int) -> list[dict]:
    return distir.launch(gallery.run_gallery, size, pass_context=True, timeout=100)


@pytest.mark.multirank
@pytest.mark.parametrize("size", [2, 5])
@pytest.mark.parametrize("name", NAMES)
def test_every_algorithm_on_gloo_ranks_equals_torch(name, size) -> None:
    reduction = _reduction(name)
    expected = reduction.expected([reduction.inputs(r, size) for r in range(size)])
    per_rank = _launched(size)
    for algorithm in gallery.algorithms(reduction):
        for rank, results in enumerate(per_rank):
            got = results[name, algorithm]
            assert gallery.matches(reduction, got, expected), (algorithm, rank, got, expected)


def test_matches_tells_a_wrong_result_apart() -> None:
    reduction = _reduction("argmax")
    inputs = [reduction.inputs(r, 3) for r in range(3)]
    values, ranks = reduction.expected(inputs)
    assert gallery.matches(reduction, (values, ranks), (values, ranks))
    assert not gallery.matches(reduction, (values, ranks.flip(0)), (values, ranks))
    reversed_ranks = reduction.expected(inputs[::-1])[1]
    assert not gallery.matches(reduction, (values, reversed_ranks), (values, ranks))
