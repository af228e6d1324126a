"""`dist.shift` on the Torch backend: one all-to-all in which each rank
sends its whole `x` to one peer and receives one peer's (gloo's and NCCL's
`all_to_all_single`, split counts of 0 and 1 message). A collective, not
paired sends and receives: it cannot deadlock, whatever the offset, and
its wait is bounded by the op's deadline like every collective's. A rank
with no source (the open ends of a shift without `rotate`) returns zeros.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distir.core.invocation import Invocation
from distir.ops.shift.ir import ShiftOp, shift_source
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation


class ShiftImplementation(Implementation):
    name = "shift-all-to-all"
    operation_types = (ShiftOp,)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        resources.precondition(invocation, inputs)
        offset, rotate = invocation.properties["offset"], invocation.properties["rotate"]
        x, size, me = inputs[0], resources.size, resources.rank
        source = shift_source(me, size, offset, rotate)
        dest = next((r for r in range(size) if shift_source(r, size, offset, rotate) == me), None)
        # One row per message: the whole tensor (read only; never the caller's as a result).
        row = x.contiguous().reshape(1, -1)
        got = torch.empty((int(source is not None), row.shape[1]), dtype=x.dtype, device=x.device)
        if row.shape[1]:  # every rank's shape is the same: all skip or none
            send = [int(r == dest) for r in range(size)]
            recv = [int(r == source) for r in range(size)]
            resources.all_to_all(got, row if dest is not None else row[:0], recv, send,
                                 invocation, wait=True)  # fmt: skip
        if source is None:
            return (torch.zeros_like(x, memory_format=torch.contiguous_format),)
        return (got.reshape(x.shape),)


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [ShiftImplementation()]
