"""`select-all-reduce-algorithm`: record how each generic all-reduce runs.

A generic `dist.all_reduce` (a combine region) has no native collective, so a
backend runs it as an algorithm over point-to-point messages. This pass
writes the choice into the IR as the op's `algorithm` property, which the
runtime uses to select the implementation by name:

    %y = dist.all_reduce %x commutative algorithm "ring" : tensor<1024xi64> combine(...)

The choice follows from what the region allows and what it costs. Allowed:

- `ring` for a `commutative` combine that is elementwise: reduce-scatter and
  all-gather around the ring, chunked and pipelined; bandwidth-optimal, but
  it folds every chunk in a rotated rank order and pays 2(P-1) rounds;
- `halving-doubling` for any elementwise combine: recursive halving then
  doubling, which combines adjacent rank ranges lower first and so keeps
  the rank order, with the ring's traffic in 2 log2(P) rounds;
- `recursive-doubling` for any combine, also one that is not elementwise (it
  reads other elements, e.g. a 2x2 matrix product on a tensor<4xi64>):
  whole tensors, log2(P) rounds, rank order kept;
- `gather-fold` for small messages (P copies of the message in memory).

Among those, `ir.all_reduce.choose_algorithm` picks the cheapest under an
alpha-beta cost model (per round, per byte sent, per byte combined; the
constants are measured by `distir-bench --fit`) when the group size is known
(a declared group, or the `group-size` option) and the shape is static;
otherwise it assumes a large message on many ranks and picks the
bandwidth-optimal algorithm the region allows. The runtime makes the same
choice, with the real group size, for a generic all-reduce that records
none. "Elementwise" is `ir.analysis.is_elementwise_region`: output element i
depends only on element i of the operands and extras, so the region can run
chunk by chunk; the regions of `lower-ciphertext-add` qualify.

Native all-reduces are left alone: the backend's own collective is the
fastest way to run them (`recognize-native-reductions` first turns generic
regions that are one native op into that form). Ops that already record an
algorithm keep it. `dist.all_reduce_add_ciphertext` has no `algorithm`
property: its default implementation, `ciphertext-auto`, is a ring whose
reduction schedule follows at run time from the group size and the largest
modulus: deferred to the owned chunk when the int64 headroom allows, else
only when the headroom runs out (a modular ring for moduli near 2^62).

Options override the choice for each case (`commutative`, `ordered`,
`whole`), e.g. `select-all-reduce-algorithm{commutative=gather-fold}` keeps
the gather-and-fold baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    RewritePattern,
    op_type_rewrite_pattern,
)

from distir.ir.dialect import AllReduceOp
from distir.ops.all_reduce.ir import candidate_algorithms
from distir.passes._rewrite_utils import rewrite_once
from distir.passes.options import check_options, option


@dataclass(frozen=True)
class AlgorithmChoice:
    """The algorithm names to record: by case when the options name one,
    else the cheapest allowed."""

    commutative: str | None = None
    ordered: str | None = None
    whole: str | None = None
    group_size: int | None = None

    def for_op(self, op: AllReduceOp) -> str:
        if not op.elementwise:
            override = self.whole
        elif op.commutative is not None:
            override = self.commutative
        else:
            override = self.ordered
        if override is not None:
            return override
        algorithm = op.default_algorithm(op.static_group_size() or self.group_size)
        assert algorithm is not None  # a generic all-reduce always has one
        return algorithm


@dataclass
class RecordAllReduceAlgorithm(RewritePattern):
    """A generic all-reduce without an algorithm gets one."""

    choice: AlgorithmChoice

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AllReduceOp, rewriter: PatternRewriter) -> None:
        if not op.is_generic or op.algorithm is not None or len(op.combine.blocks) != 1:
            return
        op.algorithm = StringAttr(self.choice.for_op(op))
        rewriter.notify_op_modified(op)


@dataclass(frozen=True)
class SelectAllReduceAlgorithmPass(ModulePass):
    """Record the cheapest exact point-to-point algorithm on every generic
    all-reduce (ring, halving-doubling, recursive doubling or gather-fold)."""

    name = "select-all-reduce-algorithm"

    commutative: str | None = option(None, choices=candidate_algorithms(True, True))
    """Algorithm for commutative elementwise combines (default: by cost)."""

    ordered: str | None = option(None, choices=candidate_algorithms(True, False))
    """Algorithm for elementwise combines that are not commutative (default: by cost)."""

    whole: str | None = option(None, choices=candidate_algorithms(False, False))
    """Algorithm for combines that are not elementwise (default: by cost)."""

    group_size: int | None = option(None, minimum=1)
    """Group size to choose for where the IR does not declare one."""

    def __post_init__(self) -> None:
        check_options(self)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        choice = AlgorithmChoice(self.commutative, self.ordered, self.whole, self.group_size)
        rewrite_once(op, RecordAllReduceAlgorithm(choice))
