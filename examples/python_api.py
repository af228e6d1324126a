"""The Python API: build a dist program, check it in the simulator, run it on
4 local gloo ranks.

    python examples/python_api.py
"""

from __future__ import annotations

import torch

import distir
from distir.ir.builder import all_gather, all_reduce, arith, build_program, tensor_type


def body(x):
    total = all_reduce(x, "sum")  # native sum
    # A generic all-reduce: the combine region is built by this callback.
    largest = all_reduce(x, combine=lambda a, b: arith("maxsi", a, b), commutative=True)
    return total, largest, all_gather(x)


module = build_program(body, [tensor_type("i64", [4])])
program = distir.compile(module, pipeline="recognize-native-reductions")


def inputs(rank: int) -> list[torch.Tensor]:
    return [torch.arange(4) * (rank + 1)]


def worker(ctx) -> tuple[torch.Tensor, ...]:
    # Each rank compiles the same program (compilation is cheap and local).
    return distir.compile(module, pipeline="recognize-native-reductions").run(*inputs(ctx.rank))


# Ranks are fresh processes that import this file: what runs on launch goes
# under the guard, and `worker` is a module-level function they can find.
if __name__ == "__main__":
    print(program)
    expected = distir.simulate(program, [inputs(r) for r in range(4)])
    results = distir.launch(worker, 4, pass_context=True)
    for rank, (total, largest, gathered) in enumerate(results):
        same = all(torch.equal(a, b) for a, b in zip(results[rank], expected[rank]))
        print(f"rank {rank}: sum {total.tolist()} max {largest.tolist()} "
              f"gathered {gathered.tolist()} (simulator agrees: {same})")
