"""Elastic training: lose a rank, go on at 3, admit a replacement, finish at 4.

Four local ranks train an MLP with DDP and distir's sum hook
(`distir.ddp.sum_hook`), each on its shard of a batch drawn from the step
number. At step KILL_AT rank 2 is killed (SIGKILL) inside `loss.backward()`.
The survivors get a named error, call `distir.recover(progress=step)`, which
also agrees on the step they all completed (a survivor that is one step
further along goes back to it, from the copy of its state it keeps), wrap
the model in a new DDP on the new group and go on at 3. The launcher
(`replace=True`) starts a new process for rank 2; it calls
`distir.join(state)`, the members admit it with
`distir.grow(state)` after step JOIN_AT (they pause before it until it
asks, and call `grow` after every step from there on), and it receives the parameters, the optimizer's momentum and a 64 MB
buffer (standing in for a larger model's state) from a member through a
distir program (a `dist.transfer` per dtype). The job finishes at 4. An
old DDP is taken off the parameters with `distir.ddp.unwrap` before the
model is wrapped again.

After every step the ranks agree on a digest of the parameters (one
all-reduce of it and its negation: max equals min). Then a reference run,
with no failure, follows the same membership schedule (a plain torch
subgroup for the steps at 3, a plain torch broadcast of the state when rank
2 comes back) and its digest of every step is compared with the elastic
run's. Times are seconds since the kill, or since the joiner asked.

    python examples/elastic_training.py
"""

from __future__ import annotations

import hashlib
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import distir
from distir.ddp import unwrap
from distir.errors import DistirError

