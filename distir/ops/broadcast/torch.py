"""Torch implementation of `dist.broadcast` over torch.distributed.

The same code runs gloo on CPU tensors and NCCL on CUDA tensors. Every
implementation first takes its op's precondition from the group
(`ProcessGroupResource.precondition`: local checks, and the agreement
exchange when the op needs one), then moves the payload. Results come from
the shared buffer pool, or are the input itself when the runtime marks it
writable (donated, or an intermediate whose last use is this op): that is
how a native collective runs at the speed of the raw in-place call."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from distir.core.dtypes import element_dtype
from distir.core.invocation import Invocation
from distir.ops.broadcast.ir import BroadcastOp
from distir.transport.buffers import pooled_copy, pooled_empty
from distir.transport.direct import DirectCollective
from distir.transport.groups import COLLECTIVE_DTYPES, ProcessGroupResource
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation
from distir.transport.results import awaiting


class BroadcastImplementation(Implementation):
    name = "broadcast"
    operation_types = (BroadcastOp,)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        x, root = inputs[0], self._root(invocation, inputs, resources)
        y = self._written(x, root, resources.rank, writable)
        if y is None:  # the root's own copy overlaps the message
            return self._start_root(x, root, invocation, resources)()
        # Submitted and completed in one call, without a waiter.
        resources.broadcast(y, root, invocation, wait=True)
        return (y,)

    def direct(self, invocation: Invocation, resources: Transport) -> DirectCollective | None:
        if not isinstance(resources, ProcessGroupResource):
            return None  # one c10d collective: only on a process group
        root = invocation.properties["root"]
        dtype = element_dtype(invocation.op.operands[0].type)
        if root is None or dtype not in COLLECTIVE_DTYPES:
            return None
        # A static root and a type the backend moves as it is: `execute`'s
        # hot path with what it looks up on every run resolved now.
        written, rank, nothing = self._written, resources.rank, frozenset()
        return DirectCollective(
            invocation, resources, resources.pg.broadcast, dist.BroadcastOptions,
            (("rootRank", root), ("rootTensor", 0)), dtype,
            lambda x: written(x, root, rank, nothing),
        )  # fmt: skip

    def start(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> Callable[[], tuple[torch.Tensor, ...]]:
        x, root = inputs[0], self._root(invocation, inputs, resources)
        y = self._written(x, root, resources.rank, writable)
        if y is None:
            return self._start_root(x, root, invocation, resources)
        work = resources.broadcast(y, root, invocation)
        return awaiting(resources, work, invocation, (y,))

    @staticmethod
    def _root(
        invocation: Invocation, inputs: Sequence[torch.Tensor], resources: Transport
    ) -> int:
        root = invocation.properties["root"]
        if root is None:  # a dynamic root: checked and agreed on
            root = resources.precondition(invocation, inputs).decoded["root"]
        return root

    @staticmethod
    def _written(x, root: int, rank: int, writable) -> torch.Tensor | None:
        """The tensor the broadcast writes (a receiver) or sends from (the
        root) that is also the result; None for a root that must copy."""
        if rank != root:
            return x if 0 in writable and x.is_contiguous() else pooled_empty(x.shape, x)
        # The root sends straight from its input (a broadcast only reads it there).
        source = x.contiguous()
        return source if source is not x or 0 in writable else None

    @staticmethod
    def _start_root(
        x: torch.Tensor, root: int, invocation: Invocation, resources: Transport
    ) -> Callable[[], tuple[torch.Tensor, ...]]:
        """A root that may not write its input sends from it and makes its
        own result while the message is in flight."""
        work = resources.broadcast(x, root, invocation)
        return awaiting(resources, work, invocation, (pooled_copy(x),))


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [BroadcastImplementation()]
