"""The run-time meaning of every dist op: one semantics record per op.

`SEMANTICS` lists the records, explicitly, one module per op family
(`collectives`, `p2p`, `mesh`); the simulator, the checks and the runtime
read it from here, and nothing registers itself on import. A record
(`base.OpSemantics`) holds, in one block, how its op decodes into an
`Invocation`, its precondition and its reference meaning.

Local checks with no communication (`dist.assert_reduced`) are kernels
(`distir.interpreters.kernels`); declarations, terminators and waves
(`dist.group`, `dist.mesh`, `dist.yield`, `dist.wave`) have no record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from xdsl.ir import Operation

from distir.interpreters.checks import PreconditionRule
from distir.interpreters.dtypes import static_shape
from distir.interpreters.invocation import Invocation
from distir.interpreters.semantics.base import OpSemantics
from distir.interpreters.semantics.collectives import (
    AllGatherSemantics,
    AllReduceAddCiphertextSemantics,
    AllReduceSemantics,
    AssertUniformSemantics,
    BroadcastSemantics,
    GroupSizeSemantics,
    RankSemantics,
    VariableAllToAllSemantics,
)
from distir.interpreters.semantics.gather_scatter import GatherSemantics, ScatterSemantics
from distir.interpreters.semantics.mesh import TransferSemantics
from distir.interpreters.semantics.p2p import RecvSemantics, SendRecvSemantics, SendSemantics
from distir.interpreters.semantics.reduce import ReduceSemantics
from distir.interpreters.semantics.reduce_scatter import ReduceScatterSemantics
from distir.interpreters.semantics.replication import PsumSemantics, PvarySemantics
from distir.interpreters.semantics.shift import ShiftSemantics
from distir.ir.dialect import GroupMemberOp
from distir.ir.parsing import describe_op

__all__ = ["SEMANTICS", "OpSemantics", "make_invocation", "precondition_rule", "semantics_of"]

#: every dist op's semantics record
SEMANTICS: tuple[OpSemantics, ...] = (
    RankSemantics(),
    GroupSizeSemantics(),
    BroadcastSemantics(),
    AllReduceSemantics(),
    AllReduceAddCiphertextSemantics(),
    AssertUniformSemantics(),
    AllGatherSemantics(),
    ReduceScatterSemantics(),
    PsumSemantics(),
    PvarySemantics(),
    GatherSemantics(),
    ScatterSemantics(),
    ReduceSemantics(),
    ShiftSemantics(),
    VariableAllToAllSemantics(),
    SendSemantics(),
    RecvSemantics(),
    SendRecvSemantics(),
    TransferSemantics(),
)

_BY_OP: Mapping[type[Operation], OpSemantics] = {record.op: record for record in SEMANTICS}


def semantics_of(op_type: type[Operation]) -> OpSemantics | None:
    """The semantics record of an op type, or None (not a dist op with a record)."""
    return _BY_OP.get(op_type)


def precondition_rule(op_type: type[Operation]) -> PreconditionRule | None:
    """The precondition of an op type, or None when it has none to check."""
    record = _BY_OP.get(op_type)
    return None if record is None else record.precondition


def make_invocation(
    op: Operation,
    regions: Sequence[Callable[..., tuple[torch.Tensor, ...]]] = (),
    options: Mapping[str, Any] | None = None,
) -> Invocation:
    """The op's `Invocation`: decoded once, at compile time, by its record."""
    group = None
    if isinstance(op, GroupMemberOp) and op.group is not None:
        group = op.group.root_reference.data
    record = _BY_OP.get(type(op))
    return Invocation(
        op=op,
        description=describe_op(op),
        group=group,
        properties={} if record is None else record.decode(op),
        result_shapes=tuple(static_shape(r.type) for r in op.results),
        operand_shapes=tuple(static_shape(v.type) for v in op.operands),
        regions=tuple(regions),
        options=dict(options or {}),
    )
