"""Randomised kill/join trials of an elastic job, with leak checks.

Each trial is drawn from its seed: the world size (2-4), one or two victims
(rank 0 included), the step each is SIGKILLed at and where in it (before the
step's all-reduce, after it, or, for a second victim, while forming the group
that admits the first one's replacement), and what the replacement the
launcher starts (`launch(..., replace=True)`) does: joins at once, joins
after a delay, joins with other shapes (refused: the job finishes without
it), or dies while joining (the next replacement joins). The members call
`distir.grow` after every step, pause at a drawn step until a replacement
asks (`grow(..., wait=)`), and at the end until every replacement that is
not refused is in.

Every rank contributes `(rank + 1) * 100 + step` to each step's all-reduce
and adds the total to its state; on `recover` it goes back to its own copy
of the state after the agreed step. The oracle is plain Python: the
members of each step (the same on every rank that ran it), each step's
total (the sum over those members), every finishing rank's state (the sum
over the steps, joiners included), the final membership and the ranks the
launcher reports lost.

Leaks: each rank counts its threads and open file descriptors when it
starts and when it ends (after releasing its last group): no growth. After
each trial the launcher (this process) counts its threads, file
descriptors and child processes: no growth over the first trial's (which
starts the fork server), and no rank process left.

    python benchmarks/elastic_trials.py             # 100 trials
    python benchmarks/elastic_trials.py --trials 5 --first 40
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

import distir
from distir.errors import DistirError, JoinRefused
from distir.runtime import elastic
from distir.runtime import membership as protocol
from distir.runtime.launch import launch
from distir.transport.epochs import decision_key, read_key

STEPS = 12
DEADLINE_S = 2.0
RECOVER_S = 8.0
JOIN_S = 60.0
#: where a victim dies: before its step's all-reduce, after it (before
#: `grow`), or while forming a group that admits a joiner
WHERE = ("before", "after", "joining")
JOINERS = ("ok", "slow", "shapes", "dies joining")


@dataclass(frozen=True)
class Trial:
    seed: int
    nproc: int
    #: (rank, step, where): a member killed at `step` (for "joining": the
    #: first join from that step on)
    kills: tuple[tuple[int, int, str], ...]
    #: what the first replacement of each victim does (later ones join)
    joiner: str
    #: seconds a "slow" joiner waits before asking
    delay: float
    #: step -> how many replacements the members wait for before it (they
    #: pause until one asks; the others are admitted by a later grow)
    waits: tuple[tuple[int, int], ...]


def draw(seed: int) -> Trial:
    rng = random.Random(seed)
    nproc = rng.choice((2, 3, 4))
    joiner = rng.choice(JOINERS if nproc >= 3 else ("ok", "slow", "shapes"))
    first = (rng.randrange(nproc), rng.randrange(0, STEPS - 6), rng.choice(WHERE[:2]))
    kills = [first]
    if nproc >= 3 and joiner != "dies joining" and rng.random() < 0.5:
        other = rng.choice([r for r in range(nproc) if r != first[0]])
        # (a refused joiner is never admitted: no group to die forming)
        kind = rng.choice(("same step", "later") + (("joining",) if joiner != "shapes" else ()))
        if kind == "same step":
            kills.append((other, first[1], first[2]))
        elif kind == "later":
            kills.append((other, rng.randrange(first[1], STEPS - 5), rng.choice(WHERE[:2])))
        else:
            kills.append((other, first[1] + 1, "joining"))
    last = max(step for _, step, _ in kills)
    wait = rng.randrange(last + 1, STEPS - 2)
    if any(where == "joining" for *_, where in kills):
        # the first replacement joins at `wait` (the member dies then), the
        # member's replacement later
        waits = ((wait, 1), (wait + 2, 1))
    elif joiner == "dies joining":
        waits = ((wait, 1), (wait + 2, 1))
    else:
        waits = ((wait, len(kills)),)
    return Trial(seed, nproc, tuple(kills), joiner, rng.uniform(0.1, 1.5), waits)


def contribution(rank: int, step: int) -> int:
    return (rank + 1) * 100 + step


def counts() -> tuple[int, int]:
    """This process's threads and open file descriptors."""
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def _state(width: int = 5) -> list[torch.Tensor]:
    return [torch.zeros(width, dtype=torch.float64), torch.zeros(2, dtype=torch.int64)]


