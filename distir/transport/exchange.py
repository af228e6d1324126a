"""The message layer the all-reduce algorithms are written against.

An `Exchange` is one execution's point-to-point messages inside one group,
addressed by *group* rank: `send(tensor, peer)`, `recv(tensor, peer)`
returning a handle, `wait(handle)`, and `finish()` (every send completed);
and one whole-group step for algorithms whose every message is one
segment: `all_to_all(out, x)` (even split: piece j of `x` goes to rank j,
piece j of `out` comes from rank j), complete when it returns.
`TorchExchange` runs them on torch.distributed under the op's deadline;
`InProcessExchange` runs P ranks as threads of one process, so every
algorithm can be checked against the reference for any group size (tests
run P up to 64) without starting a process.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

import torch
import torch.distributed as dist

from distir.core.invocation import Invocation
from distir.errors import DeadlineExceeded
from distir.transport.protocol import Transport, Work

R = TypeVar("R")

#: Issue CPU sends from a helper thread (see `_SendThread`).
THREADED_SENDS = True


class Exchange(Protocol):
    size: int
    rank: int

    def send(self, t: torch.Tensor, peer: int) -> None: ...

    def recv(self, t: torch.Tensor, peer: int) -> object:
        """Posts a receive into `t`; its handle goes to `wait`."""
        ...

    def wait(self, handle: object) -> None: ...

    def finish(self) -> None: ...

    def all_to_all(self, out: torch.Tensor, x: torch.Tensor) -> None: ...


class _SendThread:
    """Posts gloo sends from a helper thread.

    gloo writes a message to its socket inside `isend`, in the calling
    thread, until the socket buffer is full; on loopback that write also does
    the receiver's TCP work. Posted from the rank's own thread it would
    serialise with the combine; from here it overlaps it (c10d calls and
    torch kernels release the GIL). One thread and one queue keep the
    messages in order; the rank's thread completes the returned works.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="distir-send", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            t, peer, group, posted = self._queue.get()
            if t is None:  # a fence: everything before it is posted
                posted.set()
                continue
            try:
                posted.append(dist.isend(t, dst=peer, group=group))
            except BaseException as e:  # reported by the rank's thread
                posted.append(e)

    def send(
        self, t: torch.Tensor, peer: int, group: dist.ProcessGroup | None, posted: list
    ) -> None:
        self._queue.put((t, peer, group, posted))

    def fence(self) -> threading.Event:
        done = threading.Event()
        self._queue.put((None, None, None, done))
        return done


_send_thread: _SendThread | None = None
_send_thread_lock = threading.Lock()


def _shared_send_thread() -> _SendThread:
    global _send_thread
    with _send_thread_lock:
        if _send_thread is None:
            _send_thread = _SendThread()
        return _send_thread


