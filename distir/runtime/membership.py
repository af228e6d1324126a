"""Surviving a lost rank: the survivors agree on who is left and go on.

After a failure (a peer's exit, a deadline, a rank that raised), every
survivor calls `recover()`. It returns the same `Membership` on every
survivor: the previous members that are still there, a new epoch number and
a new process group over them, or raises a named error, within its deadline
(plus the 2 s every failure path may take).

The protocol runs on the rendezvous store, which outlives every rank (the
launcher hosts it, or torchrun's agent). For the move from epoch e to e+1:

1. Fencing first: if the decision for e+1 exists and leaves this rank out,
   it raises `Excluded` (it was frozen or late while the others moved on).
2. Join: the rank writes `join/<e+1>/<rank>`.
3. Decide: the rank polls until every member of epoch e has joined or is
   known to be gone (the launcher writes `gone/<rank>` with the cause when
   a rank's process ends or its function returns or raises), or until the
   join window closes. It then proposes the members that joined, with one
   compare-and-set on `decision/<e+1>`: the first proposal wins, and every
   rank reads that one.
4. Form: the decided members create a process group named after the epoch
   (its rendezvous keys are new in the store) and confirm it with one small
   all-reduce. If a member died meanwhile, creation or confirmation fails on
   every member, and they run the protocol again from the decided
   membership (epoch e+2), where the dead member is gone or never joins.

Why it is safe. The store is one server, so `compare_set` is a linearisable
register: exactly one membership is decided per epoch and every rank reads
the same one. A decision only names ranks that joined, i.e. that were
running `recover` for that very epoch. A rank outside the decision cannot
enter the new group (its rendezvous names only the decided members, by
rank), and the failure path and `recover` check the decision before
anything else, so a rank that wakes up after the others moved on hears
`Excluded`, naming the epoch it missed, and never takes part in a collective
of that epoch. Every wait is bounded: store reads (`call_bounded`), the
join window, group creation and confirmation (backend timeouts); when the
deadline passes, `RecoveryFailed` says which step did not finish.

Liveness is what the evidence gives: with the launcher's `gone` reports a
lost rank is known at once and recovery takes about the time of a group
creation; without them (torchrun, or a frozen rank) the survivors wait for
the join window. Compared with torchft's quorum (a lighthouse server that
forms a quorum at every step from heartbeats), this runs only after a
failure and needs no server besides the store.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distir.durations import Duration, seconds
from distir.errors import DistirError, RecoveryFailed
from distir.transport.domain import StoreUnavailable, call_bounded, resolve_group
from distir.transport.epochs import (
    RUNS,
    STEPS,
    STORE_PREFIX,
    Membership,
    decision_key,
    default_store,
    excluded,
    format_decision,
    membership,
    parse_members,
    parse_outcome,
    read_key,
    set_membership,
)

#: the key the launcher writes when a rank's process is gone (value: why)
GONE_KEY = "distir/gone/{rank}"

#: the share of `recover`'s deadline its join window takes by default: the
#: rest is left for forming and confirming the new group
JOIN_WINDOW_SHARE = 0.6

#: seconds between two looks at the store while waiting for joins
_POLL_S = 0.01


#: the launcher's store, where it reports gone ranks (None under torchrun)
_job_store: Any = None


def set_job_store(store: Any) -> None:
    """The store the launcher hosts (it reports gone ranks there)."""
    global _job_store
    _job_store = store


def _join_key(epoch: int, rank: int) -> str:
    return f"{STORE_PREFIX}join/{epoch}/{rank}"


def recover(
    group: Any = None,
    *,
    deadline: Duration = 30.0,
    join_window: Duration | None = None,
    progress: int | None = None,
) -> Membership:
    """Agrees with the other survivors on who is left and forms a new group.

    Every survivor calls it after a failure, with the group that failed
    (None: the current membership's group, the default group at first). It
    returns the same `Membership` on every survivor, within `deadline`
    (seconds or a timedelta; plus at most 2 s), or raises `Excluded` (the others moved on
    without this rank) or `RecoveryFailed` (no agreement in time). Members
    that do not join within `join_window` seconds (default:
    `JOIN_WINDOW_SHARE` of the deadline, 60%) are left out; ranks the
    launcher reports gone are not waited for. Programs run on
    `membership.group` afterwards; the old group is destroyed.

    Where to resume is agreed in the same decision: `membership.completed`
    is the number of positions completed on every member, the same on
    every member. Positions are this rank's completed program runs (since
    epoch 0, restarting from `completed` on each new group), or
    `progress`, the application's own count of completed steps, when every
    member passes it (ranks that disagree on which they count get
    `RecoveryFailed`). A step made of several runs, or of local work after
    them (an optimizer step), is one position with `progress=`.

    Give it a deadline longer than the collectives' deadline plus the time
    to form a group: a survivor may still be inside a collective of the old
    group, and gloo does not always wake it when a peer dies (nor can one
    rank close another's connections: gloo's `abort` does nothing), so it
    may join only at its own collective deadline.

        try:
            y = program.run(x, group=m.group)
            step += 1
        except distir.errors.DistirError:
            m = distir.recover(progress=step)
            step = m.completed  # the same on every member
    """
    deadline = seconds(deadline, "deadline")
    start = time.monotonic()
    end = start + deadline
    window = (
        JOIN_WINDOW_SHARE * deadline if join_window is None else seconds(join_window, "join_window")
    )
    current = membership()
    if group is not None and group is not current.group:
        raise DistirError(
            "recover: the group given is not the current membership's group (epoch "
            f"{current.epoch}, ranks {list(current.ranks)}); pass the group that "
            "recover returned last, or None"
        )
    return agree(current, _position(current, progress), end, window, "recover")


def agree(
    current: Membership,
    position: str,
    end: float,
    window: float,
    what: str,
    admit: tuple[int, ...] = (),
    decision: bytes | None = None,
) -> Membership:
    """The next membership after `current`, decided and formed before
    `end` (`time.monotonic()`): the members of `current` that join within
    `window` seconds, and the ranks in `admit` (`distir.grow`). A joiner
    passes the `decision` that admitted it and starts at forming."""
    me = dist.get_rank()
    store = default_store()
    previous = current
    start = time.monotonic()
    failures: list[str] = []
    while True:
        epoch = current.epoch + 1
        if decision is None:
            decision = _decide(
                store, current, epoch, me, position, min(end, time.monotonic() + window), end,
                admit,
            )  # fmt: skip
        members = parse_members(decision)
        if me not in members:
            _fence(previous, epoch, members)
            raise excluded(me, epoch, members)
        kind, completed, joined = parse_outcome(decision)
        decision = None
        if kind not in (RUNS, STEPS):
            raise RecoveryFailed(
                f"{what}: the members of epoch {epoch} (ranks {list(members)}) count "
                "different positions: some passed progress= and some did not; pass it on "
                "every rank or on none"
            )
        if joined:  # tells each joiner which decision admitted it
            _bounded(
                lambda e=epoch, js=joined: [store.set(admitted_key(r), str(e)) for r in js],
                max(0.5, end - time.monotonic()),
                "admitting",
            )
        formed = _form(members, epoch, me, end)
        if isinstance(formed, str):
            failures.append(f"epoch {epoch} over ranks {list(members)}: {formed}")
            current = Membership(epoch, members, None, members.index(me), (), completed)
            admit = ()
            if time.monotonic() >= end:
                raise RecoveryFailed(
                    f"{what}: no membership agreed within {end - start:.3g} s ("
                    + "; ".join(failures)
                    + ")"
                )
            continue
        result = Membership(
            epoch,
            members,
            formed,
            members.index(me),
            tuple(r for r in previous.ranks if r not in members),
            completed,
            tuple(r for r in members if r not in previous.ranks),
        )
        set_membership(result)
        _release(previous.group)
        return result


def admitted_key(rank: int) -> str:
    """Where the decision that admitted `rank` is named (its epoch)."""
    return f"{STORE_PREFIX}admitted/{rank}"


def _position(current: Membership, progress: int | None) -> str:
    """This rank's position as its join record holds it: "steps:<n>" (the
    application's), or "runs:<n>" (runs completed on the current group)."""
    if progress is not None:
        if isinstance(progress, bool) or not isinstance(progress, int) or progress < 0:
            raise DistirError(
                f"recover: progress must be a count of completed steps (an int >= 0), "
                f"not {progress!r}"
            )
        return f"{STEPS}:{progress}"
    from distir.transport.domain import domain_for

    runs = 0
    if current.group is not None:
        runs = domain_for(current.group).completed
    return f"{RUNS}:{current.completed + runs}"


def _fence(previous: Membership, epoch: int, members: tuple[int, ...]) -> None:
    """This rank is out: its old group's domain says so from now on."""
    from distir.transport.domain import domain_for

    if previous.group is not None and dist.is_initialized():
        try:
            domain_for(previous.group if previous.epoch else None).poison(
                excluded(dist.get_rank(), epoch, members)
            )
        except Exception:
            pass


def _decide(
    store: Any,
    current: Membership,
    epoch: int,
    me: int,
    position: str,
    close: float,
    end: float,
    admit: tuple[int, ...] = (),
) -> bytes:
    """The decision of `epoch` (`format_decision`): read, or proposed once
    every member of the current epoch joined or is gone, or the window
    closed. A rank joins with its position; the proposal carries the
    members that joined and the least of their positions."""
    key = decision_key(epoch)
    bound = max(0.5, end - time.monotonic())

    def first_look() -> bytes | None:
        decided = read_key(store, key)
        if decided is None:
            store.set(_join_key(epoch, me), position)
        return decided

    decided = _bounded(first_look, bound, "joining")
    if decided is not None:
        return decided
    pending = [r for r in current.ranks if r != me]

    def look() -> tuple[bytes | None, list[int]]:
        decided = read_key(store, key)
        if decided is not None:
            return decided, []
        joined = [r for r in current.ranks if store.check([_join_key(epoch, r)])]
        gone = (
            [r for r in current.ranks if _job_store.check([GONE_KEY.format(rank=r)])]
            if _job_store is not None
            else []
        )
        return None, [r for r in current.ranks if r in joined or r in gone]

    while True:
        decided, accounted = _bounded(look, max(0.5, end - time.monotonic()), "waiting for joins")
        if decided is not None:
            return decided
        if set(pending) <= set(accounted) or time.monotonic() >= close:
            break
        time.sleep(_POLL_S)

    def propose() -> bytes:
        joined = {r: read_key(store, _join_key(epoch, r)) for r in current.ranks}
        records = {r: v.decode().split(":") for r, v in joined.items() if v is not None}
        members = tuple(sorted(records))
        kinds = {kind for kind, _ in records.values()}
        completed = min(int(n) for _, n in records.values())
        grown = tuple(sorted(set(members) | set(admit)))
        return store.compare_set(
            key, "", format_decision(grown, kinds, completed, tuple(sorted(admit)))
        )

    return _bounded(propose, max(0.5, end - time.monotonic()), "proposing")


