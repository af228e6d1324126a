"""Growing a running job (`distir.join`, `distir.grow`): a new process joins,
receives its state from a member and the job goes on at the new size.

A joiner takes a rank of the world that is not a member (a lost rank's, when
the launcher restarts it with `launch(..., replace=True)`), calls
`join(state)` and waits. The members call `grow(state)` together at a point
of their loop (every step, or every few: it costs one small all-reduce when
nobody waits). The protocol is recovery's (`distir.runtime.membership`),
with the joiners added to the proposal:

1. The joiner clears what an earlier process of its rank left in the store
   and writes `want/<rank>` with the digest of its state's shapes and
   dtypes (and the application's `tag`).
2. Each member reads the requests; a digest that is not its own is refused
   (`refused/<rank>`, the joiner raises `JoinRefused`). The members agree on
   the requests they saw with one all-reduce (max over a row per world
   rank), so every member admits the same set.
3. If any: the members decide the next epoch as recovery does (join,
   decide with one compare-and-set, form a group named after the epoch,
   confirm it), the proposal naming the admitted ranks too. Every member
   writes `admitted/<rank>` = the epoch; the joiner reads that decision and
   forms the group with them. One decision per epoch, and a rank of an older
   membership is fenced, exactly as in recovery.
4. The joiners receive the state with a distir program: per dtype, the
   flattened tensors go by one `dist.transfer` from the members that were
   there before (each holds it whole) to the joiners only, each joiner
   reading it from one member (two joiners from two members). State split
   across the members (`ShardedState`) moves instead from the layout over
   the old members to the layout over the new ones, one `dist.transfer`
   per tensor (`distir.runtime.elastic_shards`). A joiner compiles its
   program before asking.

Faults end as in recovery: a joiner that dies while joining makes forming
fail on every member, who decide the next epoch without it (the launcher
reports it gone); a member that dies during a join does the same; two
joiners are admitted by one decision. The joiner's wait is bounded by its
deadline (`JoinFailed`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from distir.durations import Duration, seconds
from distir.errors import DistirError, JoinFailed, JoinRefused
from distir.runtime import membership as protocol
from distir.runtime.elastic_shards import (
    Shard,
    ShardedState,
    hand_over,
    misfit,
    misfit_reason,
    prepare,
    transfer,
)
from distir.transport.domain import call_bounded
from distir.transport.epochs import (
    STORE_PREFIX,
    Membership,
    decision_key,
    default_store,
    membership,
    parse_members,
    parse_outcome,
    read_key,
)

#: what `grow` and `join` hand over: whole tensors, or shards
State = Sequence[torch.Tensor] | ShardedState

#: seconds between two looks at the store while a joiner waits
_POLL_S = 0.01


def _want_key(rank: int) -> str:
    return f"{STORE_PREFIX}want/{rank}"


def _refused_key(rank: int) -> str:
    return f"{STORE_PREFIX}refused/{rank}"


#: the running job's world size, which members publish at their first `grow`
#: (a joiner started in another world is refused: see `join`)
_WORLD_KEY = f"{STORE_PREFIX}world"

#: whether this process published the world size (once is enough)
_world_published = False


def state_digest(state: State, tag: str = "") -> str:
    """What a joiner and the members must agree on before any byte moves:
    the shapes and dtypes of the state, in order, and the application's tag
    (of a `ShardedState`: its layout)."""
    if isinstance(state, ShardedState):
        described = f"sharded|{state.described()}"
    else:
        described = ";".join(f"{tuple(t.shape)}:{t.dtype}" for t in state)
    return hashlib.sha256(f"{tag}|{described}".encode()).hexdigest()[:32]


def _check_state(state: State, what: str) -> list[torch.Tensor] | ShardedState:
    if isinstance(state, ShardedState):
        return state
    tensors = list(state)
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise DistirError(f"{what}: state[{i}] is a {type(t).__name__}, not a torch.Tensor")
    return tensors


def join_requests() -> tuple[int, ...]:
    """The ranks outside the current membership that wait in `join`
    (`distir.join_requests()`): one read of the store, on this rank only.
    What `grow` admits is agreed by the members, not this; members may read
    it at different moments (a joiner that `grow` refused withdraws its
    request), so a loop that pauses until its replacement asks uses
    `grow(state, wait=...)`, where the members agree when to stop."""
    current = membership()
    store = default_store()
    outside = [r for r in range(dist.get_world_size()) if r not in current.ranks]
    return protocol._bounded(
        lambda: tuple(r for r in outside if store.check([_want_key(r)])), 5.0, "join requests"
    )


def grow(
    state: State,
    *,
    deadline: Duration = 30.0,
    progress: int | None = None,
    tag: str = "",
    join_window: Duration | None = None,
    wait: Duration = 0.0,
) -> Membership:
    """Admits the processes waiting in `join` (if any) and sends them `state`
    (`distir.grow`).

    Every member calls it at the same point of its loop, with the same
    `state` (tensors, e.g. parameters and optimizer state, written in place
    on joiners; or a `ShardedState`, split across the members: every member
    then moves to its shard of the new membership by `dist.transfer`s, and
    a member whose shard does not fit the current layout is named on every
    member and to the joiners that asked, before anything is decided; so
    are members whose states differ). Returns the current membership when
    nobody waits (after one small all-reduce), else the next one, the same on every member and
    joiner: `joined` names the new ranks and `completed` the position they
    start from (this rank's runs, or `progress` as in `recover`). A failure
    raises as `recover` does; the caller then recovers. `deadline`,
    `progress` and `join_window` mean what they mean for `recover`; `tag`
    is the application's name for its state (a joiner with another tag is
    refused, as one with other shapes or dtypes).

    `wait` (seconds) pauses until a joiner asks, for a loop that waits for
    its replacement: the members look and agree (one small all-reduce) every
    few milliseconds, and all stop together, at the first look in which any
    of them saw a request (admitted or refused), or once the wait of any of
    them is over; `deadline` counts from there. A pause on
    `join_requests()` instead can leave members apart: a joiner refused by
    the first member to look withdraws before a later one sees it.

        try:
            train_step(m)
            step += 1
            grown = distir.grow(state, progress=step)
            if grown.epoch != m.epoch:  # someone joined: a new group
                m = grown
        except distir.errors.DistirError:
            m = distir.recover(progress=step)
            step = m.completed
    """
    tensors = _check_state(state, "grow")
    deadline_s = seconds(deadline, "deadline")
    end = time.monotonic() + deadline_s
    window = (
        protocol.JOIN_WINDOW_SHARE * deadline_s
        if join_window is None
        else seconds(join_window, "join_window")
    )
    current = membership()
    position = protocol._position(current, progress)
    digest = state_digest(tensors, tag)
    store = default_store()
    world = dist.get_world_size()
    outside = [r for r in range(world) if r not in current.ranks]
    global _world_published
    if not _world_published:
        protocol._bounded(
            lambda: store.set(_WORLD_KEY, str(world)),
            max(0.5, end - time.monotonic()),
            "publishing the world size",
        )
        _world_published = True

    def look() -> list[int]:
        seen = [0] * world
        for r in outside:
            wanted_bytes = read_key(store, _want_key(r))
            if wanted_bytes is not None:
                wanted = wanted_bytes.decode()
                if wanted == digest:
                    seen[r] = 1
                else:
                    seen[r] = 2
                    store.set(
                        _refused_key(r),
                        f"its state (shapes, dtypes and tag: digest {wanted}) is not the "
                        f"members' (digest {digest}); start it with the same model, "
                        "optimizer and tag",
                    )
        return seen

    from distir.runtime.eager import all_reduce

    # Riding on the same all-reduce: whether some member's shards do not fit
    # the current layout (rank * tensors + tensor + 1, the largest wins), and
    # the members' digests (MAX of d and of -d: the largest and the least),
    # so that every member finds a misfit or a disagreement in the same round.
    me = dist.get_rank()
    bad = misfit(tensors, current, me) if isinstance(tensors, ShardedState) else None
    width = len(tensors.layout) if isinstance(tensors, ShardedState) else 1
    problem = 0 if bad is None else me * width + bad[0] + 1
    mine = int(digest[:15], 16)
    waited = time.monotonic() + (seconds(wait, "wait") if wait else 0.0)
    while True:
        seen = protocol._bounded(look, max(0.5, end - time.monotonic()), "reading join requests")
        # Then whether this member's wait is over. The members stop on the
        # agreed row, so all in the same round.
        over = int(time.monotonic() >= waited)
        agreed = all_reduce(
            torch.tensor([*seen, over, problem, mine, -mine], dtype=torch.int64),
            "max",
            group=current.group,
            deadline=deadline_s,
        )
        if int(agreed[world]) or any(int(v) for v in agreed[:world]):
            break
        time.sleep(_POLL_S)
    worst, high, low = (int(v) for v in agreed[world + 1 :])
    if worst or high != -low:
        if worst:
            rank, index = divmod(worst - 1, width)
            assert isinstance(tensors, ShardedState)
            reason = misfit_reason(tensors, current, rank, index)
        else:
            reason = (
                f"the members (ranks {list(current.ranks)}) hold states with different "
                "shapes, dtypes, layouts or tags; nothing moved"
            )
        # Every member writes the same answer to the joiners that asked.
        protocol._bounded(
            lambda: [store.set(_refused_key(r), reason) for r in outside if int(agreed[r]) == 1],
            max(0.5, end - time.monotonic()),
            "refusing join requests",
        )
        here = "" if bad is None else f" (rank {me} holds {bad[1]})"
        raise DistirError(f"grow: {reason}{here}")
    end = max(end, time.monotonic() + deadline_s)
    admit = tuple(r for r in range(world) if int(agreed[r]) == 1)
    if not admit:
        return current
    new = protocol.agree(current, position, end, window, "grow", admit)
    # Answered: the admitted that made it into the group. A request of one
    # that did not stays: its replacement may already have written its own
    # under the same key (deleting it lost the replacement), so a joiner that
    # died while joining is tried again at the next grow.
    protocol._bounded(
        lambda: [store.delete_key(_want_key(r)) for r in new.joined],
        max(0.5, end - time.monotonic()),
        "clearing join requests",
    )
    _hand_over(new, tensors, deadline=max(1.0, end - time.monotonic()))
    return new


def join(
    state: State,
    *,
    deadline: Duration = 60.0,
    tag: str = "",
    join_window: Duration | None = None,
) -> Membership:
    """Asks the running job to admit this process, and receives `state`
    (`distir.join`).

    Call it instead of the members' first steps, on a rank that is not a
    member (a replacement `launch(..., replace=True)` starts, with
    `RankContext.joining` set). Returns the membership that admitted it (the
    same as the members'): `completed` is the position to start from, and
    `state`'s tensors hold a member's values (a `ShardedState`: its
    `shards` hold this rank's shards of the new membership). Raises
    `JoinRefused` when the members' state differs (shapes, dtypes or `tag`)
    or this process's world size is not the job's (a job grows back to its
    world, never past it), `JoinFailed` when not admitted within
    `deadline`, and as `recover` does when forming fails.

        def worker(ctx):                  # launch(worker, 4, tolerate=1, replace=True)
            state = make_state()          # the same shapes and dtypes as the members'
            m = distir.join(state) if ctx.joining else distir.membership()
            step = m.completed
            ...
    """
    tensors = _check_state(state, "join")
    deadline_s = seconds(deadline, "deadline")
    end = time.monotonic() + deadline_s
    window = (
        protocol.JOIN_WINDOW_SHARE * deadline_s
        if join_window is None
        else seconds(join_window, "join_window")
    )
    me = dist.get_rank()
    store = default_store()
    digest = state_digest(tensors, tag)
    admitted = protocol.admitted_key(me)

    def ask() -> None:
        for key in (admitted, _refused_key(me)):  # an earlier process's answers
            store.delete_key(key)
        store.set(_want_key(me), digest)

    # The program that hands the state over, compiled before asking (the
    # members wait for the joiner once it is admitted).
    if isinstance(tensors, ShardedState):
        prepare(tuple(tensors.layout.values()), dist.get_world_size(), me, whole=False)
    elif tensors:
        prepare(_whole(tensors)[1], dist.get_world_size(), me, whole=True)
    protocol._bounded(ask, max(0.5, end - time.monotonic()), "join: asking")

    world = dist.get_world_size()

    def answer() -> tuple[str, bytes, int] | None:
        refused = read_key(store, _refused_key(me))
        if refused is not None:
            return "refused", refused, 0
        theirs = read_key(store, _WORLD_KEY)
        if theirs is not None and int(theirs) != world:
            return "refused", _other_world(me, world, int(theirs)).encode(), 0
        epoch = read_key(store, admitted)
        if epoch is not None:
            decision = read_key(store, decision_key(int(epoch)))
            if decision is not None:  # set before `admitted` names it
                return "admitted", decision, int(epoch)
        return None

    while True:
        got = protocol._bounded(answer, max(0.5, end - time.monotonic()), "join: waiting")
        if got is not None:
            break
        if time.monotonic() >= end:
            _withdraw(store, me)
            raise JoinFailed(
                f"join: rank {me} was not admitted within {deadline_s:g} s (the members "
                "call distir.grow at a point of their loop; none did, or none is left)"
            )
        time.sleep(_POLL_S)
    kind, value, epoch = got
    if kind == "refused":
        _withdraw(store, me)
        raise JoinRefused(f"join: the members refused rank {me}: {value.decode()}")
    members = parse_members(value)
    _, completed, joined = parse_outcome(value)
    before = tuple(r for r in members if r not in joined)
    if protocol._job_store is not None:  # this rank is back: no longer gone
        gone = protocol.GONE_KEY.format(rank=me)
        protocol._bounded(lambda: protocol._job_store.delete_key(gone), 2.0, "join: returning")
    previous = Membership(epoch - 1, before, None, 0, (), completed)
    position = f"{value.decode().split('|')[1]}:{completed}"
    new = protocol.agree(previous, position, end, window, "join", decision=value)
    _withdraw(store, me)
    _hand_over(new, tensors, deadline=max(1.0, end - time.monotonic()))
    return new


def _hand_over(m: Membership, state: list[torch.Tensor] | ShardedState, deadline: float) -> None:
    if isinstance(state, ShardedState):
        hand_over(state, m, deadline=deadline)
    else:
        share_state(m, state, deadline=deadline)


def _other_world(me: int, world: int, theirs: int) -> str:
    return (
        f"this process is rank {me} of a world of {world} ranks, the running job's world "
        f"has {theirs}: a job grows back to the ranks of the world it started with, never "
        "past it (the members look for joiners among the ranks of their own world only: "
        "docs/training/elastic.md, Limits); "
        f"start the replacement as a rank of range({theirs}) that is not a member"
    )


def _withdraw(store: Any, me: int) -> None:
    try:
        call_bounded(lambda: store.delete_key(_want_key(me)), 1.0, "join: withdrawing")
    except Exception:  # the store is gone: nothing to withdraw from
        pass


def _whole(state: Sequence[torch.Tensor]) -> tuple[list[torch.dtype], list[Shard]]:
    """The dtypes of `state` in a fixed order, and per dtype the flat tensor
    its tensors travel in, held whole."""
    dtypes = sorted({t.dtype for t in state}, key=str)
    sizes = [sum(t.numel() for t in state if t.dtype == d) for d in dtypes]
    return dtypes, [Shard((n,), d, None) for d, n in zip(dtypes, sizes)]


def share_state(m: Membership, state: Sequence[torch.Tensor], *, deadline: float = 30.0) -> None:
    """The members `m` admitted get the state of the members that were
    there before: per dtype, the flattened tensors travel by one
    `dist.transfer` (of one distir program) from the old members, where the
    tensor is held whole, to the joiners only, who read it from one member
    each (two joiners from two different members, where there are two),
    and write it back in place. Does nothing when `m` admitted nobody."""
    if not m.joined:
        return
    dtypes, specs = _whole(state)
    joiners = tuple(i for i, r in enumerate(m.ranks) if r in m.joined)
    mine = m.rank not in joiners
    flats = [
        torch.cat([t.detach().reshape(-1) for t in state if t.dtype == d]) if mine else None
        for d in dtypes
    ]
    got = transfer(specs, flats, m, joiners, deadline=deadline)
    if mine:
        return
    with torch.no_grad():
        for d, flat in zip(dtypes, got):
            offset = 0
            for t in state:
                if t.dtype == d:
                    t.copy_(flat[offset : offset + t.numel()].view_as(t))
                    offset += t.numel()
