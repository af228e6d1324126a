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

Recovery is explicit: a new process group gets a fresh domain, and
`reset_domain(group)` clears one after the ranks have agreed to go on.
"""

from __future__ import annotations

import threading
from typing import Any

from distir.errors import DistirError, Poisoned

_STORE_PREFIX = "distir/poison/"


class ExecutionDomain:
    """The failure state of one process group."""

    def __init__(self, key: str, rank: int, store: Any = None):
        self.key = key
        self.rank = rank
        self.store = store
        self.first_failure: str | None = None
        self._lock = threading.Lock()

    def check(self, what: str) -> None:
        """Raises `Poisoned` if this domain failed before."""
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
        message = f"{type(error).__name__}: {error}"
        with self._lock:
            if self.first_failure is not None:
                return
            self.first_failure = message
        if self.store is not None:
            try:
                self.store.set(_STORE_PREFIX + self.key, f"rank {self.rank}: {message}")
            except Exception:  # the store may be the thing that broke
                pass

    def published_failure(self) -> str | None:
        """The failure another rank published, if any (reads the store: for
        failure paths only)."""
        if self.store is None:
            return None
        key = _STORE_PREFIX + self.key
        try:
            if not self.store.check([key]):
                return None
            return self.store.get(key).decode(errors="replace")
        except Exception:  # the store itself is gone: the job is broken
            return None


_domains: dict[Any, ExecutionDomain] = {}
_domains_lock = threading.Lock()


def _group_key(group: Any) -> str:
    import torch.distributed as dist

    if group is None:
        return "world"
    ranks = dist.get_process_group_ranks(group)
    # group_name is the same on every rank and new for every new group.
    name = getattr(group, "group_name", "")
    return "ranks-" + "-".join(str(r) for r in ranks) + (f"@{name}" if name else "")


def _default_store() -> Any:
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:
        return None


def domain_for(group: Any = None) -> ExecutionDomain:
    """The domain shared by every program running on `group` (None: world)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise DistirError("torch.distributed is not initialised")
    # Keyed by the group object: a new group (after a failure) is a new domain.
    ident = ("world", id(dist.group.WORLD)) if group is None else ("group", id(group))
    with _domains_lock:
        domain = _domains.get(ident)
        if domain is None:
            domain = ExecutionDomain(_group_key(group), dist.get_rank(), _default_store())
            _domains[ident] = domain
        return domain


def reset_domain(group: Any = None) -> None:
    """Forgets a domain's failure (locally and in the store). Call it on
    every rank, after the ranks agreed to go on (e.g. after a barrier), and
    only when no rank is still inside a collective of the failed run."""
    domain = domain_for(group)
    with domain._lock:
        domain.first_failure = None
    if domain.store is not None:
        try:
            domain.store.delete_key(_STORE_PREFIX + domain.key)
        except Exception:
            pass
