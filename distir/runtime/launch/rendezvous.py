"""How a rank joins its job: the torchrun environment (`init_from_environment`,
what `distir-run` checks before it starts anything), the variables a local
rank gets, the launcher's store and the wait for every rank's process group.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from distir.durations import Duration, seconds
from distir.errors import DistirError

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


def set_cuda_device(backend: str, rank: int) -> None:
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
    set_cuda_device(backend, int(os.environ.get("LOCAL_RANK", rank)))
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return RankContext(dist.get_rank(), dist.get_world_size(), backend)


def local_rank_environment(rank: int, world_size: int, port: int) -> None:
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


#: store keys of the ranks whose process group is up (one launch, one store)
_READY_KEY = "distir/launch/ready/{}"


def wait_for_every_rank(store: Any, rank: int, world_size: int, timeout_s: float) -> None:
    """Returns once every rank's `init_process_group` has returned. Without
    it a rank that ends at once in `fn` (an exception, `os._exit`) closes its
    connections while a slower peer is still connecting its full mesh, and
    the peer fails in its own start-up ("Connection closed by peer") instead
    of reaching `fn` and reporting a named error there (seen once in a CI
    run of the threshold fault test)."""
    store.set(_READY_KEY.format(rank), b"1")
    store.wait([_READY_KEY.format(r) for r in range(world_size)], timedelta(seconds=timeout_s))


@contextmanager
def rank_environment() -> Iterator[None]:
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


def host_store(timeout_s: float) -> Any:
    """The job's rendezvous store, served by this process on a free port."""
    from torch.distributed import TCPStore

    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )
