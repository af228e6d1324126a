"""The ring all-reduce: reduce-scatter, then all-gather, P - 1 steps each.

For commutative elementwise combines and native kinds. Every chunk is cut
into segments that are sent as soon as they are combined, so combining one
segment overlaps the transfer of the next; the first send goes straight
from the input, the result is built in the output (which may be the input),
and two receive buffers of one chunk are all the extra memory: O(N / P).
Each chunk is folded in a rotated rank order, hence commutative only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from distir.backends.algorithms.base import (
    FlatAllReduce,
    segment_elements,
    segment_ranges,
    split_even,
)
from distir.backends.combines import SCRATCH, BoundCombine
from distir.backends.exchange import Exchange
from distir.ir.analysis import RING

#: combine_for_step(s) -> the bound combine used at reduce-scatter step s.
StepCombines = Callable[[int], BoundCombine]


def ring_all_reduce(
    x: torch.Tensor, out: torch.Tensor, combine_for_step: StepCombines, ex: Exchange
) -> None:
    """out = reduction of every rank's flat `x`: ring reduce-scatter, then
    ring all-gather, segment by segment (combine order: local ⊕ received).
    `out` may be `x`."""
    size, rank = ex.size, ex.rank
    n = x.numel()
    offsets = split_even(n, size)
    seg = segment_elements(x.element_size(), offsets[1])
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    widest = max(offsets[c + 1] - offsets[c] for c in range(size))
    buffers = (
        SCRATCH.get("ring0", widest, x.dtype, x.device),
        SCRATCH.get("ring1", widest, x.dtype, x.device),
    )
    in_place = out.data_ptr() == x.data_ptr()

    def segments(c: int) -> list[tuple[int, int]]:
        return segment_ranges(offsets[c], offsets[c + 1], seg)

    def post_combine_recvs(c: int, buf: torch.Tensor) -> list:
        base = offsets[c]
        return [(ex.recv(buf[a - base : b - base], prv), a, b, buf[a - base : b - base])
                for a, b in segments(c)]  # fmt: skip

    def post_gather_recvs(c: int) -> list:
        return [(ex.recv(out[a:b], prv), a, b) for a, b in segments(c)]

    for a, b in segments(rank):
        ex.send(x[a:b], nxt)
    pending = post_combine_recvs((rank - 1) % size, buffers[0])
    gathering: list = []
    for step in range(size - 1):
        if step + 1 < size - 1:
            upcoming = post_combine_recvs((rank - step - 2) % size, buffers[(step + 1) % 2])
        else:
            upcoming = []
            if in_place:
                # The first sends read chunk `rank` of x, which is out: they
                # must be done before the all-gather writes into it.
                ex.finish()
            gathering = post_gather_recvs(rank)
        combine = combine_for_step(step)
        for work, a, b, received in pending:
            ex.wait(work)
            combine(out[a:b], x[a:b], received, a)
            ex.send(out[a:b], nxt)
        pending = upcoming
    for step in range(size - 1):
        last = step + 1 == size - 1
        upcoming = [] if last else post_gather_recvs((rank - step - 1) % size)
        for work, a, b in gathering:
            ex.wait(work)
            if not last:
                ex.send(out[a:b], nxt)
        gathering = upcoming
    ex.finish()


class RingAllReduceImplementation(FlatAllReduce):
    """Ring reduce-scatter + all-gather for commutative elementwise combines
    and native kinds."""

    name = RING

    def run(self, flat, out, combine, ex) -> None:
        ring_all_reduce(flat, out, lambda step: combine, ex)
