"""Semantics records of the all-reduces: `dist.all_reduce` and the ciphertext sum.

Each record is one block: how its op decodes, its precondition (what every
rank checks locally and what all ranks of the group must agree on before
the payload moves; the Torch backend evaluates the same rule) and its
reference rule (the definition in docs/reference/dialect.md, computed from every rank's
operands)."""

from __future__ import annotations

from typing import Any

import torch
from xdsl.dialects.builtin import IntegerAttr

from distir.core.checks import (
    Agreed,
    Precondition,
    check_ciphertext,
)
from distir.core.invocation import Invocation
from distir.core.kernels import NATIVE_FOLDS, fold_in_rank_order
from distir.core.records import (
    Inputs,
    OpSemantics,
    ReferenceCall,
    Results,
    same_layout,
)
from distir.ir.attributes import ASSUMED_GROUP_SIZE
from distir.ops.all_reduce.ciphertext import AllReduceAddCiphertextOp
from distir.ops.all_reduce.ir import AllReduceOp


class AllReduceSemantics(OpSemantics):
    op = AllReduceOp

    def decode(self, op: AllReduceOp) -> dict[str, Any]:
        assumed = op.attributes.get(ASSUMED_GROUP_SIZE)
        return {
            "kind": None if op.is_generic else str(op.kind.data),
            "assumed_max_group_size": (
                assumed.value.data if isinstance(assumed, IntegerAttr) else None
            ),
        }

    def fresh_results(self, op: AllReduceOp) -> bool:
        # A generic all-reduce's combine region may yield one of its operands.
        return not op.is_generic

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        agreed = [Agreed.layout("input layouts", inputs[0])] if inv.dynamic(0) else []
        agreed += [Agreed.tensor(f"extra operand #{i}", e) for i, e in enumerate(inputs[1:])]
        return Precondition(agreed=agreed)

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        _, everyone = call.agree(inputs)
        values = [ops[0] for ops in everyone]
        same_layout(call, values, "the input")
        values[0] = values[0].clone()  # never the caller's tensor, even for one rank
        kind = call.invocation.properties["kind"]
        if kind is not None:
            fold = NATIVE_FOLDS[kind]
            return (fold_in_rank_order(lambda a, b: (fold(a, b),), values),)
        return (fold_in_rank_order(call.invocation.regions[0], values, inputs[1:]),)


class AllReduceAddCiphertextSemantics(OpSemantics):
    op = AllReduceAddCiphertextOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        ct, moduli = inputs
        q_max = check_ciphertext(inv.description, ct, moduli)
        agreed = [Agreed.tensor("moduli", moduli)]
        if inv.dynamic(0):
            agreed.append(Agreed.layout("ciphertext layouts", ct))
        return Precondition(agreed=agreed, decoded={"q_max": q_max})

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        _, everyone = call.agree(inputs)
        values = [ops[0] for ops in everyone]
        same_layout(call, values, "the ciphertext")
        values[0] = values[0].clone()
        q = inputs[1].view(-1, 1)
        # exact: both addends are below q < 2^62
        return (fold_in_rank_order(lambda a, b: (torch.remainder(a + b, q),), values),)


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (AllReduceSemantics(), AllReduceAddCiphertextSemantics(),)
