"""What runs in a rank process: its start (signals, environment, process group,
the wait for its peers), the launched function and its report; and the
refusal of a script that would launch again from inside a rank.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

from distir.errors import DistirError
from distir.runtime.launch.rendezvous import (
    RankContext,
    local_rank_environment,
    set_cuda_device,
    wait_for_every_rank,
)
from distir.runtime.launch.reports import send_report, serialize
from distir.runtime.launch.spawning import follow_parent
from distir.runtime.launch.watching import FORWARDED_SIGNALS


def rank_entry(
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
    follow_parent(parent_pid, rank)
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
    local_rank_environment(rank, world_size, port)
    initialised = False
    try:
        import torch
        import torch.distributed as dist

        if threads is not None:
            torch.set_num_threads(threads)
        from distir.runtime.membership import set_job_store

        set_cuda_device(backend, rank)
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
        wait_for_every_rank(store, rank, world_size, collective_timeout)
        context = RankContext(rank, world_size, backend, joining)
        value = fn(context, *args) if pass_context else fn(*args)
        report: tuple[bool, Any] = (True, serialize(value))
    except BaseException as e:  # the parent reports it, naming this rank
        if isinstance(e, DistirError):
            report = (False, f"{type(e).__name__}: {e}")
        else:
            report = (False, traceback.format_exc().strip())
    # Report before tearing down: after a failure, the teardown may wait for
    # peers that will never come (the parent ends this rank then).
    send_report(outcome, report)
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


#: exit code of a rank that called `launch` while importing the main script
NO_MAIN_GUARD_EXIT = 87

NO_MAIN_GUARD = (
    "distir.launch ran again inside every rank, which imports the script that calls it: "
    'put the call under `if __name__ == "__main__":`'
)


def refuse_launch_while_a_rank_starts() -> None:
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
        os._exit(NO_MAIN_GUARD_EXIT)
