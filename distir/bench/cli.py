"""`distir-bench`: distir against raw torch.distributed, side by side.

    distir-bench --quick -c
    distir-bench --nproc 2 4 -b 4K -e 64M -f 16 -c --out results/
    distir-bench --families all_reduce -d float32 int64 -o sum max -n 20 -w 2

Options follow nccl-tests (`-b/-e/-f` size sweep, `-n` iterations, `-w`
warm-up, `-d` dtype, `-o` reduction op, `-c` check). Results go into a
directory (`--out`, default `bench-results/<timestamp>/`): `results.json`,
`table.txt` and one `busbw-<family>.png` per family. With `-c`, a wrong
result is a `WRONG` in the check column, a line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from distir.bench.dispatch import run_dispatch
from distir.bench.families import FAMILIES, NATIVE_DTYPES, OPS, Family
from distir.bench.report import (
    Report,
    check_targets,
    fit_cost_model,
    format_cost_model,
    format_dispatch,
    format_summary,
    format_table,
    format_targets,
    format_wrong,
    save,
)
from distir.bench.runner import BenchConfig, run_benchmark
from distir.bench.sizes import format_size, parse_size, size_sweep
from distir.errors import DistirError

FULL_SIZES = ("4K", "64K", "1M", "16M", "64M")
#: --quick: a small matrix (one group size, a small and a large message) that
#: fits in a few minutes on a loaded 2-core machine; the full matrix is the default
QUICK_SIZES = ("4K", "1M")
QUICK_NPROC = (2,)
QUICK_DISPATCH_REPEATS = 5
DEFAULT_NPROC = (2, 4)
RESULTS_ROOT = "bench-results"


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser(registry: Mapping[str, Family] = FAMILIES) -> argparse.ArgumentParser:
    listing = "\n".join(
        f"  {name:<13} {family.doc}\n  {'':<13} variants: {'; '.join(v.name for v in family.variants)}"
        for name, family in registry.items()
    )
    parser = argparse.ArgumentParser(
        prog="distir-bench",
        description="Time distir's collectives against raw torch.distributed, side by side.\n"
        "nccl-tests conventions: S is the whole buffer (all-gather: the output), busbw =\n"
        "algbw x the family's bus factor, an iteration takes as long as its slowest rank.",
        epilog=f"families (each also times `raw`, the baseline):\n{listing}\n\n"
        "Native families also time `raw clone+op`: x.clone() (or a fresh output), then the raw\n"
        "collective. Donated variants call Program.run(..., donate=...) and reset the donated\n"
        "inputs, untimed, before each call.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sizes = parser.add_argument_group("sizes (default " + " ".join(FULL_SIZES) + ")")
    sizes.add_argument("-b", "--minbytes", type=_size, metavar="SIZE",
                       help="smallest size of the sweep (4K, 1M, ...; default: --maxbytes)")  # fmt: skip
    sizes.add_argument("-e", "--maxbytes", type=_size, metavar="SIZE",
                       help="largest size of the sweep (default: --minbytes)")  # fmt: skip
    sizes.add_argument("-f", "--stepfactor", type=int, default=2, metavar="F",
                       help="multiply the size by F at each step (default 2)")  # fmt: skip
    sizes.add_argument("--sizes", type=_size, nargs="+", metavar="SIZE",
                       help="an explicit list of sizes instead of -b/-e/-f")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help=f"preset: P={' and '.join(map(str, QUICK_NPROC))}, sizes "
                             f"{' '.join(QUICK_SIZES)}, fewer iterations (100 at 4K)")  # fmt: skip
    parser.add_argument("--nproc", type=int, nargs="+", metavar="P",
                        help="group sizes to run (default " + " ".join(map(str, DEFAULT_NPROC)) + ")")  # fmt: skip
    parser.add_argument("--families", nargs="+", default=list(registry), choices=list(registry),
                        metavar="FAMILY", help="families to run (default all, listed below)")  # fmt: skip
    parser.add_argument("-d", "--datatype", nargs="+", default=["float32"],
                        choices=[*NATIVE_DTYPES, "all"], metavar="DTYPE",
                        help=f"dtypes of the native families ({' '.join(NATIVE_DTYPES)} or all; "
                             "default float32); the others have a fixed dtype")  # fmt: skip
    parser.add_argument("-o", "--op", nargs="+", default=["sum"], choices=[*OPS, "all"],
                        metavar="OP", help=f"reductions of the native all_reduce ({' '.join(OPS)} "
                                           "or all; default sum)")  # fmt: skip
    parser.add_argument("-n", "--iters", type=int, metavar="N",
                        help="timed iterations per row (default: by size, 300 at 4K to 7 at 64M)")  # fmt: skip
    parser.add_argument("-w", "--warmup", type=int, metavar="N",
                        help="untimed iterations per row (default: by size, 3 to 1)")  # fmt: skip
    parser.add_argument("-c", "--check", action="store_true",
                        help="compare every result with raw's (or an exact reference) on every "
                             "rank, untimed; a wrong one fails the run")  # fmt: skip
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--bind", choices=("threads", "core", "none"), default="threads",
                        help="threads (default): when P <= CPUs, rank r's calling thread and "
                             "gloo's workers run on the r-th CPU this process may use, gloo's "
                             "event loops on the next; core: the calling thread only (as "
                             "mpirun --bind-to core); none: wherever the scheduler puts them")  # fmt: skip
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help=f"directory for results.json, table.txt and the plots (default "
                             f"{RESULTS_ROOT}/<timestamp>/)")  # fmt: skip
    parser.add_argument("--no-plots", action="store_true", help="skip the busbw plots")
    parser.add_argument("--dispatch-chain", type=int, default=1000, metavar="N",
                        help="ops in the 1-rank dispatch-overhead chain (0 to skip; default 1000)")  # fmt: skip
    parser.add_argument("--dispatch-repeats", type=int, metavar="N",
                        help="repeats of the dispatch chain (default 15; --quick 5)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                        help="seconds one group size may take (default 1800)")  # fmt: skip
    return parser


def resolve_sizes(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[int]:
    """The message sizes from --sizes, -b/-e/-f, --quick or the default."""
    swept = args.minbytes is not None or args.maxbytes is not None
    if args.sizes and swept:
        parser.error("give either --sizes or -b/-e/-f, not both")
    if args.sizes:
        return list(args.sizes)
    if swept:
        low = args.minbytes if args.minbytes is not None else args.maxbytes
        high = args.maxbytes if args.maxbytes is not None else args.minbytes
        try:
            return size_sweep(low, high, args.stepfactor)
        except ValueError as e:
            parser.error(str(e))
    return [parse_size(s) for s in (QUICK_SIZES if args.quick else FULL_SIZES)]


def default_out(root: Path = Path(RESULTS_ROOT)) -> Path:
    """`bench-results/<YYYYmmdd-HHMMSS>/`, with a suffix if that exists."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out, k = root / stamp, 1
    while out.exists():
        k += 1
        out = root / f"{stamp}-{k}"
    return out


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def main(argv: Sequence[str] | None = None, *, registry: Mapping[str, Family] = FAMILIES) -> int:
    """Runs the benchmark; 0 when it ran (and, with -c, every result was right)."""
    parser = build_parser(registry)
    args = parser.parse_args(argv)
    nprocs = args.nproc or list(QUICK_NPROC if args.quick else DEFAULT_NPROC)
    if args.dispatch_repeats is None:
        args.dispatch_repeats = QUICK_DISPATCH_REPEATS if args.quick else 15
    if any(p < 1 for p in nprocs):
        parser.error("--nproc values must be >= 1")
    if (args.iters is not None and args.iters < 1) or (args.warmup or 0) < 0:
        parser.error("-n must be >= 1 and -w >= 0")
    sizes = resolve_sizes(args, parser)
    dtypes = list(NATIVE_DTYPES) if "all" in args.datatype else list(dict.fromkeys(args.datatype))
    ops = list(OPS) if "all" in args.op else list(dict.fromkeys(args.op))
    out = args.out if args.out is not None else default_out()
    config = BenchConfig(
        families=tuple(registry[name] for name in dict.fromkeys(args.families)),
        sizes=tuple(sizes), dtypes=tuple(dtypes), ops=tuple(ops), check=args.check,
        quick=args.quick, iters=args.iters, warmup=args.warmup, backend=args.backend,
        bind=args.bind,
    )  # fmt: skip
    meta = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": list(sys.argv[1:] if argv is None else argv),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "backend": args.backend,
        "nproc": nprocs,
        "sizes": [format_size(s) for s in sizes],
        "families": [f.name for f in config.families],
        "dtypes": dtypes,
        "ops": ops,
        "check": args.check,
        "quick": args.quick,
        "iters": args.iters,
        "warmup": args.warmup,
        "bind": args.bind,
        "load_before": _load(),
    }
    start = time.perf_counter()
    import torch

    meta["torch"] = torch.__version__
    try:
        report = Report(meta, run_benchmark(config, nprocs, timeout=args.timeout))
        if args.dispatch_chain > 0:
            report.dispatch = run_dispatch(args.dispatch_chain, args.dispatch_repeats,
                                           args.backend, args.timeout)  # fmt: skip
    except DistirError as e:
        print(f"distir-bench: {e}", file=sys.stderr)
        return 1
    meta["load_after"] = _load()
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    meta["wall_s"] = round(time.perf_counter() - start, 1)
    written = save(report, out, plots=not args.no_plots)
    print(format_table(report.rows))
    if report.dispatch is not None:
        print()
        print(format_dispatch(report.dispatch))
    fit = fit_cost_model(report.rows)
    if fit is not None:
        print(format_cost_model(fit))
    targets = format_targets(check_targets(report.rows))
    if targets:
        print(targets)
    summary = format_summary(report.rows)
    if summary:
        print(summary)
    print(f"\nresults in {out}/: {', '.join(p.name for p in written)} ({meta['wall_s']} s; load "
          f"average before {meta['load_before']}, after {meta['load_after']})")  # fmt: skip
    wrong = report.wrong_rows()
    if wrong:
        print(f"distir-bench: {len(wrong)} row(s) computed WRONG results:\n{format_wrong(wrong)}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
