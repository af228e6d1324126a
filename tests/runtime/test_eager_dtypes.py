"""The eager collectives take every dtype of the one dtype table
(`distir.ir.element_types`), bf16 included, and match plain torch on it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.errors import DistirError

NRANKS = 2
KINDS = ("sum", "max", "min")

#: (seed, shape) of one all-reduce of each kind
cases = st.lists(
    st.tuples(st.integers(0, 99), st.lists(st.integers(1, 5), min_size=1, max_size=2).map(tuple)),
    min_size=1,
    max_size=4,
)


def _input(seed: int, shape: tuple[int, ...], rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 10 + rank)
    return torch.randn(shape, generator=g).to(torch.bfloat16)


def bf16_worker(ctx, cases: list) -> list[list[torch.Tensor]]:
    return [
        [distir.all_reduce(_input(seed, shape, ctx.rank), kind) for kind in KINDS]
        for seed, shape in cases
    ]


@pytest.mark.multirank
@settings(max_examples=1, deadline=None)
@given(cases)
def test_bf16_eager_all_reduce_matches_plain_torch_on_two_ranks(cases) -> None:
    results = distir.launch(bf16_worker, NRANKS, cases, pass_context=True, timeout=100)
    for (seed, shape), *got in zip(cases, *results, strict=True):
        a, b = (_input(seed, shape, r) for r in range(NRANKS))
        # Two addends: their bf16 sum is the exact sum rounded once, in
        # either order, which is what torch's bf16 add computes.
        want = [a + b, torch.maximum(a, b), torch.minimum(a, b)]
        for on_rank in got:
            for y, w in zip(on_rank, want, strict=True):
                assert y.dtype == torch.bfloat16 and torch.equal(y, w), (seed, shape)


def test_a_dtype_outside_the_table_is_named(one_rank_world) -> None:
    with pytest.raises(DistirError, match=r"distir.all_reduce takes tensors of .*bfloat16.*complex64"):
        distir.all_reduce(torch.ones(2, dtype=torch.complex64), "sum")
