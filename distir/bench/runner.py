"""The runner: starts P local ranks and times every family's calls side by side.

For every family, (dtype, op), and message size, each rank builds the
family's `Setup`, compiles every variant once, then runs `warmup + iters`
iterations; each iteration runs the raw call, the `raw clone+op` row, the
family's other baselines and every variant one after the other, each after
an untimed reset (the raw call's buffer, a donated variant's inputs) and a
`dist.barrier()`, so that they all see the same machine. Each iteration
starts one row further down the list (a rotation), so no row always runs
first, right after another row's allocations or the previous size. The time
of an iteration is the maximum over ranks (one all-reduce MAX after the
loop); a row reports the median, the quartiles and min-max over iterations,
and its ratio is the median over raw's median. With `check`, every call first
runs once, untimed, and its results are compared on every rank with the raw
call's (or the family's exact reference); a variant must also leave the
inputs it was not donated unchanged.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from distir.bench.families import Case, Family, Setup, Variant
from distir.bench.sizes import KIB, MIB, format_size

RAW = "raw"
CLONE_OP = "raw clone+op"


@dataclass(frozen=True)
class BenchConfig:
    """What every rank runs (pickled to the ranks, families included)."""

    families: tuple[Family, ...]
    sizes: tuple[int, ...]
    dtypes: tuple[str, ...] = ("float32",)
    ops: tuple[str, ...] = ("sum",)
    check: bool = False
    quick: bool = False
    iters: int | None = None
    warmup: int | None = None
    backend: str = "gloo"
    bind: str = "threads"


def iterations_for(size: int, quick: bool = False) -> tuple[int, int]:
    """(timed iterations, warm-up iterations) for a message size: enough
    that the median of a small message is stable (a 4 KiB call lasts 0.1-0.5
    ms and one scheduler hiccup on a loaded machine costs more: hundreds of
    iterations keep the median where it is; measured, 10 iterations moved
    --quick's 4K ratios by 30% between runs)."""
    if quick:
        # A first look in a few minutes: fewer iterations, so the ratios move
        # more between runs (16 MiB rows at 12 iterations agreed within 10%
        # between two runs for 14 of 35 ratios at P=2); the default is for
        # numbers to compare.
        if size <= 64 * KIB:
            return 100, 10
        return (30, 3) if size <= MIB else (15, 2) if size <= 16 * MIB else (5, 1)
    if size <= 64 * KIB:
        return 300, 30
    if size <= MIB:
        return 60, 5
    return (15, 2) if size <= 16 * MIB else (7, 1)


@dataclass
class Call:
    """One timed row: the call, its untimed reset, and for checking, the
    inputs it reads and which of them it may overwrite."""

    name: str
    run: Callable[[], Any]
    reset: Callable[[], object] | None = None
    program: Any = None
    inputs: tuple[Any, ...] = ()
    donated: tuple[int, ...] = ()


def _variant_call(
    variant: Variant, program: Any, inputs: tuple[Any, ...], step: Callable[[Any], Any] | None
) -> Call:
    if step is not None:  # user code around the program (the family's `step`)
        return Call(variant.name, lambda: step(program), None, program)
    donated = variant.donated(len(inputs))
    # A donated variant gets its own copy of the inputs it may overwrite,
    # restored from the family's inputs before every call.
    own = tuple(x.clone() if i in donated else x for i, x in enumerate(inputs))
    kwargs: dict[str, Any] = {}
    if variant.donate:
        kwargs["donate"] = variant.donate

    def run() -> Any:
        return program.run(*own, **kwargs)  # the caller drops the result, as a user would

    def reset() -> None:
        for i in donated:
            own[i].copy_(inputs[i])

    return Call(variant.name, run, reset if donated else None, program, own, donated)


def make_calls(family: Family, setup: Setup, world_size: int) -> list[Call]:
    """The raw row, the `raw clone+op` row (where the family has one) and
    every compiled variant, in table order."""
    import distir

    calls = [Call(RAW, setup.raw, setup.reset)]
    if setup.clone_op is not None:
        calls.append(Call(CLONE_OP, setup.clone_op, inputs=setup.inputs))
    calls.extend(Call(b.name, b.run, b.reset) for b in setup.baselines)
    for variant in family.variants:
        program = distir.compile(setup.program, variant.pipeline_for(world_size),
                                 implementations=variant.implementations,
                                 agreement=variant.agreement)  # fmt: skip
        calls.append(_variant_call(variant, program, setup.inputs, setup.step))
    return calls


def compare(got: Sequence[Any], expected: Sequence[Any], world_size: int) -> str | None:
    """None when `got` equals `expected` (integers exactly, floats within a
    few ulps per rank, for reduction order), else what differs."""
    import torch

    if len(got) != len(expected):
        return f"{len(got)} results, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        if tuple(g.shape) != tuple(e.shape) or g.dtype != e.dtype:
            return (f"result #{i} is {tuple(g.shape)} {g.dtype}, expected "
                    f"{tuple(e.shape)} {e.dtype}")  # fmt: skip
        diff = (g.double() - e.double()).abs()
        if e.dtype.is_floating_point:
            tolerance = 4 * world_size * torch.finfo(e.dtype).eps * (1 + e.double().abs())
            bad = (diff > tolerance) | (g.isnan() != e.isnan())
        else:
            bad = g != e
        wrong = int(bad.sum())
        if wrong:
            worst = float(diff[bad].nan_to_num(float("inf")).max())
            return f"result #{i}: {wrong} of {e.numel()} elements differ (max |error| {worst:.3g})"
    return None


def _as_tuple(results: Any) -> tuple[Any, ...]:
    return results if isinstance(results, tuple) else (results,)


def check_calls(calls: Sequence[Call], setup: Setup, world_size: int) -> dict[str, tuple[str, str]]:
    """Runs every call once, untimed, on every rank; returns, identically on
    every rank, name -> (verdict, detail): `ok`, `WRONG` (detail: which ranks
    and why), `ref` for a raw call that is the reference, `n/a` for a raw
    call that computes something else (the family has an exact reference)."""
    import torch.distributed as dist

    if setup.reference is not None:
        expected = tuple(t.clone() for t in setup.reference())
    else:
        if setup.reset is not None:
            setup.reset()
        expected = tuple(t.clone() for t in setup.raw())
    pristine = tuple(x.clone() for x in setup.inputs)
    local: dict[str, str | None] = {}
    for call in calls:
        if call.name == RAW:
            continue
        if call.reset is not None:
            call.reset()
        problem = compare(_as_tuple(call.run()), expected, world_size)
        for i, x in enumerate(call.inputs):
            if problem is None and i not in call.donated and not x.equal(pristine[i]):
                problem = f"input #{i} was modified but not donated"
        local[call.name] = problem
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, local)
    verdicts = {RAW: ("ref", "") if setup.reference is None else ("n/a", "raw computes another op")}
    for name in local:
        bad = [f"rank {r}: {g[name]}" for r, g in enumerate(gathered) if g[name]]
        verdicts[name] = ("WRONG", "; ".join(bad)) if bad else ("ok", "")
    return verdicts