def _bounded(fn: Any, timeout_s: float, step: str) -> Any:
    try:
        return call_bounded(fn, timeout_s, f"recover: {step}")
    except StoreUnavailable as e:
        raise RecoveryFailed(f"{e} (the rendezvous store does not answer)") from None
    except (RuntimeError, dist.DistStoreError) as e:  # the store is gone
        raise RecoveryFailed(
            f"recover: {step}: the rendezvous store failed ({str(e).splitlines()[0]})"
        ) from None


def _form(members: tuple[int, ...], epoch: int, me: int, end: float) -> Any:
    """The process group of `epoch`, confirmed by every member, or why not."""
    left = end - time.monotonic()
    if left <= 0:
        return "no time left to form the group"
    # A member that died before publishing its address makes creation wait
    # for the whole timeout: a short one leaves time for another round.
    timeout = timedelta(seconds=max(1.0, min(left, 2.0)))
    from distir.transport.groups import create_group

    try:
        group = call_bounded(
            lambda: create_group(members, f"distir-epoch-{epoch}", timeout),
            timeout.total_seconds() + 1.0,
            "creating the group",
        )
    except StoreUnavailable:
        return "creating the group did not finish (the store does not answer)"
    except (RuntimeError, ValueError, dist.DistStoreError) as e:
        return f"creating the group failed ({str(e).splitlines()[0]})"
    # Every member connected; one all-reduce shows every member is still there.
    check = torch.tensor([epoch], dtype=torch.int64)
    opts = dist.AllreduceOptions()
    opts.timeout = timeout
    try:
        group.allreduce([check], opts).wait(timeout)
    except RuntimeError as e:
        _release(group)
        return f"confirming the group failed ({str(e).splitlines()[0]})"
    if check.item() != epoch * len(members):
        _release(group)
        return f"members disagree on the epoch ({check.item()} != {epoch * len(members)})"
    # The short timeout above bounds forming the group only: its collectives
    # wait as long as the job's (the default group's timeout), or a plain
    # dist.* collective on the recovered group fails after 2 s.
    c10d._set_pg_timeout(_job_timeout(), group)
    return group


def _job_timeout() -> timedelta:
    """The default group's collective timeout (the job's)."""
    default = c10d._get_default_group()
    for device in default._device_types:
        timeout = getattr(getattr(default._get_backend(device), "options", None), "_timeout", None)
        if isinstance(timeout, timedelta):
            return timeout
    return c10d.default_pg_timeout


def _release(group: Any) -> None:
    """Destroys a group recovery replaced (never the default group: that
    would end every group) and the declared groups made on it."""
    from distir.transport.groups import release_dead_groups

    if group is None or group is resolve_group(None):
        return
    try:
        if group in c10d._world.pg_map:
            call_bounded(lambda: dist.destroy_process_group(group), 2.0, "releasing a group")
    except Exception:  # already broken: it is released anyway
        pass
    release_dead_groups()