def _die_when_forming(joined_only: bool) -> None:
    """This process dies (SIGKILL) as it starts forming a group (one that
    admits a joiner, with `joined_only`): after the decision, before the
    group exists."""
    form = protocol._form

    def dying(members, epoch, me, end):
        store = dist.distributed_c10d._get_default_store()
        decision = read_key(store, decision_key(epoch))
        if not joined_only or (decision is not None and decision.decode().split("|")[3]):
            os.kill(os.getpid(), signal.SIGKILL)
        return form(members, epoch, me, end)

    protocol._form = dying


def _log(*what) -> None:
    if os.environ.get("TRIAL_LOG"):
        print(
            f"[{time.time() % 1000:7.2f} rank {dist.get_rank()} pid {os.getpid()}]",
            *what,
            file=sys.stderr,
            flush=True,
        )


def _refused(m, ranks: list[int]) -> bool:
    """Whether `grow` refused every one of `ranks` (its record in the store,
    written before the all-reduce that ends the refusing `grow`), agreed by
    the members."""
    store = dist.distributed_c10d._get_default_store()
    mine = all(read_key(store, elastic._refused_key(r)) is not None for r in ranks)
    every = distir.all_reduce(torch.tensor([int(mine)]), "min", group=m.group, deadline=RECOVER_S)
    return bool(int(every))


def worker(ctx, trial: Trial) -> dict:
    store = dist.distributed_c10d._get_default_store()
    state = _state()
    weights = torch.arange(1, 6, dtype=torch.float64)
    waits = dict(trial.waits)
    victims = sorted({rank for rank, _, _ in trial.kills})
    final_size = trial.nproc - (len(victims) if trial.joiner == "shapes" else 0)
    #: step -> (members, total) of its last run on this rank
    steps: dict[int, tuple[tuple[int, ...], int]] = {}
    _log("starts", "joining" if ctx.joining else "")
    #: (epoch, group size, threads, fds): at the start (epoch -1) and after
    #: the first step of each membership
    usage = [(-1, 0, *counts())]
    if ctx.joining:
        first = store.add(f"trial/replacements/{ctx.rank}", 1) == 1
        if first and trial.joiner == "shapes":
            try:
                elastic.join(_state(6), deadline=JOIN_S)
            except JoinRefused as e:
                return {"refused": str(e)}
            return {"refused": None}
        if first and trial.joiner == "dies joining":
            _die_when_forming(joined_only=False)
        if first and trial.joiner == "slow":
            time.sleep(trial.delay)
        try:
            m = elastic.join(state, deadline=JOIN_S)
        except DistirError as e:
            _log("join failed", type(e).__name__, e)
            raise
        _log("joined", m.epoch, m.ranks, m.completed)
        done = m.completed
    else:
        m = distir.membership()
        done = 0
        for rank, _, where in trial.kills:
            if rank == ctx.rank and where == "joining":
                _die_when_forming(joined_only=True)
    history = {done: [t.clone() for t in state]}
    while True:
        try:
            if done in waits and trial.joiner == "shapes":
                # Until every replacement is refused (one refused before
                # the pause would leave it waiting in vain).
                while not _refused(m, victims):
                    m = elastic.grow(state, deadline=RECOVER_S, progress=done, wait=JOIN_S)
            elif done in waits and m.size < ctx.world_size:
                # The steps take milliseconds, a replacement longer to start:
                # wait for it (the members agree when to stop).
                m = elastic.grow(state, deadline=RECOVER_S, progress=done, wait=JOIN_S)
            if done >= STEPS:
                # Every replacement that will be admitted is, before the end
                # (a second one may ask after the pause).
                while m.size < final_size:
                    grown = elastic.grow(state, deadline=RECOVER_S, progress=done, wait=JOIN_S)
                    if grown.epoch == m.epoch:
                        break
                    m = grown
                break
            if not ctx.joining:
                for rank, step, where in trial.kills:
                    if rank == ctx.rank and step == done and where == "before":
                        os.kill(os.getpid(), signal.SIGKILL)
            mine = torch.tensor([contribution(ctx.rank, done)], dtype=torch.int64)
            total = distir.all_reduce(mine, "sum", group=m.group, deadline=DEADLINE_S)
            with torch.no_grad():
                state[0] += int(total) * weights
                state[1] += torch.tensor([1, int(total)])
            steps[done] = (m.ranks, int(total))
            if usage[-1][0] != m.epoch:
                usage.append((m.epoch, m.size, *counts()))
                _log("usage", usage[-1])
            done += 1
            history[done] = [t.clone() for t in state]
            if not ctx.joining:
                for rank, step, where in trial.kills:
                    if rank == ctx.rank and step == done - 1 and where == "after":
                        os.kill(os.getpid(), signal.SIGKILL)
            m = elastic.grow(state, deadline=RECOVER_S, progress=done)
        except DistirError as e:
            _log("failed at", done, type(e).__name__, e)
            m = distir.recover(deadline=RECOVER_S, progress=done)
            done = m.completed
            _log("recovered", m.epoch, m.ranks, done)
            with torch.no_grad():
                for t, saved in zip(state, history[done]):
                    t.copy_(saved)
    # Every rank still here finishes at the same membership.
    store.set(f"trial/final/{ctx.rank}", repr((m.epoch, m.ranks)))
    store.wait([f"trial/final/{r}" for r in m.ranks], timedelta(seconds=30))
    finals = {read_key(store, f"trial/final/{r}") for r in m.ranks}
    result = {
        "state": [t.tolist() for t in state],
        "steps": steps,
        "epoch": m.epoch,
        "ranks": m.ranks,
        "finals agree": len(finals) == 1,
        "usage": usage,
    }
    _log("returns")
    return result