def bind_to_core(rank: int, world_size: int) -> int | None:
    """Runs this rank's calling thread (and the threads it creates later)
    on one CPU of those the process may use, the rank-th, when there are at
    least `world_size`; returns it (None: not bound). The backend's threads
    made before (gloo's, for the default group) stay unbound.

    Why the calling thread: the scheduler moving it between the cores of a
    2-core VM is much of the spread of a small message's time (measured, 1
    MiB all-reduce at P=2, 100 iterations after a barrier: medians 2.0-2.7
    ms, quartiles 1.35-4.33 ms unbound; 1.3-1.5 ms and 1.01-3.41 ms bound).
    `bind_threads` places gloo's threads as well."""
    import os

    cpus = _cpus_for(world_size)
    if cpus is None:
        return None
    cpu = cpus[rank]
    os.sched_setaffinity(0, {cpu})
    return cpu


def _cpus_for(world_size: int) -> list[int] | None:
    """The CPUs this thread may use, when every rank can have one of them
    (None: fewer than `world_size`, or no CPU affinity here: not Linux)."""
    import os

    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return cpus if world_size <= len(cpus) else None


#: gloo's threads by name: the workers that run a collective's algorithm
#: (c10d's), and the event loop that moves a pair's bytes (gloo's own)
GLOO_WORKER, GLOO_LOOP = "pt_gloo_runloop", "gloo_tcp_loop"


