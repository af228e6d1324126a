"""Where a small message's time goes at P=2: a run's phases, side by side with raw.

    python benchmarks/timeline.py [--iters 400] [--bytes 4096]

Starts two local gloo ranks, places their threads as `distir-bench` does
(`--bind threads`), and times, after a barrier each, alternately:

* a trusted donated all-reduce and broadcast against `dist.all_reduce` and
  `dist.broadcast` in place;
* a verified variable all-to-all against the fair baseline (the counts
  exchanged with `all_to_all_single`, then the rows);
* the fair baseline with 30 us of busy Python added before its first
  exchange, between the two, or after the second (what a microsecond of
  host work costs at each place).

For every row it prints the median over iterations of the slowest rank's
time (what `distir-bench` reports); for distir's rows also, per rank, the median microseconds since the
start of the run at which each collective was submitted, returned from
its submit, and completed (from `ProcessGroupResource._run` and, for a run
that submits its collective itself, `DirectCollective.submit`, both wrapped
here for timing), and the end of the run: the gaps between them are the run's
own Python, measured where it runs rather than in a hot loop.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import distir
from distir.bench.families import Case, all_to_all_setup
from distir.bench.runner import bind_threads
from distir.runtime.launch import launch
from distir.transport import groups
from distir.transport.direct import DirectCollective


def _spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _program(op: str, n: int) -> str:
    t = f"tensor<{n}xf32>"
    return f"func.func @main(%x: {t}) -> {t} {{\n  %y = {op} : {t}\n  func.return %y : {t}\n}}"


class _TimedWork:
    """A work whose wait stamps its completion."""

    def __init__(self, work, marks: list[int], clock: Callable[[], int]):
        self.work, self.marks, self.clock = work, marks, clock

    def wait(self, timeout=None):
        done = self.work.wait(timeout=timeout)
        self.marks.append(self.clock())
        return done


def _stamp_direct_submits(marks: list[int], clock: Callable[[], int]) -> Callable[[], None]:
    """Wraps the collective each `DirectCollective` made from now on submits
    (a specialised run calls it without `_run`); returns the undo."""
    original = DirectCollective.__init__

    def init(self, invocation, resource, submit, *args, **kwargs):
        def stamped(tensors, opts):
            marks.append(clock())
            work = submit(tensors, opts)
            marks.append(clock())
            return _TimedWork(work, marks, clock)

        original(self, invocation, resource, stamped, *args, **kwargs)

    DirectCollective.__init__ = init

    def undo() -> None:
        DirectCollective.__init__ = original

    return undo


def rank_main(context, nbytes: int, iters: int) -> dict[str, dict[str, list[float]]]:
    rank = context.rank
    marks: list[int] = []
    clock = time.perf_counter_ns
    undo_direct = _stamp_direct_submits(marks, clock)  # before the first run binds
    x = torch.randn(nbytes // 4)
    reduce = distir.compile(_program("dist.all_reduce sum %x", x.numel()), agreement=False)
    bcast = distir.compile(_program("dist.broadcast %x root 0", x.numel()), agreement=False)
    setup = all_to_all_setup(Case(nbytes, context.world_size, rank, "cpu", "float32", None))
    a2a = distir.compile(setup.program)
    rows, counts = setup.inputs
    exchanged, received = torch.empty_like(counts), torch.empty_like(rows)

    def fair(before: float = 0, between: float = 0, after: float = 0) -> Callable[[], None]:
        def call() -> None:
            _spin(before)
            dist.all_to_all_single(exchanged, counts)
            splits = exchanged.tolist()
            _spin(between)
            dist.all_to_all_single(received, rows, splits, counts.tolist())
            _spin(after)

        return call

    calls: dict[str, Callable[[], object]] = {
        "all-reduce, distir trusted donated": lambda: reduce.run(x, donate=True),
        "all-reduce, raw": lambda: dist.all_reduce(x),
        "broadcast, distir trusted donated": lambda: bcast.run(x, donate=True),
        "broadcast, raw": lambda: dist.broadcast(x, 0),
        "variable all-to-all, distir verified": lambda: a2a.run(rows, counts),
        "variable all-to-all, fair baseline": fair(),
        "fair baseline + 30 us before": fair(before=30),
        "fair baseline + 30 us between": fair(between=30),
        "fair baseline + 30 us after": fair(after=30),
    }
    for call in calls.values():  # groups made, buffers pooled
        call()
    bind_threads(rank, context.world_size)

    original = groups.ProcessGroupResource._run

    def timed_run(self, submit, args, options, invocation, wait):
        opts, timeout = options
        marks.append(clock())
        work = submit(*args, opts)
        marks.append(clock())
        if wait:
            work.wait(timeout=timeout)
        marks.append(clock())
        return None if wait else work

    groups.ProcessGroupResource._run = timed_run
    try:
        times: dict[str, list[list[int]]] = {name: [] for name in calls}
        names = list(calls)
        for i in range(iters):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                dist.barrier()
                marks.clear()
                start = clock()
                calls[name]()
                end = clock()
                times[name].append([m - start for m in marks] + [end - start])
    finally:
        groups.ProcessGroupResource._run = original
        undo_direct()
    return {
        name: {
            "marks": [statistics.median(column) / 1e3 for column in zip(*per_iteration)],
            "ends": [marks[-1] / 1e3 for marks in per_iteration],
        }
        for name, per_iteration in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=400)
    parser.add_argument("--bytes", type=int, default=4096)
    args = parser.parse_args()
    per_rank = launch(rank_main, 2, args.bytes, args.iters, pass_context=True, timeout=900)
    print(f"P=2, {args.bytes} bytes, {args.iters} iterations; microseconds since the start "
          "of the call (distir rows: each collective's submit, submit returned, completed; "
          "then the end)")  # fmt: skip
    for name in per_rank[0]:
        for rank, rows in enumerate(per_rank):
            marks = rows[name]["marks"]
            print(f"  {name:38s} rank {rank}: " + " ".join(f"{m:6.1f}" for m in marks))
        slowest = [max(ends) for ends in zip(*(rows[name]["ends"] for rows in per_rank))]
        print(f"  {name:38s} slowest rank: {statistics.median(slowest):6.1f}")


if __name__ == "__main__":
    main()
