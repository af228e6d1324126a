"""The semantics records of `dist.pvary` (the identity) and `dist.psum`
(the sum all-reduce's meaning, a native sum); what sets them apart from
an identity and an all-reduce is their transposes (`ir.py`)."""

from __future__ import annotations

from typing import Any

from distir.core.checks import Agreed, Precondition
from distir.core.invocation import Invocation
from distir.core.records import Inputs, OpSemantics, ReferenceCall, Results
from distir.ops.all_reduce.semantics import AllReduceSemantics
from distir.ops.replication.ir import PsumOp, PvaryOp

#: how a pvary input that differs between ranks reads in the error
REPLICATED_INPUT = (
    "values to dist.pvary, whose input must be replicated (the same on every rank; "
    "its gradient is the sum over ranks)"
)


class PvarySemantics(OpSemantics):
    op = PvaryOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        # the input is one replicated value: a per-rank one would get the
        # sum over ranks as its gradient, silently wrong
        return Precondition(agreed=[Agreed.tensor(REPLICATED_INPUT, inputs[0])])

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        call.agree(inputs)
        return (inputs[0].clone(),)  # a new tensor, as every result is


class PsumSemantics(AllReduceSemantics):
    op = PsumOp  # type: ignore[assignment]

    def decode(self, op: PsumOp) -> dict[str, Any]:  # type: ignore[override]
        return {"kind": "sum", "assumed_max_group_size": None}

    def fresh_results(self, op: PsumOp) -> bool:  # type: ignore[override]
        return True


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (PsumSemantics(), PvarySemantics())
