"""The reference simulator: P ranks in one process, plain tensors, no network.

It is the semantic oracle every pass and backend is tested against, so its
collectives are written straight from the definitions in DESIGN.md — gather
every rank's operands, compute the result the definition names — and share no
code with the torch implementations beyond the local input checks.

Each rank runs the compiled program in its own thread; at a collective the
ranks of the group meet at an exchange point, check that they all reached the
same op, and each computes its result from everybody's operands.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from xdsl.ir import Operation

from distir.errors import CollectiveMismatchError, DistirError
from distir.interpreters.checks import (
    check_axis_rows,
    check_ciphertext,
    check_counts,
    check_group_assumption,
    check_peer,
    check_root,
    fail,
)
from distir.interpreters.invocation import Invocation, make_invocation
from distir.ir.dialect import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AllReduceOp,
    BroadcastOp,
    GroupOp,
    GroupSizeOp,
    PeerOp,
    RankOp,
    RecvOp,
    SendOp,
    TransferOp,
    VariableAllToAllOp,
)
from distir.ir.layouts import local_box

_FOLDS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add,
    "prod": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}


class SimulationError(DistirError):
    """A simulated rank failed; the message names the rank and the op."""


@dataclass
class _Meeting:
    arrived: dict[int, tuple[str, Sequence[torch.Tensor]]]
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

    def exchange(
        self,
        key: tuple,
        members: tuple[int, ...],
        me: int,
        description: str,
        payload: Sequence[torch.Tensor],
    ) -> list[Sequence[torch.Tensor]]:
        """Every member's payload, in group rank order."""
        with self._cond:
            meeting = self._meetings.setdefault(key, _Meeting({}))
            meeting.arrived[me] = (description, payload)
            self._cond.notify_all()
            def gone() -> list[int]:
                return [m for m in members if m in self.finished and m not in meeting.arrived]

            ok = self._cond.wait_for(
                lambda: len(meeting.arrived) == len(members)
                or self.failed is not None
                or bool(gone()),
                timeout=self.timeout,
            )
            if self.failed is not None and len(meeting.arrived) < len(members):
                raise SimulationError(
                    f"{description}: another rank failed first ({self.failed})"
                )
            if gone() and len(meeting.arrived) < len(members):
                raise SimulationError(
                    f"{description}: ranks {gone()} finished the program without reaching "
                    f"this collective (rank {me} waits in it)"
                )
            if not ok:
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
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self.failed is None:
                self.failed = error
            self._cond.notify_all()

    # Point-to-point: one FIFO mailbox per (group, source, destination).

    def post(self, key: tuple, payload: torch.Tensor) -> None:
        with self._cond:
            self._mailboxes.setdefault(key, []).append(payload)
            self._cond.notify_all()

    def take(self, key: tuple, description: str) -> torch.Tensor:
        with self._cond:
            box = self._mailboxes.setdefault(key, [])
            ok = self._cond.wait_for(lambda: box or self.failed is not None,
                                     timeout=self.timeout)
            if box:
                return box.pop(0)
            if self.failed is not None:
                raise SimulationError(f"{description}: another rank failed first ({self.failed})")
            assert not ok
            raise SimulationError(
                f"{description}: no message from group rank {key[1]} within {self.timeout} s"
            )


