"""The builder helper of `dist.variable_all_to_all`."""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType
from xdsl.ir import SSAValue

from distir.ir.building import (
    GroupRef,
    Value,
    located,
    with_dynamic_axis,
)
from distir.ops.all_to_all.ir import VariableAllToAllOp


@located
def variable_all_to_all(
    x: Value,
    send_counts: Value,
    *,
    axis: int = 0,
    result_type: TensorType | None = None,
    group: GroupRef = None,
) -> tuple[SSAValue, SSAValue]:
    """Returns `(received rows, recv_counts)`; the received axis is dynamic
    unless `result_type` says otherwise."""
    t = result_type or with_dynamic_axis(SSAValue.get(x).type, axis)
    op = VariableAllToAllOp(x, send_counts, t, axis=axis, group=group)
    return op.result, op.recv_counts