class TorchExchange:
    """Messages over a process group; every wait goes through the group's
    deadline (`resources.complete`). CPU sends are posted by the shared send
    thread when `THREADED_SENDS` is set."""

    def __init__(self, resources: Transport, invocation: Invocation):
        self.resources = resources
        self.invocation = invocation
        self.group = resources.group
        self.size = resources.size
        self.rank = resources.rank
        self.sends: list[dist.Work] = []
        #: the send thread's posted works (or the error it met posting one)
        self.threaded: list[dist.Work | BaseException] | None = None

    def send(self, t: torch.Tensor, peer: int) -> None:
        if not t.numel():
            return
        dst = self.resources.global_rank(peer)
        if THREADED_SENDS and t.device.type == "cpu":
            if self.threaded is None:
                self.threaded = []
            _shared_send_thread().send(t, dst, self.group, self.threaded)
        else:
            self.sends.append(dist.isend(t, dst=dst, group=self.group))

    def recv(self, t: torch.Tensor, peer: int) -> Work:
        if not t.numel():
            return None
        return dist.irecv(t, src=self.resources.global_rank(peer), group=self.group)

    def wait(self, handle: Work) -> None:
        if handle is not None:
            self.resources.complete(handle, self.invocation)

    def finish(self) -> None:
        if self.threaded is not None:
            deadline = self.resources.deadline_for(self.invocation)
            if not _shared_send_thread().fence().wait(timeout=deadline):
                raise DeadlineExceeded(
                    self.invocation.description,
                    f"sends were not posted within the {deadline:g} s deadline",
                )
            self.sends += self.threaded
            self.threaded = None
        sends, self.sends = self.sends, []
        for work in sends:
            if isinstance(work, BaseException):
                raise work
            self.wait(work)

    def all_to_all(self, out: torch.Tensor, x: torch.Tensor) -> None:
        splits = [x.numel() // self.size] * self.size
        self.resources.all_to_all(out, x, splits, splits, self.invocation, wait=True)


class InProcessWorld:
    """Mailboxes shared by the ranks of an `InProcessExchange` group."""

    def __init__(self, size: int, timeout: float = 30.0):
        self.size = size
        self.timeout = timeout
        self._boxes: dict[tuple[int, int], queue.Queue] = {
            (a, b): queue.Queue() for a in range(size) for b in range(size)
        }

    def exchange(self, rank: int) -> InProcessExchange:
        return InProcessExchange(self, rank)

    def run(self, body: Callable[[InProcessExchange], R], join_s: float = 60.0) -> list[R]:
        """`body(exchange)` on one thread per rank; their results in rank
        order. The first error a rank raised is raised here, and a rank
        still running after `join_s` is an error (an algorithm that waits
        for a message nobody sends ends its test, not the process)."""
        results: list = [None] * self.size
        errors: list[BaseException] = []

        def thread(rank: int) -> None:
            try:
                results[rank] = body(self.exchange(rank))
            except BaseException as e:  # raised below, in the caller's thread
                errors.append(e)

        threads = [threading.Thread(target=thread, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(join_s)
        if errors:
            raise errors[0]
        if any(t.is_alive() for t in threads):
            raise TimeoutError(f"an in-process rank still runs after {join_s} s")
        return results


class InProcessExchange:
    """One rank's messages, as a thread of the process: sends copy the data
    (a real send leaves the buffer to the caller after `finish`), receives
    copy into the caller's tensor when waited for, in order per pair."""

    def __init__(self, world: InProcessWorld, rank: int):
        self.world = world
        self.size = world.size
        self.rank = rank

    def send(self, t: torch.Tensor, peer: int) -> None:
        if t.numel():
            self.world._boxes[(self.rank, peer)].put(t.clone())

    def recv(self, t: torch.Tensor, peer: int) -> tuple[torch.Tensor, int] | None:
        return (t, peer) if t.numel() else None

    def wait(self, handle: tuple[torch.Tensor, int] | None) -> None:
        if handle is None:
            return
        t, peer = handle
        try:
            message = self.world._boxes[(peer, self.rank)].get(timeout=self.world.timeout)
        except queue.Empty:
            raise TimeoutError(f"rank {self.rank}: no message from {peer}") from None
        if message.shape != t.shape:
            raise AssertionError(
                f"rank {self.rank} receives {list(t.shape)} but {peer} sent {list(message.shape)}"
            )
        t.copy_(message)

    def finish(self) -> None:
        return None

    def _pieces(self, t: torch.Tensor) -> list[torch.Tensor]:
        return list(t.reshape(self.size, -1).unbind(0))

    def all_to_all(self, out: torch.Tensor, x: torch.Tensor) -> None:
        sent, received = self._pieces(x), self._pieces(out)
        for peer in range(self.size):
            if peer != self.rank:
                self.send(sent[peer], peer)
        received[self.rank].copy_(sent[self.rank])
        for peer in range(self.size):
            if peer != self.rank:
                self.wait(self.recv(received[peer], peer))
