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
from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerType, ModuleOp, TensorType
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from distir.ir.dialect import AllReduceOp, ReductionKind, YieldOp
from distir.passes._rewrite_utils import with_location

NATIVE_KIND_OF: dict[type[Operation], ReductionKind] = {
    arith.AddiOp: ReductionKind.SUM,
    arith.AddfOp: ReductionKind.SUM,
    arith.MuliOp: ReductionKind.PROD,
    arith.MulfOp: ReductionKind.PROD,
    arith.MaxSIOp: ReductionKind.MAX,
    arith.MaximumfOp: ReductionKind.MAX,
    arith.MinSIOp: ReductionKind.MIN,
    arith.MinimumfOp: ReductionKind.MIN,
    arith.AndIOp: ReductionKind.BAND,
    arith.OrIOp: ReductionKind.BOR,
    arith.XOrIOp: ReductionKind.BXOR,
}

# i1 arithmetic wraps (addi is xor) and maxsi/minsi read 1 as -1.
_NOT_NATIVE_ON_I1 = frozenset({arith.AddiOp, arith.MuliOp, arith.MaxSIOp, arith.MinSIOp})


def native_kind(op: AllReduceOp) -> ReductionKind | None:
    """The native kind a generic all-reduce computes, if its region is one
    recognised op on (lhs, rhs)."""
    if op.kind is not None or op.algorithm is not None or len(op.combine.blocks) != 1:
        return None
    block = op.combine.block
    ops = list(block.ops)
    if len(ops) != 2 or len(block.args) < 2:
        return None
    combine, terminator = ops
    kind = NATIVE_KIND_OF.get(type(combine))
    if kind is None or not isinstance(terminator, YieldOp):
        return None
    if len(combine.results) != 1 or list(terminator.arguments) != [combine.results[0]]:
        return None
    lhs, rhs = block.args[0], block.args[1]
    if tuple(combine.operands) not in ((lhs, rhs), (rhs, lhs)):
        return None
    element = op.input.type.element_type if isinstance(op.input.type, TensorType) else None
    if type(combine) in _NOT_NATIVE_ON_I1 and element == IntegerType(1):
        return None
    return kind


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
        PatternRewriteWalker(
            GreedyRewritePatternApplier([NativeReductionRecognition()], dce_enabled=False),
            apply_recursively=False,
        ).rewrite_module(op)
