"""Run-time meaning of point-to-point ops: reference rules.

Messages travel through one FIFO mailbox per (group, source, destination);
a receive checks the message against the op's result type, as the Torch
backend checks the header that precedes every message.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from distir.errors import CollectiveMismatchError
from distir.interpreters.checks import check_peer
from distir.interpreters.reference import SimulatedCall, reference
from distir.ir.dialect import RecvOp, SendOp, SendRecvOp

Inputs = Sequence[torch.Tensor]


def _peer(call: SimulatedCall, name: str, dynamic: list[torch.Tensor]) -> int:
    value = call.invocation.properties.get(name)
    value = int(dynamic.pop(0)) if value is None else value
    check_peer(call.invocation, "destination" if name == "dest" else "source", value, call.size)
    return value


def _receive(call: SimulatedCall, source: int) -> torch.Tensor:
    message = call.take(source)
    inv = call.invocation
    declared = inv.result_shapes[0]
    if message.dtype != inv.properties["result_dtype"] or message.dim() != len(declared) or any(
        d is not None and d != s for d, s in zip(declared, message.shape)
    ):
        raise CollectiveMismatchError(
            inv.description,
            f"group rank {source} sent {message.dtype} {list(message.shape)}, which "
            "this op's result type does not admit",
        )
    return message


@reference(SendOp)
def send_reference(call: SimulatedCall, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    call.post(_peer(call, "dest", list(inputs[1:])), inputs[0])
    return ()


@reference(RecvOp)
def recv_reference(call: SimulatedCall, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    return (_receive(call, _peer(call, "source", list(inputs))),)


@reference(SendRecvOp)
def sendrecv_reference(call: SimulatedCall, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    dynamic = list(inputs[1:])
    dest = _peer(call, "dest", dynamic)
    source = _peer(call, "source", dynamic)
    call.post(dest, inputs[0])
    return (_receive(call, source),)
