"""The builder helper of `dist.all_gather`."""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType
from xdsl.ir import SSAValue

from distir.ir.building import (
    GroupRef,
    Value,
    located,
    with_dynamic_axis,
)
from distir.ops.all_gather.ir import AllGatherOp


@located
def all_gather(
    x: Value,
    *,
    axis: int = 0,
    counts: Value | None = None,
    result_type: TensorType | None = None,
    group: GroupRef = None,
) -> SSAValue:
    """Even (or, with `counts`, uneven) all-gather; the gathered axis is
    dynamic unless `result_type` says otherwise."""
    t = result_type or with_dynamic_axis(SSAValue.get(x).type, axis)
    return AllGatherOp(x, t, axis=axis, counts=counts, group=group).result
