"""The semantics record of `dist.reduce_scatter`: its precondition (the
axis splits into P equal parts on every rank; a dynamic input's layout is
agreed) and its reference rule, the rank-order fold of DESIGN.md sliced to
this rank's part."""

from __future__ import annotations

from typing import Any

from distir.interpreters.checks import Agreed, Precondition, fail
from distir.interpreters.invocation import Invocation
from distir.interpreters.kernels import NATIVE_FOLDS, fold_in_rank_order
from distir.interpreters.records import (
    Inputs,
    OpSemantics,
    ReferenceCall,
    Results,
    same_layout,
)
from distir.ops.reduce_scatter.ir import ReduceScatterOp


class ReduceScatterSemantics(OpSemantics):
    op = ReduceScatterOp

    def decode(self, op: ReduceScatterOp) -> dict[str, Any]:
        return {"kind": str(op.kind.data), "axis": op.axis.value.data}

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        x, axis = inputs[0], inv.properties["axis"]
        if x.dim() <= axis:
            raise fail(inv, f"input of rank {x.dim()} has no axis {axis}")
        rows = x.shape[axis]
        if rows % size:
            raise fail(
                inv, f"input has {rows} rows on axis {axis}, which do not split evenly "
                f"over a group of size {size}",
            )  # fmt: skip
        agreed = [Agreed.layout("input layouts", x)] if inv.dynamic(0) else []
        return Precondition(agreed=agreed)

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        _, everyone = call.agree(inputs)
        values = [ops[0] for ops in everyone]
        same_layout(call, values, "the input")
        values[0] = values[0].clone()
        fold = NATIVE_FOLDS[call.invocation.properties["kind"]]
        total = fold_in_rank_order(lambda a, b: (fold(a, b),), values)
        axis = call.invocation.properties["axis"]
        part = total.shape[axis] // call.size
        return (total.narrow(axis, call.me * part, part).clone(),)


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (ReduceScatterSemantics(),)
