"""Execution domains: the first failure on a process group stops the rest.

Every program that runs on one process group shares that group's domain.
When a collective fails — a deadline, a peer that exited, a rank that
rejected its inputs — the domain is *poisoned*: every later collective in it
raises `Poisoned` at once, citing the first failure, instead of entering a
backend whose peers may never arrive. A rank that poisons its domain also
publishes the reason in the group's rendezvous store, so ranks that did not
see the failure themselves stop at their next run instead of hanging.

Recovery is explicit: a new process group gets a fresh domain, and
`reset_domain(group)` clears one after the ranks have agreed to go on.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from distir.errors import DistirError, Poisoned

_STORE_PREFIX = "distir/poison/"


class ExecutionDomain:
    """The failure state of one process group."""

    def __init__(self, key: str, store: Any = None):
        self.key = key
        self.store = store
        self.first_failure: str | None = None
        self._lock = threading.Lock()

    @property
    def poisoned(self) -> bool:
        return self.first_failure is not None

    def check(self, what: str) -> None:
        """Raises `Poisoned` if this domain failed before."""
        if self.first_failure is not None:
            raise Poisoned(
                f"{what}: not started, the execution domain of group {self.key} failed "
                f"earlier: {self.first_failure}",
                self.first_failure,
            )

    def check_remote(self, what: str) -> None:
        """Also consults the store: did another rank poison the domain?"""
        self.check(what)
        if self.store is None:
            return
        key = _STORE_PREFIX + self.key
        try:
            if not self.store.check([key]):
                return
            reason = self.store.get(key).decode(errors="replace")
        except Exception:  # the store itself is gone: the job is broken
            return
        self.poison_local(f"another rank reported: {reason}")
        self.check(what)

    def poison(self, error: BaseException) -> None:
        """Marks the domain failed, here and (best effort) for every rank."""
        message = f"{type(error).__name__}: {error}"
        if not self.poison_local(message):
            return
        if self.store is not None:
            try:
                self.store.set(_STORE_PREFIX + self.key, message)
            except Exception:  # the store may be the thing that broke
                pass

    def poison_local(self, message: str) -> bool:
        with self._lock:
            if self.first_failure is not None:
                return False
            self.first_failure = message
            self.poisoned_at = time.time()
            return True


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
            domain = ExecutionDomain(_group_key(group), _default_store())
            _domains[ident] = domain
        return domain


def reset_domain(group: Any = None) -> None:
    """Forgets a domain's failure (locally and in the store)."""
    domain = domain_for(group)
    with domain._lock:
        domain.first_failure = None
    if domain.store is not None:
        try:
            domain.store.delete_key(_STORE_PREFIX + domain.key)
        except Exception:
            pass
