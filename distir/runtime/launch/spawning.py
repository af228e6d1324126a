"""Starting local rank processes: forked from a server that has imported torch
and distir (or spawned fresh), with the launcher's output, and tied to the
launching process so that none outlives it.
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
from typing import Any

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


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def follow_parent(parent_pid: int, rank: int) -> None:
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


def rank_start() -> tuple[Any, int]:
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


def stop_fork_server() -> None:
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


atexit.register(stop_fork_server)  # does nothing when no server was started


class LauncherOutput:
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


def outputs_open() -> bool:
    try:
        os.fstat(1)
        os.fstat(2)
    except OSError:
        return False
    return True
