"""What every all-reduce algorithm shares: chunk layout, segment sizes, and
the plumbing of an implementation over flat tensors.

An algorithm is a function of (flat input, flat output, combine, exchange):
it reads only its input, writes only its output (which may be the input
itself when the runtime lets the op overwrite it), and talks to its peers
only through the `Exchange` (group ranks), so it runs unchanged over
torch.distributed and over the in-process exchange tests use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from distir.ops.all_reduce.ir import AllReduceOp, algorithm_applies
from distir.ops.all_reduce.torch.combines import BoundCombine, build_combine
from distir.transport.buffers import pooled_empty
from distir.transport.exchange import Exchange, TorchExchange
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation, Invocation

#: Bytes per message segment; None picks one eighth of a chunk, clamped to
#: [MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES]: small enough that combining one
#: segment overlaps the transfer of the next, large enough that the
#: per-message costs (about 100 us of Python and gloo posting) stay small.
SEGMENT_BYTES: int | None = None
MIN_SEGMENT_BYTES = 1 << 20
MAX_SEGMENT_BYTES = 4 << 20


def split_even(n: int, parts: int) -> list[int]:
    """Offsets of `parts` contiguous chunks of `n` elements whose sizes differ
    by at most one: chunk c is [offsets[c], offsets[c + 1])."""
    base, extra = divmod(n, parts)
    offsets = [0]
    for c in range(parts):
        offsets.append(offsets[-1] + base + (1 if c < extra else 0))
    return offsets


def segment_ranges(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(stop, a + size)) for a in range(start, stop, size)]


def segment_elements(element_size: int, chunk_elements: int) -> int:
    if SEGMENT_BYTES is not None:
        return max(1, SEGMENT_BYTES // element_size)
    wanted = chunk_elements * element_size // 8
    return max(1, min(MAX_SEGMENT_BYTES, max(MIN_SEGMENT_BYTES, wanted)) // element_size)


def virtual_layout(size: int, rank: int) -> tuple[int, int, int | None]:
    """(p2, virtual rank or -1, partner for the pair fold) for a group of
    `size`: the largest power of two p2 <= size; ranks 2i and 2i+1 for
    i < size − p2 fold into virtual rank i, the rest shift down."""
    p2 = 1 << (size.bit_length() - 1)
    extra = size - p2
    if rank < 2 * extra:
        return p2, (rank // 2 if rank % 2 == 0 else -1), (rank + 1 if rank % 2 == 0 else rank - 1)
    return p2, rank - extra, None


def real_rank(virtual: int, size: int, p2: int) -> int:
    extra = size - p2
    return 2 * virtual if virtual < extra else virtual + extra


class AllReduceAlgorithm(Implementation):
    """An all-reduce algorithm, chosen by its `name`: it runs the ops whose
    combine it computes exactly, as `ir.all_reduce.ALGORITHM_NEEDS` says."""

    operation_types = (AllReduceOp,)

    def matches(self, op) -> bool:
        return isinstance(op, AllReduceOp) and algorithm_applies(self.name, op)


class FlatAllReduce(AllReduceAlgorithm):
    """Shared plumbing: the op's precondition, flatten, the result buffer (the
    input itself when writable), P = 1 and N = 0, and the combine, built
    once per op."""

    def __init__(self) -> None:
        self._combines: dict[int, tuple[Invocation, Any]] = {}

    def combine_for(self, invocation: Invocation) -> Any:
        entry = self._combines.get(id(invocation))
        if entry is None or entry[0] is not invocation:
            entry = (invocation, build_combine(invocation.op, invocation.regions))
            self._combines[id(invocation)] = entry
        return entry[1]

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        x, *extras = inputs
        resources.precondition(invocation, inputs)
        flat = x.contiguous().reshape(-1)
        if 0 in writable and flat.data_ptr() == x.data_ptr():
            out = flat
        else:
            out = pooled_empty((flat.numel(),), x)
            if resources.size == 1 or flat.numel() == 0:
                out.copy_(flat)
        if resources.size == 1 or flat.numel() == 0:
            return (out.view(x.shape),)
        combine = self.combine_for(invocation).bind(extras, x)
        self.run(flat, out, combine, TorchExchange(resources, invocation))
        return (out.view(x.shape),)

    def run(self, flat: torch.Tensor, out: torch.Tensor, combine: BoundCombine,
            ex: Exchange) -> None:
        raise NotImplementedError