STEPS = 20
KILL_AT = 6
JOIN_AT = 11
VICTIM = 2
BATCH = 16  # per rank
DEADLINE_S = 2.0
RECOVER_S = 8.0
BUFFER_MB = 64


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer, list[torch.Tensor]]:
    """The same initial model on every rank, its optimizer, and its state as
    a list of tensors: parameters, momentum buffers, and the extra buffer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for p in model.parameters():  # zeros give the first step's buffer exactly
        optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)
    buffers = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    extra = torch.zeros(BUFFER_MB * 1024 * 1024 // 4)
    return model, optimizer, [*model.parameters(), *buffers, extra]


def batch(step: int, shard: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This shard of step `step`'s batch for a group of `size` ranks."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size * BATCH, 32, generator=g)
    y = torch.randint(0, 10, (size * BATCH,), generator=g)
    return x[shard * BATCH : (shard + 1) * BATCH], y[shard * BATCH : (shard + 1) * BATCH]


def wrap(model: torch.nn.Module, group):
    import distir.ddp as hooks

    ddp = DDP(model, process_group=group)
    # On the membership's group itself: each epoch's group is new (a
    # separate group of the same ranks as an earlier one would not be).
    hook = hooks.SumHookState(group=group, deadline=DEADLINE_S, separate_group=False)
    ddp.register_comm_hook(hook, hooks.sum_hook)
    return ddp, hook


def digest(model: torch.nn.Module) -> int:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return int.from_bytes(h.digest()[:7], "little")


def agreed(d: int, group) -> bool:
    both = distir.all_reduce(torch.tensor([d, -d]), "max", group=group, deadline=DEADLINE_S)
    return int(both[0]) == d == -int(both[1])


def train_step(ddp, hook, optimizer, step: int, m) -> None:
    x, y = batch(step, m.rank, m.size)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    with hook.named_errors():
        loss.backward()
    optimizer.step()


def elastic_worker(ctx) -> dict:
    store = dist.distributed_c10d._get_default_store()
    model, optimizer, state = model_and_optimizer()
    events: dict[str, float] = {}
    if ctx.joining:
        events["asked"] = time.monotonic()
        m = distir.join(state, deadline=60)
        events["received state"] = time.monotonic()
    else:
        m = distir.membership()
    done = m.completed
    ddp, hook = wrap(model, m.group)
    digests: dict[int, tuple[int, tuple[int, ...], bool]] = {}
    while done < STEPS:
        saved = [t.clone() for t in state[:-1]]  # the state after `done` steps
        if ctx.rank == VICTIM and done == KILL_AT and not ctx.joining:
            store.set("example/killed at", repr(time.monotonic()))
            model[0].weight.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL))
        if done == JOIN_AT and m.size < ctx.world_size:
            until = time.monotonic() + 60  # the replacement takes longer to start
            while not distir.join_requests() and time.monotonic() < until:
                time.sleep(0.01)
        try:
            train_step(ddp, hook, optimizer, done, m)
            done += 1
            d = digest(model)
            digests[done] = (d, m.ranks, agreed(d, m.group))
            if "recovered" in events and "next step" not in events:
                events["next step"] = time.monotonic()
            if ctx.joining and "first step" not in events:
                events["first step"] = time.monotonic()
            if done > JOIN_AT:  # (from a fixed step, so that the schedule is the same every run)
                grown = distir.grow(state, deadline=RECOVER_S, progress=done)
                if grown.epoch != m.epoch:
                    m = grown
                    unwrap(ddp)  # the old DDP's hooks leave the parameters
                    ddp, hook = wrap(model, m.group)
        except DistirError:
            unwrap(ddp)  # the old DDP's hooks leave the parameters
            m = distir.recover(deadline=RECOVER_S, progress=done)
            events["recovered"] = time.monotonic()
            if m.completed < done:  # a step the others did not complete: undo it
                with torch.no_grad():
                    for t, s in zip(state, saved):
                        t.copy_(s)
            done = m.completed
            ddp, hook = wrap(model, m.group)
    killed_at = float(store.get("example/killed at"))
    origin = events.get("asked", killed_at)
    return {
        "times": {what: t - origin for what, t in events.items()},
        "digests": digests,
        "final": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
        "epoch": m.epoch,
        "ranks": m.ranks,
    }


def reference_worker(ctx, schedule: dict[int, tuple[int, ...]]) -> dict:
    """The same steps with no failure: DDP and the sum hook on a plain torch
    subgroup of each step's members; rank 2 gets the state by a plain torch
    broadcast when it comes back."""
    model, optimizer, state = model_and_optimizer()
    groups = {ranks: dist.new_group(list(ranks)) for ranks in sorted(set(schedule.values()))}
    digests = {}
    ddp = hook = None
    for step in range(STEPS):
        ranks = schedule[step + 1]
        if step == 0 or ranks != schedule[step]:
            if step and len(ranks) > len(schedule[step]):
                root = min(schedule[step])
                for t in state:
                    dist.broadcast(t.data, root, group=groups[ranks])
            if ddp is not None:
                unwrap(ddp)  # the old DDP's hooks leave the parameters
            ddp = hook = None
            if ctx.rank in ranks:
                ddp, hook = wrap(model, groups[ranks])
        if ctx.rank not in ranks:
            continue

        class Place:
            rank = ranks.index(ctx.rank)
            size = len(ranks)

        train_step(ddp, hook, optimizer, step, Place)
        digests[step + 1] = (
            digest(model),
            torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
        )
    return {"digests": digests}


def main() -> None:
    print(
        f"4 ranks train an MLP with DDP and distir's sum hook for {STEPS} steps; rank "
        f"{VICTIM} is killed (SIGKILL) in step {KILL_AT}'s backward; its replacement is "
        f"admitted after step {JOIN_AT}"
    )
    outcome = distir.launch(
        elastic_worker, 4, pass_context=True, tolerate=1, replace=True, timeout=200
    )
    for rank, why in sorted(outcome.lost.items()):
        print(f"launcher: rank {rank} lost ({why})")
    survivors = [r for r in range(4) if r != VICTIM]
    for rank in survivors:
        t = outcome.results[rank]["times"]
        print(
            f"rank {rank}: recovered at t={t['recovered']:.2f} s, next step done at "
            f"t={t['next step']:.2f} s"
        )
    joiner = outcome.results[VICTIM]["times"]
    print(
        f"rank {VICTIM} (replacement): received {BUFFER_MB} MB of state and more "
        f"{joiner['received state']:.2f} s after asking, first step done at "
        f"{joiner['first step']:.2f} s"
    )
    reference = outcome.results[0]["digests"]
    schedule = {step: ranks for step, (_, ranks, _) in reference.items()}
    sizes = [len(schedule[s]) for s in sorted(schedule)]
    runs = [(n, sum(1 for _ in group)) for n, group in _runs(sizes)]
    print("membership schedule: " + ", then ".join(f"{k} steps at {n}" for n, k in runs))
    every = all(
        ok for result in outcome.results.values() for _, _, ok in result["digests"].values()
    )
    same = all(
        result["digests"][s][0] == reference[s][0]
        for result in outcome.results.values()
        for s in result["digests"]
    )
    print(f"digest agreed by every member after every step: {'yes' if every and same else 'no'}")
    plain = distir.launch(reference_worker, 4, schedule, pass_context=True, timeout=300)
    mine = outcome.results[0]["final"]
    equal = sum(plain[0]["digests"][s][0] == reference[s][0] for s in schedule)
    diff = float((plain[0]["digests"][STEPS][1] - mine).abs().max())
    print(
        f"reference run with the same schedule: {equal} of {STEPS} steps' parameters equal "
        f"bit for bit; final largest difference {diff:.1e}"
    )


def _runs(sizes: list[int]):
    from itertools import groupby

    return groupby(sizes)


if __name__ == "__main__":
    main()
