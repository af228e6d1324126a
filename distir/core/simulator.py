"""The reference interpreter: P ranks in one process, plain tensors, no network.

It is the semantic oracle every pass and backend is tested against. Each rank
runs the compiled program in its own thread; a dist op's meaning is the
`reference` of its semantics record (`distir.core.semantics`), written
straight from the definitions in docs/reference/dialect.md: gather every rank's operands,
compute what the definition names. Records hold the precondition the Torch
backend evaluates too, so the reference rejects exactly what the runtime
rejects, and nothing else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from xdsl.ir import Operation

from distir.core.checks import (
    Precondition,
    check_group_assumption,
    evaluate,
    fail,
    mismatch,
)
from distir.core.invocation import Invocation
from distir.core.semantics import SEMANTICS, OpSemantics, make_invocation
from distir.errors import CollectiveMismatchError, DistirError
from distir.ir.dialect import GroupDeclaration


class SimulationError(DistirError):
    """A simulated rank failed; the message names the rank and the op."""


@dataclass
class _Meeting:
    arrived: dict[int, tuple[str, Any]]
    left: int = 0


class SimulatedWorld:
    """The exchange points where simulated ranks meet for each collective."""

    def __init__(self, size: int, timeout: float):
        self.size = size
        self.timeout = timeout
        self._cond = threading.Condition()
        self._meetings: dict[tuple, _Meeting] = {}
        self._mailboxes: dict[tuple, list[torch.Tensor]] = {}
        #: ranks whose program returned: they will never reach another collective
        self.finished: set[int] = set()
        self.failed: BaseException | None = None
        # Deadlock detection: every change a waiting rank may wait for (an
        # arrival, a message, a rank finishing or failing) starts a new
        # generation; a waiting rank notes the generation in which it last
        # found nothing to do. When every rank still running has found
        # nothing to do in the current generation, no rank can ever change
        # anything again: the program is deadlocked, named at once instead of
        # at the timeout.
        self._generation = 0
        self._stuck: dict[int, tuple[int, str]] = {}
        #: why no waiting rank can go on, once that is so
        self.deadlock: str | None = None

    def _changed(self) -> None:
        """Under the lock: a change waiting ranks must look at."""
        self._generation += 1
        self._cond.notify_all()

    def _wait(self, rank: int, waits_for: str, ready: Callable[[], bool]) -> bool:
        """Under the lock: waits until `ready()`, a failure or a deadlock
        (True), or the timeout (False)."""
        end = time.monotonic() + self.timeout
        try:
            while True:
                if ready() or self.failed is not None or self.deadlock is not None:
                    return True
                self._stuck[rank] = (self._generation, waits_for)
                running = [r for r in range(self.size) if r not in self.finished]
                if all(self._stuck.get(r, (-1,))[0] == self._generation for r in running):
                    self.deadlock = "deadlock: every rank still running waits (" + "; ".join(
                        f"rank {r}: {self._stuck[r][1]}" for r in running
                    ) + ") and none can go on"
                    self._cond.notify_all()
                    return True
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        finally:
            self._stuck.pop(rank, None)

    def exchange(
        self, key: tuple, members: tuple[int, ...], me: int, description: str, payload: Any
    ) -> list[Any]:
        """Every member's payload, in group rank order."""
        with self._cond:
            meeting = self._meetings.setdefault(key, _Meeting({}))
            meeting.arrived[me] = (description, payload)
            self._changed()

            def gone() -> list[int]:
                return [m for m in members if m in self.finished and m not in meeting.arrived]

            ok = self._wait(
                me, description, lambda: len(meeting.arrived) == len(members) or bool(gone())
            )
            if len(meeting.arrived) < len(members):
                if self.failed is not None:
                    raise SimulationError(
                        f"{description}: another rank failed first ({self.failed})"
                    )
                if self.deadlock is not None:
                    raise SimulationError(f"{description}: {self.deadlock}")
                if gone():
                    raise SimulationError(
                        f"{description}: ranks {gone()} finished the program without "
                        f"reaching this collective (rank {me} waits in it)"
                    )
                assert not ok
                missing = sorted(set(members) - set(meeting.arrived))
                raise SimulationError(
                    f"{description}: ranks {missing} never reached this collective "
                    f"within {self.timeout} s (rank {me} waited)"
                )
            arrived = dict(meeting.arrived)
            meeting.left += 1
            if meeting.left == len(members):
                del self._meetings[key]
        descriptions = {arrived[m][0] for m in members}
        if len(descriptions) > 1:
            per_rank = "; ".join(f"rank {m}: {arrived[m][0]}" for m in members)
            raise CollectiveMismatchError(
                description, f"ranks reached different collectives ({per_rank})"
            )
        return [arrived[m][1] for m in members]

    def finish(self, rank: int) -> None:
        with self._cond:
            self.finished.add(rank)
            self._changed()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self.failed is None:
                self.failed = error
            self._changed()

    # Point-to-point: one FIFO mailbox per (group, source, destination).

    def post(self, key: tuple, payload: torch.Tensor) -> None:
        with self._cond:
            self._mailboxes.setdefault(key, []).append(payload)
            self._changed()

    def take(self, key: tuple, description: str) -> torch.Tensor:
        """The next message to group rank key[2] from group rank key[1] of
        the group of global ranks key[0]."""
        members, source, me = key
        with self._cond:
            box = self._mailboxes.setdefault(key, [])
            waits_for = f"{description}, a message from group rank {source}"
            ok = self._wait(members[me], waits_for, lambda: bool(box))
            if box:
                return box.pop(0)
            if self.failed is not None:
                raise SimulationError(f"{description}: another rank failed first ({self.failed})")
            if self.deadlock is not None:
                raise SimulationError(
                    f"{description}: no message from group rank {source} can ever come: "
                    f"{self.deadlock}"
                )
            assert not ok
            raise SimulationError(
                f"{description}: no message from group rank {key[1]} within {self.timeout} s"
            )


