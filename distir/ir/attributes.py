"""Attributes of the dist dialect, the facts about them, and op effects.

`ReductionKind` names the reductions every backend offers natively;
`REDUCTION_KINDS` says, once, what each kind is (which element types it
takes, which arith op computes it): verifiers, passes and backends read it
there. The effects say what cse and dce may do with an op.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import auto

from xdsl.dialects import arith
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Operation, SpacedOpaqueSyntaxAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.traits import EffectInstance, MemoryEffect, MemoryEffectKind
from xdsl.utils.str_enum import StrEnum

###############################################################################
# Reduction kinds
###############################################################################


class ReductionKind(StrEnum):
    """Reductions every backend offers natively."""

    SUM = auto()
    PROD = auto()
    MIN = auto()
    MAX = auto()
    BAND = auto()
    BOR = auto()
    BXOR = auto()


@dataclass(frozen=True)
class ReductionKindFacts:
    """What a native reduction kind computes.

    `integer_combine` and `float_combine` are the arith ops that combine two
    values the way the kind does, on integer and on floating-point element
    types (None: the kind takes integers only). `min` and `max` are signed.
    `c10d` names the `torch.distributed.ReduceOp` member that computes the
    kind natively. Every other table of kinds (the interpreters' folds, the
    Torch backend's c10d reductions) is derived from these facts.
    """

    integer_combine: type[Operation]
    float_combine: type[Operation] | None
    c10d: str

    @property
    def integer_only(self) -> bool:
        """True for the bitwise kinds, which take integer element types only."""
        return self.float_combine is None


REDUCTION_KINDS: Mapping[ReductionKind, ReductionKindFacts] = {
    ReductionKind.SUM: ReductionKindFacts(arith.AddiOp, arith.AddfOp, "SUM"),
    ReductionKind.PROD: ReductionKindFacts(arith.MuliOp, arith.MulfOp, "PRODUCT"),
    ReductionKind.MIN: ReductionKindFacts(arith.MinSIOp, arith.MinimumfOp, "MIN"),
    ReductionKind.MAX: ReductionKindFacts(arith.MaxSIOp, arith.MaximumfOp, "MAX"),
    ReductionKind.BAND: ReductionKindFacts(arith.AndIOp, None, "BAND"),
    ReductionKind.BOR: ReductionKindFacts(arith.OrIOp, None, "BOR"),
    ReductionKind.BXOR: ReductionKindFacts(arith.XOrIOp, None, "BXOR"),
}

BITWISE_KINDS = frozenset(kind for kind, facts in REDUCTION_KINDS.items() if facts.integer_only)


@irdl_attr_definition
class ReductionKindAttr(EnumAttribute[ReductionKind], SpacedOpaqueSyntaxAttribute):
    """A native reduction kind; printed bare (`sum`) inside dist ops, `#dist<kind sum>` generically."""

    name = "dist.kind"

    @property
    def facts(self) -> ReductionKindFacts:
        return REDUCTION_KINDS[self.data]


#: Discardable attribute of a collective whose exactness a pass proved only
#: for groups of at most this many ranks; executors refuse larger groups.
ASSUMED_GROUP_SIZE = "assumed_max_group_size"


###############################################################################
# Effects
###############################################################################


class CollectiveEffect(MemoryEffect):
    """Reads and writes the communicator.

    Two textually identical collectives are two rounds of communication and an
    unused collective still has to be entered by every rank, so `cse` must
    never merge them and `dce` must never delete them.
    """

    @classmethod
    def get_effects(cls, op: Operation) -> set[EffectInstance]:
        return {
            EffectInstance(MemoryEffectKind.READ),
            EffectInstance(MemoryEffectKind.WRITE),
        }


class RaisesEffect(MemoryEffect):
    """An op that may raise: never deleted, merged or moved by cse and dce."""

    @classmethod
    def get_effects(cls, op: Operation) -> set[EffectInstance]:
        return {EffectInstance(MemoryEffectKind.WRITE)}
