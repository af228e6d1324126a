"""One rank of `distir-run`, and what is checked once before any rank starts.

`check_program` finds in the launching process everything a rank would find
wrong with the program and its inputs; `run_rank` is the body of every rank:
make or load its inputs, compile with the pipeline, run (timed), summarise.

Only the standard library is imported at module level (see `distir.cli.run`):
distir, xDSL and torch load inside the functions that use them.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distir.cli.report import rank_list, summarize


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
    #: with --replace: a lost rank is restarted, joins, and runs the rest
    replace: bool = False


# Reading the program ------------------------------------------------------------------


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
        raise DistirError(f"{argument} is not a text file: byte {e.start} is not UTF-8") from None


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
        raise CompileError("\n".join([f"{e.span.get_location()}: {e.msg}{hint}", *lines])) from None
    except DiagnosticException as e:
        raise CompileError(f"{filename}: {e}") from None


def input_function(module, request: RunRequest):
    """The entry function whose arguments a run takes: the program as
    written (whose ops say what synthesised inputs must keep), unless the
    pipeline changes their types (convert-shard-to-dist runs a memref
    argument as a tensor); then the converted one."""
    from distir.ir.parsing import make_context
    from distir.passes import apply_pipeline
    from distir.runtime.planning import entry_function

    function = entry_function(module, request.entry)
    if not request.pipeline:
        return function
    lowered = module.clone()
    apply_pipeline(make_context(), lowered, request.pipeline)
    converted = entry_function(lowered, request.entry)
    same = converted.function_type.inputs == function.function_type.inputs
    return function if same else converted


# Before any rank starts -----------------------------------------------------------------


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


def check_program(request: RunRequest, nproc: int) -> None:
    """Everything a rank would find wrong with the program, found once, in
    the launching process: its syntax and verification, the world sizes its
    IR allows (before compiling, which loads torch, so that a wrong --nproc
    fails at once), the pipeline, point-to-point deadlocks, the inputs."""
    from distir.errors import DistirError
    from distir.runtime.requirements import check_world_size

    module = parse_program(request.source, request.filename)
    if _verifies(module):
        check_world_size(module, nproc, request.entry)
    import distir
    from distir.runtime.inputs import MAX_SEED, check_inputs_file

    program = distir.compile(
        module, request.pipeline, entry=request.entry, deadline=request.deadline
    )
    check_world_size(program.module, nproc, request.entry)  # what the passes assumed
    _check_point_to_point(program.module, request.entry, nproc)
    if request.inputs:
        check_inputs_file(request.inputs, input_function(module, request), nproc)
    elif request.seed > MAX_SEED:
        raise DistirError(f"--random-inputs {request.seed}: the seed must be at most {MAX_SEED}")


# One rank -------------------------------------------------------------------------------


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


def run_rank(request: RunRequest, rank: int, world_size: int, joining: bool = False) -> dict:
    """Body of one rank: make inputs (synthesised from the program as
    written, before any pass), compile with the pipeline, run (timed),
    summarise. A replacement (`joining`) joins the running ranks first and
    runs from the position they agreed on."""
    import torch

    import distir
    from distir.errors import DistirError, one_line
    from distir.runtime import elastic

    module = parse_program(request.source, request.filename)
    recovered: list[str] = []
    inputs: list = []
    if joining:
        m = elastic.join([], deadline=request.deadline + 60.0)
        recovered.append(
            f"joined: epoch {m.epoch}, rank {m.rank} of {m.size} ({rank_list(m.ranks)}), "
            f"from run #{m.completed}"
        )
        inputs = _rank_inputs(request, input_function(module, request), m.rank, m.size)
    else:
        m = distir.membership()
        error = None
        try:
            inputs = _rank_inputs(request, input_function(module, request), rank, world_size)
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
    group = m.group if m.epoch else None
    done = m.completed  # runs done on every rank (the agreed position)
    while done < request.repeat:
        try:
            torch.distributed.barrier(group=group)
            start = time.perf_counter()
            results = program.run(*inputs, group=group)
            if request.backend == "nccl":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
            done += 1
            if request.replace and done < request.repeat:
                grown = elastic.grow([], deadline=request.deadline + 10.0, progress=done)
                if grown.epoch != m.epoch:
                    m, group = grown, grown.group
                    fn = input_function(module, request)
                    inputs = _rank_inputs(request, fn, m.rank, m.size)
                    recovered.append(
                        f"grown: epoch {m.epoch}, rank {m.rank} of {m.size} "
                        f"({rank_list(m.ranks)}; joined {rank_list(m.joined)})"
                    )
        except (DistirError, RuntimeError):
            if request.tolerate is None:
                raise
            # A peer was lost: agree on the survivors and where they are, and
            # finish the runs on them.
            m = distir.recover(deadline=request.deadline + 10.0, progress=done)
            group, done = m.group, m.completed
            inputs = _rank_inputs(request, input_function(module, request), m.rank, m.size)
            recovered.append(
                f"recovered: epoch {m.epoch}, rank {m.rank} of {m.size} "
                f"({rank_list(m.ranks)}; lost {rank_list(m.lost)})"
            )
            if request.replace:  # its replacement is starting: give it time to ask
                until = time.monotonic() + request.deadline + 30.0
                while not elastic.join_requests() and time.monotonic() < until:
                    time.sleep(0.02)
            continue
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


def launched_rank(ctx: Any, request: RunRequest) -> dict:
    """`run_rank` under `distir.launch`: an unexpected exception becomes a
    one-line `DistirError`."""
    from distir.errors import DistirError, one_line

    try:
        return run_rank(request, ctx.rank, ctx.world_size, getattr(ctx, "joining", False))
    except DistirError:
        raise
    except Exception as e:
        # The parent prints one line per rank, never a traceback.
        raise DistirError(one_line(e)) from None
