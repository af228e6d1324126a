"""Run-time meaning of the asserts: the semantics record of
`dist.assert_uniform` (it talks to the group) and the kernel of
`dist.assert_reduced` (a `LocalCheck`: it reads this rank's limbs only)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from xdsl.ir import Operation

from distir.core.checks import Agreed, Precondition, check_ciphertext
from distir.core.invocation import Invocation
from distir.core.kernels import Kernel, KernelFactory
from distir.core.records import Inputs, OpSemantics, ReferenceCall, Results
from distir.errors import OpError
from distir.ir.parsing import describe_op
from distir.ops.asserts.ir import AssertReducedOp, AssertUniformOp


class AssertUniformSemantics(OpSemantics):
    op = AssertUniformOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        return Precondition(agreed=[Agreed.tensor("values", inputs[0])])

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        call.agree(inputs)
        return ()


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (AssertUniformSemantics(),)


def _assert_reduced(op: AssertReducedOp) -> Kernel:
    description = describe_op(op)
    bits = None if op.max_modulus_bits is None else op.max_modulus_bits.value.data

    def run(limbs: torch.Tensor, moduli: torch.Tensor) -> tuple[()]:
        q_max = check_ciphertext(description, limbs, moduli)
        if bits is not None and q_max >= 1 << bits:
            raise OpError(
                description,
                f"modulus {q_max} is not below 2^{bits}, the bound (max_modulus_bits "
                f"{bits}) this program was lowered under",
            )
        return ()

    return run


#: the family's local-check kernels (the block compiler runs them as it runs arith)
KERNELS: Mapping[type[Operation], KernelFactory] = {AssertReducedOp: _assert_reduced}
