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
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from distir.cli import quiet_when_output_closes

# Only the standard library is imported before `main` has taken over SIGINT
# and SIGTERM: distir, xDSL and torch load inside the functions that use them
# (the rank body in `distir.cli.rank` and the printing in `distir.cli.report`
# keep to the same rule).
from distir.cli.rank import RunRequest, check_program, launched_rank, read_program
from distir.cli.report import format_failures, print_report

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM

DEFAULT_NPROC = 4


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
        "--replace",
        action="store_true",
        help="with --tolerate: start a new process in place of each lost rank; it joins "
        "the running ranks (distir.runtime.elastic), which admit it after their next run, "
        "and runs the rest of the --repeat runs with them",
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


def _run(args: argparse.Namespace) -> int:
    from distir.errors import DistirError
    from distir.runtime.launch import (
        check_backend,
        init_from_environment,
        launch,
        stale_rendezvous_variables,
        under_torchrun,
    )

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
    if args.replace and args.tolerate is None:
        raise DistirError("--replace needs --tolerate K: how many ranks may be lost and replaced")

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
        replace=args.replace,
    )
    if args.output is not None:
        _check_output_path(args.output)

    check_program(request, nproc)
    check_backend(args.backend, None if torchrun else nproc)

    if torchrun:
        import torch.distributed as dist

        ctx = init_from_environment(args.backend, timeout=max(args.timeout, args.deadline))
        try:
            report = launched_rank(ctx, request)
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
        launched_rank,
        nproc,
        request,
        backend=args.backend,
        timeout=args.timeout,
        collective_timeout=max(60.0, args.deadline),
        pass_context=True,
        tolerate=args.tolerate,
        replace=args.replace,
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


@quiet_when_output_closes
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
