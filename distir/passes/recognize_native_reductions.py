"""`recognize-native-reductions`: generic all-reduces that are native ones.

A generic `dist.all_reduce` whose combine region is exactly one commutative
arith op applied to `(lhs, rhs)`, in either order, and yielded:

    %y = dist.all_reduce %x : tensor<8xi64> combine(%a, %b) {
      %m = arith.maxsi %b, %a : tensor<8xi64>
      dist.yield %m : tensor<8xi64>
    }

becomes the native form, which every backend runs with its own collective:

    %y = dist.all_reduce max %x : tensor<8xi64>

Recognised ops: addi, addf -> sum; muli, mulf -> prod; maxsi, maximumf ->
max; minsi, minimumf -> min; andi -> band; ori -> bor; xori -> bxor. The
native max and min are signed, so `maxui`/`minui` stay generic, and so do
addi/muli/maxsi/minsi on i1 (native sum, prod, max and min of booleans
are not the same as i1 wrap-around and signed-i1 arithmetic). Extra operands
cannot be used by such a region and are dropped. An op that records an
`algorithm` keeps it, and stays generic: the algorithm was chosen for the
generic form. Floating-point regions are recognised too: the combine of a
generic all-reduce is associative by contract, which is what lets the native
collective reassociate.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    RewritePattern,
    op_type_rewrite_pattern,
)

from distir.ir.dialect import AllReduceOp, ReductionKind
from distir.passes._rewrite_utils import rewrite_once, with_location


def native_kind(op: AllReduceOp) -> ReductionKind | None:
    """The native kind a generic all-reduce that records no algorithm
    computes (`AllReduceOp.computed_kind`)."""
    if not op.is_generic or op.algorithm is not None:
        return None
    return op.computed_kind()


@dataclass
class NativeReductionRecognition(RewritePattern):
    """A generic all-reduce computing a native kind -> the native form."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AllReduceOp, rewriter: PatternRewriter) -> None:
        kind = native_kind(op)
        if kind is None:
            return
        native = AllReduceOp(op.input, kind=kind, group=op.group)
        native.attributes.update(op.attributes)
        with_location([native], op.location)
        rewriter.replace(op, native)


@dataclass(frozen=True)
class RecognizeNativeReductionsPass(ModulePass):
    """Turn generic all-reduces whose combine is one commutative arith op
    into native all-reduces."""

    name = "recognize-native-reductions"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        rewrite_once(op, NativeReductionRecognition())
