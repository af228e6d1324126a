"""Four ranks lose one and go on with three.

Four local ranks run a loop of all-reduces of 1 MiB. During all-reduce #10,
rank 2 kills itself with SIGKILL. Every survivor's run fails with a named
error; each calls `distir.recover()`, which returns the same membership on
all three (epoch 1, ranks 0, 1 and 3) and a new process group over them;
the membership also says how many all-reduces completed on every survivor
(the one in flight may have completed on some of them only), the same
number on each, and the loop goes on from there, on that group, and every
result is checked. The launcher (`tolerate=1`) returns the survivors'
results and reports the lost rank with its cause. Times are seconds since
the kill.

    python examples/survive_a_lost_rank.py
"""

from __future__ import annotations

import os
import signal
import threading
import time

import torch
import torch.distributed as dist

import distir
import distir.errors

ROUNDS = 40
VICTIM = 2
KILLED_IN = 10
ELEMENTS = 128 * 1024  # 1 MiB of int64

PROGRAM = f"""
func.func @main(%x: tensor<{ELEMENTS}xi64>) -> tensor<{ELEMENTS}xi64> {{
  %y = dist.all_reduce sum %x : tensor<{ELEMENTS}xi64>
  func.return %y : tensor<{ELEMENTS}xi64>
}}
"""


def worker(ctx) -> dict:
    store = dist.distributed_c10d._get_default_store()
    program = distir.compile(PROGRAM, deadline=2.0)
    m = distir.membership()  # epoch 0: the four ranks
    events: dict[str, float] = {}
    done = 0
    while done < ROUNDS:
        x = torch.full((ELEMENTS,), ctx.rank + 1 + done, dtype=torch.int64)
        if ctx.rank == VICTIM and done == KILLED_IN:
            store.set("example/killed at", repr(time.monotonic()))
            threading.Timer(0.005, os.kill, (os.getpid(), signal.SIGKILL)).start()
        try:
            y = program.run(x, group=m.group)
        except distir.errors.DistirError:
            events["failure named"] = time.monotonic()
            # Longer than the collectives' deadline: a survivor may wait on
            # the lost rank until its own deadline.
            m = distir.recover(deadline=8.0)
            events["membership agreed"] = time.monotonic()
            # The all-reduce in flight when rank 2 died may have completed on
            # some survivors (all four contributions had reached them) and
            # failed on others: the membership says how many runs completed
            # on every survivor, the same number on each, and the loop goes
            # on from there (one run per step here: a step made of several
            # runs passes recover(progress=steps) instead).
            done = m.completed
            continue
        expected = sum(r + 1 + done for r in m.ranks)
        assert bool((y == expected).all()), f"all-reduce #{done}: wrong result"
        if "membership agreed" in events and "first all-reduce" not in events:
            events["first all-reduce"] = time.monotonic()
        done += 1
    events["loop finished"] = time.monotonic()
    killed_at = float(store.get("example/killed at"))
    return {
        "times": {what: t - killed_at for what, t in events.items()},
        "epoch": m.epoch,
        "ranks": m.ranks,
        "checked": done,
    }


def main() -> None:
    print(
        f"4 ranks, a loop of {ROUNDS} all-reduces of 1 MiB; rank {VICTIM} kills itself "
        f"(SIGKILL) during all-reduce #{KILLED_IN}"
    )
    outcome = distir.launch(worker, 4, pass_context=True, tolerate=1, timeout=120)
    for rank, report in sorted(outcome.results.items()):
        t = report["times"]
        ranks = ", ".join(map(str, report["ranks"]))
        print(
            f"rank {rank}: failure named at t={t['failure named']:.2f} s, membership agreed "
            f"at t={t['membership agreed']:.2f} s (epoch {report['epoch']}: ranks {ranks}), "
            f"first all-reduce on them done at t={t['first all-reduce']:.2f} s, loop "
            f"finished at t={t['loop finished']:.2f} s with {report['checked']} results checked"
        )
    for rank, why in sorted(outcome.lost.items()):
        print(f"launcher: rank {rank} lost ({why})")


if __name__ == "__main__":
    main()