def bind_threads(rank: int, world_size: int) -> int | None:
    """What `bind_to_core` does, and gloo's threads of every group made so
    far placed too: its workers on the rank's CPU (they run while the
    calling thread waits), its event loops on the next rank's CPU (they
    wake for every message, also while the calling thread computes).
    Returns the rank's CPU (None: not bound, when P > CPUs or the platform
    has no CPU affinity). Run again after groups are created: their threads
    are placed then.

    Measured (1 MiB all-reduce, P=2, 150 iterations after a barrier, 10th
    to 90th percentile): calling thread bound only 0.65-2.74 and 0.79-3.80
    ms; workers with it and event loops on the other CPU 0.72-1.24 and
    0.83-1.21 ms (every thread on the rank's CPU: median 3.1 ms; workers on
    the other CPU: 0.89-1.45 ms)."""
    import os

    cpus = _cpus_for(world_size)
    if cpus is None or not os.path.isdir("/proc/self/task"):
        return None
    cpu, other = cpus[rank], cpus[(rank + 1) % len(cpus)]
    os.sched_setaffinity(0, {cpu})
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if name == GLOO_WORKER:
                os.sched_setaffinity(int(tid), {cpu})
            elif name == GLOO_LOOP:
                os.sched_setaffinity(int(tid), {other})
        except OSError:  # the thread ended meanwhile
            continue
    return cpu


