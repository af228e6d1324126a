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
"""

from __future__ import annotations

import atexit
import ctypes
import io
import multiprocessing as mp
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_any
from typing import Any

from distir.durations import Duration, seconds
from distir.errors import DistirError, count

#: torchrun's elastic agent sets this for every worker it starts
#: (torch/distributed/elastic/agent/server/local_elastic_agent.py); nothing
#: else does, so it is what "running under torchrun" means.
TORCHRUN_MARKER = "TORCHELASTIC_RUN_ID"

#: every variable torchrun sets for a worker
TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
)

#: the variables an env:// rendezvous reads
RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

#: signals forwarded to the ranks
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: seconds ranks get to exit after a forwarded signal, before SIGKILL
_SIGNAL_GRACE_S = 1.0

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15

#: Modules the fork server imports once, so that a rank forked from it starts
#: in milliseconds instead of importing torch, xDSL and distir anew (about
#: 2 s of CPU each): what every rank runs (this module), compiles and runs
#: programs with, and recovers with.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "distir.runtime.launch",
    "distir.runtime.program",
    "distir.runtime.membership",
]

#: Environment variables that take effect when an interpreter, its loader or
#: torch starts (OpenMP and MKL thread pools, torch's C++ logging): a rank
#: forked from a server that started under other values would not see them,
#: so while they differ from the server's, ranks are spawned fresh instead.
_STARTUP_VARIABLE_PREFIXES = (
    "PYTHON", "LD_", "MALLOC_", "OMP_", "KMP_", "GOMP_", "MKL_", "TORCH_", "PYTORCH_",
)

#: the fork server's pid and the startup variables it started under
_server_started_under: tuple[int, dict[str, str]] | None = None
_server_lock = threading.Lock()


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


class BackendUnavailable(DistirError):
    """The requested torch.distributed backend cannot run here."""


@dataclass(frozen=True)
class RankContext:
    """What a launched function may want to know about its rank."""

    rank: int
    world_size: int
    backend: str
    #: a replacement started by `launch(..., replace=True)`: it joins the
    #: running job (`distir.runtime.elastic.join`) instead of starting it
    joining: bool = False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a torchrun worker (`TORCHELASTIC_RUN_ID` set)."""
    return TORCHRUN_MARKER in (os.environ if environ is None else environ)


def stale_rendezvous_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """RANK, WORLD_SIZE, ... set although this is no torchrun worker: left
    over from another job, and ignored by `launch`."""
    env = os.environ if environ is None else environ
    if under_torchrun(env):
        return []
    return [name for name in RENDEZVOUS_VARIABLES if name in env]


