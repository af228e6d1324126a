"""What an executor needs about one op, decoded from the IR once.

Both the Torch backend and the reference interpreter run dist ops from an
`Invocation`: the op's description for errors, its group, its static
properties as plain Python values and the static shapes of its results,
decoded at compile time so that nothing reads IR at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from xdsl.dialects.builtin import IntegerAttr
from xdsl.ir import Operation

from distir.interpreters.dtypes import element_dtype, static_shape
from distir.ir.dialect import (
    ASSUMED_GROUP_SIZE,
    AllGatherOp,
    AllReduceOp,
    BroadcastOp,
    GroupMemberOp,
    RecvOp,
    SendOp,
    SendRecvOp,
    TransferOp,
    VariableAllToAllOp,
)
from distir.ir.layouts import transfer_map
from distir.ir.parsing import describe_op


@dataclass(frozen=True)
class Invocation:
    """Everything an implementation needs about one op, decoded once at
    compile time: its description for errors, its group, static properties,
    the static shapes of its results and its compiled regions."""

    op: Operation
    description: str
    group: str | None
    properties: Mapping[str, Any]
    result_shapes: tuple[tuple[int | None, ...], ...]
    operand_shapes: tuple[tuple[int | None, ...], ...] = ()
    regions: tuple[Callable[..., tuple[torch.Tensor, ...]], ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)

    def dynamic(self, operand: int) -> bool:
        """Whether the operand's IR type leaves some dimension dynamic."""
        return None in self.operand_shapes[operand]


def transfer_plan(op: TransferOp):
    """(source mesh, source layout, destination mesh, destination layout,
    global shape, map) of a transfer op: computed once, at compile time."""
    src_mesh, src_layout, dst_mesh, dst_layout, shape = op.transfer_spec()
    return src_mesh, src_layout, dst_mesh, dst_layout, shape, transfer_map(
        src_mesh, src_layout, dst_mesh, dst_layout, shape
    )


def decode_properties(op: Operation) -> dict[str, Any]:
    """The properties of a dist op as plain Python values."""
    props: dict[str, Any] = {}
    if isinstance(op, BroadcastOp):
        props["root"] = None if op.root is None else op.root.value.data
    elif isinstance(op, AllReduceOp):
        props["kind"] = None if op.kind is None else str(op.kind.data)
        assumed = op.attributes.get(ASSUMED_GROUP_SIZE)
        props["assumed_max_group_size"] = (
            assumed.value.data if isinstance(assumed, IntegerAttr) else None
        )
    elif isinstance(op, AllGatherOp | VariableAllToAllOp):
        props["axis"] = op.axis.value.data
    if isinstance(op, SendOp | SendRecvOp):
        props["dest"] = None if op.dest is None else op.dest.value.data
    if isinstance(op, RecvOp | SendRecvOp):
        props["source"] = None if op.source is None else op.source.value.data
        props["result_dtype"] = element_dtype(op.result.type)
    if isinstance(op, TransferOp):
        props["plan"] = transfer_plan(op)
    return props


def make_invocation(
    op: Operation,
    regions: Sequence[Callable[..., tuple[torch.Tensor, ...]]] = (),
    options: Mapping[str, Any] | None = None,
) -> Invocation:
    group = None
    if isinstance(op, GroupMemberOp) and op.group is not None:
        group = op.group.root_reference.data
    return Invocation(
        op=op,
        description=describe_op(op),
        group=group,
        properties=decode_properties(op),
        result_shapes=tuple(static_shape(r.type) for r in op.results),
        operand_shapes=tuple(static_shape(v.type) for v in op.operands),
        regions=tuple(regions),
        options=dict(options or {}),
    )
