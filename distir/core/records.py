"""What a semantics record is: everything the interpreters know about one dist op.

A record is a small class, one per op, with the op type it describes and up
to three members, read in this order by whoever executes the op:

- `decode(op)`: the op's static properties as plain Python values, read once
  at compile time into the op's `Invocation` (a root, a reduction kind, an
  axis, a transfer plan);
- `precondition(invocation, inputs, size, rank)`: what every rank checks
  locally and the values all ranks of the group must agree on before the
  payload moves (None: nothing to check); the Torch backend and the
  reference simulator evaluate the same rule;
- `reference(call, inputs)`: the op's meaning as docs/reference/dialect.md defines it,
  computed from every rank's operands: the oracle every backend and every
  pass is tested against.

Records are handed around explicitly (`distir.core.semantics.SEMANTICS`,
a tuple), as xDSL hands its `@register_impls` classes to an interpreter:
importing a module registers nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import torch
from xdsl.ir import Operation

from distir.core.checks import Precondition, PreconditionRule
from distir.core.invocation import Invocation
from distir.errors import CollectiveMismatchError

Inputs = Sequence[torch.Tensor]
Results = tuple[torch.Tensor, ...]


class ReferenceCall(Protocol):
    """One execution of one dist op on one simulated rank, as a reference
    rule sees it (`distir.core.simulator.SimulatedCall` is one)."""

    invocation: Invocation
    #: the global ranks of the op's group, in group rank order
    members: tuple[int, ...]
    #: this rank's rank in the op's group, and the group's size
    me: int
    size: int

    @property
    def global_rank(self) -> int:
        """This simulated process's global rank."""
        ...

    def fail(self, message: str) -> Exception: ...

    def agree(self, inputs: Inputs) -> tuple[Precondition, list[Sequence[Any]]]:
        """Evaluates the op's precondition on every rank, exchanges inputs;
        returns this rank's precondition and every rank's inputs."""
        ...

    def exchange(self, payload: Any, members: tuple[int, ...] | None = None) -> list[Any]:
        """Every member's `payload`, in group rank order."""
        ...

    def post(self, dest: int, payload: torch.Tensor) -> None: ...

    def take(self, source: int) -> torch.Tensor: ...


class OpSemantics:
    """The run-time meaning of one dist op (see the module docstring)."""

    #: the op type this record describes
    op: ClassVar[type[Operation]]
    #: (invocation, inputs, group size, group rank) -> Precondition, or None
    #: when the op has nothing to check or agree on before its payload
    precondition: ClassVar[PreconditionRule | None] = None
    #: decoded properties that are static ranks of the op's group: checked
    #: against the group size when a program binds to a group
    group_ranks: ClassVar[tuple[str, ...]] = ()

    def decode(self, op: Operation) -> dict[str, Any]:
        """The op's static properties as plain Python values."""
        return {}

    def fresh_results(self, op: Operation) -> bool:
        """Whether every executor returns new tensors as this op's results
        (pooled buffers, or an input it was allowed to overwrite), never a
        tensor something else holds: the block compiler then lets a later
        collective overwrite them at their last use."""
        return True

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        """The op's results on this rank, computed from every rank's operands."""
        raise NotImplementedError(f"{self.op.name} has no reference semantics")

    def __repr__(self) -> str:
        return f"<semantics of {self.op.name}>"


class AlongAxis(OpSemantics):
    """A collective that concatenates or splits rows along an `axis`
    (`dist.all_gather`, `dist.variable_all_to_all`)."""

    def decode(self, op: Operation) -> dict[str, Any]:
        return {"axis": op.axis.value.data}  # type: ignore[attr-defined]


def same_layout(call: ReferenceCall, values: Sequence[torch.Tensor], what: str) -> None:
    first = values[0]
    for r, v in enumerate(values):
        if v.shape != first.shape or v.dtype != first.dtype:
            raise CollectiveMismatchError(
                call.invocation.description,
                f"{what} of rank {r} is {list(v.shape)} {v.dtype} but rank 0 has "
                f"{list(first.shape)} {first.dtype}",
            )
