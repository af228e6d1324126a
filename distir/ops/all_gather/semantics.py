"""Semantics record of `dist.all_gather`."""

from __future__ import annotations

import torch

from distir.core.checks import (
    Agreed,
    Precondition,
    check_axis_rows,
    check_counts,
)
from distir.core.invocation import Invocation
from distir.core.records import (
    AlongAxis,
    Inputs,
    OpSemantics,
    ReferenceCall,
    Results,
    same_layout,
)
from distir.ops.all_gather.ir import AllGatherOp


def gathered_precondition(inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
    """What every rank of a gather along an axis agrees on (its input's
    layout; with counts, the counts and that this rank's input has its
    count of rows): `dist.all_gather`'s and `dist.gather`'s."""
    x, axis = inputs[0], inv.properties["axis"]
    if len(inputs) == 1:
        agreed = [Agreed.layout("input layouts", x)] if inv.dynamic(0) else []
        return Precondition(agreed=agreed)
    counts = check_counts(inv, "counts", inputs[1], size)
    check_axis_rows(inv, x, axis, counts[rank], f"counts[{rank}]")
    agreed = [Agreed.value("counts", counts)]
    if inv.dynamic(0):
        agreed.append(Agreed.layout("input layouts", x, skip_axis=axis))
    return Precondition(agreed=agreed, decoded={"counts": counts})


def gathered(call: ReferenceCall, inputs: Inputs) -> torch.Tensor:
    """Every rank's input concatenated along the axis, in rank order."""
    _, everyone = call.agree(inputs)
    parts = [ops[0] for ops in everyone]
    if len(inputs) == 1:
        same_layout(call, parts, "the input")
    return torch.cat(parts, dim=call.invocation.properties["axis"])


class AllGatherSemantics(AlongAxis):
    op = AllGatherOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        return gathered_precondition(inv, inputs, size, rank)

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        return (gathered(call, inputs),)


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (AllGatherSemantics(),)
