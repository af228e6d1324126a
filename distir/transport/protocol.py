"""The transport seam: what an op's Torch implementation may ask of its group.

An implementation (`distir/ops/<family>/torch.py`, the base class in
`transport.registry`) runs an op on one group through a `Transport`: who
this rank is in the group, the collectives it submits under the op's
deadline, the small exchanges that agree on preconditions, and the facts
a choice of implementation may depend on, declared as `Capabilities`
(where tensors must live, which element types it moves and reduces,
whether it has a store, what a failure leaves behind), as c10d's
`register_backend` declares a backend's devices.

`ProcessGroupResource` (`transport.groups`), one initialised
torch.distributed process group on gloo or NCCL, is the transport every
run uses today; the protocol names what any other (MPI, NCCL symmetric
memory) must provide. A collective returns the backend's work handle for
`complete`, or None when it was asked to `wait` and has completed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

from distir.core.checks import Precondition
from distir.core.invocation import Invocation


class Abort(enum.Enum):
    """What a failed or late collective leaves behind, and who can end a
    wait: the runtime's failure model (poisoning, `distir.recover`) reads it."""

    #: the group's connections are closed (gloo closes every pair when a
    #: collective times out) and no rank can end another's wait: a peer
    #: wakes at its own deadline; only a new group goes on
    DEADLINE = "deadline"
    #: the communicator can be aborted, which ends the waits in it (NCCL's
    #: `abort`); the group is still unusable afterwards
    COMMUNICATOR = "communicator"


@dataclass(frozen=True)
class Capabilities:
    """The facts of a transport that an implementation may depend on."""

    #: device types whose tensors its collectives take ("cpu", "cuda")
    devices: frozenset[str]
    #: element types its collectives move as they are (others move as bytes)
    moves: frozenset[torch.dtype]
    #: element types its reductions take (a native reduction of any other
    #: type is refused when the program is compiled)
    reduces: frozenset[torch.dtype]
    #: whether it has a rendezvous store (a failure is published there, and
    #: membership is agreed through it)
    store: bool
    #: what a failed collective leaves behind
    abort: Abort


@dataclass(frozen=True)
class Needs:
    """What an op implementation needs of its transport, declared beside it
    (`Implementation.needs`): the registry keeps every implementation of an
    op in preference order, and binding a program to a group takes the
    first whose needs that group's `Capabilities` meet. The default needs
    nothing: it runs on any transport."""

    #: device types the transport's collectives must all take ("cuda")
    devices: frozenset[str] = frozenset()
    #: element types it must move as they are (not as bytes)
    moves: frozenset[torch.dtype] = frozenset()
    #: element types its reductions must take
    reduces: frozenset[torch.dtype] = frozenset()
    #: whether it must have a rendezvous store
    store: bool = False
    #: the failure semantics it must have (None: either)
    abort: Abort | None = None

    def met_by(self, capabilities: Capabilities) -> bool:
        """Whether a transport with `capabilities` gives all of this."""
        return (
            self.devices <= capabilities.devices
            and self.moves <= capabilities.moves
            and self.reduces <= capabilities.reduces
            and (capabilities.store or not self.store)
            and (self.abort is None or self.abort is capabilities.abort)
        )

    def describe(self) -> str:
        """The needs in words, for the error that no implementation fits."""
        parts = [f"devices {sorted(self.devices)}"] if self.devices else []
        for what, dtypes in (("moves", self.moves), ("reduces", self.reduces)):
            if dtypes:
                parts.append(f"{what} {sorted(str(d).removeprefix('torch.') for d in dtypes)}")
        if self.store:
            parts.append("a store")
        if self.abort is not None:
            parts.append(f"{self.abort.value} abort")
        return ", ".join(parts) or "nothing"


#: an implementation's needs when it declares none: any transport serves
ANY_TRANSPORT = Needs()