def sync_for(device: str) -> Callable[[], None]:
    import torch

    if device == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def time_calls(
    calls: Sequence[Call], iters: int, warmup: int, device: str,
    settle: Callable[[], object] | None = None,
) -> dict[str, list[float]]:
    """Seconds per timed iteration for every call, the slowest rank's.
    `settle` runs once after the warm-up, which made the variants' process
    groups and their threads (without a warm-up, after the first
    iteration, which made them)."""
    import torch
    import torch.distributed as dist

    sync = sync_for(device)
    times: dict[str, list[float]] = {call.name: [] for call in calls}
    for i in range(warmup + iters):
        if i == max(warmup, 1) and settle is not None:
            settle()
        shift = i % len(calls)
        for call in [*calls[shift:], *calls[:shift]]:
            if call.reset is not None:
                call.reset()
            sync()
            dist.barrier()
            start = time.perf_counter()
            call.run()
            sync()
            elapsed = time.perf_counter() - start
            if i >= warmup:
                times[call.name].append(elapsed)
    for name, mine in times.items():
        t = torch.tensor(mine, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times[name] = t.cpu().tolist()
    return times


def bench_rank(context: Any, config: BenchConfig) -> list[dict]:
    """Runs on every rank (through `distir.launch`); returns the rows,
    identical on every rank."""
    world_size, rank = context.world_size, context.rank
    device = "cuda" if config.backend == "nccl" else "cpu"
    bind = None
    if config.bind == "core":
        bind_to_core(rank, world_size)
    elif config.bind == "threads":
        bind = lambda: bind_threads(rank, world_size)  # noqa: E731
        bind()
    rows: list[dict] = []
    for family in config.families:
        for dtype, op in family.cases(config.dtypes, config.ops):
            for nbytes in config.sizes:
                case = Case(nbytes, world_size, rank, device, dtype, op)
                setup = family.setup(case)
                calls = make_calls(family, setup, world_size)
                verdicts = check_calls(calls, setup, world_size) if config.check else {}
                iters, warmup = iterations_for(nbytes, config.quick)
                iters = config.iters or iters
                warmup = warmup if config.warmup is None else config.warmup
                times = time_calls(calls, iters, warmup, device, bind)
                raw_median = statistics.median(times[RAW])
                mine = [make_row(family, case, call, setup.nbytes, times[call.name], raw_median,
                                 verdicts.get(call.name), times[RAW]) for call in calls]  # fmt: skip
                rows.extend(mine)
                if rank == 0:
                    _progress(mine)
                del setup, calls
    return rows


def make_row(family: Family, case: Case, call: Call, nbytes: int, times: Sequence[float],
             raw_median: float, verdict: tuple[str, str] | None,
             raw_times: Sequence[float] = ()) -> dict:  # fmt: skip
    """One JSON row (the keys the report and saved results read).

    `paired_ratio` is the median over iterations of this row's time over
    raw's in the same iteration (the two ran a few calls apart): a drift of
    the machine's load between iterations cancels in it, where the ratio of
    medians (`ratio_to_raw`, the table's) keeps it."""
    median = statistics.median(times)
    paired = [t / r for t, r in zip(times, raw_times) if r > 0]
    algbw = nbytes / median / 1e9 if median > 0 else 0.0
    plan = [name for _, name in call.program.plan_summary()] if call.program is not None else []
    return {
        "family": family.name,
        "variant": call.name,
        "P": case.world_size,
        "dtype": case.dtype,
        "op": case.op,
        "size": case.nbytes,
        "size_label": format_size(case.nbytes),
        "bytes": nbytes,
        "median_ms": median * 1e3,
        "min_ms": min(times) * 1e3,
        "max_ms": max(times) * 1e3,
        "q1_ms": _quartiles(times)[0] * 1e3,
        "q3_ms": _quartiles(times)[1] * 1e3,
        "iterations": len(times),
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * family.bus_factor(case.world_size),
        "raw_median_ms": raw_median * 1e3,
        "ratio_to_raw": median / raw_median if raw_median > 0 else float("nan"),
        "paired_ratio": statistics.median(paired) if paired else float("nan"),
        "implementations": sorted(set(plan)),
        "check": verdict[0] if verdict else None,
        "check_detail": verdict[1] if verdict else "",
    }


def _quartiles(times: Sequence[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles (min and max for fewer than 2 values)."""
    if len(times) < 2:
        return min(times), max(times)
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q1, q3


def _progress(rows: Sequence[dict]) -> None:
    first = rows[0]
    parts = []
    for r in rows:
        ratio = "" if r["variant"] == RAW else f" ({r['ratio_to_raw']:.2f}x)"
        wrong = " WRONG" if r["check"] == "WRONG" else ""
        parts.append(f"{r['variant']} {r['median_ms']:.2f} ms{ratio}{wrong}")
    what = " ".join(x for x in (first["family"], first["dtype"], first["op"]) if x)
    print(f"  P={first['P']} {what} {first['size_label']:>4}: " + " | ".join(parts),
          file=sys.stderr, flush=True)  # fmt: skip


def run_benchmark(
    config: BenchConfig, nprocs: Sequence[int], *, timeout: float = 1800.0
) -> list[dict]:
    """Every group size in turn (`timeout` seconds each); rank 0's rows."""
    from distir.runtime.launch import launch

    rows: list[dict] = []
    for nproc in nprocs:
        print(f"distir-bench: P={nproc}, {config.backend}, sizes "
              f"{' '.join(format_size(s) for s in config.sizes)} ...", file=sys.stderr,
              flush=True)  # fmt: skip
        per_rank = launch(bench_rank, nproc, config, backend=config.backend, pass_context=True,
                          timeout=timeout, collective_timeout=min(timeout, 300.0))  # fmt: skip
        rows.extend(per_rank[0])
    return rows
