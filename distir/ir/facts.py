"""Facts about dist ops that passes, verifiers and executors read.

Each op declares its facts once, on its class, as data:

- traits: `EveryRankEnters` (every rank of the op's group must execute it,
  in the same order: collectives, waves, transfers; point-to-point ops do
  not have it and may sit under rank-dependent control flow),
  `UniformResults` (its results are equal on every rank of the group) and
  `AgreementRidesWithPayload` (the op's own first exchange carries its
  precondition check, so the run never hoists it) and `LocalCheck` (the op
  looks at local data only and runs as a local kernel);
- `ChoosesAlgorithm`, a base class: the op is run by one of several named
  algorithms, recorded on it or chosen for the group size at plan time;
- `DescribesPlan`, a base class: the op's traffic is decided at compile
  time and prints as IR comments;
- `OPERAND_ROLES`, a class attribute mapping each operand definition's name
  to an `OperandRole`: what the operand means to the op, which says what
  ranks must agree on before the payload moves and what valid inputs look
  like.

Nothing here imports torch: the SPMD verifier, the agreement planner and
input synthesis all read the same declarations.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from enum import auto

from xdsl.ir import Block, Operation, SSAValue
from xdsl.traits import OpTrait
from xdsl.utils.str_enum import StrEnum


class OperandRole(StrEnum):
    """What an operand is to its op."""

    #: per-rank data; dtype and shape must match across ranks, unless the op
    #: names an axis along which row counts may differ
    PAYLOAD = auto()
    #: must hold the same value on every rank (a combine's extra operands)
    UNIFORM = auto()
    #: a group rank, the same on every rank (a dynamic broadcast root)
    ROOT = auto()
    #: a group rank that may differ between ranks (a dynamic peer)
    PEER = auto()
    #: RNS moduli `[L]`, the same on every rank, each `2 <= q < 2^62`
    MODULI = auto()
    #: RNS limbs `[..., L, N]`, reduced modulo the op's MODULI operand
    LIMBS = auto()
    #: per-rank row counts `[P]`, the same on every rank; rank r's payload
    #: has `counts[r]` rows along the op's axis
    GATHER_COUNTS = auto()
    #: per-rank row counts `[P]`, the same on every rank; the payload has
    #: `sum(counts)` rows along the op's axis and rank r's result `counts[r]`
    SCATTER_COUNTS = auto()
    #: per-peer row counts `[P]`, different on every rank; the payload has
    #: `sum(counts)` rows along the op's axis
    SEND_COUNTS = auto()
    #: a rank's local shard of a mesh transfer's source layout
    SHARD = auto()


#: roles whose values every rank of the group must agree on
AGREED_ROLES = frozenset(
    {
        OperandRole.UNIFORM,
        OperandRole.ROOT,
        OperandRole.MODULI,
        OperandRole.GATHER_COUNTS,
        OperandRole.SCATTER_COUNTS,
    }
)


class EveryRankEnters(OpTrait):
    """Every rank of the op's group executes the op, in program order."""


class UniformResults(OpTrait):
    """The op's results are equal on every rank of its group."""


class AgreementRidesWithPayload(OpTrait):
    """The op exchanges per-rank counts before its payload anyway (the
    variable all-to-all): its agreement rides with those counts instead of
    costing an exchange of its own. For the first such op of a program
    whose operands are entry arguments, the counts travel in the run's
    agreement row (the planner hoists it: its receive counts then cost no
    exchange); for any other, each rank's "accepted" flag and digest ride
    in the op's own counts exchange, which its implementation makes."""


class LocalCheck(OpTrait):
    """The op checks this rank's own data and talks to no other rank
    (`dist.assert_reduced`): it runs as a local kernel, like arith, not
    through a backend implementation or the agreement protocol."""


class Structural(OpTrait):
    """A declaration (`dist.group`, `dist.mesh`), a terminator (`dist.yield`)
    or a wave: nothing runs for the op itself (a wave runs through its
    ops), so it has no semantics record and no implementation."""


