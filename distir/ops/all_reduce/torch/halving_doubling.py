"""Halving-doubling all-reduce (Rabenseifner): keeps rank order.

For elementwise combines, commutative or not, and native kinds:
reduce-scatter by recursive halving, then all-gather by recursive doubling.
Each round combines the blocks of two adjacent rank ranges, lower range on
the left, so the fold order is the rank order; a group size that is not a
power of two first folds neighbouring pairs (2i, 2i+1). The same traffic as
the ring in 2 log2(P) rounds instead of 2(P - 1); one receive buffer of half
the message, plus one message on ranks that fold a pair.
"""

from __future__ import annotations

import torch

from distir.ops.all_reduce.ir import HALVING_DOUBLING
from distir.ops.all_reduce.torch.base import (
    FlatAllReduce,
    real_rank,
    segment_elements,
    segment_ranges,
    virtual_layout,
)
from distir.ops.all_reduce.torch.combines import SCRATCH, BoundCombine
from distir.transport.exchange import Exchange


def halving_doubling_all_reduce(
    x: torch.Tensor, out: torch.Tensor, combine: BoundCombine, ex: Exchange
) -> None:
    """out = x_0 ⊕ … ⊕ x_{P−1} in rank order; `out` may be `x`."""
    size, rank = ex.size, ex.rank
    n = x.numel()
    seg = segment_elements(x.element_size(), n // 2)
    p2, virtual, pair = virtual_layout(size, rank)
    if pair is not None:
        if virtual < 0:  # the upper rank of a pair: contribute, then receive
            for a in range(0, n, seg):
                ex.send(x[a : a + seg], pair)
            ex.finish()
            ex.wait(ex.recv(out, pair))
            return
        received = SCRATCH.get("pair", n, x.dtype, x.device)
        _segmented_exchange(ex, None, pair, received, pair, 0, n, seg, out, x, combine, False)
        own = out
    else:
        own = x

    lo, hi, distance = 0, n, 1
    given: list[tuple[int, int, int]] = []
    buffer = SCRATCH.get("halve", n - n // 2, x.dtype, x.device)
    while distance < p2:
        partner_v = virtual ^ distance
        partner = real_rank(partner_v, size, p2)
        mid = lo + (hi - lo) // 2
        if virtual & distance:
            keep, give = (mid, hi), (lo, mid)
        else:
            keep, give = (lo, mid), (mid, hi)
        upper = virtual > partner_v  # the partner's ranks come first
        _segmented_exchange(
            ex, own[give[0] : give[1]], partner, buffer[: keep[1] - keep[0]], partner,
            keep[0], keep[1], seg, out, own, combine, upper,
        )  # fmt: skip
        ex.finish()
        own = out
        given.append((give[0], give[1], partner))
        lo, hi = keep
        distance <<= 1
    for give_lo, give_hi, partner in reversed(given):
        ex.send(out[lo:hi], partner)
        ex.wait(ex.recv(out[give_lo:give_hi], partner))
        ex.finish()
        lo, hi = min(lo, give_lo), max(hi, give_hi)
    if pair is not None:
        ex.send(out, pair)
        ex.finish()


def _segmented_exchange(
    ex: Exchange,
    outgoing: torch.Tensor | None,
    send_peer: int,
    incoming: torch.Tensor,
    recv_peer: int,
    lo: int,
    hi: int,
    seg: int,
    out: torch.Tensor,
    own: torch.Tensor,
    combine: BoundCombine,
    received_first: bool,
) -> None:
    """Send `outgoing`, receive [lo, hi) into `incoming` segment by segment,
    and combine each segment into out[lo:hi] as soon as it arrives: own ⊕
    received, or received ⊕ own when `received_first`."""
    ranges = segment_ranges(lo, hi, seg)
    works = [ex.recv(incoming[a - lo : b - lo], recv_peer) for a, b in ranges]
    if outgoing is not None:
        for a in range(0, outgoing.numel(), seg):
            ex.send(outgoing[a : a + seg], send_peer)
    for work, (a, b) in zip(works, ranges):
        ex.wait(work)
        received = incoming[a - lo : b - lo]
        if received_first:
            combine(out[a:b], received, own[a:b], a)
        else:
            combine(out[a:b], own[a:b], received, a)


class HalvingDoublingAllReduceImplementation(FlatAllReduce):
    """Recursive halving + doubling that keeps rank order, for elementwise
    combines (commutative or not) and native kinds."""

    name = HALVING_DOUBLING

    def run(self, flat, out, combine, ex) -> None:
        halving_doubling_all_reduce(flat, out, combine, ex)
