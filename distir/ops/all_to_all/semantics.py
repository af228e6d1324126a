"""Semantics record of `dist.variable_all_to_all`."""

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
)
from distir.ops.all_to_all.ir import VariableAllToAllOp


class VariableAllToAllSemantics(AlongAxis):
    op = VariableAllToAllOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        x, axis = inputs[0], inv.properties["axis"]
        send = check_counts(inv, "send counts", inputs[1], size)
        check_axis_rows(inv, x, axis, sum(send), "the sum of send counts")
        agreed = [Agreed.layout("row layouts", x, skip_axis=axis)] if inv.dynamic(0) else []
        return Precondition(agreed=agreed, decoded={"send": send})

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        _, everyone = call.agree(inputs)
        axis = call.invocation.properties["axis"]
        received, recv_counts = [], []
        for x, send_counts in everyone:
            sizes = [int(c) for c in send_counts.tolist()]
            received.append(torch.split(x, sizes, dim=axis)[call.me])
            recv_counts.append(sizes[call.me])
        counts_dtype = inputs[1].dtype
        return (torch.cat(received, dim=axis), torch.tensor(recv_counts, dtype=counts_dtype))


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (VariableAllToAllSemantics(),)
