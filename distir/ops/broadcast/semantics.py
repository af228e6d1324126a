"""Semantics record of `dist.broadcast`."""

from __future__ import annotations

from typing import Any

from distir.core.checks import (
    Agreed,
    Precondition,
    named_rank,
)
from distir.core.invocation import Invocation
from distir.core.records import (
    Inputs,
    OpSemantics,
    ReferenceCall,
    Results,
    same_layout,
)
from distir.ops.broadcast.ir import BroadcastOp


class BroadcastSemantics(OpSemantics):
    op = BroadcastOp
    group_ranks = ("root",)

    def decode(self, op: BroadcastOp) -> dict[str, Any]:
        return {"root": None if op.root is None else op.root.value.data}

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        static_root = inv.properties["root"]
        root = named_rank(inv, "root", list(inputs[1:]), size)
        agreed = [Agreed.value("roots", root)] if static_root is None else []
        if inv.dynamic(0):
            agreed.append(Agreed.layout("message layouts", inputs[0]))
        return Precondition(agreed=agreed, decoded={"root": root})

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        mine, everyone = call.agree(inputs)
        same_layout(call, [ops[0] for ops in everyone], "the message")
        return (everyone[mine.decoded["root"]][0].clone(),)


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (BroadcastSemantics(),)
