"""The current membership and the store's record of later ones: what a rank
reads to learn whether the survivors moved on without it.

`distir.runtime.membership` runs the recovery protocol (join, decide, form)
and records each new membership here; the failure path of an execution
domain (`distir.transport.domain`) reads `exclusion()` from here. This module
sits below both, so neither needs the other to answer "was this rank left
out?".
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distir.errors import DistirError, Excluded

#: the store keys of the protocol start with this
STORE_PREFIX = "distir/membership/"


@dataclass(frozen=True)
class Membership:
    """Who runs together after `epoch` recoveries.

    `ranks` are global ranks (sorted); `group` is the process group over
    them (the default group at epoch 0); `rank` is this process's
    rank in `group`; `lost` the ranks of the previous membership left out.

    `completed` is where every member resumes: the number of positions
    completed on every member when the previous membership failed, agreed
    in the same decision as `ranks` (so every member reads the same number).
    Positions are runs of programs (counted from 0 at epoch 0, and from
    `completed` on each later membership's group), or the application's
    own steps when every member passed `progress=` to `recover`. The run
    in flight when a rank died may have completed on some members only: a
    member that is further along goes back to `completed`.

    `joined` are the ranks this membership admitted (`distir.grow`): new
    processes that take no part in `completed` and receive their state from
    a member that was there before."""

    epoch: int
    ranks: tuple[int, ...]
    group: dist.ProcessGroup = field(repr=False, compare=False)
    rank: int
    lost: tuple[int, ...] = ()
    completed: int = 0
    joined: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return len(self.ranks)


_lock = threading.Lock()
_current: Membership | None = None


def membership() -> Membership:
    """The current membership (epoch 0: the whole default group)."""
    global _current
    if not dist.is_initialized():
        raise DistirError("torch.distributed is not initialised")
    with _lock:
        world = c10d._get_default_group()
        if _current is None or (_current.epoch == 0 and _current.group is not world):
            ranks = tuple(range(dist.get_world_size()))
            _current = Membership(0, ranks, world, dist.get_rank())
        return _current


def set_membership(new: Membership) -> None:
    """Records the membership recovery formed."""
    global _current
    with _lock:
        _current = new


def default_store() -> dist.Store:
    return c10d._get_default_store()


#: what `read_key` asks `compare_set` to expect: no key holds it (a NUL
#: byte starts no value distir writes), so the call never writes
_ABSENT = "\x00distir: no such key"


def read_key(store: dist.Store, key: str) -> bytes | None:
    """The value of `key`, or None when it is not set: one atomic request.

    Never `check` then `get`: a key deleted between the two (a joiner that
    withdraws its request, a domain cleared at release) leaves `get` waiting
    for the store's whole timeout, holding the store client's lock, so every
    later store call of the process stalls behind it. `compare_set` with an
    expected value no key holds returns the value, or the expected value
    when the key is missing, and writes nothing."""
    value = store.compare_set(key, _ABSENT, _ABSENT)
    return None if value == _ABSENT.encode() else value


def decision_key(epoch: int) -> str:
    return f"{STORE_PREFIX}decision/{epoch}"


#: what positions count: runs of programs, or the application's own steps
RUNS, STEPS = "runs", "steps"


def parse_members(value: bytes) -> tuple[int, ...]:
    """The members of a decision (`format_decision`)."""
    return tuple(int(r) for r in value.decode().split("|")[0].split(",") if r)


def format_decision(
    members: tuple[int, ...], kinds: set[str], completed: int, joined: tuple[int, ...] = ()
) -> str:
    """A decision as the store holds it: members, what positions count
    ("runs", "steps", or "mixed" when the members disagree), the positions
    completed on every member and the members admitted by it."""
    kind = kinds.pop() if len(kinds) == 1 else "mixed"
    return f"{','.join(map(str, members))}|{kind}|{completed}|{','.join(map(str, joined))}"


def parse_outcome(value: bytes) -> tuple[str, int, tuple[int, ...]]:
    """What positions count in a decision, how many completed on every
    member, and the members it admitted."""
    _, kind, completed, joined = value.decode().split("|")
    return kind, int(completed), tuple(int(r) for r in joined.split(",") if r)


def read_decision(store: dist.Store, epoch: int) -> tuple[int, ...] | None:
    """The members decided for `epoch`, or None while undecided."""
    value = read_key(store, decision_key(epoch))
    return None if value is None else parse_members(value)


def excluded(me: int, epoch: int, members: tuple[int, ...]) -> Excluded:
    return Excluded(
        f"rank {me} was excluded at epoch {epoch}: the survivors "
        f"{', '.join(map(str, members))} moved on without it (it was frozen, late or cut "
        "off for longer than their join window); it must not take part in their "
        "collectives, so it stops here",
        epoch,
    )


def exclusion() -> Excluded | None:
    """`Excluded` if the survivors decided an epoch after this rank's
    without it (reads the store: for failure paths only, unbounded: the
    caller bounds it)."""
    if not dist.is_initialized():
        return None
    current = membership()
    me = dist.get_rank()
    decided = read_decision(default_store(), current.epoch + 1)
    if decided is None or me in decided:
        return None
    return excluded(me, current.epoch + 1, decided)