def check_backend(backend: str, nproc: int | None = None) -> None:
    """Raises `BackendUnavailable` unless `backend` can run `nproc` ranks on
    this machine (NCCL: a CUDA GPU per rank); `nproc=None` checks one rank
    of a job started elsewhere (torchrun)."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            raise BackendUnavailable(
                f"--backend nccl needs a CUDA GPU, and torch {torch.__version__} sees none "
                "(gloo runs on CPU: --backend gloo)"
            )
        if not dist.is_nccl_available():
            raise BackendUnavailable(
                f"--backend nccl: this torch build ({torch.__version__}) has no NCCL backend"
            )
        if nproc is not None and nproc > gpus:
            raise BackendUnavailable(
                f"--backend nccl needs one GPU per rank: {nproc} ranks, {gpus} GPU(s)"
            )
    elif backend == "gloo":
        if not dist.is_gloo_available():
            raise BackendUnavailable(f"this torch build ({torch.__version__}) has no gloo backend")
    else:
        raise BackendUnavailable(f"unknown backend {backend!r} (gloo or nccl)")


def _set_cuda_device(backend: str, rank: int) -> None:
    if backend == "nccl":
        import torch

        torch.cuda.set_device(rank % torch.cuda.device_count())


def init_from_environment(backend: str = "gloo", timeout: Duration = 300.0) -> RankContext:
    """Join a torchrun job (env:// rendezvous) unless already initialised;
    `timeout` (seconds or a timedelta) bounds the rendezvous and is the
    process group's timeout for every collective."""
    import torch.distributed as dist

    timeout_s = seconds(timeout, "timeout")
    rank = int(os.environ["RANK"])
    _set_cuda_device(backend, int(os.environ.get("LOCAL_RANK", rank)))
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return RankContext(dist.get_rank(), dist.get_world_size(), backend)


def _serialize(value: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _deserialize(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _follow_parent(parent_pid: int, rank: int) -> None:
    """Die with the launching process, even if it is SIGKILLed.

    The parent is the launcher (spawned ranks) or the fork server, which
    exits as soon as the launcher is gone (see `_leave_fork_server`).
    PR_SET_PDEATHSIG only covers a parent that dies after the call, so the
    parent is checked right after it: if it is already gone, this rank has
    been adopted by another process and must not run.
    """
    _leave_fork_server()
    libc = _libc()
    if libc is not None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The name `pgrep distir-rank` finds (15 bytes at most).
        libc.prctl(_PR_SET_NAME, f"distir-rank-{rank}".encode()[:15], 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def _leave_fork_server() -> None:
    """A forked rank inherits the fork server's "alive" pipe, whose write end
    every client of the server holds: the server exits when the last one
    closes it. Let go of it, so that the server, the rank's parent, exits as
    soon as the launcher dies, and PR_SET_PDEATHSIG then ends the rank. (A
    rank that starts processes with forkserver itself gets a server of its
    own: the server state it inherits names none.)"""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and getattr(server, "_forkserver_pid", None) is None:
        os.close(fd)
        server._forkserver_alive_fd = None


def _startup_variables() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_STARTUP_VARIABLE_PREFIXES)}


def _rank_start() -> tuple[Any, int]:
    """How this launch starts its ranks, and the pid their parent will have.

    Ranks fork from a server that has imported torch and distir (started at
    the first launch, in the environment and signal mask ranks start in, so
    call this where those are in place); where the platform has no fork
    server, or the startup variables differ from the server's, each rank is
    a fresh spawned interpreter. Either way a rank starts with the launcher's
    environment, working directory, stdout and stderr as they are now.
    """
    global _server_started_under
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn"), os.getpid()
    from multiprocessing import forkserver

    server = forkserver._forkserver
    with _server_lock:
        running = _server_started_under
        if running is not None and running[1] != _startup_variables():
            return mp.get_context("spawn"), os.getpid()
        if running is None:
            server.set_forkserver_preload(_PRELOAD)
        server.ensure_running()  # restarts a server that died
        pid = server._forkserver_pid
        if running is None or running[0] != pid:
            _server_started_under = (pid, _startup_variables())
    return mp.get_context("forkserver"), pid


def _stop_fork_server() -> None:
    """Ends the fork server at once: at exit, and before a forwarded signal
    takes effect. It holds the launcher's stdout and stderr as they were
    when it started, and left to notice the launcher's exit and tear its
    own interpreter down, it would keep them open for about a second longer
    (a pipe reading the launcher's output would wait for it)."""
    global _server_started_under
    from multiprocessing import forkserver

    with _server_lock:
        if _server_started_under is None:
            return
        pid, _ = _server_started_under
        _server_started_under = None
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            forkserver._forkserver._stop()  # reaps it and forgets it
        except (AttributeError, OSError, ChildProcessError):
            pass


atexit.register(_stop_fork_server)  # does nothing when no server was started


class _LauncherOutput:
    """The launcher's stdout and stderr as they are when a rank starts, sent
    to a forked rank (whose own are those of the fork server, i.e. of the
    first launch) as the process is pickled."""

    def __reduce__(self) -> tuple[Any, tuple]:
        from multiprocessing import reduction

        return _attach_output, (reduction.DupFd(1), reduction.DupFd(2))


def _attach_output(out: Any, err: Any) -> None:
    for received, target in ((out, 1), (err, 2)):
        fd = received.detach()
        os.dup2(fd, target)
        os.close(fd)


def _outputs_open() -> bool:
    try:
        os.fstat(1)
        os.fstat(2)
    except OSError:
        return False
    return True


def _local_rank_environment(rank: int, world_size: int, port: int) -> None:
    """The variables a torchrun worker would see, for this local rank;
    leftovers of another job are gone."""
    for name in TORCHRUN_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def _rank_entry(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    threads: int | None,
    collective_timeout: float,
    fn: Callable[..., Any],
    args: tuple,
    pass_context: bool,
    outcome: Connection,
    parent_pid: int,
    environment: dict[str, str],
    launcher_output: None = None,  # applied when unpickled (_attach_output)
    joining: bool = False,
) -> None:
    _follow_parent(parent_pid, rank)
    if os.environ != environment:  # a forked rank: the server's environment
        os.environ.clear()
        os.environ.update(environment)
    # The parent blocked SIGINT and SIGTERM while starting this process, so
    # that neither could interrupt the interpreter's start-up with a
    # traceback. A signal sent since is pending: with the default action, it
    # ends this rank at once, even inside a blocking collective. Signals the
    # parent ignores (a background job's SIGINT) stay ignored.
    for signum in FORWARDED_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
    _local_rank_environment(rank, world_size, port)
    initialised = False
    try:
        import torch
        import torch.distributed as dist

        if threads is not None:
            torch.set_num_threads(threads)
        from distir.runtime.membership import set_job_store

        _set_cuda_device(backend, rank)
        # The launching process hosts the store: it outlives every rank.
        store = dist.TCPStore(
            "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=collective_timeout)
        )
        set_job_store(store)
        if joining:
            # The members' default group connected long ago and will never
            # connect again: this rank's stays unconnected (it only ever
            # talks on the groups distir.grow forms).
            os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=collective_timeout),
        )
        os.environ.pop("TORCH_GLOO_LAZY_INIT", None)
        initialised = True
        _wait_for_every_rank(store, rank, world_size, collective_timeout)
        context = RankContext(rank, world_size, backend, joining)
        value = fn(context, *args) if pass_context else fn(*args)
        report: tuple[bool, Any] = (True, _serialize(value))
    except BaseException as e:  # the parent reports it, naming this rank
        if isinstance(e, DistirError):
            report = (False, f"{type(e).__name__}: {e}")
        else:
            report = (False, traceback.format_exc().strip())
    # Report before tearing down: after a failure, the teardown may wait for
    # peers that will never come (the parent ends this rank then).
    _send_report(outcome, report)
    outcome.close()
    if initialised and report[0]:
        dist.destroy_process_group()
    # End without interpreter finalisation: after a deadline, gloo may still
    # hold a joinable C++ thread (a pending pair operation), and destroying
    # it at exit aborts the rank with "terminate called without an active
    # exception" (seen in 3 of 8 runs of examples/when_things_go_wrong.py
    # under load). The result is reported; nothing is left to clean up.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


