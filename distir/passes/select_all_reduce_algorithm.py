"""`select-all-reduce-algorithm`: record how each generic all-reduce runs.

A generic `dist.all_reduce` (a combine region) has no native collective, so a
backend runs it as an algorithm over point-to-point messages. This pass
writes the choice into the IR as the op's `algorithm` property, which the
runtime uses to select the implementation by name:

    %y = dist.all_reduce %x commutative algorithm "ring" : tensor<1024xi64> combine(...)

The choice follows from what the region allows:

- `ring` for a `commutative` combine that is elementwise: reduce-scatter and
  all-gather around the ring, chunked and pipelined; the bandwidth-optimal
  choice, but it folds every chunk in a rotated rank order;
- `halving-doubling` for an elementwise combine that is not commutative:
  recursive halving then doubling, which combines adjacent rank ranges lower
  first and so keeps the rank order, with the same traffic as the ring;
- `recursive-doubling` for a combine that is not elementwise (it reads other
  elements, e.g. a 2x2 matrix product on a tensor<4xi64>), which cannot be
  cut into chunks: whole tensors, log2(P) rounds, rank order kept.

"Elementwise": every op of the region is an arith op on tensors of the op's
shape (the element type may change), a splat constant or a constant of the
op's shape, or a `tensor.splat` (with its sizes from `tensor.dim`); the extra
operands have the op's shape. Then output element i depends only on element
i of the operands and extras, so the region can run chunk by chunk. The
regions of `lower-ciphertext-add`, both static and dynamic, qualify.

Native all-reduces are left alone: the backend's own collective is the
fastest way to run them (`recognize-native-reductions` first turns generic
regions that are one native op into that form). Ops that already record an
algorithm keep it. `dist.all_reduce_add_ciphertext` has no `algorithm`
property: its default implementation, `ciphertext-auto`, is a ring whose
reduction schedule follows at run time from the group size and the largest
modulus: deferred to the owned chunk when the int64 headroom allows, else
only when the headroom runs out (a modular ring for moduli near 2^62).

Options name the algorithm for each case (`commutative`, `ordered`,
`whole`), e.g. `select-all-reduce-algorithm{commutative=gather-fold}` keeps
the gather-and-fold baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, tensor
from xdsl.dialects.builtin import (
    DenseIntOrFPElementsAttr,
    IndexType,
    ModuleOp,
    StringAttr,
    TensorType,
)
from xdsl.ir import Block, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from distir.ir.dialect import AllReduceOp, YieldOp
from distir.ir.elementwise import ELEMENTWISE_OPS

RING = "ring"
HALVING_DOUBLING = "halving-doubling"
RECURSIVE_DOUBLING = "recursive-doubling"


def _shape(t) -> tuple[int, ...] | None:
    return tuple(t.get_shape()) if isinstance(t, TensorType) else None


def _is_splat(op: arith.ConstantOp) -> bool:
    return isinstance(op.value, DenseIntOrFPElementsAttr) and op.value.is_splat()


def _only_sizes(value: SSAValue) -> bool:
    """Used only as a size of a `tensor.splat`, directly or through `tensor.dim`."""
    return all(
        (isinstance(use.operation, tensor.SplatOp) and use.index >= 1)
        or (isinstance(use.operation, tensor.DimOp) and use.index == 1)
        for use in value.uses
    )


def is_elementwise_combine(block: Block) -> bool:
    """Whether the combine region computes each element from the same
    element of its operands and extras (see the module docstring)."""
    shape = _shape(block.args[0].type) if block.args else None
    if shape is None or any(_shape(arg.type) != shape for arg in block.args[2:]):
        return False
    for op in block.ops:
        if isinstance(op, YieldOp):
            return len(op.arguments) == 1
        if isinstance(op, tensor.DimOp) or (
            isinstance(op, arith.ConstantOp) and isinstance(op.result.type, IndexType)
        ):
            ok = _only_sizes(op.results[0])
        elif isinstance(op, arith.ConstantOp):
            t = op.result.type
            ok = (
                _shape(t) == shape or _is_splat(op)
                if isinstance(t, TensorType)
                else all(
                    isinstance(use.operation, tensor.SplatOp) and use.index == 0
                    for use in op.result.uses
                )
            )
        elif isinstance(op, tensor.SplatOp):
            ok = _shape(op.results[0].type) == shape
        else:
            ok = isinstance(op, ELEMENTWISE_OPS) and all(
                _shape(v.type) == shape for v in (*op.operands, *op.results)
            )
        if not ok:
            return False
    return False


@dataclass(frozen=True)
class AlgorithmChoice:
    """The algorithm names to record, by what the combine allows."""

    commutative: str = RING
    ordered: str = HALVING_DOUBLING
    whole: str = RECURSIVE_DOUBLING

    def for_op(self, op: AllReduceOp) -> str:
        if not is_elementwise_combine(op.combine_block):
            return self.whole
        return self.commutative if op.commutative is not None else self.ordered


@dataclass
class RecordAllReduceAlgorithm(RewritePattern):
    """A generic all-reduce without an algorithm gets one."""

    choice: AlgorithmChoice

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AllReduceOp, rewriter: PatternRewriter) -> None:
        if op.kind is not None or op.algorithm is not None or len(op.combine.blocks) != 1:
            return
        op.algorithm = StringAttr(self.choice.for_op(op))
        rewriter.notify_op_modified(op)


@dataclass(frozen=True)
class SelectAllReduceAlgorithmPass(ModulePass):
    """Record a point-to-point algorithm on every generic all-reduce: ring
    when commutative, halving-doubling when order matters, recursive
    doubling when the combine is not elementwise."""

    name = "select-all-reduce-algorithm"

    commutative: str = RING
    """Algorithm for commutative elementwise combines."""

    ordered: str = HALVING_DOUBLING
    """Algorithm for elementwise combines that are not commutative."""

    whole: str = RECURSIVE_DOUBLING
    """Algorithm for combines that are not elementwise."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        choice = AlgorithmChoice(self.commutative, self.ordered, self.whole)
        PatternRewriteWalker(
            GreedyRewritePatternApplier([RecordAllReduceAlgorithm(choice)], dce_enabled=False),
            apply_recursively=False,
        ).rewrite_module(op)
