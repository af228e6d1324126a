"""The builder helper of `dist.reduce_scatter`."""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType
from xdsl.ir import SSAValue

from distir.ir.attributes import ReductionKind
from distir.ir.building import (
    GroupRef,
    Value,
    located,
    native_kind,
    with_dynamic_axis,
)
from distir.ops.reduce_scatter.ir import ReduceScatterOp


@located
def reduce_scatter(
    x: Value,
    kind: ReductionKind | str = "sum",
    *,
    axis: int = 0,
    result_type: TensorType | None = None,
    group: GroupRef = None,
) -> SSAValue:
    """Native reduce-scatter: rank r gets part r of the reduction of every
    rank's `x`, split evenly along `axis`; that axis is dynamic unless
    `result_type` says otherwise."""
    t = result_type or with_dynamic_axis(SSAValue.get(x).type, axis)
    return ReduceScatterOp(x, t, kind=native_kind(kind), axis=axis, group=group).result
