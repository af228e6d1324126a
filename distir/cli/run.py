"""`distir-run`: compile a dist program and run `@main` on P ranks.

    distir-run examples/all_reduce.mlir --nproc 4

starts 4 local gloo ranks on 127.0.0.1 (no cluster, no setup) and prints a
per-rank summary of every result and the time a run took. Under torchrun
(RANK, WORLD_SIZE and MASTER_ADDR set) it runs as that rank instead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from distir.errors import DistirError


@dataclass(frozen=True)
class RunRequest:
    program: str
    pipeline: str
    inputs: str | None
    seed: int
    dynamic_size: int
    repeat: int
    backend: str


def checksum(t: Any) -> str:
    data = t.detach().cpu().contiguous().view(-1)
    return f"{zlib.crc32(data.numpy().tobytes()):08x}"


def summarize(t: Any, limit: int = 6) -> str:
    flat = t.detach().cpu().reshape(-1)
    values = [round(v, 6) if isinstance(v, float) else v for v in flat[:limit].tolist()]
    more = ", ..." if flat.numel() > limit else ""
    shown = ", ".join(str(v) for v in values)
    return (
        f"{str(t.dtype).replace('torch.', '')}{list(t.shape)} crc32 {checksum(t)} "
        f"[{shown}{more}]"
    )


def run_rank(request: RunRequest, rank: int, world_size: int) -> dict:
    """Body of one rank: compile, make inputs, run (timed), summarise."""
    import torch

    import distir
    from distir.runtime.inputs import load_inputs, synthesize_inputs

    program = distir.compile(request.program, request.pipeline)
    if request.inputs:
        inputs = load_inputs(request.inputs, rank, world_size)
    else:
        inputs = synthesize_inputs(
            program.function, rank, world_size, request.seed, request.dynamic_size
        )
    if request.backend == "nccl":
        inputs = [x.cuda() for x in inputs]
    times = []
    results: Any = None
    for _ in range(request.repeat):
        torch.distributed.barrier()
        start = time.perf_counter()
        results = program.run(*inputs)
        if request.backend == "nccl":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    if not isinstance(results, tuple):
        results = (results,)
    return {
        "rank": rank,
        "results": [summarize(r) for r in results],
        "times_ms": times,
    }


def _launched_rank(ctx, request: RunRequest) -> dict:
    return run_rank(request, ctx.rank, ctx.world_size)


def print_report(request: RunRequest, reports: Sequence[dict], where: str) -> None:
    print(
        f"distir-run: {request.program} on {where} "
        f"(pipeline: {request.pipeline or 'none'})"
    )
    for report in reports:
        times = report["times_ms"]
        timing = (
            f"{times[0]:.3f} ms"
            if len(times) == 1
            else f"median {statistics.median(times):.3f} ms over {len(times)} runs "
            f"(first {times[0]:.3f} ms)"
        )
        print(f"rank {report['rank']}: run {timing}")
        for i, line in enumerate(report["results"]):
            print(f"  result #{i}: {line}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distir-run",
        description="Run a dist program's @main on P local ranks (or as a torchrun rank).",
    )
    parser.add_argument("program", help="a .mlir file")
    parser.add_argument("--nproc", type=int, default=4, help="local ranks to start (default 4)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--inputs",
        help="a .py defining make_inputs(rank, world_size), or a .pt of tensors",
    )
    source.add_argument(
        "--random-inputs",
        type=int,
        default=0,
        metavar="SEED",
        help="synthesise inputs from the IR with this seed (the default, seed 0)",
    )
    parser.add_argument("--dynamic-size", type=int, default=4,
                        help="size of dynamic dimensions in synthesised inputs")
    parser.add_argument("--pipeline", "-p", default="", help="passes to run first")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per rank")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds before a hung run is killed")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    request = RunRequest(
        program=args.program,
        pipeline=args.pipeline,
        inputs=args.inputs,
        seed=args.random_inputs,
        dynamic_size=args.dynamic_size,
        repeat=max(1, args.repeat),
        backend=args.backend,
    )
    try:
        import distir
        from distir.runtime.launch import init_from_environment, launch, under_torchrun

        # Compile once here: a bad program fails before any rank starts.
        distir.compile(request.program, request.pipeline)
        if under_torchrun():
            import torch.distributed as dist

            ctx = init_from_environment(request.backend)
            try:
                report = run_rank(request, ctx.rank, ctx.world_size)
            finally:
                dist.destroy_process_group()
            print_report(request, [report], f"torchrun rank {ctx.rank} of {ctx.world_size}")
            return 0
        reports = launch(
            _launched_rank,
            args.nproc,
            request,
            backend=request.backend,
            timeout=args.timeout,
            pass_context=True,
        )
    except DistirError as e:
        print(f"distir-run: error: {e}", file=sys.stderr)
        return 1
    except FileNotFoundError as e:
        print(f"distir-run: error: {e}", file=sys.stderr)
        return 1
    print_report(request, reports, f"{args.nproc} local {request.backend} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
