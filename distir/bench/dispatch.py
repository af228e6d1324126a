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
from inspect import signature

from distir.bench.families import program as program_text
from distir.bench.runner import sync_for


def dispatch_rank(context: object, chain: int, repeats: int, backend: str) -> dict:
    """A 1-rank group: `chain` dependent all-reduces of 4 floats, as raw
    calls, through the op's implementation alone, through Program.run, and
    through Program.run with an implementation that reduces in place (what
    the runtime would run if it could donate dead intermediates): the last
    one isolates the runtime's own dispatch cost."""
    import torch
    import torch.distributed as dist

    import distir
    from distir.backends.groups import ProcessGroupResource
    from distir.backends.registry import Implementation, ImplementationRegistry
    from distir.interpreters.invocation import make_invocation
    from distir.ir.dialect import AllReduceOp

    class InPlaceSum(Implementation):
        name = "in-place-sum"
        operation_types = (AllReduceOp,)

        # *_, **__: whichever in-place argument the runtime passes (in_place= or writable).
        def execute(self, invocation, inputs, resources, *_, **__):
            dist.all_reduce(inputs[0], group=resources.group)
            return (inputs[0],)

    class NoCollective(Implementation):
        name = "no-collective"
        operation_types = (AllReduceOp,)

        def execute(self, invocation, inputs, resources, *_, **__):
            return (inputs[0],)

    device = "cuda" if backend == "nccl" else "cpu"
    sync = sync_for(device)
    t = "tensor<4xf32>"
    body = "\n  ".join(f"%x{i + 1} = dist.all_reduce sum %x{i} : {t}" for i in range(chain))
    text = program_text([("x0", t)], body, [(f"x{chain}", t)])
    start = time.perf_counter()
    program = distir.compile(text)
    compile_s = time.perf_counter() - start
    in_place = distir.compile(text, registry=ImplementationRegistry([InPlaceSum()]))
    no_collective = distir.compile(text, registry=ImplementationRegistry([NoCollective()]))
    x = torch.rand(4, device=device)
    scratch = x.clone()
    # The chosen implementations: `Program.plan.choices` (`Program.choices` before the plan
    # had its own module).
    choices = program.plan.choices if hasattr(program, "plan") else program.choices
    op = next(op for op in choices if op.name == "dist.all_reduce")
    implementation = choices[op]
    invocation = make_invocation(op)
    resource = ProcessGroupResource(None)
    # A read-only call: `in_place=False` where execute still takes it, else no writable inputs.
    read_only = (
        {"in_place": False} if "in_place" in signature(implementation.execute).parameters else {}
    )

    def raw():
        for _ in range(chain):
            dist.all_reduce(scratch)

    def raw_out_of_place():
        y = x
        for _ in range(chain):
            y = torch.empty_like(y).copy_(y)
            dist.all_reduce(y)

    def implementation_only():
        y = x
        for _ in range(chain):
            (y,) = implementation.execute(invocation, (y,), resource, **read_only)

    def program_run():
        program.run(x)

    def program_run_in_place():
        in_place.run(scratch)

    def program_run_without_collectives():
        no_collective.run(scratch)

    measured: dict[str, list[float]] = {}
    calls = [("raw", raw), ("raw_out_of_place", raw_out_of_place),
             ("implementation_only", implementation_only), ("program_run", program_run),
             ("program_run_in_place", program_run_in_place),
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
        "overhead_vs_out_of_place_us_per_op": per_op["program_run"] - per_op["raw_out_of_place"],
        "runtime_dispatch_us_per_op": per_op["program_run_in_place"] - per_op["raw"],
        "implementation_us_per_op": per_op["implementation_only"] - per_op["raw"],
    }


def run_dispatch(chain: int, repeats: int, backend: str = "gloo", timeout: float = 600.0) -> dict:
    """`dispatch_rank` on a 1-rank group of its own."""
    from distir.runtime.launch import launch

    print(f"distir-bench: dispatch overhead, 1 rank, chain of {chain} ops ...", file=sys.stderr,
          flush=True)  # fmt: skip
    return launch(dispatch_rank, 1, chain, repeats, backend, backend=backend, pass_context=True,
                  timeout=timeout)[0]  # fmt: skip
