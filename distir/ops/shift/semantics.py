"""The semantics record of `dist.shift`: its precondition (a dynamic
input's layout is agreed: a receiver's shape is its sender's) and its
reference rule, rank `r - offset`'s input (modulo P with `rotate`), zeros
where there is no such rank."""

from __future__ import annotations

from typing import Any

import torch

from distir.core.checks import Agreed, Precondition
from distir.core.invocation import Invocation
from distir.core.records import Inputs, OpSemantics, ReferenceCall, Results, same_layout
from distir.ops.shift.ir import ShiftOp, shift_source


class ShiftSemantics(OpSemantics):
    op = ShiftOp

    def decode(self, op: ShiftOp) -> dict[str, Any]:
        return {"offset": op.offset.value.data, "rotate": op.rotates}

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        agreed = [Agreed.layout("input layouts", inputs[0])] if inv.dynamic(0) else []
        return Precondition(agreed=agreed)

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        _, everyone = call.agree(inputs)
        values = [ops[0] for ops in everyone]
        same_layout(call, values, "the input")
        props = call.invocation.properties
        source = shift_source(call.me, call.size, props["offset"], props["rotate"])
        if source is None:
            return (torch.zeros_like(inputs[0]),)
        return (values[source].clone(),)


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (ShiftSemantics(),)