class SimulatedRank:
    """Binds a rank's dist ops to reference semantics over a SimulatedWorld."""

    def __init__(self, world: SimulatedWorld, rank: int, groups: Sequence[GroupOp]):
        self.world = world
        self.rank = rank
        self._members: dict[str | None, tuple[int, ...] | None] = {
            None: tuple(range(world.size))
        }
        for decl in groups:
            self._members[decl.sym_name.data] = decl.subgroup_of(rank)
        self._sequence: dict[tuple[int, ...], int] = {}

    def members(self, invocation: Invocation) -> tuple[int, ...]:
        members = self._members.get(invocation.group)
        if members is None:
            raise fail(invocation, f"rank {self.rank} is in no subgroup of @{invocation.group}")
        if max(members) >= self.world.size:
            raise fail(invocation, f"group @{invocation.group} names rank {max(members)} "
                       f"but only {self.world.size} ranks run")
        return members

    def bind(self, op: Operation, regions: Sequence[Callable]) -> Callable:
        invocation = make_invocation(op, regions)
        if isinstance(op, PeerOp):
            return self._bind_peer(op, invocation)
        if isinstance(op, TransferOp):
            return self._bind_transfer(invocation)
        semantics = _SEMANTICS[type(op)]

        def kernel(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            members = self.members(invocation)
            me = members.index(self.rank)
            if isinstance(op, RankOp | GroupSizeOp):
                value = me if isinstance(op, RankOp) else len(members)
                return (torch.tensor(value, dtype=torch.int64),)
            check_group_assumption(invocation, len(members))
            _LOCAL_CHECKS.get(type(op), _no_check)(invocation, inputs, me, len(members))
            seq = self._sequence.get(members, 0)
            self._sequence[members] = seq + 1
            everyone = self.world.exchange(
                (members, seq), members, self.rank, invocation.description, inputs
            )
            return semantics(invocation, everyone, me)

        return kernel


    def _bind_peer(self, op: PeerOp, invocation: Invocation) -> Callable:
        def peer(name: str, dynamic: list, size: int) -> int:
            value = invocation.properties.get(name)
            value = int(dynamic.pop(0)) if value is None else value
            check_peer(invocation, "destination" if name == "dest" else "source", value, size)
            return value

        def receive(members, me, source) -> torch.Tensor:
            message = self.world.take((members, source, me), invocation.description)
            declared = invocation.result_shapes[0]
            if message.dtype != invocation.properties["result_dtype"] or message.dim() != len(
                declared
            ) or any(d is not None and d != s for d, s in zip(declared, message.shape)):
                raise CollectiveMismatchError(
                    invocation.description,
                    f"group rank {source} sent {message.dtype} {list(message.shape)}, which "
                    "this op's result type does not admit",
                )
            return message

        def kernel(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            members = self.members(invocation)
            me = members.index(self.rank)
            if isinstance(op, SendOp):
                dest = peer("dest", list(inputs[1:]), len(members))
                self.world.post((members, me, dest), inputs[0].clone())
                return ()
            if isinstance(op, RecvOp):
                return (receive(members, me, peer("source", list(inputs), len(members))),)
            dynamic = list(inputs[1:])
            dest = peer("dest", dynamic, len(members))
            source = peer("source", dynamic, len(members))
            self.world.post((members, me, dest), inputs[0].clone())
            return (receive(members, me, source),)

        return kernel

    def _bind_transfer(self, invocation: Invocation) -> Callable:
        src_mesh, src_layout, dst_mesh, dst_layout, shape, _ = invocation.properties["plan"]
        members = tuple(sorted(set(src_mesh.ranks) | set(dst_mesh.ranks)))
        key = ("transfer",) + members

        def kernel(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            if self.rank not in members:
                return (torch.empty([0] * len(shape), dtype=x.dtype),)
            if self.rank in src_mesh.ranks:
                box = local_box(src_mesh, src_layout, shape, self.rank)
                if tuple(x.shape) != tuple(box.sizes):
                    raise fail(invocation, f"rank {self.rank} of source mesh @{src_mesh.name} "
                               f"holds a shard of shape {list(x.shape)}, but its layout gives "
                               f"it {list(box.sizes)}")
            seq = self._sequence.get(key, 0)
            self._sequence[key] = seq + 1
            everyone = self.world.exchange((key, seq), members, self.rank,
                                           invocation.description, (x,))
            shards = {r: ops[0] for r, ops in zip(members, everyone)}
            whole = _reconstruct_global(invocation, src_mesh, src_layout, shape, shards)
            if self.rank not in dst_mesh.ranks:
                return (torch.empty([0] * len(shape), dtype=x.dtype),)
            box = local_box(dst_mesh, dst_layout, shape, self.rank)
            index = tuple(slice(o, o + n) for o, n in zip(box.offsets, box.sizes))
            return (whole[index].clone(),)

        return kernel


def _mesh_coordinate(mesh, index: int) -> tuple[int, ...]:
    coord = []
    for size in reversed(mesh.shape):
        coord.append(index % size)
        index //= size
    return tuple(reversed(coord))


def _reconstruct_global(invocation, mesh, layout, shape, shards) -> torch.Tensor:
    """The global tensor from its source shards, straight from the definition:
    one replica of every shard (coordinate 0 along replicated axes), summed
    over the partial axes in ascending rank order; other replicas must agree."""
    sharding = {axis for axis in layout.dims if axis is not None}
    replicated = [
        a for a in range(len(mesh.shape)) if a not in sharding and a not in layout.partial
    ]
    coords = {rank: _mesh_coordinate(mesh, i) for i, rank in enumerate(mesh.ranks)}
    canonical = {
        tuple(c for a, c in enumerate(coord) if a not in replicated): rank
        for rank, coord in coords.items()
        if all(coord[a] == 0 for a in replicated)
    }
    whole = torch.zeros(shape, dtype=shards[mesh.ranks[0]].dtype)
    for rank in sorted(mesh.ranks):
        key = tuple(c for a, c in enumerate(coords[rank]) if a not in replicated)
        owner = canonical[key]
        if owner != rank:
            if not torch.equal(shards[owner], shards[rank]):
                raise CollectiveMismatchError(
                    invocation.description,
                    f"replicas disagree: rank {rank} and rank {owner} hold the same shard "
                    "with different values",
                )
            continue
        box = local_box(mesh, layout, shape, rank)
        where = tuple(slice(o, o + n) for o, n in zip(box.offsets, box.sizes))
        whole[where] += shards[rank]
    return whole


# Local checks: the same mistakes the torch backend rejects before communicating.


def _no_check(invocation, inputs, me, size) -> None:
    return None


def _check_broadcast(invocation, inputs, me, size) -> None:
    root = invocation.properties["root"]
    check_root(invocation, int(inputs[1]) if root is None else root, size)


def _check_gather(invocation, inputs, me, size) -> None:
    if len(inputs) == 2:
        counts = check_counts(invocation, "counts", inputs[1], size)
        check_axis_rows(invocation, inputs[0], invocation.properties["axis"], counts[me],
                        f"counts[{me}]")


def _check_all_to_all(invocation, inputs, me, size) -> None:
    send = check_counts(invocation, "send counts", inputs[1], size)
    check_axis_rows(invocation, inputs[0], invocation.properties["axis"], sum(send),
                    "the sum of send counts")


def _check_ciphertext(invocation, inputs, me, size) -> None:
    check_ciphertext(invocation, inputs[0], inputs[1])


_LOCAL_CHECKS = {
    BroadcastOp: _check_broadcast,
    AllGatherOp: _check_gather,
    VariableAllToAllOp: _check_all_to_all,
    AllReduceAddCiphertextOp: _check_ciphertext,
}


# Reference semantics: (invocation, every rank's operands, my group rank) -> results.


def _same_layout(invocation: Invocation, values: Sequence[torch.Tensor], what: str) -> None:
    first = values[0]
    for r, v in enumerate(values):
        if v.shape != first.shape or v.dtype != first.dtype:
            raise CollectiveMismatchError(
                invocation.description,
                f"{what} of rank {r} is {list(v.shape)} {v.dtype} but rank 0 has "
                f"{list(first.shape)} {first.dtype}",
            )


def _broadcast(invocation, everyone, me):
    root = invocation.properties["root"]
    roots = {root if root is not None else int(ops[1]) for ops in everyone}
    if len(roots) > 1:
        raise CollectiveMismatchError(invocation.description,
                                      f"ranks name different roots {sorted(roots)}")
    _same_layout(invocation, [ops[0] for ops in everyone], "the message")
    return (everyone[roots.pop()][0].clone(),)


def _all_reduce(invocation, everyone, me):
    values = [ops[0] for ops in everyone]
    _same_layout(invocation, values, "the input")
    kind = invocation.properties["kind"]
    acc = values[0].clone()
    if kind is not None:
        for v in values[1:]:
            acc = _FOLDS[kind](acc, v)
        return (acc,)
    extras = everyone[me][1:]
    for v in values[1:]:
        (acc,) = invocation.regions[0](acc, v, *extras)
    return (acc,)


def _ciphertext_add(invocation, everyone, me):
    values = [ops[0] for ops in everyone]
    _same_layout(invocation, values, "the ciphertext")
    q = everyone[me][1].view(-1, 1)
    acc = values[0].clone()
    for v in values[1:]:
        acc = torch.remainder(acc + v, q)  # exact: both < 2^62
    return (acc,)


def _all_gather(invocation, everyone, me):
    axis = invocation.properties["axis"]
    parts = [ops[0] for ops in everyone]
    if len(everyone[0]) == 2:
        counts = [ops[1].tolist() for ops in everyone]
        if any(c != counts[0] for c in counts):
            raise CollectiveMismatchError(invocation.description,
                                          f"ranks pass different counts {counts}")
    else:
        _same_layout(invocation, parts, "the input")
    return (torch.cat(parts, dim=axis),)


def _variable_all_to_all(invocation, everyone, me):
    axis = invocation.properties["axis"]
    received = []
    recv_counts = []
    for x, send_counts in everyone:
        sizes = [int(c) for c in send_counts.tolist()]
        received.append(torch.split(x, sizes, dim=axis)[me])
        recv_counts.append(sizes[me])
    counts_dtype = everyone[me][1].dtype
    return (torch.cat(received, dim=axis), torch.tensor(recv_counts, dtype=counts_dtype))


_SEMANTICS = {
    RankOp: None,
    GroupSizeOp: None,
    BroadcastOp: _broadcast,
    AllReduceOp: _all_reduce,
    AllReduceAddCiphertextOp: _ciphertext_add,
    AllGatherOp: _all_gather,
    VariableAllToAllOp: _variable_all_to_all,
}


def run_simulation(
    run_rank: Callable[[SimulatedRank], object],
    world_size: int,
    groups: Sequence[GroupOp],
    timeout: float,
) -> list:
    """Runs `run_rank` on `world_size` threads; returns each rank's result or
    raises the first rank's error."""
    world = SimulatedWorld(world_size, timeout)
    results: list = [None] * world_size
    errors: list[tuple[int, BaseException]] = []

    def body(rank: int) -> None:
        try:
            results[rank] = run_rank(SimulatedRank(world, rank, groups))
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
        # Report the root cause, not the ranks that failed because of it.
        errors.sort(key=lambda e: isinstance(e[1], SimulationError))
        rank, error = errors[0]
        if isinstance(error, DistirError):
            error.add_note(f"raised on simulated rank {rank}")
            raise error
        raise SimulationError(f"rank {rank}: {type(error).__name__}: {error}") from error
    return results
