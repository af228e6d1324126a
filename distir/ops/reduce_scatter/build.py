"""The builder helper of `dist.reduce_scatter`."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import TensorType
from xdsl.ir import SSAValue

from distir.ir.attributes import ReductionKind
from distir.ir.building import (
    Body,
    GroupRef,
    Value,
    located,
    native_kind,
    with_dynamic_axis,
)
from distir.ops.reduce_scatter.ir import ReduceScatterOp
from distir.ops.wave.build import make_combine_region


@located
def reduce_scatter(
    x: Value,
    kind: ReductionKind | str | None = "sum",
    *,
    axis: int = 0,
    counts: Sequence[int] | None = None,
    combine: Body | None = None,
    extras: Sequence[Value] = (),
    commutative: bool = False,
    result_type: TensorType | None = None,
    group: GroupRef = None,
) -> SSAValue:
    """Reduce-scatter: rank r gets part r of the reduction of every rank's
    `x` along `axis`, split evenly or, with `counts`, `counts[r]` rows. The
    reduction is a native `kind`, or, with `combine` (then no kind), a
    callback on `(lhs, rhs, *extras)` as for `all_reduce`. The axis is
    dynamic unless `result_type` says otherwise."""
    t = result_type or with_dynamic_axis(SSAValue.get(x).type, axis)
    if combine is None:
        if kind is None:
            raise ValueError("reduce_scatter needs a `kind` or a `combine`")
        native = native_kind(kind, "or pass combine= for your own")
        return ReduceScatterOp(x, t, kind=native, counts=counts, axis=axis, group=group).result
    x_type = SSAValue.get(x).type
    region = make_combine_region([x_type, x_type, *(SSAValue.get(e).type for e in extras)], combine)
    return ReduceScatterOp(x, t, combine=region, extras=extras, commutative=commutative,
                           counts=counts, axis=axis, group=group).result  # fmt: skip
