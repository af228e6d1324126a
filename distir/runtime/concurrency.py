"""The thread model: one run per execution domain at a time, paired by thread.

Two threads of one rank that ran programs on the same process group at the
same time would interleave their exchanges: a run of one thread could be
matched with a run of the other thread on a peer, and return the sum of
different things without an error. distir rules it out in two parts.

**Serialised per domain.** Every run on a domain (one process group) goes
through the domain's `RunGate`:

- a synchronous `Program.run` executes on the calling thread; while it is in
  flight, a run or a submission from *another* thread on the same domain is
  refused with `ConcurrentRun` (a named error, the domain is not poisoned:
  nothing was exchanged);
- `Program.run_async` queues the run and returns a `torch.futures.Future`
  at once; one distir-owned worker thread per domain executes queued runs
  one at a time, in submission order, under the same agreement, deadline
  and poison rules as `run`. While runs of one thread are queued or in
  flight, another thread's submission is refused with `ConcurrentRun`; a
  synchronous run of the same thread waits for its queued runs and then
  runs after them (submission order again). A synchronous run from a
  future's callback (which runs on the worker) runs at once, inline. A
  failure completes the run's future with the named error and poisons the
  domain, so every run queued behind it completes with `Poisoned`.

**Paired by thread and position.** Serialising locally does not stop rank
0's thread A from being paired with rank 1's thread B when both run a
program compiled from the same text, nor a rank whose run was refused from
falling one run behind its peers. So the per-run agreement also covers
*which* run this is: its position in the domain's sequence of runs (every
attempt counts, refused ones included) and the name of the thread that
submitted it (`threading.current_thread().name`: "MainThread" on every
rank, and the same default name for the Nth thread a rank creates). A run
is only ever paired with the run at the same position on every peer, from
a thread of the same name, of the same program; otherwise every rank raises
`ProgramMismatch` naming what differs. Name threads the same on every rank
when they run programs (`threading.Thread(name="grads")`).

With `agreement=False` ranks do not exchange anything before a run, so the
pairing by thread is not checked: that mode trusts the caller. Positions
count from 0 on every new group; after `reset_domain` on an old one, ranks
go on in step only if they attempted the same number of runs there (else
`ProgramMismatch` at the next run, never a wrong pairing): recovering on a
new group is the way that always works.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

from distir.errors import ConcurrentRun


class RunId(NamedTuple):
    """Which run this is on its domain: the thread that submitted it and its
    position there. Formatted (`str`) only where an agreement or an error
    reads it, which a trusted run never does."""

    thread: threading.Thread
    position: int

    def __str__(self) -> str:
        return f"thread {self.thread.name!r}, run {self.position}"


class RunGate:
    """Who may run on one execution domain now, and its queue of async runs."""

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._owner: threading.Thread | None = None  # the thread whose runs are in flight
        self._in_flight = 0  # sync runs executing + async runs queued or executing
        self._queue: deque[tuple[Callable[[], Any], torch.futures.Future]] = deque()
        self._worker: threading.Thread | None = None
        self._position = 0  # attempts so far, refused ones included
        # while the worker completes a future: the thread that queued its run
        self._completing: threading.Thread | None = None
        # threads completing a direct run's future now (see `claim_direct`)
        self._completing_direct: set[threading.Thread] = set()

    def _claim(self, what: str) -> RunId:
        """Registers one more run of the calling thread (holding the lock)
        and returns what the agreement compares: thread and position."""
        me = threading.current_thread()
        # A run from a future's callback on the worker is a run of the thread
        # whose queued run completed that future: torch runs a callback on
        # the worker, or on the caller of `then` when the future is already
        # done, and which one is a race; the run must pair the same way.
        who = self._completing if me is self._worker and self._completing is not None else me
        position = self._position
        self._position += 1
        if self._completing_direct and me in self._completing_direct:
            raise ConcurrentRun(
                f"{what}: refused, a callback of a run submitted directly to the backend "
                f"of group {self.name} started a run there: it runs on a backend thread, "
                "beside the thread that submitted it, and the two would pair with peers' "
                "runs in an order that depends on timing (wait for the future instead)"
            )
        if self._in_flight and self._owner is not me and me is not self._worker:
            owner = self._owner.name if self._owner is not None else "?"
            raise ConcurrentRun(
                f"{what}: refused, thread {me.name!r} started a run on the execution "
                f"domain of group {self.name} while runs of thread {owner!r} are in "
                "flight there; one thread at a time runs programs on a process group "
                "(wait for its runs, or use a separate group per thread)"
            )
        self._owner = who
        self._in_flight += 1
        # tuple.__new__, not RunId(...): a named tuple's constructor is a
        # Python function, and this runs on every run
        return tuple.__new__(RunId, (who, position))

    def enter(self, what: str) -> RunId | None:
        """Claims a synchronous run on this thread and returns which run it
        is, or None when this thread's async runs are queued: the run then
        goes through `submit` after them (they were submitted first). A
        claimed run ends with `leave`."""
        with self._lock:
            # On the worker itself (a future's callback), run inline: the
            # worker waiting for its own queue would never return.
            if self._worker is not None and self._worker is not threading.current_thread():
                return None
            return self._claim(what)

    def claim_direct(self, what: str) -> RunId | None:
        """Claims a run that the calling thread submits to the backend
        itself and does not wait for (`distir.runtime.specialised.
        specialised_submit`), or returns None when runs are queued on the
        worker (the run then queues behind them: submission order). The
        backend executes a group's collectives in the order they were
        submitted, so a direct run pairs with peers as a queued one would.
        It ends with `leave`, on the thread that completes it; callbacks of
        its future run there, beside the submitting thread, so a run they
        start is refused (`completing_direct`)."""
        with self._lock:
            if self._worker is not None:
                return None
            return self._claim(what)

    @contextlib.contextmanager
    def completing_direct(self) -> Iterator[None]:
        """Around the completion of a direct run's future (see `claim_direct`)."""
        me = threading.current_thread()
        self._completing_direct.add(me)
        try:
            yield
        finally:
            self._completing_direct.discard(me)

    def leave(self) -> None:
        """Ends a run claimed by `enter` or `submit`."""
        with self._lock:
            self._in_flight -= 1
            if not self._in_flight:
                self._owner = None

    def submit(self, what: str, fn: Callable[[RunId], Any]) -> torch.futures.Future:
        """Queues `fn(which run)` for the domain's worker; its future
        completes with `fn`'s result or exception."""
        future: torch.futures.Future = torch.futures.Future()
        with self._lock:
            who = self._claim(what)
            self._queue.append((functools.partial(fn, who), future))
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name=f"distir-runs-{self.name}", daemon=True
                )
                self._worker.start()
        return future

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    # Exit when idle: a domain holds no thread between bursts.
                    self._worker = None
                    return
                fn, future = self._queue.popleft()
            self._completing = fn.args[0].thread  # the RunId `submit` bound
            try:
                try:
                    result = fn()
                except BaseException as e:  # noqa: BLE001 - handed to the future
                    self.leave()
                    future.set_exception(e)
                else:
                    # Release before completing: whoever waits on the future
                    # may at once run from another thread.
                    self.leave()
                    future.set_result(result)
            finally:
                self._completing = None


_gates: weakref.WeakKeyDictionary[Any, RunGate] = weakref.WeakKeyDictionary()
_gates_lock = threading.Lock()


def gate_for(domain: Any) -> RunGate:
    """The gate of an execution domain (created on first use, released with it)."""
    with _gates_lock:
        gate = _gates.get(domain)
        if gate is None:
            gate = _gates[domain] = RunGate(getattr(domain, "key", "?"))
        return gate
