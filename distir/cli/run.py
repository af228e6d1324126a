"""`distir-run`: compile a dist program and run its entry function on P ranks.

    distir-run examples/all_reduce.mlir --nproc 4

starts 4 local gloo ranks on 127.0.0.1 (no cluster, no setup) and prints a
per-rank summary of every result and the time a run took. Under torchrun
(`TORCHELASTIC_RUN_ID` set by torchrun's agent) it runs as that rank instead.

Everything that can be checked before a rank starts is checked in this
process, once: the program file, its syntax and verification, the pass
pipeline, the world sizes its IR allows, the inputs file, the backend.
Bad input ends with one `distir-run: error:` line and exit status 1 (2 for
bad flags); SIGINT and SIGTERM stop every rank and exit with 130 and 143.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
import traceback
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

# Only the standard library is imported before `main` has taken over SIGINT
# and SIGTERM: distir, xDSL and torch load inside the functions that use them.

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM

DEFAULT_NPROC = 4


@dataclass(frozen=True)
class RunRequest:
    """What every rank needs to run the program: the source text itself
    (ranks parse it, with `filename` in locations), never a path to re-read."""

    source: str
    filename: str
    pipeline: str
    entry: str
    inputs: str | None
    seed: int
    dynamic_size: int
    repeat: int
    backend: str
    deadline: float
    keep_results: bool = False
    #: with --tolerate: survivors recover and finish their runs on the new group
    tolerate: int | None = None


def checksum(t: Any) -> str:
    """CRC32 of a tensor's bytes (any dtype, bfloat16 and bool included)."""
    import torch

    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
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


# Reading the program -------------------------------------------------------------------


