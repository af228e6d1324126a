"""Two rules the rest of the suite could not tell apart from their mutants:

- every attempt of a run advances the run position on its domain, refused
  ones included: a rank whose run was refused locally (without poisoning,
  as `ConcurrentRun`) is one run ahead of its peers, and its next run must
  be `ProgramMismatch` on every rank, never paired with a peer's other run
  (a mutant where every run is "run 0" paired them silently);
- a peer that closes its connection just before our deadline (it gave up
  at its own) is `DeadlineExceeded`, not a lost peer.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

import distir
from distir.errors import CollectiveFailed, ConcurrentRun, DeadlineExceeded, DistirError
from distir.runtime.launch import launch
from distir.transport.groups import ProcessGroupResource

T = "tensor<4xf32>"
SUM = f"func.func @main(%x: {T}) -> {T} {{\n  %y = dist.all_reduce sum %x : {T}\n  func.return %y : {T}\n}}"


def one_rank_refused_once(ctx) -> dict:
    program = distir.compile(SUM, deadline=15)
    x = torch.ones(4)
    out: dict = {}
    if ctx.rank == 0:
        first = program.run_async(x)  # waits in its agreement for rank 1
        refused: list = []

        def other() -> None:
            try:
                program.run(x)
                refused.append("ran")
            except ConcurrentRun as e:
                refused.append(type(e).__name__)

        t = threading.Thread(target=other, name="other")
        t.start()
        t.join(10)
        out["other thread"] = refused
        out["first"] = first.wait().tolist()
    else:
        time.sleep(2.0)  # rank 0's run is in flight meanwhile
        out["first"] = program.run(x).tolist()
    try:
        program.run(x)
        out["next"] = "ran"
    except DistirError as e:
        out["next"] = f"{type(e).__name__}: {e}"
    return out


@pytest.mark.multirank
@pytest.mark.timeout(90)
def test_a_run_refused_on_one_rank_leaves_it_a_run_ahead_and_the_next_run_is_named():
    reports = launch(one_rank_refused_once, 2, pass_context=True, timeout=60)
    assert reports[0]["other thread"] == ["ConcurrentRun"]
    assert reports[0]["first"] == reports[1]["first"] == [2.0] * 4
    for rank in (0, 1):
        assert reports[rank]["next"].startswith("ProgramMismatch"), reports[rank]
        assert "run 2" in reports[rank]["next"] and "run 1" in reports[rank]["next"]


def _resource() -> SimpleNamespace:
    """What `ProcessGroupResource.failure` reads of its group."""
    return SimpleNamespace(
        domain=SimpleNamespace(failure_evidence=lambda: ("", None)),
        name="world",
        rank=0,
        size=2,
        backend="gloo",
        deadline_for=lambda invocation: 10.0,
    )


@pytest.mark.parametrize(
    ("waited", "expected"),
    [(9.6, DeadlineExceeded), (9.99, DeadlineExceeded), (1.0, CollectiveFailed), (9.0, CollectiveFailed)],
)
def test_a_peer_closing_just_before_our_deadline_is_deadline_exceeded(waited, expected):
    invocation = SimpleNamespace(description="'dist.all_reduce' at x.mlir:2:3")
    error = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4321")
    named = ProcessGroupResource.failure(_resource(), error, invocation, waited)
    assert type(named) is expected, named
    assert "'dist.all_reduce' at x.mlir:2:3" in str(named)