def check(trial: Trial, outcome) -> list[str]:
    """What is wrong with a trial's outcome (nothing: an empty list)."""
    problems: list[str] = []
    victims = {rank for rank, _, _ in trial.kills}
    replacements = Counter(victims)
    if trial.joiner == "dies joining":
        replacements.update(victims)
    refused = victims if trial.joiner == "shapes" else set()
    lost = {r: why.count("(replaced)") for r, why in outcome.lost.items()}
    expected_lost = dict(replacements)
    if lost != expected_lost:
        problems.append(f"lost {outcome.lost}, expected {expected_lost} replaced")
    finished = {r: v for r, v in outcome.results.items() if "state" in v}
    expected_final = tuple(r for r in range(trial.nproc) if r not in refused)
    if sorted(finished) != list(expected_final):
        problems.append(
            f"finished {sorted(finished)}, expected {list(expected_final)} (lost: {outcome.lost})"
        )
    for r in refused:
        why = outcome.results.get(r, {}).get("refused")
        if not why or "is not the members'" not in why:
            problems.append(f"rank {r}'s replacement was not refused: {outcome.results.get(r)}")
    # The steps: the same members on every rank that ran them, every step
    # run, each total the members' contributions.
    schedule: dict[int, tuple[int, ...]] = {}
    for r, v in finished.items():
        for step, (members, total) in v["steps"].items():
            if schedule.setdefault(step, members) != members:
                problems.append(
                    f"step {step}: rank {r} ran it with {members}, another with {schedule[step]}"
                )
            want = sum(contribution(m, step) for m in members)
            if total != want:
                problems.append(f"step {step}: rank {r}'s total {total}, expected {want}")
    if sorted(schedule) != list(range(STEPS)):
        problems.append(f"steps run: {sorted(schedule)}")
        return problems
    first_kill = min(step for _, step, _ in trial.kills)
    for step in range(first_kill):
        if schedule[step] != tuple(range(trial.nproc)):
            problems.append(f"step {step} (before any kill) ran with {schedule[step]}")
    pauses = {step for step, _ in trial.waits}
    for rank, step, where in trial.kills:
        if where == "joining":
            continue
        # The first step it cannot be in: a replacement joins at a pause
        # (before its step) or after a step, so one killed after step k
        # may be back for k + 1 when the members pause there.
        gone = step + (where == "after")
        if gone < STEPS and gone not in pauses and rank in schedule[gone]:
            problems.append(f"step {gone}: rank {rank} was killed but is a member")
    if schedule[STEPS - 1] != expected_final:
        problems.append(f"last step ran with {schedule[STEPS - 1]}, expected {expected_final}")
    total = sum(sum(contribution(m, s) for m in schedule[s]) for s in range(STEPS))
    expected_state = [[float(total * (j + 1)) for j in range(5)], [STEPS, total]]
    for r, v in finished.items():
        if v["state"] != expected_state:
            problems.append(f"rank {r}: state {v['state']}, expected {expected_state}")
        if not v["finals agree"] or v["ranks"] != expected_final:
            problems.append(f"rank {r}: ends at {v['ranks']} (finals agree: {v['finals agree']})")
    for r, v in finished.items():
        problems += [f"rank {r}: {p}" for p in growth(v["usage"])]
    return problems


