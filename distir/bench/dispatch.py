"""The dispatch check: what `Program.run` adds per op over raw torch.distributed.

A 1-rank group runs a chain of `chain` dependent all-reduces of 4 floats (by
default 1,000), as raw in-place calls, as raw out-of-place calls, through the
op's implementation alone, through `Program.run`, through `Program.run` with
an implementation that reduces in place, and with one that communicates
nothing; the differences isolate the runtime's own cost per op.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import TYPE_CHECKING

from distir.bench.families import program as program_text
from distir.bench.runner import sync_for

if TYPE_CHECKING:  # torch is imported where a rank runs
    from collections.abc import Sequence

    import torch

    from distir.core.invocation import Invocation
    from distir.transport.protocol import Transport


def dispatch_rank(context: object, chain: int, repeats: int, backend: str) -> dict:
    """A 1-rank group: `chain` dependent all-reduces of 4 floats, as raw
    in-place calls, raw out-of-place calls, `Program.run` (intermediates
    are reduced in place: each is dead after the next op), `Program.run`
    with the input donated, and `Program.run` with an implementation that
    communicates nothing: the last isolates the runtime's own cost per op."""
    import torch
    import torch.distributed as dist

    import distir
    from distir.ir.dialect import AllReduceOp
    from distir.transport.registry import Implementation, ImplementationRegistry

    class NoCollective(Implementation):
        name = "no-collective"
        operation_types = (AllReduceOp,)

        def execute(
            self,
            invocation: Invocation,
            inputs: Sequence[torch.Tensor],
            resources: Transport,
            writable: frozenset[int] = frozenset(),
        ) -> tuple[torch.Tensor, ...]:
            return (inputs[0],)

    device = "cuda" if backend == "nccl" else "cpu"
    sync = sync_for(device)
    t = "tensor<4xf32>"
    body = "\n  ".join(f"%x{i + 1} = dist.all_reduce sum %x{i} : {t}" for i in range(chain))
    text = program_text([("x0", t)], body, [(f"x{chain}", t)])
    start = time.perf_counter()
    program = distir.compile(text)
    compile_s = time.perf_counter() - start
    no_collective = distir.compile(text, registry=ImplementationRegistry([NoCollective()]))
    x = torch.rand(4, device=device)
    scratch = x.clone()

    def raw():
        for _ in range(chain):
            dist.all_reduce(scratch)

    def raw_out_of_place():
        y = x
        for _ in range(chain):
            y = torch.empty_like(y).copy_(y)
            dist.all_reduce(y)

    def program_run():
        program.run(x)

    def program_run_donated():
        program.run(scratch, donate=True)

    def program_run_without_collectives():
        no_collective.run(scratch)

    measured: dict[str, list[float]] = {}
    calls = [("raw", raw), ("raw_out_of_place", raw_out_of_place),
             ("program_run", program_run), ("program_run_donated", program_run_donated),
             ("program_run_without_collectives", program_run_without_collectives)]  # fmt: skip
    for _ in range(2):
        for _, call in calls:
            call()
    for _ in range(repeats):
        for name, call in calls:
            sync()
            start = time.perf_counter()
            call()
            sync()
            measured.setdefault(name, []).append((time.perf_counter() - start) / chain * 1e6)
    per_op = {name: statistics.median(v) for name, v in measured.items()}
    return {
        "chain": chain,
        "repeats": repeats,
        "compile_s": compile_s,
        "us_per_op": per_op,
        "min_us_per_op": {name: min(v) for name, v in measured.items()},
        "overhead_us_per_op": per_op["program_run"] - per_op["raw"],
        "overhead_donated_us_per_op": per_op["program_run_donated"] - per_op["raw"],
        "runtime_dispatch_us_per_op": per_op["program_run_without_collectives"],
    }


def run_dispatch(chain: int, repeats: int, backend: str = "gloo", timeout: float = 600.0) -> dict:
    """`dispatch_rank` on a 1-rank group of its own."""
    from distir.runtime.launch import launch

    print(f"distir-bench: dispatch overhead, 1 rank, chain of {chain} ops ...", file=sys.stderr,
          flush=True)  # fmt: skip
    return launch(dispatch_rank, 1, chain, repeats, backend, backend=backend, pass_context=True,
                  timeout=timeout)[0]  # fmt: skip