#: a rank's report on its pipe: the pickle's length, then the pickle
_REPORT_HEADER = struct.Struct("!Q")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _send_report(outcome: Connection, report: tuple[bool, Any]) -> None:
    """Writes this rank's report to the launcher (framed by `_ReportReader`)."""
    data = pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL)
    _write_all(outcome.fileno(), _REPORT_HEADER.pack(len(data)) + data)


class _ReportReader:
    """One rank's report, read as its bytes arrive and never waiting for
    more: a rank stopped (SIGSTOP, a debugger) half-way through writing a
    result larger than the pipe holds cannot keep the launcher past its
    timeout. (`Connection.recv` reads a whole message or waits.)"""

    def __init__(self, connection: Connection):
        self.connection = connection
        os.set_blocking(connection.fileno(), False)
        self._data = bytearray()

    def read(self) -> tuple[bool, Any] | None:
        """The report once complete, None while it is not; EOFError when
        the rank closed its end (it ended) before a whole report."""
        fd = self.connection.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                raise EOFError
            self._data += chunk
            report = self._complete()
            if report is not None:
                return report
        return self._complete()

    def _complete(self) -> tuple[bool, Any] | None:
        if len(self._data) < _REPORT_HEADER.size:
            return None
        (size,) = _REPORT_HEADER.unpack_from(self._data)
        if len(self._data) < _REPORT_HEADER.size + size:
            return None
        return pickle.loads(self._data[_REPORT_HEADER.size : _REPORT_HEADER.size + size])


