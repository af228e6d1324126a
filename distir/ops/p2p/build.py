"""The builder helpers of point-to-point: `send`, `recv`, `sendrecv`."""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType
from xdsl.ir import SSAValue

from distir.ir.building import (
    GroupRef,
    Peer,
    Value,
    located,
)
from distir.ops.p2p.ir import RecvOp, SendOp, SendRecvOp


@located
def send(x: Value, dest: Peer, group: GroupRef = None) -> None:
    """Sends `x` to group rank `dest` (an int, or an index value)."""
    SendOp(x, dest, group)


@located
def recv(source: Peer, result_type: TensorType, group: GroupRef = None) -> SSAValue:
    """Receives a tensor of `result_type` from group rank `source`."""
    return RecvOp(source, result_type, group).result


@located
def sendrecv(
    x: Value,
    dest: Peer,
    source: Peer,
    *,
    result_type: TensorType | None = None,
    group: GroupRef = None,
) -> SSAValue:
    """Sends `x` to `dest` and receives from `source` in one exchange that
    cannot deadlock; the received type is `x`'s unless `result_type` says."""
    return SendRecvOp(x, dest, source, result_type, group).result
