"""The run-time meaning of every dist op: one semantics record per op.

`SEMANTICS` lists the records, derived from the op table
(`distir.ops.table`): each running family's `semantics` module contributes
its `SEMANTICS`, imported by name from the table (declared edges of the
import graph, as the pass table's). The simulator, the checks and the
runtime read it from here, and nothing registers itself on import. A record
(`distir.core.records.OpSemantics`) holds, in one block, how its op decodes into an
`Invocation`, its precondition and its reference meaning.

Local checks with no communication (`dist.assert_reduced`) are kernels, in
their family's `KERNELS` (`LOCAL_CHECK_KERNELS` collects them); declarations,
terminators and waves (`dist.group`, `dist.mesh`, `dist.yield`, `dist.wave`)
have no record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from typing import Any

import torch
from xdsl.ir import Operation

from distir.core.checks import PreconditionRule
from distir.core.dtypes import static_shape
from distir.core.invocation import Invocation
from distir.core.kernels import KernelFactory
from distir.core.records import OpSemantics
from distir.ir.dialect import GroupMemberOp
from distir.ir.parsing import describe_op
from distir.ops.table import running_families

__all__ = ["LOCAL_CHECK_KERNELS", "SEMANTICS", "OpSemantics", "make_invocation", "precondition_rule", "semantics_of"]

#: every dist op's semantics record
SEMANTICS: tuple[OpSemantics, ...] = tuple(
    record
    for family in running_families()
    for record in import_module(family.semantics_module).SEMANTICS
)

#: the kernel factory of every dist op that is a `LocalCheck`, from the
#: families' `KERNELS` (read by the block compiler beside the local ops')
LOCAL_CHECK_KERNELS: Mapping[type[Operation], KernelFactory] = {
    op: factory
    for family in running_families()
    for op, factory in getattr(import_module(family.semantics_module), "KERNELS", {}).items()
}

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