def growth(usage: list[tuple[int, int, int, int]]) -> list[str]:
    """Threads or fds that grow from one membership to a later one of the
    same size (each membership holds the default group and its own; a group
    left behind would add its threads and connections)."""
    first: dict[int, tuple[int, int, int]] = {}
    problems = []
    for epoch, size, threads, fds in usage[1:]:
        if epoch == 0:
            continue
        e0, t0, f0 = first.setdefault(size, (epoch, threads, fds))
        if threads > t0 or fds > f0:
            problems.append(
                f"threads, fds ({t0}, {f0}) at epoch {e0}, ({threads}, {fds}) at "
                f"epoch {epoch} (both groups of {size})"
            )
    return problems


def _descendants() -> list[tuple[int, str, str]]:
    """(pid, name, state) of every process below this one."""
    parents: dict[int, int] = {}
    info: dict[int, tuple[str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        info[int(entry)] = (name, fields[0])
    found, frontier = [], [os.getpid()]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid:
                found.append((child, *info[child]))
                frontier.append(child)
    return found


def launcher_counts() -> dict:
    processes = _descendants()
    threads, fds = counts()
    return {
        "threads": threads,
        "fds": fds,
        "processes": len(processes),
        "ranks": [p for p in processes if p[1].startswith("distir-rank")],
        "zombies": [p for p in processes if p[2] == "Z"],
    }


def run_trial(trial: Trial) -> tuple[list[str], float, list[list[tuple[int, ...]]]]:
    """What is wrong, how long it took, and each finishing rank's usage."""
    tolerate = len(trial.kills) + (trial.joiner == "dies joining")
    began = time.monotonic()
    try:
        outcome = launch(
            worker, trial.nproc, trial, pass_context=True, tolerate=tolerate, replace=True,
            timeout=180,
        )  # fmt: skip
    except Exception as e:  # a trial that fails is reported, the others go on
        return [f"{type(e).__name__}: {e}"], time.monotonic() - began, []
    usages = [v["usage"] for v in outcome.results.values() if "usage" in v]
    return check(trial, outcome), time.monotonic() - began, usages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--first", type=int, default=0, help="the first trial's seed")
    args = parser.parse_args()
    failed = 0
    baseline: dict | None = None
    #: (trial, threads, fds, processes) each time the launcher's counts change
    changes: list[tuple[int, int, int, int]] = []
    growth = Counter()
    kinds = Counter()
    durations = []
    memberships = Counter()
    for seed in range(args.first, args.first + args.trials):
        trial = draw(seed)
        problems, took, usages = run_trial(trial)
        durations.append(took)
        memberships.update(len(u) - 1 for u in usages)
        after = launcher_counts()
        if baseline is None:
            baseline = after
        now = (after["threads"], after["fds"], after["processes"])
        if not changes or changes[-1][1:] != now:
            changes.append((seed, *now))
        for what in ("threads", "fds", "processes"):
            growth[what] = max(growth[what], after[what] - baseline[what])
        if after["ranks"] or after["zombies"]:
            problems.append(f"left behind: ranks {after['ranks']}, zombies {after['zombies']}")
        kinds[f"world {trial.nproc}"] += 1
        kinds[f"{len(trial.kills)} victim(s)"] += 1
        kinds[f"joiner {trial.joiner}"] += 1
        kinds.update(f"killed {where}" for *_, where in trial.kills)
        kinds["rank 0 killed"] += any(rank == 0 for rank, _, _ in trial.kills)
        status = "ok" if not problems else "FAILED"
        print(f"trial {seed:3d} {status} {took:5.1f} s  {trial}", flush=True)
        for p in problems:
            print(f"    {p}", flush=True)
        failed += bool(problems)
    print(
        f"\n{args.trials - failed} of {args.trials} trials ok; drawn: "
        + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    )
    print(
        f"trial time: median {sorted(durations)[len(durations) // 2]:.1f} s, "
        f"max {max(durations):.1f} s"
    )
    print(
        "memberships a rank ran steps in (count of ranks): "
        + ", ".join(f"{k}: {n}" for k, n in sorted(memberships.items()))
    )
    print(
        "launcher growth over the first trial (threads, fds, processes): "
        f"{growth['threads']}, {growth['fds']}, {growth['processes']}"
    )
    print(
        "launcher (threads, fds, processes) from trial: "
        + ", ".join(f"{t}: {c}" for t, *c in changes)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
