"""Cases for the multi-rank tests, and the worker that runs them on real ranks.

Spawning gloo ranks costs seconds, so one launch runs many cases: the parent
sends a list of `Case`s, every rank compiles and runs each one on inputs it
builds itself from `(case seed, rank, world size)`, and the parent compares
what came back with the reference simulator fed the same inputs.

This module is imported by the spawned ranks, so it imports only torch and
distir (no pytest, no hypothesis) and holds only plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Arg:
    """How every rank builds one argument of `@main`.

    `values`, when given, is the argument itself: one nested list for every
    rank, or (with `per_rank`) a list holding one nested list per rank.
    Otherwise the argument is random integers in `[low, high)` of `shape`
    (one shape, or with `per_rank` one shape per rank), stored as `dtype`:
    integer-valued floats keep sums exact whatever order a backend adds in.
    `shared` makes the random values equal on every rank. With `per_rank`,
    `dtype` may also be one dtype per rank.
    """

    dtype: Any
    shape: Any = ()
    low: int = 0
    high: int = 10
    shared: bool = False
    per_rank: bool = False
    values: Any = None

    def build(self, seed: int, index: int, rank: int) -> torch.Tensor:
        name = self.dtype[rank] if self.per_rank and not isinstance(self.dtype, str) else self.dtype
        dtype = getattr(torch, name)
        if self.values is not None:
            values = self.values[rank] if self.per_rank else self.values
            return torch.tensor(values, dtype=dtype)
        shape = self.shape[rank] if self.per_rank else self.shape
        who = 0 if self.shared else rank + 1
        generator = torch.Generator().manual_seed(seed * 1_000_003 + who * 1009 + index)
        raw = torch.randint(self.low, self.high, tuple(shape), generator=generator)
        return raw.to(dtype)


@dataclass(frozen=True)
class Case:
    """One program and how each rank makes its inputs.

    `pipeline` runs before execution on the ranks; the parent compares with
    the simulator on the program *without* the pipeline, the semantics the
    passes must keep. With `expect_error` the ranks must fail (each rank's
    outcome is then the text of its error) and the group goes on to the next
    case.
    """

    name: str
    source: str
    args: tuple[Arg, ...] = ()
    seed: int = 0
    pipeline: str = ""
    implementations: tuple[tuple[str, str], ...] = field(default=())
    expect_error: bool = False
    #: off for programs whose control flow is uniform per subgroup, which the
    #: conservative SPMD check cannot prove
    verify_spmd: bool = True

    def inputs(self, rank: int, world_size: int) -> list[torch.Tensor]:
        del world_size  # the Args already encode everything size-dependent
        return [arg.build(self.seed, i, rank) for i, arg in enumerate(self.args)]

    def inputs_per_rank(self, world_size: int) -> list[list[torch.Tensor]]:
        return [self.inputs(r, world_size) for r in range(world_size)]


def as_tuple(result: Any) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


def run_cases(ctx, cases: list[Case]) -> list[tuple[torch.Tensor, ...] | str]:
    """Worker: compile and run every case on this rank, in order.

    An unexpected failure is re-raised with the case named, so that the
    launch fails as a whole (a rank that skipped a case would desynchronise
    the group). An expected failure becomes `"<ErrorType>: <message>"`; the
    ranks then clear the poisoned execution domain together and go on.
    """
    import torch.distributed as dist

    import distir
    from distir.errors import DistirError
    from distir.transport.domain import reset_domain

    outcomes: list[tuple[torch.Tensor, ...] | str] = []
    for case in cases:
        try:
            program = distir.compile(
                case.source,
                case.pipeline,
                implementations=dict(case.implementations),
                verify_spmd=case.verify_spmd,
            )
            outcomes.append(as_tuple(program.run(*case.inputs(ctx.rank, ctx.world_size))))
        except DistirError as e:
            if not case.expect_error:
                e.add_note(f"in multi-rank test case {case.name!r} (rank {ctx.rank})")
                raise
            outcomes.append(f"{type(e).__name__}: {e}")
            # Every rank has poisoned the domain (and published it) before
            # raising: wait for all, then clear it everywhere.
            dist.barrier()
            reset_domain(None)
            dist.barrier()
        except BaseException as e:
            e.add_note(f"in multi-rank test case {case.name!r} (rank {ctx.rank})")
            raise
    return outcomes


def run_then_fail_on_rank(ctx, source: str, failing_rank: int) -> Any:
    """Worker: `failing_rank` raises before the program's first collective
    while the other ranks enter it."""
    import distir

    program = distir.compile(source)
    if ctx.rank == failing_rank:
        raise ValueError(f"deliberate failure on rank {ctx.rank}")
    return program.run(torch.ones(4, dtype=torch.int64))


def run_cases_on_device(ctx, cases: list[Case], device: str) -> list[tuple[torch.Tensor, ...]]:
    """Worker: every case with its inputs on `device` ("cpu" or "cuda", this
    rank's current CUDA device); checks tensor results stay on that device
    and returns them on the CPU for comparison."""
    import distir

    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    outcomes = []
    for case in cases:
        try:
            program = distir.compile(case.source, case.pipeline)
            inputs = [x.to(device) for x in case.inputs(ctx.rank, ctx.world_size)]
            results = as_tuple(program.run(*inputs))
            for i, r in enumerate(results):
                # Rank queries are 0-d host values wherever the data lives.
                if r.dim() > 0 and r.device != torch.device(device):
                    raise AssertionError(f"result #{i} is on {r.device}, expected {device}")
        except BaseException as e:
            e.add_note(f"in device test case {case.name!r} (rank {ctx.rank}, {device})")
            raise
        outcomes.append(tuple(r.cpu() for r in results))
    return outcomes
