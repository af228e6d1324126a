"""Surviving a lost rank (issue 22): the survivors agree on who is left,
form a new group and go on; a rank that missed an epoch is fenced.

Each scenario starts fresh gloo ranks with `launch(..., tolerate=k)`, loses
ranks for real (SIGKILL, SIGSTOP) and checks what every survivor agreed on,
how long it took, and that the collectives of the new group equal the
reference simulator run on the survivors' inputs.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import distir
from distir.errors import DistirError, Excluded, RecoveryFailed
from distir.runtime.launch import LaunchOutcome, launch
from distir.runtime.requirements import WorldSizeError

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(120)]

#: the collectives' deadline and recovery's (longer: a survivor may wait on
#: the lost rank until its own collective deadline)
DEADLINE_S = 2.0
RECOVER_S = 8.0

#: 16 MiB of int64
BIG = 2 * 1024 * 1024

ALL_REDUCE = f"""
func.func @main(%x: tensor<{BIG}xi64>) -> tensor<{BIG}xi64> {{
  %y = dist.all_reduce sum %x : tensor<{BIG}xi64>
  func.return %y : tensor<{BIG}xi64>
}}
"""

SMALL = """
func.func @main(%x: tensor<4xi64>) -> (tensor<4xi64>, tensor<4xi64>) {
  %s = dist.all_reduce sum %x : tensor<4xi64>
  %b = dist.broadcast %x root 0 : tensor<4xi64>
  func.return %s, %b : tensor<4xi64>, tensor<4xi64>
}
"""


def gather_for(size: int) -> str:
    """An all-gather whose static result type holds `size` ranks."""
    return f"""
