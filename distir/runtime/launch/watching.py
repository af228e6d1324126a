"""Watching the ranks: signals sent to the launcher recorded and forwarded,
every rank stopped within a bound, a lost rank's cause told to the survivors,
and a lost rank replaced.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_any
from typing import Any

#: signals forwarded to the ranks
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: seconds ranks get to exit after a forwarded signal, before SIGKILL
_SIGNAL_GRACE_S = 1.0


class SignalRecorder:
    """While active, SIGINT and SIGTERM are recorded instead of acted on
    (main thread only: Python delivers signals there). Signals the caller
    ignores stay ignored."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _record(self, signum: int, frame: object) -> None:
        if self.received is None:
            self.received = signum

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in FORWARDED_SIGNALS:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN or previous is None:
                continue  # ignored, or handled outside Python: leave it be
            self._previous[signum] = previous
            signal.signal(signum, self._record)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


@contextmanager
def signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held back from this thread (and from the processes
    it starts, which inherit the mask) until the block ends."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _running(procs: Sequence[Any]) -> list[Any]:
    """The started processes that have not exited."""
    return [p for p in procs if p.pid is not None and p.exitcode is None]


def wait_all(procs: Sequence[Any], until: float) -> None:
    """Waits for every process at once, until they all exited or `until`."""
    alive = _running(procs)
    while alive:
        left = until - time.monotonic()
        if left <= 0:
            return
        wait_for_any([p.sentinel for p in alive], timeout=left)
        alive = _running(alive)


def stop_ranks(procs: Sequence[Any], signum: int | None) -> set[int]:
    """Ends every rank still running: `signum` first (if any) and SIGKILL
    after a grace; returns the indices of the ranks that had to be stopped."""
    running = {i for i, p in enumerate(procs) if p in _running(procs)}
    if signum is not None:
        for i in running:
            try:
                os.kill(procs[i].pid, signum)
            except ProcessLookupError:
                pass
        wait_all(procs, time.monotonic() + _SIGNAL_GRACE_S)
    for p in _running(procs):
        p.kill()
    wait_all(procs, time.monotonic() + 2.0)
    return running


def exit_cause(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exited with code {code}"


def report_gone(store: Any, rank: int, proc: Any, outcome: tuple[bool, Any] | None) -> None:
    """Tells the survivors (`distir.recover`) that `rank` will never join."""
    from distir.runtime.membership import GONE_KEY

    if outcome is None:
        proc.join(0.5)  # its pipe closed: it is exiting
        cause = f"{exit_cause(proc.exitcode)} without a result"
    else:
        cause = "finished" if outcome[0] else str(outcome[1]).splitlines()[-1]
    try:
        store.set(GONE_KEY.format(rank=rank), cause)
    except Exception:  # the launcher's own store: only at shutdown
        pass


def replace_rank(
    rank: int,
    start: Callable[..., None],
    by_rank: dict[int, Any],
    outcomes: dict[int, tuple[bool, Any]],
    exited_without_result: set[int],
    replaced: dict[int, list[str]],
) -> Connection:
    """Starts a new process for lost `rank`, joining the running job;
    returns the reading end of its report pipe. The lost process's cause
    moves to `replaced`."""
    if rank in exited_without_result:
        exited_without_result.discard(rank)
        cause = f"{exit_cause(by_rank[rank].exitcode)} without a result"
    else:
        cause = str(outcomes.pop(rank)[1]).splitlines()[-1]
    replaced.setdefault(rank, []).append(cause)
    reader, writer = mp.Pipe(duplex=False)
    with signals_blocked():
        start(rank, writer, True)
    writer.close()
    return reader
