"""`dist.gather` and `dist.scatter` on the Torch backend: the transport's
own gather and scatter (gloo's and NCCL's), rows first.

The axis is moved to the front (a copy unless it already is, contiguous),
so that each rank's part is one contiguous run of the message. The
transports move equal parts only: an uneven gather or scatter pads every
part to the largest count and slices on arrival, as the uneven all-gather
does. Results are fresh tensors, never the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distir.core.invocation import Invocation
from distir.ops.gather_scatter.ir import GatherOp, ScatterOp
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation


def _rows_first(x: torch.Tensor, axis: int) -> torch.Tensor:
    return x.movedim(axis, 0).contiguous()


def _padded(rows: torch.Tensor, widest: int) -> torch.Tensor:
    if rows.shape[0] == widest:
        return rows
    padded = torch.zeros((widest, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    padded[: rows.shape[0]] = rows
    return padded


class GatherImplementation(Implementation):
    name = "gather"
    operation_types = (GatherOp,)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        pre = resources.precondition(invocation, inputs)
        axis, root = invocation.properties["axis"], invocation.properties["root"]
        front = _rows_first(inputs[0], axis)
        counts = pre.decoded.get("counts") or [front.shape[0]] * resources.size
        message = _padded(front, max(counts))
        rest = tuple(front.shape[1:])
        if resources.rank == root:
            parts = [torch.empty_like(message) for _ in counts]
        else:
            parts = []
        # Every rank's message has the same (agreed) shape: all skip or none.
        if message.numel():
            resources.gather(parts, message, root, invocation, wait=True)
        if resources.rank != root:
            out = torch.zeros((sum(counts), *rest), dtype=front.dtype, device=front.device)
        elif parts:
            out = torch.cat([p[:c] for p, c in zip(parts, counts)])
        else:
            out = torch.empty((sum(counts), *rest), dtype=front.dtype, device=front.device)
        return (out.movedim(0, axis).contiguous(),)


class ScatterImplementation(Implementation):
    name = "scatter"
    operation_types = (ScatterOp,)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        pre = resources.precondition(invocation, inputs)
        axis, root = invocation.properties["axis"], invocation.properties["root"]
        front = _rows_first(inputs[0], axis)
        size = resources.size
        counts = pre.decoded.get("counts") or [front.shape[0] // size] * size
        widest = max(counts)
        out = torch.empty((widest, *front.shape[1:]), dtype=front.dtype, device=front.device)
        parts = []
        if resources.rank == root:
            parts = [_padded(part, widest) for part in torch.split(front, counts)]
        if out.numel():
            resources.scatter(out, parts, root, invocation, wait=True)
        return (out[: counts[resources.rank]].movedim(0, axis).contiguous(),)


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [GatherImplementation(), ScatterImplementation()]
