"""Semantics records of the point-to-point ops: send, recv, sendrecv.

Messages travel through one FIFO mailbox per (group, source, destination);
a receive checks the message against the op's result type, as the Torch
backend checks the header that precedes every message. Peers are static
properties or, when the IR leaves them dynamic, leading index operands.
"""

from __future__ import annotations

from typing import Any

import torch
from xdsl.ir import Operation

from distir.core.checks import named_rank
from distir.core.dtypes import element_dtype, fits_shape
from distir.core.records import Inputs, OpSemantics, ReferenceCall, Results
from distir.errors import CollectiveMismatchError
from distir.ops.p2p.ir import RecvOp, SendOp, SendRecvOp


def _static_peer(op: Operation, name: str) -> int | None:
    attr = getattr(op, name)
    return None if attr is None else attr.value.data


def _decode(op: SendOp | RecvOp | SendRecvOp) -> dict[str, Any]:
    props: dict[str, Any] = {}
    if isinstance(op, SendOp | SendRecvOp):
        props["dest"] = _static_peer(op, "dest")
    if isinstance(op, RecvOp | SendRecvOp):
        props["source"] = _static_peer(op, "source")
        props["result_dtype"] = element_dtype(op.result.type)
    return props


def _receive(call: ReferenceCall, source: int) -> torch.Tensor:
    message = call.take(source)
    inv = call.invocation
    declared = inv.result_shapes[0]
    if message.dtype != inv.properties["result_dtype"] or not fits_shape(declared, message.shape):
        raise CollectiveMismatchError(
            inv.description,
            f"group rank {source} sent {message.dtype} {list(message.shape)}, which "
            "this op's result type does not admit",
        )
    return message


class SendSemantics(OpSemantics):
    op = SendOp

    def decode(self, op: SendOp) -> dict[str, Any]:
        return _decode(op)

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        call.post(named_rank(call.invocation, "dest", list(inputs[1:]), call.size), inputs[0])
        return ()


class RecvSemantics(OpSemantics):
    op = RecvOp

    def decode(self, op: RecvOp) -> dict[str, Any]:
        return _decode(op)

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        return (_receive(call, named_rank(call.invocation, "source", list(inputs), call.size)),)


class SendRecvSemantics(OpSemantics):
    op = SendRecvOp

    def decode(self, op: SendRecvOp) -> dict[str, Any]:
        return _decode(op)

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        dynamic = list(inputs[1:])
        dest = named_rank(call.invocation, "dest", dynamic, call.size)
        source = named_rank(call.invocation, "source", dynamic, call.size)
        call.post(dest, inputs[0])
        return (_receive(call, source),)


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (SendSemantics(), RecvSemantics(), SendRecvSemantics(),)
