"""The semantics records of `dist.gather` and `dist.scatter`: their
preconditions (the root is a rank of the group; counts are valid, agreed,
and match the rows; an even scatter's rows split into P parts; a dynamic
payload's layout is agreed) and their reference rules."""

from __future__ import annotations

from typing import Any

import torch

from distir.core.checks import (
    Agreed,
    Precondition,
    check_axis_rows,
    check_counts,
    check_group_rank,
    fail,
)
from distir.core.invocation import Invocation
from distir.core.records import Inputs, OpSemantics, ReferenceCall, Results, same_layout
from distir.ops.all_gather.semantics import gathered, gathered_precondition
from distir.ops.gather_scatter.ir import GatherOp, ScatterOp


class _Rooted(OpSemantics):
    def decode(self, op: GatherOp | ScatterOp) -> dict[str, Any]:
        return {"axis": op.axis.value.data, "root": op.root.value.data}


class GatherSemantics(_Rooted):
    op = GatherOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        check_group_rank(inv, "root", inv.properties["root"], size)
        return gathered_precondition(inv, inputs, size, rank)

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        whole = gathered(call, inputs)  # the all-gather's; the root keeps it
        if call.me != call.invocation.properties["root"]:
            whole = torch.zeros_like(whole)
        return (whole,)


class ScatterSemantics(_Rooted):
    op = ScatterOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        check_group_rank(inv, "root", inv.properties["root"], size)
        x, axis = inputs[0], inv.properties["axis"]
        if x.dim() <= axis:
            raise fail(inv, f"input of rank {x.dim()} has no axis {axis}")
        if len(inputs) == 1:
            if x.shape[axis] % size:
                raise fail(
                    inv, f"input has {x.shape[axis]} rows on axis {axis}, which do not split "
                    f"evenly over a group of size {size}",
                )  # fmt: skip
            agreed = [Agreed.layout("input layouts", x)] if inv.dynamic(0) else []
            return Precondition(agreed=agreed)
        counts = check_counts(inv, "counts", inputs[1], size)
        check_axis_rows(inv, x, axis, sum(counts), "the sum of counts")
        agreed = [Agreed.value("counts", counts)]
        if inv.dynamic(0):
            agreed.append(Agreed.layout("input layouts", x))
        return Precondition(agreed=agreed, decoded={"counts": counts})

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        mine, everyone = call.agree(inputs)
        same_layout(call, [ops[0] for ops in everyone], "the input")
        x = everyone[call.invocation.properties["root"]][0]
        axis = call.invocation.properties["axis"]
        if len(inputs) == 1:
            counts = [x.shape[axis] // call.size] * call.size
        else:
            counts = mine.decoded["counts"]
        return (torch.split(x, counts, dim=axis)[call.me].clone(),)


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (GatherSemantics(), ScatterSemantics())
