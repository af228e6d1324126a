"""The semantics record of `dist.reduce`: its precondition (the root is a
rank of the group; a dynamic input's layout is agreed) and its reference
rule, the rank-order fold every reduction is defined by, on the root and zeros elsewhere."""

from __future__ import annotations

from typing import Any

import torch

from distir.core.checks import Agreed, Precondition, check_group_rank
from distir.core.invocation import Invocation
from distir.core.kernels import NATIVE_FOLDS, fold_in_rank_order
from distir.core.records import Inputs, OpSemantics, ReferenceCall, Results, same_layout
from distir.ops.reduce.ir import ReduceToRootOp


class ReduceSemantics(OpSemantics):
    op = ReduceToRootOp

    def decode(self, op: ReduceToRootOp) -> dict[str, Any]:
        return {"kind": str(op.kind.data), "root": op.root.value.data}

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        check_group_rank(inv, "root", inv.properties["root"], size)
        agreed = [Agreed.layout("input layouts", inputs[0])] if inv.dynamic(0) else []
        return Precondition(agreed=agreed)

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        _, everyone = call.agree(inputs)
        values = [ops[0] for ops in everyone]
        same_layout(call, values, "the input")
        if call.me != call.invocation.properties["root"]:
            return (torch.zeros_like(values[0]),)
        values[0] = values[0].clone()  # never the caller's tensor, even for one rank
        fold = NATIVE_FOLDS[call.invocation.properties["kind"]]
        return (fold_in_rank_order(lambda a, b: (fold(a, b),), values),)


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (ReduceSemantics(),)
