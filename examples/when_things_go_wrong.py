"""Two faults on 2 local ranks, and what every rank sees.

1. A late rank: rank 1 sleeps past the 2 s deadline. Rank 0 raises
   DeadlineExceeded naming the op; its next run raises Poisoned at once, and
   rank 1, told through the group's store, stops at its first run. The run's
   program agreement is the first exchange, so it is what times out here.
2. A wrong input: rank 1 passes 5 elements where the program says 4. Both
   ranks raise ProgramMismatch before any payload moves.

    python examples/when_things_go_wrong.py
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch

import distir
import distir.errors

PROGRAM = """
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce sum %x : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
"""


def attempt(program, x) -> str:
    try:
        program.run(x)
        return "ok"
    except distir.errors.DistirError as e:
        return f"{type(e).__name__}: {e}"


def late_rank(ctx) -> list[str]:
    program = distir.compile(PROGRAM, deadline=timedelta(seconds=2))
    if ctx.rank == 1:
        time.sleep(3)
    x = torch.arange(4)
    return [attempt(program, x), attempt(program, x)]


def wrong_input(ctx) -> list[str]:
    program = distir.compile(PROGRAM, deadline=timedelta(seconds=2))
    x = torch.arange(5 if ctx.rank == 1 else 4)
    return [attempt(program, x)]


if __name__ == "__main__":
    for scenario in (late_rank, wrong_input):
        print(f"== {scenario.__name__}")
        for rank, lines in enumerate(distir.launch(scenario, 2, pass_context=True)):
            for i, line in enumerate(lines):
                print(f"rank {rank}, run {i + 1}: {line}")
