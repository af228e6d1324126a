"""The Torch implementation of mesh-to-mesh transfers.

Both sides read the same static transfer map, computed once at compile
time with the op's plan (`TransferOp.transfer_plan`), so every message's size is known in advance
and needs no header. The map runs as one batch of point-to-point
exchanges; messages between one pair of ranks are posted in map order on
both sides, which is how gloo and NCCL match them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from distir.core.invocation import Invocation
from distir.ops.transfer.ir import TransferOp, TransferPlan
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation


def _slices(offsets: Sequence[int], sizes: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(o, o + s) for o, s in zip(offsets, sizes))


class TransferImplementation(Implementation):
    """A mesh-to-mesh transfer as one batch of point-to-point exchanges."""

    name = "transfer-p2p"
    operation_types = (TransferOp,)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        plan: TransferPlan = invocation.properties["plan"]
        x = inputs[0]
        me = resources.rank
        resources.precondition(invocation, inputs)  # the shard has its layout's shape
        shape = plan.dest_box(me).sizes if me in plan.dest_mesh.ranks else plan.outside_shape
        y = torch.zeros(shape, dtype=x.dtype, device=x.device)
        ops, arrivals = [], []
        for t in plan.transfers:
            if t.src_rank == me and t.dst_rank == me:
                arrivals.append((t, x[_slices(t.src_offsets, t.box.sizes)]))
            elif t.src_rank == me:
                piece = x[_slices(t.src_offsets, t.box.sizes)].contiguous()
                ops.append(dist.P2POp(dist.isend, piece, group=resources.group,
                                      group_peer=t.dst_rank))
            elif t.dst_rank == me:
                buffer = torch.empty(t.box.sizes, dtype=x.dtype, device=x.device)
                ops.append(dist.P2POp(dist.irecv, buffer, group=resources.group,
                                      group_peer=t.src_rank))
                arrivals.append((t, buffer))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                resources.complete(work, invocation)
        # Apply in map order: partial addends are summed in source-rank order.
        for t, piece in arrivals:
            target = y[_slices(t.dst_offsets, t.box.sizes)]
            if t.partial:
                target.add_(piece)
            else:
                target.copy_(piece)
        return (y,)


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [TransferImplementation()]