class SimulatedCall:
    """One execution of one dist op on one simulated rank: what a reference
    rule may ask (its group, its rank in it) and do (exchange with the group,
    post and take point-to-point messages)."""

    def __init__(
        self,
        rank: SimulatedRank,
        semantics: OpSemantics,
        invocation: Invocation,
        members: tuple[int, ...],
    ):
        self.simulated = rank
        self.semantics = semantics
        self.invocation = invocation
        self.members = members
        self.me = members.index(rank.rank)
        self.size = len(members)

    @property
    def global_rank(self) -> int:
        return self.simulated.rank

    def fail(self, message: str) -> Exception:
        return fail(self.invocation, message)

    def exchange(self, payload: Any, members: tuple[int, ...] | None = None) -> list[Any]:
        """Every member's `payload`, in group rank order (`members`: global
        ranks of another set than the op's group, e.g. two meshes)."""
        members = members or self.members
        return self.simulated.exchange(members, self.invocation.description, payload)

    def agree(self, inputs: Sequence[torch.Tensor]) -> tuple[Precondition, list[Sequence[Any]]]:
        """Checks the op's precondition on every rank and exchanges inputs;
        raises as the runtime's agreement does (the rank that rejected its
        inputs raises its own error, the others name it); returns this rank's
        precondition and every rank's inputs."""
        check_group_assumption(self.invocation, self.size)
        rule = self.semantics.precondition
        mine = (
            evaluate(rule, self.invocation, inputs, self.size, self.me)
            if rule is not None
            else Precondition()
        )
        everyone = self.exchange((mine.report(), mine.digest(), tuple(inputs)))
        if mine.error is not None:
            raise mine.error
        reports = [report for report, _, _ in everyone]
        if any(r["error"] for r in reports) or len({d for _, d, _ in everyone}) > 1:
            raise mismatch(self.invocation.description, self.group_name, reports)
        return mine, [values for _, _, values in everyone]

    @property
    def group_name(self) -> str:
        return "world" if self.invocation.group is None else f"@{self.invocation.group}"

    def post(self, dest: int, payload: torch.Tensor) -> None:
        self.simulated.world.post((self.members, self.me, dest), payload.clone())

    def take(self, source: int) -> torch.Tensor:
        return self.simulated.world.take((self.members, source, self.me),
                                         self.invocation.description)


