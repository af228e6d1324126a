"""Starting ranks: P local processes on 127.0.0.1, or the torchrun environment.

`launch(fn, nproc)` is the embedded default: no cluster and no setup. It
spawns `nproc` processes, initialises a process group among them over
loopback, runs `fn(*args)` on each and returns every rank's result, in rank
order. Every wait is bounded and no rank outlives the call:

- a rank that fails is reported with its error, a rank that hangs is killed
  when `timeout` expires;
- SIGINT and SIGTERM sent to the launching process are forwarded to every
  rank; the ranks are waited for together (at most about 2 s, then killed)
  and the signal then takes its usual effect on the caller (KeyboardInterrupt
  for SIGINT, termination for SIGTERM, or whatever handler the caller
  installed);
- on Linux each rank asks the kernel to kill it when the launching process
  dies (`PR_SET_PDEATHSIG`), so not even a SIGKILL of the parent leaves a
  rank behind.

The rendezvous store lives in the launching process and the ranks connect
to it as clients, so any rank, rank 0 included, may die while the others go
on. With `tolerate=k` the launch survives up to k lost ranks: the launcher
reports each rank whose process ended (or whose function returned or
raised) in the store, the survivors' `distir.recover()` reads that as
evidence, and `launch` returns the survivors' results with each lost rank's
cause (`LaunchOutcome`).

Under torchrun (`TORCHELASTIC_RUN_ID` set, as torchrun's elastic agent does
for every worker, together with RANK, WORLD_SIZE, MASTER_ADDR, ...),
`init_from_environment` joins the job as that rank instead, so the same
program scales to many machines. RANK or WORLD_SIZE without
`TORCHELASTIC_RUN_ID` are leftovers of another job, not a rendezvous.

The package, by concern: `rendezvous` (the torchrun environment, a local
rank's variables, the launcher's store), `spawning` (starting rank
processes: the fork server, following the launcher), `rank` (what runs in a
rank), `reports` (a rank's result on its pipe), `watching` (signals,
stopping, losses and replacements); `launch()` itself is here.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_any
from typing import Any, NoReturn

from distir.durations import Duration, seconds
from distir.errors import DistirError, count
from distir.runtime.launch.rank import (
    NO_MAIN_GUARD,
    NO_MAIN_GUARD_EXIT,
    rank_entry,
    refuse_launch_while_a_rank_starts,
)
from distir.runtime.launch.rendezvous import (
    RENDEZVOUS_VARIABLES,
    TORCHRUN_MARKER,
    TORCHRUN_VARIABLES,
    BackendUnavailable,
    RankContext,
    check_backend,
    free_port,
    host_store,
    init_from_environment,
    rank_environment,
    stale_rendezvous_variables,
    under_torchrun,
)
from distir.runtime.launch.reports import ReportReader, deserialize, finished_results
from distir.runtime.launch.spawning import (
    LauncherOutput,
    outputs_open,
    rank_start,
    stop_fork_server,
)
from distir.runtime.launch.watching import (
    FORWARDED_SIGNALS,
    SignalRecorder,
    exit_cause,
    replace_rank,
    report_gone,
    signals_blocked,
    stop_ranks,
    wait_all,
)

__all__ = [
    "BackendUnavailable",
    "FORWARDED_SIGNALS",
    "LaunchError",
    "LaunchOutcome",
    "NO_MAIN_GUARD",
    "RENDEZVOUS_VARIABLES",
    "RankContext",
    "TORCHRUN_MARKER",
    "TORCHRUN_VARIABLES",
    "check_backend",
    "free_port",
    "init_from_environment",
    "launch",
    "stale_rendezvous_variables",
    "under_torchrun",
]


class LaunchError(DistirError):
    """One or more ranks failed or did not finish in time."""

    def __init__(self, message: str, failures: dict[int, str], results: dict[int, Any]):
        super().__init__(message)
        #: rank -> why it failed
        self.failures = failures
        #: rank -> result, for the ranks that finished
        self.results = results


@dataclass(frozen=True)
class LaunchOutcome:
    """What `launch(..., tolerate=k)` returns: the results of the ranks that
    finished, and why each other rank was lost (its error, exit code or
    signal)."""

    results: dict[int, Any]
    lost: dict[int, str]


def _check_launchable(fn: Callable[..., Any]) -> None:
    """Ranks are fresh interpreters that import `fn` by its module and name:
    refuse, up front, what they could not find."""
    qualname = getattr(fn, "__qualname__", None)
    name = qualname or repr(fn)
    hint = "define it with `def` at the top level of an importable module or script"
    if getattr(fn, "__name__", None) == "<lambda>":
        raise TypeError(f"launch needs a module-level function, got a lambda; {hint}")
    if isinstance(qualname, str) and "<locals>" in qualname:
        raise TypeError(
            f"launch needs a module-level function, got {name}, defined inside another "
            f"function; {hint}"
        )
    if getattr(fn, "__module__", None) == "__main__":
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        if main_file is None or not os.path.exists(main_file):
            raise TypeError(
                f"launch needs a function that its ranks can import, but {name} is defined "
                "in an interactive session (__main__ has no file); move it into a module "
                "and import it"
            )
    try:
        pickle.dumps(fn)
    except Exception as e:
        raise TypeError(f"launch cannot send {name} to its ranks: {e}; {hint}") from None


def launch(
    fn: Callable[..., Any],
    nproc: int,
    *args: Any,
    backend: str = "gloo",
    timeout: Duration = 120.0,
    collective_timeout: Duration = 60.0,
    threads_per_rank: int | None = 1,
    pass_context: bool = False,
    tolerate: int | None = None,
    replace: bool = False,
) -> Any:
    """Runs `fn(*args)` (or `fn(RankContext, *args)`) on `nproc` local ranks
    and returns their results in rank order.

    Args:
        fn: a module-level function (ranks import it by name; a lambda, a
            nested function or one defined in an interactive session is
            refused with a TypeError before any rank starts).
        nproc: how many ranks to start (>= 1).
        args: passed to `fn` on every rank (picklable).
        backend: "gloo" (CPU) or "nccl" (one CUDA GPU per rank).
        timeout: seconds (or a timedelta) the whole launch may take, from
            starting the ranks to the last result; ranks still running then
            are killed and reported as hung.
        collective_timeout: seconds (or a timedelta) torch.distributed waits
            in any one collective or rendezvous before it fails (the process
            group's `timeout`); distir's own per-collective deadline is the
            program's `deadline`.
        threads_per_rank: torch intra-op threads per rank (None: torch's default).
        pass_context: pass a `RankContext` as the first argument.
        tolerate: how many ranks may be lost (their process dies, or their
            function raises) while the others go on and recover
            (`distir.recover()`); the launch then returns a `LaunchOutcome`
            with the survivors' results and each lost rank's cause, and
            raises `LaunchError` only when more than `tolerate` are lost.
            None (the default): any failure ends the launch, as a
            `LaunchError`, and the results are a list.
        replace: with `tolerate`, start a new process in place of each lost
            one (at most `tolerate` in all), with `RankContext.joining` set:
            it joins the running job (`distir.runtime.elastic.join`) and
            its result is the rank's; `LaunchOutcome.lost` still names each
            loss, with "(replaced)".

    Each rank is a process forked from a server that has imported torch and
    distir (multiprocessing's `forkserver`, started by the first launch; a
    fresh `spawn`ed interpreter where the platform has none, or while the
    variables that take effect at interpreter start, such as OMP_* or
    TORCH_*, differ from the server's). Either way it starts with the
    launcher's environment, working directory, stdout and stderr of the
    moment, and imports `fn`'s module, so module-level code of that module
    (and of the main script) runs once in every rank. A script that calls `launch`
    must do so under `if __name__ == "__main__":`, or every rank would
    launch again::

        def worker(ctx):
            return ctx.rank

        if __name__ == "__main__":
            print(distir.launch(worker, 4, pass_context=True))   # [0, 1, 2, 3]

    Raises `LaunchError` naming each failed or hung rank, and
    `BackendUnavailable` before starting anything if `backend` cannot run
    here. SIGINT and SIGTERM are forwarded to the ranks (see the module
    docstring). Every rank process is gone when this returns or raises.
    """
    refuse_launch_while_a_rank_starts()
    _check_rank_counts(nproc, tolerate, replace)
    timeout_s = seconds(timeout, "timeout")
    collective_timeout_s = seconds(collective_timeout, "collective_timeout")
    _check_launchable(fn)
    check_backend(backend, nproc)
    job = _Job(fn, args, nproc, backend, threads_per_rank, collective_timeout_s, pass_context,
               tolerate, replace)  # fmt: skip
    recorder = SignalRecorder()
    recorder.install()
    try:
        job.start_ranks()
        job.collect_reports(recorder, timeout_s)
        job.wind_down(recorder.received)
    finally:
        job.close()
        recorder.restore()
    if recorder.received is not None:
        _interrupted(recorder.received, job.outcomes)
    return job.results(timeout_s)


def _check_rank_counts(nproc: int, tolerate: int | None, replace: bool) -> None:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1, got {nproc!r}")
    if tolerate is not None and (
        isinstance(tolerate, bool) or not isinstance(tolerate, int) or not 0 <= tolerate < nproc
    ):
        raise ValueError(f"tolerate must be an integer in [0, {nproc}), got {tolerate!r}")
    if replace and tolerate is None:
        raise ValueError("replace=True needs tolerate=k: how many ranks may be lost and replaced")


def _interrupted(signum: int, outcomes: Mapping[int, tuple[bool, Any]]) -> NoReturn:
    """After SIGINT or SIGTERM reached the launcher (every rank stopped): the
    signal does what it would have done without launch; if the caller's
    handler returns, the launch ends as a `LaunchError`."""
    stop_fork_server()
    name = signal.Signals(signum).name
    signal.raise_signal(signum)
    raise LaunchError(
        f"interrupted by {name}: every rank was stopped", {}, finished_results(outcomes)
    )


class _Job:
    """One launch's ranks, from their start to their results: the state the
    steps of `launch` share."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple,
        nproc: int,
        backend: str,
        threads_per_rank: int | None,
        collective_timeout_s: float,
        pass_context: bool,
        tolerate: int | None,
        replace: bool,
    ):
        self.fn, self.args, self.nproc, self.backend = fn, args, nproc, backend
        self.threads_per_rank, self.collective_timeout_s = threads_per_rank, collective_timeout_s
        self.pass_context, self.tolerate, self.replace = pass_context, tolerate, replace
        self.store = host_store(collective_timeout_s)
        # One pipe per rank, not a shared queue: a rank that dies without a
        # result is seen at once (end of file), and no semaphore is left behind.
        self.pipes: list[tuple[Connection, Any]] = [
            mp.Pipe(duplex=False) for _ in range(nproc)
        ]
        self.procs: list[Any] = []
        #: rank -> its process now (a replacement's, after a loss)
        self.by_rank: dict[int, Any] = {}
        #: rank -> why each earlier process of it was lost (replace=True)
        self.replaced: dict[int, list[str]] = {}
        self.outcomes: dict[int, tuple[bool, Any]] = {}
        self.exited_without_result: set[int] = set()
        self.stopped: set[int] = set()
        #: how long the others get once the group is broken
        self.grace = min(collective_timeout_s, 10.0) + 2.0
        self.cut_short = False
        self.deadline = 0.0
        #: starts a rank (`start(rank, writer, joining)`), once `start_ranks` ran
        self.start: Callable[..., None] | None = None

    def start_ranks(self) -> None:
        """Starts every rank, SIGINT and SIGTERM held back meanwhile."""
        try:
            # Starting multiprocessing's resource tracker unblocks SIGINT and
            # SIGTERM in this thread: start it before they are blocked.
            resource_tracker.ensure_running()
            with signals_blocked(), rank_environment():
                self.start = self._starter()
                for r in range(self.nproc):
                    self.start(r, self.pipes[r][1])
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise TypeError(
                f"launch cannot send the arguments of {self.fn!r} to its ranks: {e}"
            ) from e
        finally:
            for _, writer in self.pipes:
                writer.close()  # the ranks hold the write ends now

    def _starter(self) -> Callable[..., None]:
        """How this launch starts a rank (`start(rank, writer, joining)`), in
        the environment and signal mask of the moment."""
        ctx, parent_pid = rank_start()
        environment = dict(os.environ)
        forked = ctx.get_start_method() == "forkserver"
        output = LauncherOutput() if forked and outputs_open() else None

        def start(r: int, writer: Any, joining: bool = False) -> None:
            self.procs.append(ctx.Process(
                target=rank_entry,
                args=(r, self.nproc, self.store.port, self.backend, self.threads_per_rank,
                      self.collective_timeout_s, self.fn, self.args, self.pass_context, writer,
                      parent_pid, environment, output, joining),
                name=f"distir-rank-{r}",
                daemon=True,
            ))  # fmt: skip
            self.by_rank[r] = self.procs[-1]
            self.procs[-1].start()

        return start

    def collect_reports(self, recorder: SignalRecorder, timeout_s: float) -> None:
        """Reads the ranks' reports as they arrive, until every rank
        reported, `timeout_s` passed (less once the group is broken) or a
        signal was recorded."""
        pending = {self.pipes[r][0]: r for r in range(self.nproc)}
        reports = {r: ReportReader(self.pipes[r][0]) for r in range(self.nproc)}
        self.deadline = time.monotonic() + timeout_s
        while pending and recorder.received is None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                break
            # Short waits: a recorded signal is noticed within 0.1 s.
            for reader in wait_for_any(list(pending), timeout=min(0.1, left)):
                rank = pending[reader]  # type: ignore[index]
                try:
                    report = reports[rank].read()
                except EOFError:
                    self.exited_without_result.add(rank)
                else:
                    if report is None:
                        continue  # more of it to come
                    self.outcomes[rank] = report
                del pending[reader]  # type: ignore[arg-type]
                replacement = self._ended(rank)
                if replacement is not None:
                    pending[replacement] = rank
                    reports[rank] = ReportReader(replacement)

    def _ended(self, rank: int) -> Connection | None:
        """`rank` reported or ended: with `tolerate`, the survivors are told
        and, while the losses are tolerated, a lost rank is replaced (the
        reader of its replacement's report is returned); a loss beyond them
        cuts the wait short."""
        lost = rank in self.exited_without_result or not self.outcomes[rank][0]
        if self.tolerate is not None:
            # Evidence for the survivors' recovery: this rank is gone.
            report_gone(self.store, rank, self.by_rank[rank], self.outcomes.get(rank))
            losses = (
                len(self.exited_without_result)
                + sum(not ok for ok, _ in self.outcomes.values())
                + sum(map(len, self.replaced.values()))
            )
            if losses <= self.tolerate:
                if not (lost and self.replace):
                    return None
                assert self.start is not None
                reader = replace_rank(rank, self.start, self.by_rank, self.outcomes,
                                      self.exited_without_result, self.replaced)  # fmt: skip
                self.pipes.append((reader, None))
                return reader
        if lost:
            # The group is broken: others will fail or time out on their
            # own collective deadline; collect what arrives within a grace.
            if time.monotonic() + self.grace < self.deadline:
                self.deadline, self.cut_short = time.monotonic() + self.grace, True
        return None

    def wind_down(self, signum: int | None) -> None:
        """Every rank ends: given a moment to tear down (unless a signal
        came), then stopped (`signum` first, if any)."""
        if signum is None:
            # Finished ranks are tearing down their process group; a rank
            # that failed may be stuck in that teardown, so it gets less time.
            failed = self.exited_without_result or any(not ok for ok, _ in self.outcomes.values())
            wait_all(self.procs, min(self.deadline, time.monotonic() + (1.0 if failed else 5.0)))
        self.stopped = stop_ranks(self.procs, signum)

    def close(self) -> None:
        # Only stops ranks that are alive when start-up itself failed.
        stop_ranks(self.procs, None)
        for reader, _ in self.pipes:
            reader.close()

    def failures(self, timeout_s: float) -> dict[int, str]:
        """rank -> why it failed (each replaced process's cause first)."""
        failures: dict[int, str] = {}
        stopped_procs = [self.procs[i] for i in self.stopped]
        for r in range(self.nproc):
            proc = self.by_rank[r]
            if r in self.exited_without_result or (
                r not in self.outcomes and proc not in stopped_procs
            ):
                failures[r] = f"{exit_cause(proc.exitcode)} without a result"
            elif r not in self.outcomes:
                failures[r] = (
                    f"did not finish in time (still running {self.grace:g} s after another rank "
                    "failed; killed)"
                    if self.cut_short
                    else f"did not finish in time (killed after the {timeout_s:g} s timeout)"
                )
            elif not self.outcomes[r][0]:
                failures[r] = self.outcomes[r][1]
        for r, causes in self.replaced.items():
            last = [failures[r]] if r in failures else []
            failures[r] = "; ".join([*(f"{c} (replaced)" for c in causes), *last])
        return failures

    def results(self, timeout_s: float) -> Any:
        """The ranks' results in rank order, or a `LaunchOutcome` (tolerated
        losses); `LaunchError` naming each failure beyond them."""
        if any(p.exitcode == NO_MAIN_GUARD_EXIT for p in self.procs):
            raise LaunchError(NO_MAIN_GUARD, {r: NO_MAIN_GUARD for r in range(self.nproc)}, {})
        failures = self.failures(timeout_s)
        if self.tolerate is not None and len(failures) <= self.tolerate:
            return LaunchOutcome(finished_results(self.outcomes), failures)
        if failures:
            lines = [f"{len(failures)} of {count(self.nproc, 'rank')} failed:"]
            for r, why in sorted(failures.items()):
                lines.append(f"  rank {r}: {why}")
            raise LaunchError("\n".join(lines), failures, finished_results(self.outcomes))
        return [deserialize(self.outcomes[r][1]) for r in range(self.nproc)]