class RunsBodyInPlace(ABC):
    """An op whose one-block body runs once, where the op stands, on every
    rank that reaches the op (the wave): its results are the values its
    body's terminator yields. The planner, the analyses and the block
    compiler look through it to the ops of its body."""

    @abstractmethod
    def body_block(self) -> Block:
        """The body: its ops, then the terminator."""

    def yielded(self) -> Sequence[SSAValue]:
        """The values the body yields: the op's results, in order."""
        terminator = self.body_block().last_op
        assert terminator is not None
        return tuple(terminator.operands)


class RankQuery(ABC):
    """An op whose one result is a number fixed by the rank and the size of
    its group (`dist.rank`, `dist.group_size`): analyses that follow ranks
    (the SPMD verifier's peer matching) evaluate it."""

    @abstractmethod
    def value_on(self, rank: int, size: int) -> int:
        """The result on rank `rank` of a group of `size` ranks."""


class DeclaresRanks(ABC):
    """A module-level declaration that names global ranks (a group, a mesh):
    the program needs a world that holds them."""

    @abstractmethod
    def declared_ranks(self) -> tuple[int, ...]:
        """Every rank the declaration names, ascending."""

    @abstractmethod
    def declared_as(self) -> str:
        """How an error names it: `group @a`, `mesh @m`."""


class ChoosesAlgorithm(ABC):
    """An op that several named implementations (algorithms) can run: the
    planner binds the one its program records, else the op's default for
    the group size, chosen again when the program binds to a group (the
    generic all-reduce: ring, halving-doubling, ...)."""

    @abstractmethod
    def recorded_algorithm(self) -> str | None:
        """The algorithm the program records on the op (a pass's choice)."""

    @abstractmethod
    def default_algorithm(self, size: int | None) -> str | None:
        """The algorithm to run on a group of `size` ranks (None: unknown)
        when none is recorded; None: the registry's default implementation."""


class ImpliesGroupSize(ABC):
    """An op whose static types fix the size of its group (an even
    all-gather of 2 rows per rank into 8 rows: 4 ranks); the runtime's
    world-size requirements ask it."""

    @abstractmethod
    def implied_group_size(self) -> tuple[str, int | None] | None:
        """`(why, size)` when the op's types fix its group's size (`size`
        None: no size fits them), else None; `why` follows the op's name."""


class DescribesPlan(ABC):
    """An op whose traffic is decided at compile time (the mesh transfer's
    map) and can be shown before it runs (`print-transfer-maps`)."""

    @abstractmethod
    def describe_plan(self, named: str) -> str:
        """The plan as `//` comment lines, the op called `named` in them."""


def operand_roles(op: Operation) -> Iterator[tuple[SSAValue, OperandRole]]:
    """(operand, role) for every operand of `op`, in operand order; operands
    of ops without declared roles are payloads."""
    roles = getattr(type(op), "OPERAND_ROLES", None)
    if not roles:
        for value in op.operands:
            yield value, OperandRole.PAYLOAD
        return
    for name, role in roles.items():
        value = getattr(op, name)
        if value is None:
            continue
        if isinstance(value, SSAValue):
            yield value, role
        else:  # a variadic operand
            for v in value:
                yield v, role


#: roles whose local checks can fail on one rank only, or whose values the
#: ranks must compare, before any payload moves
_CHECKED_ROLES = AGREED_ROLES | {
    OperandRole.LIMBS,
    OperandRole.SEND_COUNTS,
    OperandRole.SHARD,
}


def needs_agreement(op: Operation) -> bool:
    """Whether ranks must exchange an "accepted" flag and a digest before the
    op's payload: the op is entered by every rank and some operand has a role
    that is checked or agreed, or a dynamically shaped payload. Decided from
    the IR alone, so every rank decides the same."""
    if not op.has_trait(EveryRankEnters):
        return False
    for value, role in operand_roles(op):
        if role in _CHECKED_ROLES:
            return True
        shape = getattr(value.type, "get_shape", None)
        if role is OperandRole.PAYLOAD and shape is not None and any(d < 0 for d in shape()):
            return True
    return False
