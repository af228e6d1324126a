"""The builder helpers of `dist.gather` and `dist.scatter`."""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType
from xdsl.ir import SSAValue

from distir.ir.building import GroupRef, Value, located, with_dynamic_axis
from distir.ops.gather_scatter.ir import GatherOp, ScatterOp


@located
def gather(
    x: Value,
    root: int = 0,
    *,
    axis: int = 0,
    counts: Value | None = None,
    result_type: TensorType | None = None,
    group: GroupRef = None,
) -> SSAValue:
    """Even (or, with `counts`, uneven) gather to `root` (zeros on the other
    ranks); the gathered axis is dynamic unless `result_type` says otherwise."""
    t = result_type or with_dynamic_axis(SSAValue.get(x).type, axis)
    return GatherOp(x, t, root=root, axis=axis, counts=counts, group=group).result


@located
def scatter(
    x: Value,
    root: int = 0,
    *,
    axis: int = 0,
    counts: Value | None = None,
    result_type: TensorType | None = None,
    group: GroupRef = None,
) -> SSAValue:
    """Even (or, with `counts`, uneven) scatter of `root`'s `x`: rank r gets
    part r; the split axis is dynamic unless `result_type` says otherwise."""
    t = result_type or with_dynamic_axis(SSAValue.get(x).type, axis)
    return ScatterOp(x, t, root=root, axis=axis, counts=counts, group=group).result