#: store keys of the ranks whose process group is up (one launch, one store)
_READY_KEY = "distir/launch/ready/{}"


def _wait_for_every_rank(store: Any, rank: int, world_size: int, timeout_s: float) -> None:
    """Returns once every rank's `init_process_group` has returned. Without
    it a rank that ends at once in `fn` (an exception, `os._exit`) closes its
    connections while a slower peer is still connecting its full mesh, and
    the peer fails in its own start-up ("Connection closed by peer") instead
    of reaching `fn` and reporting a named error there (seen once in a CI
    run of the threshold fault test)."""
    store.set(_READY_KEY.format(rank), b"1")
    store.wait([_READY_KEY.format(r) for r in range(world_size)], timedelta(seconds=timeout_s))


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


class _SignalRecorder:
    """While active, SIGINT and SIGTERM are recorded instead of acted on
    (main thread only: Python delivers signals there). Signals the caller
    ignores stay ignored."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _record(self, signum: int, frame: object) -> None:
        if self.received is None:
            self.received = signum

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in FORWARDED_SIGNALS:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN or previous is None:
                continue  # ignored, or handled outside Python: leave it be
            self._previous[signum] = previous
            signal.signal(signum, self._record)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held back from this thread (and from the processes
    it starts, which inherit the mask) until the block ends."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _running(procs: Sequence[Any]) -> list[Any]:
    """The started processes that have not exited."""
    return [p for p in procs if p.pid is not None and p.exitcode is None]


def _wait_all(procs: Sequence[Any], until: float) -> None:
    """Waits for every process at once, until they all exited or `until`."""
    alive = _running(procs)
    while alive:
        left = until - time.monotonic()
        if left <= 0:
            return
        wait_for_any([p.sentinel for p in alive], timeout=left)
        alive = _running(alive)


def _stop(procs: Sequence[Any], signum: int | None) -> set[int]:
    """Ends every rank still running: `signum` first (if any) and SIGKILL
    after a grace; returns the indices of the ranks that had to be stopped."""
    running = {i for i, p in enumerate(procs) if p in _running(procs)}
    if signum is not None:
        for i in running:
            try:
                os.kill(procs[i].pid, signum)
            except ProcessLookupError:
                pass
        _wait_all(procs, time.monotonic() + _SIGNAL_GRACE_S)
    for p in _running(procs):
        p.kill()
    _wait_all(procs, time.monotonic() + 2.0)
    return running


@contextmanager
def _rank_environment() -> Iterator[None]:
    """The environment ranks start in: c10d's C++ warnings off unless the
    user set TORCH_CPP_LOG_LEVEL (a rank whose peer failed first may lose
    the store at teardown, which c10d reports with native stack traces;
    distir names every failure itself)."""
    if "TORCH_CPP_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        yield
    finally:
        del os.environ["TORCH_CPP_LOG_LEVEL"]


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
    _refuse_launch_while_a_rank_starts()
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1, got {nproc!r}")
    if tolerate is not None and (
        isinstance(tolerate, bool) or not isinstance(tolerate, int) or not 0 <= tolerate < nproc
    ):
        raise ValueError(f"tolerate must be an integer in [0, {nproc}), got {tolerate!r}")
    if replace and tolerate is None:
        raise ValueError("replace=True needs tolerate=k: how many ranks may be lost and replaced")
    timeout_s = seconds(timeout, "timeout")
    collective_timeout_s = seconds(collective_timeout, "collective_timeout")
    _check_launchable(fn)
    check_backend(backend, nproc)
    store = _host_store(collective_timeout_s)
    port = store.port
    # One pipe per rank, not a shared queue: a rank that dies without a
    # result is seen at once (end of file), and no semaphore is left behind.
    pipes = [mp.Pipe(duplex=False) for _ in range(nproc)]
    procs: list[Any] = []
    #: rank -> its process now (a replacement's, after a loss)
    by_rank: dict[int, Any] = {}
    #: rank -> why each earlier process of it was lost (replace=True)
    replaced: dict[int, list[str]] = {}
    outcomes: dict[int, tuple[bool, Any]] = {}
    exited_without_result: set[int] = set()
    stopped: set[int] = set()
    recorder = _SignalRecorder()
    recorder.install()
    try:
        try:
            # Starting multiprocessing's resource tracker unblocks SIGINT and
            # SIGTERM in this thread: start it before they are blocked.
            resource_tracker.ensure_running()
            with _signals_blocked(), _rank_environment():
                ctx, parent_pid = _rank_start()
                environment = dict(os.environ)
                forked = ctx.get_start_method() == "forkserver"
                output = _LauncherOutput() if forked and _outputs_open() else None

                def start(r: int, writer: Any, joining: bool = False) -> None:
                    procs.append(ctx.Process(
                        target=_rank_entry,
                        args=(r, nproc, port, backend, threads_per_rank, collective_timeout_s,
                              fn, args, pass_context, writer, parent_pid, environment,
                              output, joining),
                        name=f"distir-rank-{r}",
                        daemon=True,
                    ))
                    by_rank[r] = procs[-1]
                    procs[-1].start()

                for r in range(nproc):
                    start(r, pipes[r][1])
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise TypeError(f"launch cannot send the arguments of {fn!r} to its ranks: {e}") from e
        finally:
            for _, writer in pipes:
                writer.close()  # the ranks hold the write ends now
        pending = {pipes[r][0]: r for r in range(nproc)}
        reports = {r: _ReportReader(pipes[r][0]) for r in range(nproc)}
        deadline = time.monotonic() + timeout_s
        grace = min(collective_timeout_s, 10.0) + 2.0
        cut_short = False
        while pending and recorder.received is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # Short waits: a recorded signal is noticed within 0.1 s.
            for reader in wait_for_any(list(pending), timeout=min(0.1, left)):
                rank = pending[reader]  # type: ignore[index]
                try:
                    report = reports[rank].read()
                except EOFError:
                    exited_without_result.add(rank)
                else:
                    if report is None:
                        continue  # more of it to come
                    outcomes[rank] = report
                del pending[reader]  # type: ignore[arg-type]
                lost = rank in exited_without_result or not outcomes[rank][0]
                if tolerate is not None:
                    # Evidence for the survivors' recovery: this rank is gone.
                    _report_gone(store, rank, by_rank[rank], outcomes.get(rank))
                    losses = (
                        len(exited_without_result)
                        + sum(not ok for ok, _ in outcomes.values())
                        + sum(map(len, replaced.values()))
                    )
                    if losses <= tolerate:
                        if lost and replace:
                            reader = _replace_rank(rank, start, by_rank, outcomes,
                                                   exited_without_result, replaced)
                            pending[reader] = rank
                            reports[rank] = _ReportReader(reader)
                            pipes.append((reader, None))
                        continue
                if lost:
                    # The group is broken: others will fail or time out on their
                    # own collective deadline; collect what arrives within a grace.
                    if time.monotonic() + grace < deadline:
                        deadline, cut_short = time.monotonic() + grace, True
        if recorder.received is None:
            # Finished ranks are tearing down their process group; a rank
            # that failed may be stuck in that teardown, so it gets less time.
            failed = exited_without_result or any(not ok for ok, _ in outcomes.values())
            _wait_all(procs, min(deadline, time.monotonic() + (1.0 if failed else 5.0)))
        stopped = _stop(procs, recorder.received)
    finally:
        # Only reached with ranks alive when start-up itself failed.
        _stop(procs, None)
        for reader, _ in pipes:
            reader.close()
        recorder.restore()

    if recorder.received is not None:
        _stop_fork_server()
        name = signal.Signals(recorder.received).name
        # The signal now does what it would have done without launch.
        signal.raise_signal(recorder.received)
        raise LaunchError(
            f"interrupted by {name}: every rank was stopped", {}, _finished(outcomes)
        )

    if any(p.exitcode == _NO_MAIN_GUARD_EXIT for p in procs):
        raise LaunchError(NO_MAIN_GUARD, {r: NO_MAIN_GUARD for r in range(nproc)}, {})
    failures: dict[int, str] = {}
    stopped_procs = [procs[i] for i in stopped]
    for r in range(nproc):
        if r in exited_without_result or (r not in outcomes and by_rank[r] not in stopped_procs):
            failures[r] = f"{_exit_cause(by_rank[r].exitcode)} without a result"
        elif r not in outcomes:
            failures[r] = (
                f"did not finish in time (still running {grace:g} s after another rank "
                "failed; killed)"
                if cut_short
                else f"did not finish in time (killed after the {timeout_s:g} s timeout)"
            )
        elif not outcomes[r][0]:
            failures[r] = outcomes[r][1]
    for r, causes in replaced.items():
        last = [failures[r]] if r in failures else []
        failures[r] = "; ".join([*(f"{c} (replaced)" for c in causes), *last])
    if tolerate is not None and len(failures) <= tolerate:
        return LaunchOutcome(_finished(outcomes), failures)
    if failures:
        lines = [f"{len(failures)} of {count(nproc, 'rank')} failed:"]
        for r, why in sorted(failures.items()):
            lines.append(f"  rank {r}: {why}")
        raise LaunchError("\n".join(lines), failures, _finished(outcomes))
    return [_deserialize(outcomes[r][1]) for r in range(nproc)]


#: exit code of a rank that called `launch` while importing the main script
_NO_MAIN_GUARD_EXIT = 87
NO_MAIN_GUARD = (
    "distir.launch ran again inside every rank, which imports the script that calls it: "
    'put the call under `if __name__ == "__main__":`'
)


def _refuse_launch_while_a_rank_starts() -> None:
    """A spawned rank imports the main script before it runs anything; a
    script that calls `launch` at its top level (no `__main__` guard) would
    launch again from there. multiprocessing's own error for it is a page of
    tracebacks per rank: end the rank quietly with a code the launcher
    recognises instead, and the launcher says what to do in one line."""
    if getattr(mp.current_process(), "_inheriting", False):
        # os._exit, not SystemExit: a forked rank's bootstrap turns any
        # SystemExit into exit code 1.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_NO_MAIN_GUARD_EXIT)


def _host_store(timeout_s: float) -> Any:
    """The job's rendezvous store, served by this process on a free port."""
    from torch.distributed import TCPStore

    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )


def _exit_cause(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exited with code {code}"


def _report_gone(store: Any, rank: int, proc: Any, outcome: tuple[bool, Any] | None) -> None:
    """Tells the survivors (`distir.recover`) that `rank` will never join."""
    from distir.runtime.membership import GONE_KEY

    if outcome is None:
        proc.join(0.5)  # its pipe closed: it is exiting
        cause = f"{_exit_cause(proc.exitcode)} without a result"
    else:
        cause = "finished" if outcome[0] else str(outcome[1]).splitlines()[-1]
    try:
        store.set(GONE_KEY.format(rank=rank), cause)
    except Exception:  # the launcher's own store: only at shutdown
        pass


def _replace_rank(
    rank: int,
    start: Callable[..., None],
    by_rank: dict[int, Any],
    outcomes: dict[int, tuple[bool, Any]],
    exited_without_result: set[int],
    replaced: dict[int, list[str]],
) -> Connection:
    """Starts a new process for lost `rank`, joining the running job;
    returns the reading end of its report pipe. The lost process's cause
    moves to `replaced`."""
    if rank in exited_without_result:
        exited_without_result.discard(rank)
        cause = f"{_exit_cause(by_rank[rank].exitcode)} without a result"
    else:
        cause = str(outcomes.pop(rank)[1]).splitlines()[-1]
    replaced.setdefault(rank, []).append(cause)
    reader, writer = mp.Pipe(duplex=False)
    with _signals_blocked():
        start(rank, writer, True)
    writer.close()
    return reader


def _finished(outcomes: Mapping[int, tuple[bool, Any]]) -> dict[int, Any]:
    return {r: _deserialize(outcome[1]) for r, outcome in outcomes.items() if outcome[0]}
