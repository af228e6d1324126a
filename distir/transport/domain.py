"""Execution domains: the first failure on a process group stops the rest.

Every program that runs on one process group shares that group's domain.
When anything fails during a run on a rank — a collective's deadline, a peer
that exited, a rejected input, a local op that raised, group creation — the
runtime *poisons* the domain before the error propagates: every later run and
collective in it raises `Poisoned` at once, citing the first failure, instead
of entering a backend whose peers may be somewhere else in the program. A
poisoned rank never enters another collective on the domain, so no exchange
of one rank can be matched with another rank's different exchange.

A rank that poisons its domain also publishes the reason in the group's
rendezvous store. Nothing reads the store on the hot path: a peer waiting in
a collective that the failed rank will never enter stops at its deadline, and
only then reads the published reason, to say which rank failed and why.

A domain belongs to one process group object and dies with it: domains
are held by a weak reference to the group (never by its address, which a
later group may reuse), so a new group always starts clean.

Every read of the store here is bounded (`call_bounded`): the store may live
in a rank that is frozen, and a failure path must never wait longer than the
deadline it reports.

Recovery: when the failure was a local refusal before any exchange (a
rejected input, a mismatch every rank saw), the group still works and
`reset_domain(group)` clears the flag once the ranks agree to go on. When the
backend failed (a deadline, a lost peer), the group's connections are closed
and no reset can revive it: the survivors call `distir.recover()`
(`distir.runtime.recovery`), which agrees on who is left and forms a new
group.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from torch.distributed import distributed_c10d as c10d

from distir.errors import CollectiveFailed, DeadlineExceeded, DistirError, Poisoned

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup, Store

_STORE_PREFIX = "distir/poison/"

#: seconds a failure path may spend reading the store
STORE_READ_BOUND_S = 0.75

#: seconds a failing rank may spend publishing its failure (best effort)
STORE_PUBLISH_BOUND_S = 0.25

T = TypeVar("T")


class StoreUnavailable(DistirError):
    """A bounded store or group operation did not answer in time."""


def call_bounded(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """`fn()`, or `StoreUnavailable` after `timeout_s` seconds.

    The call runs in a daemon thread: a store client blocked on a frozen
    server cannot be interrupted, so a call that does not return is left
    behind (it holds one thread until the server answers or the process
    ends) and the caller goes on."""
    box: list[tuple[bool, object]] = []

    def target() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:  # handed to the caller
            box.append((False, e))

    thread = threading.Thread(target=target, name=f"distir-bounded: {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not box:
        raise StoreUnavailable(f"{what}: no answer within {timeout_s:g} s")
    ok, value = box.pop()
    if not ok:
        # Without the `del`, the error's traceback holds this frame, which
        # holds the error: a cycle that keeps everything the failed call's
        # frames refer to (a half-made process group: its threads and
        # sockets) until the next garbage collection.
        try:
            raise value
        finally:
            del value
    return value


class ExecutionDomain:
    """The failure state of one process group."""

    def __init__(self, key: str, rank: int, store: Store | None = None):
        self.key = key
        self.rank = rank
        self.store = store
        #: None while the domain is healthy: every failure sets it first (a
        #: run's one check before it starts reads only this)
        self.first_failure: str | None = None
        #: whether the backend failed (the group's connections are gone)
        self.broken = False
        #: the first failure, when it must be raised again as itself (a
        #: fenced rank keeps hearing that it was excluded)
        self.sticky: DistirError | None = None
        #: runs that completed on this rank (`distir.recover` agrees on the
        #: position to resume from with it; one run at a time per domain)
        self.completed = 0
        self._lock = threading.Lock()

    def check(self, what: str) -> None:
        """Raises `Poisoned` if this domain failed before."""
        if self.sticky is not None:
            raise self.sticky
        if self.first_failure is not None:
            raise Poisoned(
                f"{what}: not started, the execution domain of group {self.key} failed "
                f"earlier: {self.first_failure}",
                self.first_failure,
            )

    def poison(self, error: BaseException) -> None:
        """Marks the domain failed, here and (best effort) for every rank."""
        if isinstance(error, Poisoned):
            return  # the domain already failed; that failure is the one to cite
        from distir.errors import Excluded

        message = f"{type(error).__name__}: {error}"
        with self._lock:
            if self.first_failure is not None:
                return
            self.first_failure = message
            self.broken = isinstance(error, (DeadlineExceeded, CollectiveFailed, Excluded))
            if isinstance(error, Excluded):
                self.sticky = error
        store = self.store
        if store is not None:
            try:
                call_bounded(
                    lambda: store.set(_STORE_PREFIX + self.key, f"rank {self.rank}: {message}"),
                    STORE_PUBLISH_BOUND_S,
                    "publishing a failure",
                )
            except Exception:  # the store may be the thing that broke
                pass

    def published_failure(self) -> str | None:
        """The failure another rank published, if any (reads the store: for
        failure paths only)."""
        return self.failure_evidence()[0]

    def failure_evidence(self) -> tuple[str | None, DistirError | None]:
        """What the store says after a failure, in one bounded read: the
        failure another rank published, and `Excluded` if the survivors
        moved on without this rank (`distir.runtime.membership`)."""
        store = self.store
        if store is None:
            return None, None
        key = _STORE_PREFIX + self.key

        def read() -> tuple[str | None, DistirError | None]:
            from distir.transport.epochs import exclusion, read_key

            published = read_key(store, key)
            if published is None:
                return None, exclusion()
            return published.decode(errors="replace"), exclusion()

        try:
            return call_bounded(read, STORE_READ_BOUND_S, "reading a published failure")
        except Exception:  # the store is gone or frozen: nothing more to say
            return None, None


#: process group object -> its domain; weak, so that a domain dies with its
#: group and a later group at the same address gets a new one
_domains: weakref.WeakKeyDictionary[ProcessGroup, ExecutionDomain] = weakref.WeakKeyDictionary()
_domains_lock = threading.Lock()


def _group_key(group: ProcessGroup | None) -> str:
    import torch.distributed as dist

    if group is None:
        return "world"
    ranks = dist.get_process_group_ranks(group)
    # group_name is the same on every rank and new for every new group.
    name = getattr(group, "group_name", "")
    return "ranks-" + "-".join(str(r) for r in ranks) + (f"@{name}" if name else "")


def _default_store() -> Store | None:
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:
        return None


def domain_for(group: ProcessGroup | None = None) -> ExecutionDomain:
    """The domain shared by every program running on `group` (None: world)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise DistirError("torch.distributed is not initialised")
    # Keyed by the group object itself: a new group (after a failure, or one
    # reusing a destroyed group's address) is a new domain.
    pg = resolve_group(group)
    with _domains_lock:
        domain = _domains.get(pg)
        if domain is None:
            domain = ExecutionDomain(_group_key(group), dist.get_rank(), _default_store())
            _domains[pg] = domain
        return domain