def read_program(argument: str) -> tuple[str, str]:
    """(text, name for locations) of the program argument: a file, or `-`
    for standard input. Raises `DistirError` saying what is wrong."""
    from distir.errors import DistirError

    if argument == "-":
        return sys.stdin.read(), "<stdin>"
    path = Path(argument)
    if path.is_dir():
        raise DistirError(f"{argument} is a directory, not a program file")
    if not path.exists():
        hint = ""
        if not path.suffix and path.with_suffix(".mlir").is_file():
            hint = f" (did you mean {argument}.mlir?)"
        raise DistirError(f"{argument}: no such file{hint}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DistirError(f"cannot read {argument}: {e.strerror}") from None
    try:
        return data.decode("utf-8"), argument
    except UnicodeDecodeError as e:
        raise DistirError(
            f"{argument} is not a text file: byte {e.start} is not UTF-8"
        ) from None


def parse_program(text: str, filename: str):
    """The module `text` holds; a parse error is a located `CompileError`."""
    from xdsl.utils.exceptions import DiagnosticException, ParseError

    from distir.errors import CompileError
    from distir.ir.parsing import parse_module

    try:
        return parse_module(text, filename)
    except ParseError as e:
        lines = e.span.print_with_context(None).splitlines()[1:]
        hint = ""
        if not filename.endswith(".mlir") and filename != "<stdin>":
            hint = " (distir-run reads MLIR text, as in a .mlir file)"
        raise CompileError(
            "\n".join([f"{e.span.get_location()}: {e.msg}{hint}", *lines])
        ) from None
    except DiagnosticException as e:
        raise CompileError(f"{filename}: {e}") from None


def entry_function(module, entry: str):
    from xdsl.dialects import func

    from distir.errors import CompileError

    for op in module.ops:
        if isinstance(op, func.FuncOp) and op.sym_name.data == entry:
            return op
    raise CompileError(f"the module has no entry function @{entry}")


# One rank ------------------------------------------------------------------------------


def one_line(e: BaseException) -> str:
    """`ValueError: boom (at inputs.py:5)`: an unexpected exception without
    its traceback, located at the deepest frame."""
    message = str(e).strip().splitlines()[0] if str(e).strip() else ""
    frames = traceback.extract_tb(e.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {message}{where}" if message else f"{type(e).__name__}{where}"


def _rank_inputs(request: RunRequest, function, rank: int, world_size: int) -> list:
    from distir.errors import DistirError
    from distir.runtime.inputs import check_inputs, load_inputs, synthesize_inputs

    if request.inputs:
        inputs = load_inputs(request.inputs, rank, world_size)
        try:
            check_inputs(inputs, function)
        except DistirError as e:
            raise DistirError(f"{request.inputs}: {e}") from None
        return inputs
    return synthesize_inputs(function, rank, world_size, request.seed, request.dynamic_size)


def _agree_on_inputs(error: str | None, world_size: int) -> None:
    """Every rank learns whether every rank has its inputs, so that one
    rank's bad inputs stop all of them at once, before any collective."""
    import torch.distributed as dist

    from distir.errors import DistirError

    errors: list[str | None] = [None] * world_size
    dist.all_gather_object(errors, error)
    if error is not None:
        raise DistirError(error)
    failed = [r for r, e in enumerate(errors) if e is not None]
    if failed:
        who = ", ".join(str(r) for r in failed)
        raise DistirError(f"not run: rank{'s' if len(failed) > 1 else ''} {who} had no inputs")


def run_rank(request: RunRequest, rank: int, world_size: int) -> dict:
    """Body of one rank: make inputs (synthesised from the program as
    written, before any pass), compile with the pipeline, run (timed),
    summarise."""
    import torch

    import distir
    from distir.errors import DistirError

    module = parse_program(request.source, request.filename)
    error = None
    inputs: list = []
    try:
        inputs = _rank_inputs(request, entry_function(module, request.entry), rank, world_size)
    except DistirError as e:
        error = str(e)
    except Exception as e:
        error = one_line(e)
    _agree_on_inputs(error, world_size)
    program = distir.compile(
        module, request.pipeline, entry=request.entry, deadline=request.deadline
    )
    if request.backend == "nccl":
        inputs = [x.cuda() for x in inputs]
    times = []
    results: Any = None
    group = None
    recovered: list[str] = []
    while len(times) < request.repeat:
        try:
            torch.distributed.barrier(group=group)
            start = time.perf_counter()
            results = program.run(*inputs, group=group)
        except (DistirError, RuntimeError):
            if request.tolerate is None:
                raise
            # A peer was lost: agree on the survivors and finish the runs on them.
            m = distir.recover(deadline=request.deadline + 10.0)
            group = m.group
            inputs = _rank_inputs(request, entry_function(module, request.entry), m.rank, m.size)
            recovered.append(
                f"recovered: epoch {m.epoch}, rank {m.rank} of {m.size} "
                f"({_rank_list(m.ranks)}; lost {_rank_list(m.lost)})"
            )
            continue
        if request.backend == "nccl":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    if not isinstance(results, tuple):
        results = (results,)
    report = {
        "rank": rank,
        "results": [summarize(r) for r in results],
        "times_ms": times,
        "recovered": recovered,
    }
    if request.keep_results:
        report["values"] = [r.detach().cpu() for r in results]
    return report


def _launched_rank(ctx, request: RunRequest) -> dict:
    from distir.errors import DistirError

    try:
        return run_rank(request, ctx.rank, ctx.world_size)
    except DistirError:
        raise
    except Exception as e:
        # The parent prints one line per rank, never a traceback.
        raise DistirError(one_line(e)) from None


# Reporting -----------------------------------------------------------------------------


def print_report(request: RunRequest, reports: Sequence[dict], where: str) -> None:
    print(
        f"distir-run: {request.filename} on {where} "
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
        for line in report.get("recovered", ()):
            print(f"  {line}")
        for i, line in enumerate(report["results"]):
            print(f"  result #{i}: {line}")


def _rank_list(ranks: Sequence[int]) -> str:
    """`rank 2`, `ranks 0-3`, `ranks 0, 2, 3`."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def format_failures(failures: dict[int, str], nproc: int) -> str:
    """`N of P ranks failed:` and one line per distinct reason, naming the
    ranks that gave it (a reason every rank gave is printed once)."""
    by_reason: dict[str, list[int]] = {}
    for rank, why in sorted(failures.items()):
        # The base class adds nothing to the message; specific ones do.
        why = why.removeprefix("DistirError: ")
        by_reason.setdefault(why, []).append(rank)
    lines = [f"{len(failures)} of {nproc} {'rank' if nproc == 1 else 'ranks'} failed:"]
    for why, ranks in by_reason.items():
        lines.append(f"  {_rank_list(ranks)}: {why}")
    return "\n".join(lines)


# Flags ---------------------------------------------------------------------------------


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _at_least(low: int, kind: type = int):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return value

    return parse


def _positive_seconds(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _version() -> str:
    import importlib.metadata

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    return (
        f"distir-run {version('distir')} (torch {version('torch')}, xdsl {version('xdsl')}, "
        f"Python {sys.version.split()[0]})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog="distir-run",
        description="Run a dist program's entry function on P local ranks, "
        "or as one rank of a torchrun job.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="""\
examples:
  distir-run examples/all_reduce.mlir --nproc 2
  distir-run examples/ciphertext_add.mlir --nproc 3 -p lower-ciphertext-add
  distir-opt -p canonicalize prog.mlir | distir-run - --nproc 4
  torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-id JOB \\
      --rdzv-endpoint HOST:29500 -m distir.cli.run prog.mlir

exit status: 0 success, 1 a bad program, input or a failed rank, 2 bad flags,
130 after SIGINT, 143 after SIGTERM (every rank is stopped first).""",
    )
    parser.add_argument("program", help="the program: a file of dist IR, or - for standard input")
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument(
        "--nproc",
        type=_at_least(1),
        default=None,
        metavar="N",
        help=f"local ranks to start (default: {DEFAULT_NPROC}; not allowed under torchrun, "
        "which sets the world size)",
    )
    parser.add_argument(
        "--entry",
        default="main",
        metavar="NAME",
        help="the function to run (default: %(default)s)",
    )
    parser.add_argument(
        "--pipeline",
        "-p",
        default="",
        help="passes to run first, in distir-opt -p syntax (default: none)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--inputs",
        metavar="FILE",
        help="a .py defining make_inputs(rank, world_size), called in every rank, or a .pt "
        "holding a list of tensors (every rank) or one list per rank "
        "(default: synthesised from the program)",
    )
    source.add_argument(
        "--random-inputs",
        type=_at_least(0),
        default=0,
        metavar="SEED",
        help="seed of the inputs synthesised from the program (default: %(default)s)",
    )
    parser.add_argument(
        "--dynamic-size",
        type=_at_least(0),
        default=4,
        metavar="N",
        help="size of dynamic dimensions in synthesised inputs (default: %(default)s)",
    )
    parser.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="torch.distributed backend: gloo on CPU, nccl on one CUDA GPU per rank "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--repeat",
        type=_at_least(1),
        default=1,
        metavar="N",
        help="timed runs per rank, each after a barrier (default: %(default)s)",
    )
    parser.add_argument(
        "--deadline",
        type=_positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="seconds every collective may take before it fails with DeadlineExceeded on "
        "every rank (default: %(default)g)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=120.0,
        metavar="SECONDS",
        help="seconds before a hung launch is killed: the limit for starting every local "
        "rank and running to the end; under torchrun, the limit of the rendezvous "
        "(default: %(default)g)",
    )
    parser.add_argument(
        "--tolerate",
        type=_at_least(0),
        metavar="K",
        help="go on while at most K ranks are lost: the survivors agree on who is left "
        "(distir.recover), finish their runs on the new group and are reported with "
        "each lost rank's cause (default: any lost rank ends the run)",
    )
    parser.add_argument(
        "--output",
        "-o",
        metavar="FILE.pt",
        help="save every rank's results with torch.save: a list with one list of "
        "tensors per rank, in rank order (default: not saved)",
    )
    return parser


# The command ---------------------------------------------------------------------------


def _note(message: str) -> None:
    print(f"distir-run: note: {message}", file=sys.stderr)


def _check_output_path(output: str) -> None:
    from distir.errors import DistirError

    path = Path(output)
    if path.is_dir():
        raise DistirError(f"--output {output} is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise DistirError(f"--output {output}: directory {parent} does not exist")
    if path.exists() and not os.access(path, os.W_OK):
        raise DistirError(f"--output {output} is not writable")
    if not path.exists() and not os.access(parent, os.W_OK):
        raise DistirError(f"--output {output}: directory {parent} is not writable")


def _check_inputs_file(request: RunRequest, function, world_size: int) -> None:
    """What can be known about an inputs file without running a rank: that
    it exists and imports (`.py`), or loads and fits the program (`.pt`)."""
    from distir.errors import DistirError
    from distir.runtime.inputs import (
        check_inputs,
        inputs_from_data,
        load_input_factory,
        read_input_file,
    )

    path = Path(request.inputs or "")
    if path.suffix == ".py":
        load_input_factory(path)
    elif path.suffix == ".pt":
        data = read_input_file(path)
        for rank in range(world_size):
            inputs = inputs_from_data(data, path, rank, world_size)
            try:
                check_inputs(inputs, function)
            except DistirError as e:
                raise DistirError(f"{path}, inputs of rank {rank}: {e}") from None
    elif not path.exists():
        raise DistirError(f"inputs file {path} does not exist")
    else:
        raise DistirError(
            f"inputs file {path} must be a .py defining make_inputs(rank, world_size) or a .pt"
        )


def _check_point_to_point(module, entry: str, nproc: int) -> None:
    """Point-to-point traffic that deadlocks with `nproc` ranks (compile
    only rejects a deadlock found at every group size)."""
    from distir.errors import DistirError
    from distir.passes.verify_spmd import PointToPointDeadlock, check_point_to_point

    try:
        check_point_to_point(module, entry, nproc)
    except PointToPointDeadlock as e:
        raise DistirError(str(e)) from None


def _verifies(module) -> bool:
    """Whether `module` verifies; `distir.compile` reports why it does not."""
    from xdsl.utils.exceptions import DiagnosticException

    try:
        module.verify()
    except DiagnosticException:
        return False
    return True


def _run(args: argparse.Namespace) -> int:
    from distir.errors import DistirError
    from distir.runtime.launch import (
        check_backend,
        init_from_environment,
        launch,
        stale_rendezvous_variables,
        under_torchrun,
    )
    from distir.runtime.requirements import check_world_size

    torchrun = under_torchrun()
    if torchrun and args.nproc is not None:
        raise DistirError(
            f"--nproc cannot be used under torchrun: torchrun started this process as rank "
            f"{os.environ.get('RANK', '?')} of {os.environ.get('WORLD_SIZE', '?')} "
            "(set the number of ranks with torchrun --nproc-per-node and --nnodes)"
        )
    if not torchrun:
        stale = stale_rendezvous_variables()
        if stale:
            _note(
                f"ignoring {', '.join(stale)} in the environment: TORCHELASTIC_RUN_ID is "
                "not set, so this is no torchrun worker; starting local ranks"
            )
    nproc = int(os.environ["WORLD_SIZE"]) if torchrun else (args.nproc or DEFAULT_NPROC)
    if args.tolerate is not None and args.tolerate >= nproc:
        raise DistirError(f"--tolerate {args.tolerate} must be smaller than the {nproc} ranks")

    text, filename = read_program(args.program)
    request = RunRequest(
        source=text,
        filename=filename,
        pipeline=args.pipeline,
        entry=args.entry,
        inputs=args.inputs,
        seed=args.random_inputs,
        dynamic_size=args.dynamic_size,
        repeat=args.repeat,
        backend=args.backend,
        deadline=args.deadline,
        keep_results=args.output is not None,
        tolerate=args.tolerate,
    )
    if args.output is not None:
        _check_output_path(args.output)

    # Everything a rank would find wrong with the program, found once, here.
    module = parse_program(text, filename)
    if _verifies(module):
        # Before compiling, which loads torch: a wrong --nproc fails at once.
        check_world_size(module, nproc, args.entry)
    import distir

    program = distir.compile(module, args.pipeline, entry=args.entry, deadline=args.deadline)
    check_world_size(module, nproc, args.entry)
    check_world_size(program.module, nproc, args.entry)  # what the passes assumed
    _check_point_to_point(program.module, args.entry, nproc)
    if args.inputs:
        _check_inputs_file(request, entry_function(module, args.entry), nproc)
    else:
        from distir.runtime.inputs import MAX_SEED

        if args.random_inputs > MAX_SEED:
            raise DistirError(f"--random-inputs {args.random_inputs}: the seed must be at most "
                              f"{MAX_SEED}")  # fmt: skip
    check_backend(args.backend, None if torchrun else nproc)

    if torchrun:
        import torch.distributed as dist

        ctx = init_from_environment(args.backend, timeout=max(args.timeout, args.deadline))
        try:
            report = _launched_rank(ctx, request)
            gathered: list[Any] | None = None
            if args.output is not None:
                gathered = [None] * ctx.world_size if ctx.rank == 0 else None
                dist.gather_object(report.pop("values"), gathered, dst=0)
        finally:
            dist.destroy_process_group()
        print_report(request, [report], f"torchrun rank {ctx.rank} of {ctx.world_size}")
        if gathered is not None:
            _save(args.output, gathered)
        return 0

    outcome = launch(
        _launched_rank,
        nproc,
        request,
        backend=args.backend,
        timeout=args.timeout,
        collective_timeout=max(60.0, args.deadline),
        pass_context=True,
        tolerate=args.tolerate,
    )
    lost: dict[int, str] = {}
    if args.tolerate is not None:
        lost, outcome = outcome.lost, [outcome.results[r] for r in sorted(outcome.results)]
    reports = outcome
    values = [report.pop("values", None) for report in reports]
    print_report(request, reports, f"{nproc} local {args.backend} {'rank' if nproc == 1 else 'ranks'}")
    for rank, why in sorted(lost.items()):
        print(f"rank {rank}: lost ({why.removeprefix('DistirError: ')})")
    if args.output is not None:
        _save(args.output, values)
    return 0


def _save(output: str, per_rank: Any) -> None:
    """Writes the results; a write that fails (a full disk, /dev/full) is a
    one-line error. Serialised first, so the file is written by Python's own
    I/O, whose failures are OSErrors (torch's writer raises RuntimeErrors)."""
    import io

    import torch

    from distir.errors import DistirError

    data = io.BytesIO()
    torch.save(per_rank, data)
    try:
        with open(output, "wb") as f:
            f.write(data.getbuffer())
    except OSError as e:
        raise DistirError(f"cannot write --output {output}: {e.strerror or e}") from None
    _note(f"saved every rank's results to {output}")


#: what distir-run says, and its exit status, when a signal ends it
_SIGNAL_EXITS = {
    signal.SIGINT: (EXIT_SIGINT, "interrupted (SIGINT)"),
    signal.SIGTERM: (EXIT_SIGTERM, "terminated (SIGTERM)"),
}


def _exit_on_signal(signum: int, frame: object) -> None:
    """Ends distir-run at once, whatever it was doing. While ranks run,
    `launch` holds these signals itself: it stops every rank first, then
    hands the signal back to this handler."""
    status, what = _SIGNAL_EXITS[signum]
    # os.write, not print: the signal may have interrupted a print.
    os.write(2, f"distir-run: {what}; no rank is left running\n".encode())
    os._exit(status)


def _own_signals() -> None:
    """SIGINT and SIGTERM end this process at once with 130 and 143. An
    exception raised from a handler could be swallowed by whatever code it
    interrupts (a finaliser, an import), so the handler exits instead."""
    for signum in _SIGNAL_EXITS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _exit_on_signal)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `distir-run` console script; returns the exit status.

    Run as the program (`argv` None, in the main thread), it owns SIGINT and
    SIGTERM; called in-process with `argv`, it leaves the caller's signal
    handlers alone and reports Ctrl-C as exit status 130.
    """
    if argv is None and threading.current_thread() is threading.main_thread():
        _own_signals()
    from distir.errors import DistirError

    try:
        args = build_parser().parse_args(argv)
        return _run(args)
    except DistirError as e:
        from distir.runtime.launch import LaunchError

        message = str(e)
        if isinstance(e, LaunchError) and e.failures:
            message = format_failures(e.failures, len(e.failures) + len(e.results))
        print(f"distir-run: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("distir-run: interrupted (SIGINT); no rank is left running", file=sys.stderr)
        return EXIT_SIGINT
    except BrokenPipeError:
        # The reader of our output went away (`distir-run ... | head`).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