func.func @main(%x: tensor<2xi64>) -> tensor<{2 * size}xi64> {{
  %y = dist.all_gather %x axis 0 : tensor<2xi64> -> tensor<{2 * size}xi64>
  func.return %y : tensor<{2 * size}xi64>
}}
"""


def small_input(rank: int) -> torch.Tensor:
    return torch.arange(4, dtype=torch.int64) * 10 + rank


def _kill_self_soon(delay_s: float) -> None:
    threading.Timer(delay_s, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()


def _until_failure(program, x, group=None) -> tuple[float, str]:
    """Runs `program` until it fails; (when, the error's name)."""
    while True:
        try:
            program.run(x, group=group)
        except DistirError as e:
            return time.monotonic(), type(e).__name__


def _on_new_group(m: distir.Membership, size_before: int) -> dict:
    """What a survivor computes on the new group."""
    out: dict = {}
    s, b = distir.compile(SMALL, deadline=DEADLINE_S).run(small_input(m.rank), group=m.group)
    out["sum"], out["bcast"] = s.tolist(), b.tolist()
    x = torch.tensor([2 * m.rank, 2 * m.rank + 1])
    out["gather"] = (
        distir.compile(gather_for(m.size), deadline=DEADLINE_S).run(x, group=m.group).tolist()
    )
    try:  # compiled for the old size: refused at bind time, on every rank
        distir.compile(gather_for(size_before), deadline=DEADLINE_S).run(x, group=m.group)
        out["old gather"] = "ran"
    except WorldSizeError as e:
        out["old gather"] = str(e)
    return out


def lose_one_mid_all_reduce(ctx, victim: int) -> dict:
    program = distir.compile(ALL_REDUCE, deadline=DEADLINE_S)
    x = torch.full((BIG,), ctx.rank + 1, dtype=torch.int64)
    program.run(x)  # everyone is up and connected
    if ctx.rank == victim:
        _kill_self_soon(0.2)  # inside one of the 16 MiB all-reduces below
    failed_at, error = _until_failure(program, x)
    m = distir.recover(deadline=RECOVER_S)
    agreed_at = time.monotonic()
    y = program.run(x, group=m.group)
    first_at = time.monotonic()
    return {
        "error": error,
        "epoch": m.epoch,
        "ranks": m.ranks,
        "lost": m.lost,
        "agreed after": agreed_at - failed_at,
        "first collective after": first_at - failed_at,
        "all_reduce": (int(y[0]), bool((y == y[0]).all())),
        **_on_new_group(m, 4),
    }


def _check_survivors(outcome: LaunchOutcome, survivors: list[int]) -> None:
    expected_small = distir.compile(SMALL).simulate(
        [[small_input(r)] for r in range(len(survivors))]
    )
    gather = distir.compile(gather_for(len(survivors))).simulate(
        [[torch.tensor([2 * r, 2 * r + 1])] for r in range(len(survivors))]
    )
    for new_rank, rank in enumerate(survivors):
        got = outcome.results[rank]
        assert got["ranks"] == tuple(survivors), got
        assert got["epoch"] == 1
        assert got["agreed after"] < RECOVER_S + 2, got
        assert got["all_reduce"] == (sum(r + 1 for r in survivors), True)
        assert got["sum"] == expected_small[new_rank][0].tolist()
        assert got["bcast"] == expected_small[new_rank][1].tolist()
        assert got["gather"] == gather[new_rank].tolist()
        assert "compile it again for 3 ranks" in got["old gather"], got["old gather"]
        assert "needs 4 ranks, not 3" in got["old gather"], got["old gather"]


@pytest.mark.parametrize("victim", [2, 0])
def test_a_rank_killed_mid_all_reduce_is_left_out_and_the_others_go_on(victim: int) -> None:
    outcome = launch(lose_one_mid_all_reduce, 4, victim, pass_context=True, tolerate=1, timeout=100)
    assert isinstance(outcome, LaunchOutcome)
    assert outcome.lost == {victim: "killed by SIGKILL without a result"}
    survivors = [r for r in range(4) if r != victim]
    _check_survivors(outcome, survivors)
    for rank in survivors:
        assert outcome.results[rank]["lost"] == (victim,)


def lose_two_in_turn(ctx, victims: tuple[int, int]) -> list:
    program = distir.compile(SMALL, deadline=DEADLINE_S)
    m = distir.membership()
    seen = []
    for victim in victims:
        program.run(small_input(m.rank), group=m.group)
        if ctx.rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        _until_failure(program, small_input(m.rank), m.group)
        m = distir.recover(deadline=RECOVER_S)
        s, _ = program.run(small_input(m.rank), group=m.group)
        seen.append((m.epoch, m.ranks, m.lost, s.tolist()))
    return seen


def test_two_failures_in_turn_shrink_four_ranks_to_two() -> None:
    outcome = launch(lose_two_in_turn, 4, (3, 1), pass_context=True, tolerate=2, timeout=100)
    assert set(outcome.lost) == {1, 3}
    for rank in (0, 2):
        three, two = outcome.results[rank]
        assert three[:3] == (1, (0, 1, 2), (3,))
        assert three[3] == sum(small_input(r) for r in range(3)).tolist()
        assert two[:3] == (2, (0, 2), (1,))
        assert two[3] == sum(small_input(r) for r in range(2)).tolist()


def freeze_one(ctx, frozen: int) -> dict:
    store = dist.distributed_c10d._get_default_store()
    program = distir.compile(SMALL, deadline=DEADLINE_S)
    program.run(small_input(ctx.rank))
    if ctx.rank == frozen:
        store.set("test/frozen-pid", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
        # Woken up after the others moved on: fenced, whatever it tries.
        seen = {}
        for what, call in (
            ("run", lambda: program.run(small_input(ctx.rank))),
            ("run again", lambda: program.run(small_input(ctx.rank))),
            ("recover", lambda: distir.recover(deadline=RECOVER_S)),
        ):
            try:
                call()
                seen[what] = "no error"
            except Excluded as e:
                seen[what] = f"Excluded at epoch {e.epoch}"
            except DistirError as e:
                seen[what] = f"{type(e).__name__}: {e}"
        store.set("test/woken-tried", "1")
        return seen
    failed_at, error = _until_failure(program, small_input(ctx.rank))
    m = distir.recover(deadline=RECOVER_S)
    agreed_at = time.monotonic()
    s, b = program.run(small_input(m.rank), group=m.group)
    if m.rank == 0:
        os.kill(int(store.get("test/frozen-pid")), signal.SIGCONT)
    # The woken rank has tried everything; nothing of it reached us.
    store.wait(["test/woken-tried"], timedelta(seconds=RECOVER_S + 30))
    s2, _ = program.run(small_input(m.rank), group=m.group)
    return {
        "ranks": m.ranks,
        "agreed after": agreed_at - failed_at,
        "sums": (s.tolist(), s2.tolist()),
    }


def test_a_frozen_rank_is_fenced_when_it_wakes_up() -> None:
    outcome = launch(freeze_one, 3, 2, pass_context=True, tolerate=1, timeout=100)
    assert outcome.lost == {}
    expected = sum(small_input(r) for r in (0, 1)).tolist()
    for rank in (0, 1):
        got = outcome.results[rank]
        assert got["ranks"] == (0, 1)
        assert got["agreed after"] < RECOVER_S + 2
        assert got["sums"] == (expected, expected)
    assert outcome.results[2] == {
        "run": "Excluded at epoch 1",
        "run again": "Excluded at epoch 1",
        "recover": "Excluded at epoch 1",
    }


def die_while_recovering(ctx) -> str:
    from distir.runtime import membership

    program = distir.compile(SMALL, deadline=DEADLINE_S)
    program.run(small_input(ctx.rank))
    if ctx.rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    _until_failure(program, small_input(ctx.rank))
    start = time.monotonic()
    if ctx.rank == 1:
        # Dies right after joining the recovery, before the group is formed.
        threading.Thread(target=distir.recover, kwargs={"deadline": RECOVER_S}, daemon=True).start()
        store = dist.distributed_c10d._get_default_store()
        while not store.check([membership._join_key(1, 1)]):
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        m = distir.recover(deadline=RECOVER_S)
        outcome = f"epoch {m.epoch} ranks {m.ranks}"
        s, _ = program.run(small_input(m.rank), group=m.group)
        outcome += f" sum {s.tolist()}"
    except RecoveryFailed as e:
        outcome = f"RecoveryFailed: {e}"
    return f"{time.monotonic() - start:.2f} {outcome}"


def test_a_rank_killed_during_recovery_ends_in_one_clear_outcome() -> None:
    outcome = launch(die_while_recovering, 4, pass_context=True, tolerate=2, timeout=100)
    assert set(outcome.lost) == {1, 3}
    took_0, said_0 = outcome.results[0].split(" ", 1)
    took_2, said_2 = outcome.results[2].split(" ", 1)
    assert said_0 == said_2
    assert float(took_0) < RECOVER_S + 2 and float(took_2) < RECOVER_S + 2
    expected = sum(small_input(r) for r in (0, 1)).tolist()
    # Rank 1 joined before it died: the first round may have included it.
    assert said_0 in (
        f"epoch 1 ranks (0, 2) sum {expected}",
        f"epoch 2 ranks (0, 2) sum {expected}",
    )


def _tasks_and_fds() -> tuple[int, int]:
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def recover_many_times(ctx, times: int) -> list:
    program = distir.compile(SMALL, deadline=DEADLINE_S)
    counts = []
    for i in range(times):
        m = distir.recover(deadline=RECOVER_S)
        s, _ = program.run(small_input(m.rank), group=m.group)
        assert s.tolist() == (small_input(0) + small_input(1)).tolist()
        if i in (4, times - 1):
            counts.append((m.epoch, *_tasks_and_fds()))
    return counts


def test_fifty_recoveries_keep_threads_and_sockets_bounded() -> None:
    outcome = launch(recover_many_times, 2, 50, pass_context=True, timeout=100)
    for (epoch_5, tasks_5, fds_5), (epoch_50, tasks_50, fds_50) in outcome:
        assert (epoch_5, epoch_50) == (5, 50)
        assert tasks_50 - tasks_5 <= 3, (tasks_5, tasks_50)
        assert fds_50 - fds_5 <= 6, (fds_5, fds_50)


_DTYPES = {"i64": torch.int64, "f64": torch.float64, "i32": torch.int32}


def _generated_cases(seed: int, count: int) -> list[str]:
    """Programs whose meaning does not depend on the group size: a native
    all-reduce, a broadcast from a root every group here has, and an
    all-gather with a dynamic result type; element types and shapes drawn
    from `seed`."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        kind = rng.choice(["sum", "max", "min", "prod"])
        n, element = rng.randint(1, 5), rng.choice(sorted(_DTYPES))
        t, gathered = f"tensor<{n}x{element}>", f"tensor<?x{element}>"
        cases.append(
            f"""
func.func @main(%x: {t}) -> ({t}, {t}, {gathered}) {{
  %r = dist.all_reduce {kind} %x : {t}
  %b = dist.broadcast %x root {rng.randint(0, 1)} : {t}
  %g = dist.all_gather %x axis 0 : {t} -> {gathered}
  func.return %r, %b, %g : {t}, {t}, {gathered}
}}
"""
        )
    return cases


def _case_input(program, seed: int, case: int, rank: int) -> torch.Tensor:
    """Small integer values (exact in every element type and every order)."""
    (t,) = program.input_types
    generator = torch.Generator().manual_seed(seed * 1000 + case * 10 + rank)
    values = torch.randint(-3, 4, tuple(t.get_shape()), generator=generator)
    return values.to(_DTYPES[str(t.element_type)])


def compiled_programs_survive(ctx, seed: int, count: int, victim: int) -> list:
    programs = [distir.compile(src, deadline=DEADLINE_S) for src in _generated_cases(seed, count)]
    for i, program in enumerate(programs):  # bound and run on the three ranks first
        program.run(_case_input(program, seed, i, ctx.rank))
    if ctx.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    _until_failure(programs[0], _case_input(programs[0], seed, 0, ctx.rank))
    m = distir.recover(deadline=RECOVER_S)
    # The same compiled programs, not recompiled, on the two survivors.
    return [
        [r.tolist() for r in program.run(_case_input(program, seed, i, ctx.rank), group=m.group)]
        for i, program in enumerate(programs)
    ]


def test_compiled_programs_run_on_the_survivors_as_the_reference_says() -> None:
    seed, count, victim = 2026, 6, 1
    outcome = launch(
        compiled_programs_survive,
        3,
        seed,
        count,
        victim,
        pass_context=True,
        tolerate=1,
        timeout=100,
    )
    survivors = [0, 2]
    for i, src in enumerate(_generated_cases(seed, count)):
        program = distir.compile(src)
        reference = program.simulate(
            [[_case_input(program, seed, i, r)] for r in range(3)], lost=[victim]
        )
        for new_rank, rank in enumerate(survivors):
            got = outcome.results[rank][i]
            assert got == [r.tolist() for r in reference[new_rank]], (src, rank)


def test_the_reference_with_a_rank_dropped_is_the_reference_on_the_survivors() -> None:
    program = distir.compile(SMALL)
    inputs = [[small_input(r)] for r in range(4)]
    dropped = program.simulate(inputs, lost=[0, 2])
    survivors = program.simulate([inputs[1], inputs[3]])
    assert len(dropped) == 2
    for got, expected in zip(dropped, survivors):
        assert [t.tolist() for t in got] == [t.tolist() for t in expected]
    # rank 1 of the old group is rank 0 of the survivors: it is the root now
    assert dropped[1][1].tolist() == small_input(1).tolist()