def resolve_group(group: ProcessGroup | None) -> ProcessGroup:
    """The process group object `group` names (None: the default group)."""
    if group is not None:
        return group
    return c10d._get_default_group()


def group_alive(pg: ProcessGroup) -> bool:
    """Whether a process group object is still registered (not destroyed)."""
    return pg in c10d._world.pg_map


def reset_domain(group: ProcessGroup | None = None) -> None:
    """Forgets a domain's failure (locally and in the store), for a failure
    that left the group working: a rejected input or a mismatch that every
    rank saw before any payload moved. Call it on every rank, after the
    ranks agreed to go on (e.g. after a barrier).

    After a backend failure (a deadline, a lost peer) the group's
    connections are closed and cannot be revived: this raises
    `DistirError` and the survivors call `distir.recover()` instead."""
    domain = domain_for(group)
    with domain._lock:
        if domain.broken:
            raise DistirError(
                f"reset_domain: group {domain.key} cannot run collectives again (its "
                f"backend failed: {domain.first_failure}); the survivors call "
                "distir.recover() to agree on who is left and form a new group"
            )
        domain.first_failure = None
    store = domain.store
    if store is not None:
        try:
            call_bounded(
                lambda: store.delete_key(_STORE_PREFIX + domain.key),
                STORE_READ_BOUND_S,
                "clearing a published failure",
            )
        except Exception:
            pass
