"""Point-to-point ops: send, recv and the paired sendrecv.

Peers are ranks of the op's group, written as a literal (`to 1`) or an index
operand (`to %peer`).
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects.builtin import I64, IndexType, IntegerAttr, TensorType
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    result_def,
    traits_def,
)
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import CollectiveEffect
from distir.ir.facts import OperandRole
from distir.ir.syntax import GroupRef, StaticOrDynamicRank
from distir.ir.transpose import Cotangents, Transposable, Transposer
from distir.ops.groups.ir import GroupMemberOp, GroupName, group_property

Peer = int | SSAValue | Operation
"""A peer as builders take it: a static group rank or an index value."""


class PeerOp(GroupMemberOp, Transposable, ABC):
    """A point-to-point op: only the two ranks involved take part.

    Unlike collectives, point-to-point ops may sit under rank-dependent
    control flow (rank 0 sends, rank 1 receives). Peers are ranks of the
    op's group: a static attribute or an index operand. Every message carries
    a small header (dtype and shape), checked by the receiver, so a mismatch
    is an error naming the op instead of garbage.
    """

    traits = traits_def(CollectiveEffect())

    custom_directives = (StaticOrDynamicRank, GroupRef)

    # The peer's transposed op is always emitted: this one must be too.
    TRANSPOSED_WITHOUT_COTANGENT: ClassVar[bool] = True

    #: what the op does, in order: ("send", "dest") and/or ("recv", "source")
    #: (a paired exchange sends first, so it never waits on itself); the
    #: SPMD verifier matches the ranks' traffic from it
    TRAFFIC: ClassVar[tuple[tuple[str, str], ...]]

    def peer(self, which: str) -> int | SSAValue:
        """The `"dest"` or `"source"` rank: its static value, or the index
        operand that holds it."""
        attr = self.properties.get(which)
        return attr.value.data if isinstance(attr, IntegerAttr) else getattr(self, f"{which}_value")

    def peer_in_backward(self, t: Transposer, which: str) -> int | SSAValue:
        """`peer(which)` as the backward function reads it."""
        peer = self.peer(which)
        return peer if isinstance(peer, int) else t.primal(peer)

    def _verify_peer(self, attr: IntegerAttr | None, value: SSAValue | None, what: str) -> None:
        if (attr is None) == (value is None):
            raise VerifyException(f"'{self.name}' needs exactly one {what}")
        if attr is not None:
            self.verify_static_rank(what, attr.value.data)


@irdl_op_definition
class SendOp(PeerOp):
    """Sends `x` to group rank `to`, which must run a matching `dist.recv`
    (or `dist.sendrecv`)."""

    name = "dist.send"

    TRAFFIC: ClassVar[tuple[tuple[str, str], ...]] = (("send", "dest"),)

    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "dest_value": OperandRole.PEER,
    }

    input = operand_def(TensorType)
    dest_value = opt_operand_def(IndexType)
    dest = opt_prop_def(IntegerAttr[I64])

    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    assembly_format = (
        "$input `to` custom<StaticOrDynamicRank>($dest_value, $dest) custom<GroupRef>($group) "
        "attr-dict `:` type($input)"
    )

    def __init__(self, input: SSAValue | Operation, dest: Peer, group: GroupName = None):
        props: dict[str, Attribute] = {}
        dynamic = self.rank_operands(dest, "dest", props)
        group_property(props, group)
        super().__init__(operands=[SSAValue.get(input), dynamic], properties=props)

    def verify_(self) -> None:
        self.verify_group()
        self._verify_peer(self.dest, self.dest_value, "destination")

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """A receive from the destination."""
        received = RecvOp(self.peer_in_backward(t, "dest"), self.input.type, self.group)  # type: ignore[arg-type]
        return [t.emit(received).results[0], None]


@irdl_op_definition
class RecvOp(PeerOp):
    """Receives a tensor of the result type from group rank `from`."""

    name = "dist.recv"

    TRAFFIC: ClassVar[tuple[tuple[str, str], ...]] = (("recv", "source"),)

    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"source_value": OperandRole.PEER}

    source_value = opt_operand_def(IndexType)
    source = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "`from` custom<StaticOrDynamicRank>($source_value, $source) custom<GroupRef>($group) "
        "attr-dict `:` type($result)"
    )

    def __init__(self, source: Peer, result_type: TensorType, group: GroupName = None):
        props: dict[str, Attribute] = {}
        dynamic = self.rank_operands(source, "source", props)
        group_property(props, group)
        super().__init__(operands=[dynamic], result_types=[result_type], properties=props)

    def verify_(self) -> None:
        self.verify_group()
        self._verify_peer(self.source, self.source_value, "source")

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """A send of the cotangent (zeros when none) to the source."""
        ct = t.or_zeros(cotangents[0], self.result)
        t.emit(SendOp(ct, self.peer_in_backward(t, "source"), self.group))
        return [None] * len(self.operands)


@irdl_op_definition
class SendRecvOp(PeerOp):
    """Sends `x` to `to` and receives the result from `from`, as one paired
    exchange that cannot deadlock (a ring shift is one `dist.sendrecv` on
    every rank)."""

    name = "dist.sendrecv"

    TRAFFIC: ClassVar[tuple[tuple[str, str], ...]] = (("send", "dest"), ("recv", "source"))

    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "dest_value": OperandRole.PEER,
        "source_value": OperandRole.PEER,
    }

    input = operand_def(TensorType)
    dest_value = opt_operand_def(IndexType)
    source_value = opt_operand_def(IndexType)
    dest = opt_prop_def(IntegerAttr[I64])
    source = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    assembly_format = (
        "$input `to` custom<StaticOrDynamicRank>($dest_value, $dest) "
        "`from` custom<StaticOrDynamicRank>($source_value, $source) custom<GroupRef>($group) "
        "attr-dict `:` type($input) `->` type($result)"
    )

    def __init__(
        self,
        input: SSAValue | Operation,
        dest: Peer,
        source: Peer,
        result_type: TensorType | None = None,
        group: GroupName = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {}
        dest_operands = self.rank_operands(dest, "dest", props)
        source_operands = self.rank_operands(source, "source", props)
        group_property(props, group)
        super().__init__(
            operands=[input, dest_operands, source_operands],
            result_types=[result_type or input.type],
            properties=props,
        )

    def verify_(self) -> None:
        self.verify_group()
        self._verify_peer(self.dest, self.dest_value, "destination")
        self._verify_peer(self.source, self.source_value, "source")

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """The reverse exchange: to the source, from the destination."""
        ct = t.or_zeros(cotangents[0], self.result)
        back = SendRecvOp(
            ct,
            self.peer_in_backward(t, "source"),
            self.peer_in_backward(t, "dest"),
            self.input.type,  # type: ignore[arg-type]
            self.group,
        )
        return [t.emit(back).results[0], None, None]


PEER_OPS: tuple[type[PeerOp], ...] = (SendOp, RecvOp, SendRecvOp)
