"""Where to resume (issue 39): `recover` tells every survivor, identically,
how many positions completed on every member.

A rank is killed at a drawn point of a run (before it starts, inside its
all-reduce, right after it returned). Each survivor counts for itself the
runs that returned the right sum (the test's own count, no distir state);
the answer every survivor gets must be the least of those counts, the same
on all of them, and the loop resumed from it must compute the sums a plain
torch oracle gives for the survivors.
"""

from __future__ import annotations

import os
import random
import signal
import threading

import pytest
import torch

import distir
from distir.errors import DistirError, RecoveryFailed
from distir.runtime.launch import launch

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(120)]

DEADLINE_S = 2.0
RECOVER_S = 8.0
ROUNDS = 12

#: 8 MiB of int64: long enough that a kill lands inside the exchange
ELEMENTS = 1024 * 1024

PROGRAM = f"""
func.func @main(%x: tensor<{ELEMENTS}xi64>) -> tensor<{ELEMENTS}xi64> {{
  %y = dist.all_reduce sum %x : tensor<{ELEMENTS}xi64>
  func.return %y : tensor<{ELEMENTS}xi64>
}}
"""


def contribution(rank: int, position: int) -> int:
    return 1000 * position + rank + 1


def loop(ctx, victim: int, killed_at: int, point: str, steps: bool) -> dict:
    program = distir.compile(PROGRAM, deadline=DEADLINE_S)
    m = distir.membership()
    done = 0  # positions this rank completed, counted here and not by distir
    seen: dict = {"resumed": []}
    while done < ROUNDS:
        if ctx.rank == victim and done == killed_at:
            if point == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            if point == "inside":
                threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGKILL)).start()
        x = torch.full((ELEMENTS,), contribution(ctx.rank, done), dtype=torch.int64)
        try:
            y = program.run(x, group=m.group)
        except DistirError:
            seen["own count at failure"] = done
            m = distir.recover(deadline=RECOVER_S, progress=done if steps else None)
            seen["resumed"].append((m.epoch, m.ranks, m.completed))
            done = m.completed
            continue
        expected = sum(contribution(r, done) for r in m.ranks)
        assert bool((y == expected).all()), f"position {done}: wrong sum"
        done += 1
        if ctx.rank == victim and done - 1 == killed_at and point == "after":
            os.kill(os.getpid(), signal.SIGKILL)
    seen["finished"] = done
    return seen


#: (victim, position of the kill, where in the run): every point, rank 0
#: among the victims, positions drawn once with a fixed seed
CASES = [
    (victim, random.Random(39 + i).randrange(1, ROUNDS - 2), point, steps)
    for i, (victim, point, steps) in enumerate(
        [
            (2, "before", False),
            (0, "inside", False),
            (3, "after", False),
            (1, "inside", True),
            (0, "after", True),
        ]
    )
]


@pytest.mark.parametrize(("victim", "killed_at", "point", "steps"), CASES)
def test_every_survivor_resumes_from_the_same_right_position(
    victim: int, killed_at: int, point: str, steps: bool
) -> None:
    outcome = launch(
        loop, 4, victim, killed_at, point, steps, pass_context=True, tolerate=1, timeout=100
    )
    assert set(outcome.lost) == {victim}
    survivors = tuple(r for r in range(4) if r != victim)
    own = {r: outcome.results[r]["own count at failure"] for r in survivors}
    # The least of what the survivors completed, the same everywhere.
    agreed = min(own.values())
    for r in survivors:
        assert outcome.results[r]["resumed"] == [(1, survivors, agreed)], (r, own, outcome)
        assert outcome.results[r]["finished"] == ROUNDS
    # The victim completed `killed_at` positions (plus the one it left
    # after, or maybe the one it was killed in): the survivors are at most
    # one position apart and never behind the victim's last full position.
    assert killed_at <= agreed <= killed_at + 1, (own, killed_at)
    assert max(own.values()) - agreed <= 1, own
    if point == "before":  # no survivor can complete a run the victim never entered
        assert agreed == killed_at


def mixed(ctx) -> str:
    try:
        distir.recover(deadline=RECOVER_S, progress=3 if ctx.rank == 0 else None)
    except RecoveryFailed as e:
        return str(e)
    return "no error"


def test_ranks_that_count_different_positions_get_a_named_error() -> None:
    for message in launch(mixed, 2, pass_context=True, timeout=60):
        assert "some passed progress= and some did not" in message, message


def bad_progress(ctx) -> str:
    try:
        distir.recover(deadline=RECOVER_S, progress=-1)
    except DistirError as e:
        return str(e)
    return "no error"


def test_a_negative_progress_is_refused() -> None:
    for message in launch(bad_progress, 2, pass_context=True, timeout=60):
        assert "progress must be a count of completed steps" in message, message
