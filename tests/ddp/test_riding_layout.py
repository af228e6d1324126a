"""Where the sum hook's digest rides keeps every gradient summed in DDP's order.

gloo's ring all-reduce (gloo/allreduce.cc, `ring`; the segment bound is
`AllreduceOptionsImpl::kMaxSegmentSize`, 1 MiB, in gloo/allreduce.h) cuts
a buffer of B bytes into S = roundUp(max(ceil(B / 1 MiB), 2P), P) segments
of roundUp(ceil(B / S), element size) bytes; P runs of S / P consecutive
segments are the ranks' chunks, and the ring reduces every segment of
chunk c starting at rank c - 1: the order of an element's sum depends only
on its chunk. So a payload keeps DDP's bits exactly when every gradient
lies in the chunk it lies in when DDP sums the bare bucket.

The model below is written from gloo's source, apart from distir's
`gloo_segments`; the property draws bucket sizes (around every segment
boundary, up to 6M elements) and group sizes 2-8 and checks, for every
gradient, its chunk in the bucket and in `riding_layout`'s payload. The
DDP tests check the bits themselves on 3 and 4 gloo ranks.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.ddp import RIDING, riding_layout

MAX_SEGMENT_BYTES = 1 << 20  # gloo's kMaxSegmentSize


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def ring_chunks(positions: np.ndarray, numel: int, ranks: int, element_bytes: int) -> np.ndarray:
    """The ring chunk (the rank whose chunk it is) of each element position
    of a buffer of `numel` elements, as gloo's `ring` cuts it."""
    total = numel * element_bytes
    segments = _round_up(max(-(-total // MAX_SEGMENT_BYTES), 2 * ranks), ranks)
    segment_bytes = _round_up(-(-total // segments), element_bytes)
    per_rank = segments // ranks
    return (positions * element_bytes // segment_bytes) // per_rank


def _sizes() -> st.SearchStrategy[int]:
    # Around the sizes where gloo's segment count or size changes.
    boundary = st.integers(1, 24).map(lambda k: k * MAX_SEGMENT_BYTES // 4)
    return st.integers(1, 6_000_000) | st.tuples(boundary, st.integers(-9, 9)).map(
        lambda t: max(1, t[0] + t[1])
    )


@settings(max_examples=40)  # each example checks up to 6M gradients
@given(numel=_sizes(), ranks=st.integers(2, 8))
def test_every_gradient_stays_in_its_ring_chunk(numel: int, ranks: int) -> None:
    layout = riding_layout(numel, torch.float32, ranks)
    if layout is None:  # the ranks agree at every run instead: nothing to keep
        assert ranks >= 3
        return
    assert layout.slots * layout.rows >= RIDING  # the digest fits
    assert layout.rows * layout.chunk >= numel
    gradients = np.arange(numel, dtype=np.int32)
    # gradient i: row i // chunk, at i % chunk in it
    payload = gradients // layout.chunk * (layout.chunk + layout.slots) + gradients % layout.chunk
    if ranks == 2:
        # Two addends are summed in the same bits either way; the digest
        # is appended and nothing else moves.
        assert layout.rows == 1
        assert np.array_equal(payload, gradients)
        return
    bare = ring_chunks(gradients, numel, ranks, 4)
    riding = ring_chunks(payload, layout.numel, ranks, 4)
    moved = np.flatnonzero(bare != riding)
    assert moved.size == 0, (
        f"{numel} gradients at {ranks} ranks: gradient {moved[0]} moves from chunk "
        f"{bare[moved[0]]} to {riding[moved[0]]}"
    )


def test_the_model_sees_an_appended_digest_move_gradients() -> None:
    # The reason the digest is not simply appended at 3 ranks or more: the
    # model must see it (or the property above would pass on any layout).
    numel, ranks = 1000, 3
    gradients = np.arange(numel)
    bare = ring_chunks(gradients, numel, ranks, 4)
    appended = ring_chunks(gradients, numel + RIDING, ranks, 4)
    assert (bare != appended).any()
