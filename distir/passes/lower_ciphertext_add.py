"""`lower-ciphertext-add`: the ciphertext all-reduce as a generic all-reduce.

`dist.all_reduce_add_ciphertext %ct, %q` becomes a commutative generic
`dist.all_reduce` whose combine region is modular addition per limb, in plain
arith ops. The moduli `[L]` are the extra operand: small, so ranks agree on
them at the cost of a digest of L words, and broadcast to the ciphertext's
shape inside the region:

    dist.assert_reduced %ct, %q : tensor<4x8xi64>, tensor<4xi64>
    %y = dist.all_reduce %ct, %q commutative {known_combine = "modular-add"} : tensor<4x8xi64>, tensor<4xi64> combine(%lhs, %rhs, %q_limbs) {
      %empty = tensor.empty() : tensor<4x8xi64>
      %mod = linalg.broadcast ins(%q_limbs:tensor<4xi64>) outs(%empty:tensor<4x8xi64>) dimensions = [1]
      %sum = arith.addi %lhs, %rhs : tensor<4x8xi64>
      %sum_minus_q = arith.subi %sum, %mod : tensor<4x8xi64>
      %c63 = arith.constant dense<63> : tensor<4x8xi64>
      %below_q = arith.shrsi %sum_minus_q, %c63 : tensor<4x8xi64>
      %add_back = arith.andi %below_q, %mod : tensor<4x8xi64>
      %reduced = arith.addi %sum_minus_q, %add_back : tensor<4x8xi64>
      dist.yield %reduced : tensor<4x8xi64>
    }

The combine adds, subtracts the modulus, and adds it back where the
difference went negative (the conditional subtraction of lattice-crypto code,
e.g. Kyber's `csubq`); no division. Exact for reduced inputs
`0 <= lhs, rhs < q < 2^62`: the sum `s <= 2q - 2 < 2^63` does not overflow,
`d = s - q` lies in `[-q, q - 2]`, the arithmetic shift `d >> 63` is all ones
exactly when `d < 0`, i.e. `s < q`, so the result is `d + q = s` when `s < q`
and `d = s - q` otherwise: `s mod q`, reduced again, so the region is
associative and commutative. Every op has the same meaning under signed and
unsigned readings of the non-negative operands, so a backend may run it on
int64 tensors as is. For dynamic shapes the shift amount is a `tensor.splat`
and the broadcast target a `tensor.empty`, both sized from `%lhs`.

What the op checked, the lowered program still checks: `dist.assert_reduced`
rejects unreduced limbs and bad moduli on the rank that holds them, and the
moduli, as an extra operand, must be equal on every rank (the runtime agrees
on a digest of every extra before the payload). The pass records the fact a
backend needs as `known_combine = "modular-add"` (the verifier holds the
region to it), so a backend runs its in-place modular add without
re-recognising the region.

(Why not `cmpi uge` + `select`/`extui`: in xDSL 0.74 `arith.cmpi` types its
result as a scalar `i1` even on tensor operands, `arith.extui` accepts only
scalar integers and `arith.select` only a scalar condition, so none of them
verifies as an element-wise choice on tensors. `minui(s, s - q)` would do in
three ops but relies on a full 64-bit unsigned minimum of a wrapped value,
which int64 backends easily get wrong.)

Run `defer-modular-reduction` first when it should apply: this pass consumes
every `dist.all_reduce_add_ciphertext`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import tensor
from xdsl.dialects.builtin import (
    ModuleOp,
    StringAttr,
    TensorType,
)
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    RewritePattern,
    op_type_rewrite_pattern,
)

from distir.ir.dialect import AllReduceAddCiphertextOp, AllReduceOp, AssertReducedOp
from distir.ops.all_reduce.ir import KNOWN_COMBINE, MODULAR_ADD, modular_add_region
from distir.passes._rewrite_utils import rewrite_once, with_location


@dataclass
class CiphertextAddLowering(RewritePattern):
    """`dist.all_reduce_add_ciphertext` -> generic `dist.all_reduce` with a
    modular-addition combine region."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AllReduceAddCiphertextOp, rewriter: PatternRewriter) -> None:
        ct_type, moduli = op.input.type, op.moduli
        assert isinstance(ct_type, TensorType) and isinstance(moduli.type, TensorType)
        prelude: list[Operation] = []
        limbs = ct_type.get_shape()[-2]
        if moduli.type.get_shape()[0] != limbs:
            # linalg.broadcast wants the moduli's length to match the limb
            # dimension also in being static or dynamic.
            cast = tensor.CastOp(moduli, TensorType(moduli.type.element_type, [limbs]))
            cast.dest.name_hint = f"{moduli.name_hint or 'moduli'}_cast"
            prelude.append(cast)
            moduli = cast.dest
        assert isinstance(moduli.type, TensorType)
        reduce = AllReduceOp(
            op.input,
            combine=modular_add_region(ct_type, moduli.type),
            extras=[moduli],
            commutative=True,
            group=op.group,
        )
        reduce.attributes.update(op.attributes)
        reduce.attributes[KNOWN_COMBINE] = StringAttr(MODULAR_ADD)
        # The op rejected unreduced limbs; the lowered program must too.
        check = AssertReducedOp(op.input, op.moduli)
        with_location([check, *prelude, reduce], op.location)
        rewriter.insert([check, *prelude])
        rewriter.replace(op, reduce)


@dataclass(frozen=True)
class LowerCiphertextAddPass(ModulePass):
    """Lower every `dist.all_reduce_add_ciphertext` to a generic all-reduce
    whose combine region is visible modular-addition arith IR."""

    name = "lower-ciphertext-add"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        rewrite_once(op, CiphertextAddLowering())
