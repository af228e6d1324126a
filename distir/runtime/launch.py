"""Starting ranks: P local processes on 127.0.0.1, or the torchrun environment.

`launch(fn, nproc)` is the embedded default: no cluster and no setup. It
spawns `nproc` processes, initialises a process group among them over
loopback, runs `fn(*args)` on each and returns every rank's result, in rank
order. Every wait is bounded: a rank that fails is reported with its
traceback, a rank that hangs is killed when `timeout` expires, and no process
outlives the call.

Under torchrun (RANK, WORLD_SIZE and MASTER_ADDR set), `init_from_environment`
joins the job as that rank instead, so the same program scales to many
machines.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from distir.errors import DistirError


class LaunchError(DistirError):
    """One or more ranks failed or did not finish in time."""

    def __init__(self, message: str, failures: dict[int, str], results: dict[int, Any]):
        super().__init__(message)
        #: rank -> why it failed
        self.failures = failures
        #: rank -> result, for the ranks that finished
        self.results = results


@dataclass(frozen=True)
class RankContext:
    """What a launched function may want to know about its rank."""

    rank: int
    world_size: int
    backend: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def default_backend() -> str:
    return "gloo"


def _set_cuda_device(backend: str, rank: int) -> None:
    if backend == "nccl":
        import torch

        torch.cuda.set_device(rank % torch.cuda.device_count())


def init_from_environment(backend: str = "gloo", timeout: float = 300.0) -> RankContext:
    """Join a torchrun job (env:// rendezvous) unless already initialised."""
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    _set_cuda_device(backend, int(os.environ.get("LOCAL_RANK", rank)))
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    return RankContext(dist.get_rank(), dist.get_world_size(), backend)


def _serialize(value: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _deserialize(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


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
    results: mp.Queue,
) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        import torch
        import torch.distributed as dist

        if threads is not None:
            torch.set_num_threads(threads)
        _set_cuda_device(backend, rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=collective_timeout),
        )
        try:
            context = RankContext(rank, world_size, backend)
            value = fn(context, *args) if pass_context else fn(*args)
            results.put((rank, True, _serialize(value)))
        finally:
            dist.destroy_process_group()
    except BaseException as e:  # the parent reports it, naming this rank
        if isinstance(e, DistirError):
            detail = f"{type(e).__name__}: {e}"
        else:
            detail = traceback.format_exc().strip()
        results.put((rank, False, detail))


def launch(
    fn: Callable[..., Any],
    nproc: int,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 120.0,
    collective_timeout: float = 60.0,
    threads_per_rank: int | None = 1,
    pass_context: bool = False,
) -> list[Any]:
    """Runs `fn(*args)` (or `fn(RankContext, *args)`) on `nproc` local ranks
    and returns their results in rank order.

    `fn` must be importable by name (a module-level function), since ranks
    are fresh processes. Raises `LaunchError` naming each failed or hung
    rank; every process is gone when this returns.
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_entry,
            args=(r, nproc, port, backend, threads_per_rank, collective_timeout, fn, args,
                  pass_context, results),
            name=f"distir-rank-{r}",
            daemon=True,
        )
        for r in range(nproc)
    ]
    outcomes: dict[int, tuple[bool, Any]] = {}
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        while len(outcomes) < nproc and time.monotonic() < deadline:
            try:
                rank, ok, payload = results.get(timeout=0.1)
            except queue.Empty:
                if all(not p.is_alive() for p in procs):
                    # Give the feeder threads of exited ranks a moment to flush.
                    try:
                        rank, ok, payload = results.get(timeout=1.0)
                    except queue.Empty:
                        break
                else:
                    continue
            outcomes[rank] = (ok, payload)
            if not ok:
                # The group is broken: others will fail or time out on their own
                # collective deadline; collect what arrives within a short grace.
                deadline = min(deadline, time.monotonic() + min(collective_timeout, 10.0) + 2)
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        for r, p in enumerate(procs):
            if p.is_alive():
                killed.add(r)
                p.kill()
                p.join(5)
        results.close()

    failures: dict[int, str] = {}
    for r in range(nproc):
        if r not in outcomes:
            failures[r] = (
                f"did not finish in time (killed after {timeout:.0f} s or after another "
                "rank failed)"
                if r in killed
                else f"exited with code {procs[r].exitcode} without a result"
            )
        elif not outcomes[r][0]:
            failures[r] = outcomes[r][1]
    if failures:
        lines = [f"{len(failures)} of {nproc} ranks failed:"]
        for r, why in sorted(failures.items()):
            lines.append(f"  rank {r}: {why}")
        finished = {
            r: _deserialize(outcome[1]) for r, outcome in outcomes.items() if outcome[0]
        }
        raise LaunchError("\n".join(lines), failures, finished)
    return [_deserialize(outcomes[r][1]) for r in range(nproc)]
