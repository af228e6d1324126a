"""The run gate under contention, in one process (no process group).

These tests drive a gate (`distir.runtime.concurrency.RunGate`) from
several threads at once, synchronous runs, queued runs, runs handed to
the backend (`claim_direct`, ended on a backend thread) and runs from a
future's callback mixed, with a tiny switch interval so that threads
interleave between bytecodes, and check its contract: never two threads'
runs in flight at once, every attempt counted once, a refused thread told
so (`ConcurrentRun`, never let in) — a callback's run included, which is
claimed as its submitter and refused like it while another thread's runs
are in flight — and the gate free again at the end.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from typing import Any

import pytest
import torch

from distir.errors import ConcurrentRun
from distir.runtime.concurrency import RunGate

pytestmark = pytest.mark.timeout(120)


class _Runs:
    """Which threads' runs are executing now (the invariant's witness)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owners: dict[str, int] = {}
        self.violations: list[str] = []
        self.ran = 0
        self.direct = 0  # runs handed to the backend

    def start(self, owner: str) -> None:
        with self.lock:
            others = [name for name, n in self.owners.items() if n and name != owner]
            if others:
                self.violations.append(f"{owner} ran beside {others}")
            self.owners[owner] = self.owners.get(owner, 0) + 1

    def end(self, owner: str) -> None:
        with self.lock:
            self.owners[owner] -= 1
            self.ran += 1


def _direct(gate: RunGate, runs: _Runs, name: str, backend: Any) -> tuple[int, int]:
    """A run handed to the backend by this thread (`claim_direct`), ended by
    a backend thread (`backend`, standing for gloo's), or queued behind this
    thread's queued runs; returns (attempts, refused)."""
    try:
        who = gate.claim_direct("test")
    except ConcurrentRun:
        return 1, 1
    if who is None:  # runs are queued: behind them
        try:
            future = gate.submit("test", lambda who: _queued(runs, name, who))
        except ConcurrentRun:
            return 1, 1
    else:
        assert who.thread is threading.current_thread()
        runs.start(name)
        runs.direct += 1  # (only this thread writes it while its run is claimed)
        future = torch.futures.Future()

        def complete() -> None:
            runs.end(name)
            gate.leave()  # on another thread than the claim's
            with gate.completing_direct():
                future.set_result(who.position)

        backend.submit(complete)
    future.wait()
    return 1, 0


def _hammer(
    gate: RunGate, runs: _Runs, name: str, rounds: int, counts: dict, backend: Any
) -> None:
    """One thread's runs: synchronous ones (some nested, as a recorded run's
    inner run is), now and then a queued one with a callback that runs
    synchronously on the worker (inline), and one handed to the backend."""
    refused = attempts = 0
    for i in range(rounds):
        if i % 5 == 0:
            tried, no = _direct(gate, runs, name, backend)
            attempts += tried
            refused += no
        attempts += 1
        try:
            who = gate.enter("test")
        except ConcurrentRun:
            refused += 1
            continue
        if who is None:  # this thread's queued runs go first: wait for them
            attempts -= 1
            continue
        assert who.thread is threading.current_thread()
        runs.start(name)
        pending = None
        try:
            if i % 7 == 0:  # a nested run of the same thread
                attempts += 1
                inner = gate.enter("test")
                assert inner is not None and inner.thread is threading.current_thread()
                gate.leave()
            if i % 3 == 0:  # a run queued from inside a run: the worker's
                attempts += 1  # run ends while this one does
                pending = gate.submit("test", lambda who: _queued(runs, name, who))
        finally:
            runs.end(name)
            gate.leave()
        if pending is not None:
            pending.wait()
        if i % 11 == 0:
            attempts += 1
            try:
                future = gate.submit("test", lambda who: _queued(runs, name, who))
            except ConcurrentRun:
                refused += 1
                continue
            # the callback's run: inline on the worker, or on this thread
            # when the future was already done (not claimed while the idle
            # worker still exists: `enter` says None, its runs go first)
            chained = future.then(lambda f: _inline(gate, runs, name))
            outcome = chained.wait()
            if outcome < 0:  # refused: another thread's runs were in flight
                attempts += 1
                refused += 1
            else:
                attempts += outcome
    counts[name] = (attempts, refused)


def _queued(runs: _Runs, name: str, who) -> int:
    runs.start(name)
    runs.end(name)
    return who.position


def _inline(gate: RunGate, runs: _Runs, name: str) -> int:
    try:
        who = gate.enter("test")
    except ConcurrentRun:
        return -1
    if who is None:
        assert threading.current_thread().name == name
        return 0
    assert who.thread.name == name  # paired as its submitter
    runs.start(name)
    runs.end(name)
    gate.leave()
    return 1


@pytest.mark.parametrize("threads", [2, 4])
def test_gate_under_contention(threads):
    gate = RunGate("test")
    runs = _Runs()
    counts: dict[str, tuple[int, int]] = {}
    interval = sys.getswitchinterval()
    backend = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        workers = [
            threading.Thread(
                target=_hammer, args=(gate, runs, f"T{k}", 400, counts, backend), name=f"T{k}"
            )
            for k in range(threads)
        ]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join(90)
        assert not any(thread.is_alive() for thread in workers)
    finally:
        sys.setswitchinterval(interval)
        backend.shutdown(wait=True)
    assert len(counts) == threads  # no thread died on an assertion
    assert runs.violations == []
    assert runs.direct > 0
    assert sum(refused for _, refused in counts.values()) < sum(a for a, _ in counts.values())
    # Every attempt counted once (refused ones too), and the gate free again.
    assert gate._position == sum(attempts for attempts, _ in counts.values())
    assert gate._in_flight == 0 and gate._owner is None
    # Once the idle worker has gone, a fresh thread may run at once.
    for _ in range(1000):
        if gate._worker is None:
            break
        time.sleep(0.01)
    outcome: dict = {}
    later = threading.Thread(target=lambda: outcome.setdefault("who", gate.enter("test")))
    later.start()
    later.join(10)
    assert outcome["who"] is not None and outcome["who"].thread is later
    gate.leave()


def test_refused_beside_a_run_in_flight():
    """While one thread's synchronous run is in flight, another thread's run
    and submission are refused with ConcurrentRun, and after the run ends
    (its lock-free leave) the other thread runs."""
    gate = RunGate("test")
    who = gate.enter("test")
    assert who is not None
    seen: dict = {}

    def other() -> None:
        for key, attempt in (
            ("run", lambda: gate.enter("test")),
            ("submit", lambda: gate.submit("test", lambda who: None)),
        ):
            try:
                attempt()
            except ConcurrentRun as e:
                seen[key] = str(e)

    thread = threading.Thread(target=other, name="B")
    thread.start()
    thread.join(10)
    assert "thread 'B'" in seen["run"] and "thread 'MainThread'" in seen["run"]
    assert "thread 'B'" in seen["submit"]
    gate.leave()
    assert gate._in_flight == 0 and gate._owner is None
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("f", gate.submit("test", lambda who: who.position)),
        name="B",
    )
    thread.start()
    thread.join(10)
    assert result["f"].wait() == 3  # positions 0 (ours), 1 and 2 (refused), 3
    assert isinstance(result["f"], torch.futures.Future)
