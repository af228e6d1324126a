"""Torch implementation of `dist.all_gather`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distir.core.invocation import Invocation
from distir.ops.all_gather.ir import AllGatherOp
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation
from distir.transport.results import gather_stacked


class AllGatherImplementation(Implementation):
    name = "all-gather"
    operation_types = (AllGatherOp,)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        axis = invocation.properties["axis"]
        x = inputs[0]
        pre = resources.precondition(invocation, inputs)
        if len(inputs) == 1:
            stacked = gather_stacked(x, resources, invocation)
            if axis == 0:
                return (stacked.flatten(0, 1) if x.dim() else stacked,)
            return (torch.cat(stacked.unbind(0), dim=axis),)
        counts = pre.decoded["counts"]
        # gloo has no uneven all-gather: pad every part to the largest, gather, slice.
        widest = max(counts)
        padded_shape = list(x.shape)
        padded_shape[axis] = widest
        padded = torch.zeros(padded_shape, dtype=x.dtype, device=x.device)
        padded.narrow(axis, 0, x.shape[axis]).copy_(x)
        stacked = gather_stacked(padded, resources, invocation)
        parts = [stacked[r].narrow(axis, 0, c) for r, c in enumerate(counts)]
        return (torch.cat(parts, dim=axis),)


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [AllGatherImplementation()]