@runtime_checkable
class Occasion(Protocol):
    """What a call on a transport is made for, as its errors name it and
    its deadline is read: an op's `Invocation`, or a `transport.groups.Step`
    (an exchange that is not an op's: the program agreement, group
    creation)."""

    @property
    def description(self) -> str: ...

    @property
    def options(self) -> Mapping[str, object]: ...


#: a collective's handle: the backend's work, None once waited for
Work = dist.Work | None


@runtime_checkable
class Transport(Protocol):
    """One group as an op implementation sees it (ranks are group ranks)."""

    rank: int
    size: int
    #: the group as errors name it ("world", "of ranks [0, 2]")
    name: str
    #: the backend's name ("gloo", "nccl")
    backend: str
    capabilities: Capabilities
    #: where this rank's exchange rows and received buffers live
    device: torch.device
    #: the process group messages are addressed in (None: the default group)
    group: dist.ProcessGroup | None
    #: the process group object collectives are submitted to
    pg: dist.ProcessGroup
    #: seconds a collective may take in this run
    deadline_s: float
    #: whether ops agree on their preconditions before their payload
    agreement: bool
    #: preconditions checked and agreed at the start of this run
    hoisted: Sequence[Precondition]
    #: receive counts that rode in this run's agreement
    agreed_counts: list[int]

    def deadline_for(self, invocation: Invocation) -> float: ...

    def complete(self, work: Work, invocation: Invocation) -> None:
        """Waits for a submitted collective, at most until its deadline."""
        ...

    def all_reduce(
        self, tensor: torch.Tensor, op: dist.ReduceOp, invocation: Invocation,
        wait: bool = False,
    ) -> Work: ...  # fmt: skip

    def broadcast(
        self, tensor: torch.Tensor, root: int, invocation: Invocation, wait: bool = False
    ) -> Work: ...

    def all_gather(
        self, out: torch.Tensor, tensor: torch.Tensor, invocation: Invocation,
        wait: bool = False,
    ) -> Work: ...  # fmt: skip

    def reduce_scatter(
        self, out: torch.Tensor, tensor: torch.Tensor, op: dist.ReduceOp,
        invocation: Invocation, wait: bool = False,
    ) -> Work: ...  # fmt: skip

    def gather(
        self, parts: Sequence[torch.Tensor], tensor: torch.Tensor, root: int,
        invocation: Invocation, wait: bool = False,
    ) -> Work: ...  # fmt: skip

    def scatter(
        self, out: torch.Tensor, parts: Sequence[torch.Tensor], root: int,
        invocation: Invocation, wait: bool = False,
    ) -> Work: ...  # fmt: skip

    def reduce(
        self, tensor: torch.Tensor, op: dist.ReduceOp, root: int, invocation: Invocation,
        wait: bool = False,
    ) -> Work: ...  # fmt: skip

    def all_to_all(
        self, out: torch.Tensor, tensor: torch.Tensor, out_splits: Sequence[int],
        in_splits: Sequence[int], invocation: Invocation, wait: bool = False,
    ) -> Work: ...  # fmt: skip

    def exchange_rows(self, row: Sequence[int], invocation: Invocation) -> list[list[int]]:
        """Every rank's `row` of int64 (all ranks pass rows of one length)."""
        ...

    def local_precondition(
        self, invocation: Invocation, inputs: Sequence[torch.Tensor]
    ) -> Precondition:
        """The op's precondition on this rank, not yet agreed."""
        ...

    def precondition(
        self, invocation: Invocation, inputs: Sequence[torch.Tensor]
    ) -> Precondition:
        """The op's precondition on this rank, agreed with the group (a
        disagreement raises on every rank)."""
        ...

    def explain(self, invocation: Invocation, pre: Precondition, rows: list[list[int]]) -> None:
        """Raises the disagreement every rank saw in `rows`."""
        ...

    def global_rank(self, group_rank: int) -> int:
        """The rank of the default group that `group_rank` of this group is."""
        ...
