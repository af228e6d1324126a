"""Two faults on 2 local ranks, and what every rank sees.

1. A late rank: rank 1 sleeps past the 2 s deadline. Rank 0 raises
   DeadlineExceeded naming the exchange it waited in (the run's agreement,
   its first exchange); its next run raises Poisoned at once. Rank 1 arrives
   to a group its peer left: its first run fails at once, its second is
   Poisoned.
2. A wrong input: rank 1 passes 5 elements where the program says 4. Both
   ranks raise before any payload moves, naming rank 1's input.
3. A local op fails on one rank (an index out of range, before the
   all-reduce): that rank raises it; its peer, waiting in the all-reduce,
   stops at its deadline and says which rank failed first, and why.

    python examples/when_things_go_wrong.py
"""

from __future__ import annotations

import time

import torch

import distir
import distir.errors

PROGRAM = """
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce sum %x : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
"""

PICK_THEN_REDUCE = """
func.func @main(%x: tensor<4xi64>, %i: index) -> tensor<4xi64> {
  %e = tensor.extract %x[%i] : tensor<4xi64>
  %s = tensor.splat %e : tensor<4xi64>
  %y = dist.all_reduce sum %s : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
"""


def attempt(program, *inputs) -> str:
    try:
        program.run(*inputs)
        return "ok"
    except distir.errors.DistirError as e:
        return f"{type(e).__name__}: {e}"


def late_rank(ctx) -> list[str]:
    program = distir.compile(PROGRAM, deadline=2.0)  # seconds, or a timedelta
    if ctx.rank == 1:
        time.sleep(3)
    x = torch.arange(4)
    return [attempt(program, x), attempt(program, x)]


def wrong_input(ctx) -> list[str]:
    program = distir.compile(PROGRAM, deadline=2.0)
    x = torch.arange(5 if ctx.rank == 1 else 4)
    return [attempt(program, x)]


def local_op_fails(ctx) -> list[str]:
    program = distir.compile(PICK_THEN_REDUCE, deadline=2.0)
    index = torch.tensor(9 if ctx.rank == 1 else 0)
    lines = [attempt(program, torch.arange(4), index), attempt(program, torch.arange(4), index)]
    if ctx.rank == 1:
        time.sleep(3)  # stay up while the peer waits for its deadline
    return lines


if __name__ == "__main__":
    for scenario in (late_rank, wrong_input, local_op_fails):
        print(f"== {scenario.__name__}")
        for rank, lines in enumerate(distir.launch(scenario, 2, pass_context=True)):
            for i, line in enumerate(lines):
                print(f"rank {rank}, run {i + 1}: {line}")
