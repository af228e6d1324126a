"""Point-to-point implementations: send, recv and sendrecv.

Every `dist.send`/`dist.sendrecv` message is preceded by a fixed-size header
(dtype and shape, `tensor_header`), which the receiver checks against its
op's result type: a mismatch is an error naming the op, never garbage, and a
dynamically shaped receive learns its shape from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from distir.core.checks import named_rank
from distir.core.dtypes import fits_shape
from distir.errors import CollectiveMismatchError
from distir.ops.p2p.ir import RecvOp, SendOp, SendRecvOp
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation, Invocation

#: dtype codes of message headers
DTYPE_CODES = {
    dtype: code
    for code, dtype in enumerate(
        [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
         torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint16,
         torch.uint32, torch.uint64]
    )
}  # fmt: skip
_CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
HEADER_DIMS = 8
HEADER_SIZE = 2 + HEADER_DIMS


def tensor_header(x: torch.Tensor) -> list[int]:
    """[dtype code, rank, dims...] padded to HEADER_SIZE; tensors of higher
    rank than HEADER_DIMS are rejected by the sender."""
    if x.dim() > HEADER_DIMS:
        raise ValueError(f"point-to-point messages have at most {HEADER_DIMS} dimensions")
    dims = list(x.shape)
    return [DTYPE_CODES.get(x.dtype, 99), x.dim(), *dims, *[0] * (HEADER_DIMS - len(dims))]


def describe_header(row: Sequence[int]) -> str:
    dtype = _CODE_DTYPES.get(row[0])
    name = str(dtype).replace("torch.", "") if dtype is not None else "?"
    dims = row[2 : 2 + min(row[1], HEADER_DIMS)]
    return f"{name}[{', '.join(map(str, dims))}]" if row[1] else f"{name} scalar"


def _wait_all(resources: Transport, works: Sequence, invocation: Invocation) -> None:
    for work in works:
        resources.complete(work, invocation)


def _header(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor(tensor_header(x), dtype=torch.int64, device=x.device)


def _buffer_for(invocation: Invocation, header: torch.Tensor, peer: int) -> torch.Tensor:
    """A receive buffer for the announced message, after checking it against
    the op's result type."""
    row = header.tolist()
    dtype = _CODE_DTYPES.get(row[0])
    shape = row[2 : 2 + row[1]]
    expected_dtype = invocation.properties["result_dtype"]
    declared = invocation.result_shapes[0]
    if dtype != expected_dtype or not fits_shape(declared, shape):
        shown = "x".join("?" if d is None else str(d) for d in declared)
        raise CollectiveMismatchError(
            invocation.description,
            f"group rank {peer} sent {describe_header(row)} but this op receives "
            f"tensor<{shown}x{str(expected_dtype).replace('torch.', '')}>",
        )
    return torch.empty(shape, dtype=dtype, device=header.device)


def _p2p(op: Callable, tensor: torch.Tensor, peer: int, res: Transport):
    return dist.P2POp(op, tensor, group=res.group, group_peer=peer)


class SendImplementation(Implementation):
    name = "send"
    operation_types = (SendOp,)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        x = inputs[0].contiguous()
        peer = named_rank(invocation, "dest", list(inputs[1:]), resources.size)
        works = dist.batch_isend_irecv(
            [_p2p(dist.isend, _header(x), peer, resources), _p2p(dist.isend, x, peer, resources)]
        )
        _wait_all(resources, works, invocation)
        return ()


class RecvImplementation(Implementation):
    name = "recv"
    operation_types = (RecvOp,)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        peer = named_rank(invocation, "source", list(inputs), resources.size)
        header = torch.empty(HEADER_SIZE, dtype=torch.int64, device=resources.device)
        _wait_all(resources, dist.batch_isend_irecv(
            [_p2p(dist.irecv, header, peer, resources)]), invocation)
        y = _buffer_for(invocation, header, peer)
        _wait_all(resources, dist.batch_isend_irecv(
            [_p2p(dist.irecv, y, peer, resources)]), invocation)
        return (y,)


class SendRecvImplementation(Implementation):
    name = "sendrecv"
    operation_types = (SendRecvOp,)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        x = inputs[0].contiguous()
        dynamic = list(inputs[1:])
        dest = named_rank(invocation, "dest", dynamic, resources.size)
        source = named_rank(invocation, "source", dynamic, resources.size)
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


def p2p_contributions() -> list[Implementation]:
    return [
        SendImplementation(),
        RecvImplementation(),
        SendRecvImplementation(),
    ]


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return p2p_contributions()
