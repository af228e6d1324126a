"""Semantics record of `dist.assert_uniform`."""

from __future__ import annotations

from distir.core.checks import (
    Agreed,
    Precondition,
)
from distir.core.invocation import Invocation
from distir.core.records import Inputs, OpSemantics, ReferenceCall, Results
from distir.ops.asserts.ir import AssertUniformOp


class AssertUniformSemantics(OpSemantics):
    op = AssertUniformOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        return Precondition(agreed=[Agreed.tensor("values", inputs[0])])

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        call.agree(inputs)
        return ()


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (AssertUniformSemantics(),)
