"""The program that hands sharded state to joiners (`elastic_shards`),
drawn and run by the reference interpreter in one process (no ranks).

Hypothesis draws the tensors (shapes, dtypes, the dim split over the
members or none), the size of the new membership and which of its group
ranks are joiners (rank 0 included); each old member holds its
`torch.tensor_split` chunk of a full tensor over the old members, joiners
hold nothing. The oracle is plain torch: every rank of the new membership
ends with its `torch.tensor_split` chunk over all of them (the whole tensor
where none is split); the whole-state form (to the joiners only) gives
every joiner the whole tensor and the old members nothing.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.runtime.elastic_shards import Shard, _program

DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32)


@st.composite
def cases(draw):
    size = draw(st.integers(2, 4))
    joined = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=size - 1, unique=True))
    specs = []
    for _ in range(draw(st.integers(1, 3))):
        shape = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=3)))
        dim = draw(st.one_of(st.none(), st.integers(0, len(shape) - 1)))
        specs.append(Shard(shape, draw(st.sampled_from(DTYPES)), dim))
    return size, tuple(sorted(joined)), tuple(specs)


def _full(spec: Shard, seed: int) -> torch.Tensor:
    n = torch.Size(spec.shape).numel()
    return (torch.arange(n, dtype=torch.int64) * 7 + seed).reshape(spec.shape).to(spec.dtype)


def _chunk(x: torch.Tensor, dim: int | None, parts: int, index: int) -> torch.Tensor:
    return x if dim is None else torch.tensor_split(x, parts, dim=dim)[index]


@settings(max_examples=25, deadline=None)
@given(cases())
def test_every_rank_gets_its_chunk_of_the_new_layout(case):
    size, joined, specs = case
    before = tuple(i for i in range(size) if i not in joined)
    fulls = [_full(s, i) for i, s in enumerate(specs)]
    inputs = [
        [
            _chunk(x, s.dim, len(before), before.index(r))
            if r in before
            else torch.empty((0,) * len(s.shape), dtype=s.dtype)
            for x, s in zip(fulls, specs)
        ]
        for r in range(size)
    ]
    out = _program(specs, before, tuple(range(size))).simulate(inputs)
    for r in range(size):
        got = out[r] if isinstance(out[r], tuple | list) else (out[r],)
        for x, s, y in zip(fulls, specs, got):
            assert torch.equal(y, _chunk(x, s.dim, size, r)), (r, s)


@settings(max_examples=15, deadline=None)
@given(cases())
def test_whole_state_goes_to_the_joiners_only(case):
    size, joined, specs = case
    specs = tuple(Shard(s.shape, s.dtype, None) for s in specs)
    before = tuple(i for i in range(size) if i not in joined)
    fulls = [_full(s, i) for i, s in enumerate(specs)]
    inputs = [
        [x if r in before else torch.empty((0,) * len(x.shape), dtype=x.dtype) for x in fulls]
        for r in range(size)
    ]
    out = _program(specs, before, joined).simulate(inputs)
    for r in range(size):
        got = out[r] if isinstance(out[r], tuple | list) else (out[r],)
        for x, y in zip(fulls, got):
            if r in joined:
                assert torch.equal(y, x), r
            else:
                assert y.numel() == 0, r