class SimulatedRank:
    """Binds a rank's dist ops to their semantics records over a SimulatedWorld."""

    def __init__(
        self,
        world: SimulatedWorld,
        rank: int,
        groups: Sequence[GroupDeclaration],
        semantics: Sequence[OpSemantics] = SEMANTICS,
    ):
        self.world = world
        self.rank = rank
        self._semantics = {record.op: record for record in semantics}
        self._members: dict[str | None, tuple[int, ...] | None] = {
            None: tuple(range(world.size))
        }
        for decl in groups:
            self._members[decl.name] = decl.subgroup_of(rank)
        self._sequence: dict[tuple[int, ...], int] = {}

    def members(self, invocation: Invocation) -> tuple[int, ...]:
        members = self._members.get(invocation.group)
        if members is None:
            raise fail(invocation, f"rank {self.rank} is in no subgroup of @{invocation.group}")
        if max(members) >= self.world.size:
            raise fail(invocation, f"group @{invocation.group} names rank {max(members)} "
                       f"but only {self.world.size} ranks run")
        return members

    def exchange(self, members: tuple[int, ...], description: str, payload: Any) -> list[Any]:
        seq = self._sequence.get(members, 0)
        self._sequence[members] = seq + 1
        return self.world.exchange((members, seq), members, self.rank, description, payload)

    def bind(self, op: Operation, regions: Sequence[Callable]) -> Callable:
        invocation = make_invocation(op, regions)
        semantics = self._semantics.get(type(op))
        if semantics is None:
            raise fail(invocation, "has no reference semantics")

        def kernel(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            call = SimulatedCall(self, semantics, invocation, self.members(invocation))
            return semantics.reference(call, inputs)

        return kernel


def run_simulation(
    run_rank: Callable[[SimulatedRank], object],
    world_size: int,
    groups: Sequence[GroupDeclaration],
    timeout: float,
    semantics: Sequence[OpSemantics] = SEMANTICS,
) -> list:
    """Runs `run_rank` on `world_size` threads; returns each rank's result or
    raises the first rank's error. Dist ops mean what their records in
    `semantics` say (every dist op's, by default), as an xDSL interpreter
    runs the implementation classes it is handed."""
    world = SimulatedWorld(world_size, timeout)
    results: list = [None] * world_size
    errors: list[tuple[int, BaseException]] = []

    def body(rank: int) -> None:
        try:
            results[rank] = run_rank(SimulatedRank(world, rank, groups, semantics))
            world.finish(rank)
        except BaseException as e:  # reported below, with the rank
            errors.append((rank, e))
            world.fail(e)

    threads = [
        threading.Thread(target=body, args=(r,), name=f"distir-sim-rank-{r}", daemon=True)
        for r in range(world_size)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    if any(t.is_alive() for t in threads):
        raise SimulationError(f"simulated ranks still running after {timeout + 5} s")
    if errors:
        # Report the root cause: a rank's own error before the ranks that
        # named it, and those before ranks that only saw another one fail.
        errors.sort(key=lambda e: (isinstance(e[1], SimulationError),
                                   isinstance(e[1], CollectiveMismatchError)))
        rank, error = errors[0]
        if isinstance(error, DistirError):
            error.add_note(f"raised on simulated rank {rank}")
            raise error
        raise SimulationError(f"rank {rank}: {type(error).__name__}: {error}") from error
    return results
