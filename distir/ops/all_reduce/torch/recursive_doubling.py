"""Recursive-doubling all-reduce: whole tensors, rank order kept.

The algorithm for combines that are not elementwise (which cannot be cut
into chunks), and the cheapest for small messages: log2(P) rounds of
exchanging the current value with the partner at distance 1, 2, 4, … and
combining lower ⊕ upper; pairs fold first when P is not a power of two.
O(N) memory, N·log2(P) traffic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from distir.core.invocation import Invocation
from distir.core.kernels import NATIVE_FOLDS
from distir.ops.all_reduce.ir import RECURSIVE_DOUBLING
from distir.ops.all_reduce.torch.base import AllReduceAlgorithm, real_rank, virtual_layout
from distir.transport.buffers import pooled_copy
from distir.transport.exchange import Exchange, TorchExchange
from distir.transport.protocol import Transport

WholeCombine = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def recursive_doubling_all_reduce(
    x: torch.Tensor, combine: WholeCombine, ex: Exchange
) -> torch.Tensor:
    """The rank-order reduction of whole tensors (shape kept); never writes x."""
    size, rank = ex.size, ex.rank
    p2, virtual, pair = virtual_layout(size, rank)
    received = torch.empty_like(x)
    if pair is not None:
        if virtual < 0:
            ex.send(x, pair)
            ex.finish()
            ex.wait(ex.recv(received, pair))
            return received
        ex.wait(ex.recv(received, pair))
        current = owned(combine(x, received), x, received)
    else:
        current = x
    distance = 1
    while distance < p2:
        partner_v = virtual ^ distance
        partner = real_rank(partner_v, size, p2)
        ex.send(current, partner)
        ex.wait(ex.recv(received, partner))
        ex.finish()
        if virtual > partner_v:
            current = owned(combine(received, current), x, received)
        else:
            current = owned(combine(current, received), x, received)
        distance <<= 1
    if pair is not None:
        ex.send(current, pair)
        ex.finish()
    return current


def owned(t: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
    """`t` contiguous and sharing no memory with `others` (a region may
    yield one of its operands, or a broadcast view)."""
    ptr = t.untyped_storage().data_ptr()
    if not t.is_contiguous() or any(ptr == o.untyped_storage().data_ptr() for o in others):
        return t.contiguous().clone() if t.is_contiguous() else t.contiguous()
    return t


class RecursiveDoublingAllReduceImplementation(AllReduceAlgorithm):
    """Whole-tensor recursive doubling that keeps rank order, for any combine."""

    name = RECURSIVE_DOUBLING

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        x, *extras = inputs
        resources.precondition(invocation, inputs)
        x = x.contiguous()
        kind = invocation.properties["kind"]
        if resources.size == 1 or x.numel() == 0:
            return (pooled_copy(x),)
        if kind is not None:
            combine: WholeCombine = NATIVE_FOLDS[kind]
        else:
            region = invocation.regions[0]

            def combine(a, b):
                return region(a, b, *extras)[0]

        result = recursive_doubling_all_reduce(x, combine, TorchExchange(resources, invocation))
        if result is x:  # P = 1 on a virtual rank cannot happen, but never alias
            result = pooled_copy(x)
        return (result,)
