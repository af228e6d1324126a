"""Point-to-point implementations: send, recv, sendrecv and mesh transfers.

Every `dist.send`/`dist.sendrecv` message is preceded by a fixed-size header
(dtype and shape, see `resources.tensor_descriptor`), which the receiver
checks against its op's result type: a mismatch is an error naming the op,
never garbage, and a dynamically shaped receive learns its shape from it.

Mesh transfers need no header: both sides compute the same static transfer
map, so every message's size is known in advance. Messages between one pair
of ranks are posted in map order on both sides, which is how gloo and NCCL
match them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from distir.backends.groups import (
    DTYPE_CODES,
    ProcessGroupResource,
    describe_descriptor,
    tensor_descriptor,
)
from distir.backends.registry import Implementation, Invocation
from distir.errors import CollectiveMismatchError
from distir.interpreters.checks import check_peer, fail
from distir.ir.dialect import RecvOp, SendOp, SendRecvOp, TransferOp
from distir.ir.layouts import local_box

HEADER_SIZE = 10
_CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def _peer(invocation: Invocation, static: str, dynamic: torch.Tensor | None, size: int) -> int:
    peer = invocation.properties.get(static)
    peer = int(dynamic) if peer is None else peer
    check_peer(invocation, "destination" if static == "dest" else "source", peer, size)
    return peer


def _wait_all(resources: ProcessGroupResource, works: Sequence, invocation: Invocation) -> None:
    for work in works:
        resources.complete(work, invocation)


def _header(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor(tensor_descriptor(x), dtype=torch.int64, device=x.device)


def _buffer_for(invocation: Invocation, header: torch.Tensor, peer: int) -> torch.Tensor:
    """A receive buffer for the announced message, after checking it against
    the op's result type."""
    row = header.tolist()
    dtype = _CODE_DTYPES.get(row[0])
    shape = row[2 : 2 + row[1]]
    expected_dtype = invocation.properties["result_dtype"]
    declared = invocation.result_shapes[0]
    if (
        dtype != expected_dtype
        or len(shape) != len(declared)
        or any(d is not None and d != s for d, s in zip(declared, shape))
    ):
        shown = "x".join("?" if d is None else str(d) for d in declared)
        raise CollectiveMismatchError(
            invocation.description,
            f"group rank {peer} sent {describe_descriptor(row)} but this op receives "
            f"tensor<{shown}x{str(expected_dtype).replace('torch.', '')}>",
        )
    return torch.empty(shape, dtype=dtype, device=header.device)


def _p2p(op: Callable, tensor: torch.Tensor, peer: int, res: ProcessGroupResource):
    return dist.P2POp(op, tensor, group=res.group, group_peer=peer)


class SendImplementation(Implementation):
    name = "send"
    operation_types = (SendOp,)

    def execute(self, invocation, inputs, resources, *, in_place):
        x = inputs[0].contiguous()
        peer = _peer(invocation, "dest", inputs[1] if len(inputs) > 1 else None, resources.size)
        works = dist.batch_isend_irecv(
            [_p2p(dist.isend, _header(x), peer, resources), _p2p(dist.isend, x, peer, resources)]
        )
        _wait_all(resources, works, invocation)
        return ()


class RecvImplementation(Implementation):
    name = "recv"
    operation_types = (RecvOp,)

    def execute(self, invocation, inputs, resources, *, in_place):
        peer = _peer(invocation, "source", inputs[0] if inputs else None, resources.size)
        device = torch.device("cuda", torch.cuda.current_device()) if (
            resources.backend == "nccl"
        ) else torch.device("cpu")
        header = torch.empty(HEADER_SIZE, dtype=torch.int64, device=device)
        _wait_all(resources, dist.batch_isend_irecv(
            [_p2p(dist.irecv, header, peer, resources)]), invocation)
        y = _buffer_for(invocation, header, peer)
        _wait_all(resources, dist.batch_isend_irecv(
            [_p2p(dist.irecv, y, peer, resources)]), invocation)
        return (y,)


class SendRecvImplementation(Implementation):
    name = "sendrecv"
    operation_types = (SendRecvOp,)

    def execute(self, invocation, inputs, resources, *, in_place):
        x = inputs[0].contiguous()
        dynamic = list(inputs[1:])
        dest = _peer(invocation, "dest",
                     dynamic.pop(0) if invocation.properties.get("dest") is None else None,
                     resources.size)
        source = _peer(invocation, "source",
                       dynamic.pop(0) if invocation.properties.get("source") is None else None,
                       resources.size)
        header_in = torch.empty(HEADER_SIZE, dtype=torch.int64, device=x.device)
        works = dist.batch_isend_irecv([
            _p2p(dist.isend, _header(x), dest, resources),
            _p2p(dist.irecv, header_in, source, resources),
        ])
        _wait_all(resources, works, invocation)
        y = _buffer_for(invocation, header_in, source)
        works = dist.batch_isend_irecv([
            _p2p(dist.isend, x, dest, resources),
            _p2p(dist.irecv, y, source, resources),
        ])
        _wait_all(resources, works, invocation)
        return (y,)


def _slices(offsets: Sequence[int], sizes: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(o, o + s) for o, s in zip(offsets, sizes))


class TransferImplementation(Implementation):
    """A mesh-to-mesh transfer as one batch of point-to-point exchanges."""

    name = "transfer-p2p"
    operation_types = (TransferOp,)

    def execute(self, invocation, inputs, resources, *, in_place):
        src_mesh, src_layout, dst_mesh, dst_layout, shape, transfers = invocation.properties[
            "plan"
        ]
        x = inputs[0]
        me = resources.rank
        dtype = x.dtype
        if me in src_mesh.ranks:
            box = local_box(src_mesh, src_layout, shape, me)
            if tuple(x.shape) != tuple(box.sizes):
                raise fail(
                    invocation,
                    f"rank {me} of source mesh @{src_mesh.name} holds a shard of shape "
                    f"{list(x.shape)}, but its layout gives it {list(box.sizes)}",
                )
        if me in dst_mesh.ranks:
            out_box = local_box(dst_mesh, dst_layout, shape, me)
            y = torch.zeros(out_box.sizes, dtype=dtype, device=x.device)
        else:
            y = torch.empty([0] * len(shape), dtype=dtype, device=x.device)
        ops, arrivals = [], []
        for t in transfers:
            if t.src_rank == me and t.dst_rank == me:
                arrivals.append((t, x[_slices(t.src_offsets, t.box.sizes)]))
            elif t.src_rank == me:
                piece = x[_slices(t.src_offsets, t.box.sizes)].contiguous()
                ops.append(dist.P2POp(dist.isend, piece, group=resources.group,
                                      group_peer=t.dst_rank))
            elif t.dst_rank == me:
                buffer = torch.empty(t.box.sizes, dtype=dtype, device=x.device)
                ops.append(dist.P2POp(dist.irecv, buffer, group=resources.group,
                                      group_peer=t.src_rank))
                arrivals.append((t, buffer))
        if ops:
            _wait_all(resources, dist.batch_isend_irecv(ops), invocation)
        # Apply in map order: partial addends are summed in source-rank order.
        for t, piece in arrivals:
            target = y[_slices(t.dst_offsets, t.box.sizes)]
            if t.partial:
                target.add_(piece)
            else:
                target.copy_(piece)
        return (y,)


def p2p_contributions() -> list[Implementation]:
    return [
        SendImplementation(),
        RecvImplementation(),
        SendRecvImplementation(),
        TransferImplementation(),
    ]
