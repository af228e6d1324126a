"""A long-lived launch of real gloo ranks that runs cases sent to it.

The test process hosts a TCPStore and starts `distir.launch(serve, P, ...)`
in a background thread (`RankServer`). For case i it writes `case/i` (the
program text, pipeline, implementations and every rank's inputs and their
memory layouts); every rank compiles the program itself, runs it and writes
`outcome/i/<rank>` (its results, or the error it raised, and whether it
modified an input it did not donate). The test process reads every rank's
outcome and compares it with the oracle. `stop` ends the ranks.

A case that raises anything but `CompileError` on some rank may leave the
gloo pairs of the world group mid-message; the ranks then end their launch
(after every rank has reported) and the test process starts a fresh one for
the next case, so no case ever runs on a group another case broke.

Spawned ranks import this module by name: it imports only torch and distir.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

#: seconds every collective of a case may take (a case that hangs fails)
CASE_DEADLINE_S = 20.0
#: seconds a rank waits for the next case before giving up
IDLE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    inputs: list[list[torch.Tensor]]
    layouts: list[list[str]]
    pipeline: str = ""
    implementations: tuple[tuple[str, str], ...] = ()
    #: when given, every rank's inputs require grad and the rank runs the
    #: backward of sum(result #0 * grad_weights[rank]), returning the grads
    grad_weights: list[torch.Tensor] | None = None
    #: indices of donated inputs (`run(..., donate=...)`)
    donate: tuple[int, ...] = ()
    #: autograd saves every input before the run (w * x saves x); a
    #: backward through it after the run must be refused for an input the
    #: run may have written, and otherwise give x's value from before
    saved_by_autograd: bool = False


@dataclass(frozen=True)
class Outcome:
    """What one rank did with one case."""

    results: tuple[torch.Tensor, ...] | None
    error: str | None = None  # "<ErrorType>: <message>"
    compile_error: bool = False
    modified_inputs: tuple[int, ...] = ()
    grads: tuple[torch.Tensor | None, ...] | None = None


def dumps(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def apply_layout(value: torch.Tensor, layout: str) -> torch.Tensor:
    """A tensor equal to `value`, laid out in memory as named:
    "strided" (every other element of a larger buffer along the last dim),
    "transposed" (a transposed view), "expanded" (stride 0 along dim 0; the
    value is uniform along it), "negated" (memory holding -value under the
    negative bit: what `torch.tensor([1+2j]).conj().imag` is) or
    "contiguous"."""
    if layout == "negated":
        return torch._neg_view(-value)
    if layout == "contiguous" or value.dim() == 0:
        return value.clone()
    if layout == "strided":
        shape = list(value.shape)
        shape[-1] *= 2
        big = torch.zeros(shape, dtype=value.dtype)
        view = big[..., ::2]
        view.copy_(value)
        return view
    if layout == "transposed":
        return value.transpose(0, 1).contiguous().transpose(0, 1)
    if layout == "expanded":
        return value[:1].clone().expand(value.shape)
    raise ValueError(f"unknown layout {layout!r}")


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(dense_bytes(a), dense_bytes(b))


def dense_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t`'s elements in order (a fresh, stride-1 buffer: even a
    one-element view with stride 2 counts as contiguous to torch)."""
    flat = torch.empty(t.numel(), dtype=t.dtype)
    flat.copy_(t.detach().reshape(-1))
    return flat.view(torch.uint8)


def run_case(case: Case, rank: int) -> Outcome:
    import distir
    from distir.errors import CompileError, DistirError

    try:
        program = distir.compile(
            case.source,
            case.pipeline,
            implementations=dict(case.implementations),
            deadline=CASE_DEADLINE_S,
        )
    except CompileError as e:
        return Outcome(None, f"{type(e).__name__}: {e}", compile_error=True)
    inputs = []
    for x, lay in zip(case.inputs[rank], case.layouts[rank]):
        # "alias:i": the very tensor passed as input i (its value equals x).
        inputs.append(inputs[int(lay[6:])] if lay.startswith("alias:") else apply_layout(x, lay))
    if case.grad_weights is not None:
        inputs = [x.clone().requires_grad_() for x in inputs]
    before = [x.detach().clone() for x in inputs]
    saved = []
    if case.saved_by_autograd:
        for i, x in enumerate(inputs):  # w * x saves x, whatever x's dtype
            w = torch.ones(x.shape, dtype=torch.float64, requires_grad=True)
            saved.append((i, w, (w * x).sum()))
    try:
        results = program.run(*inputs, donate=case.donate)
    except DistirError as e:
        return Outcome(None, f"{type(e).__name__}: {e}")
    except Exception as e:  # not a named error: the test reports it as such
        return Outcome(None, f"unnamed {type(e).__name__}: {e}")
    results = results if isinstance(results, tuple) else (results,)
    for i, w, loss in saved:
        try:
            loss.backward()
        except RuntimeError as e:
            if i in case.donate and "modified by an inplace operation" in str(e):
                continue  # refused: the run may have written input i
            return Outcome(None, f"unnamed RuntimeError in backward through input #{i}: {e}")
        want = before[i].to(torch.float64)
        if not bool(((w.grad == want) | (w.grad.isnan() & want.isnan())).all()):
            return Outcome(None, f"stale: backward through input #{i} used a value written by the run")
    grads = None
    if case.grad_weights is not None:
        if not results[0].requires_grad:
            return Outcome(None, "silently detached: result #0 does not require grad")
        try:
            (results[0] * case.grad_weights[rank]).sum().backward()
        except Exception as e:
            return Outcome(None, f"unnamed {type(e).__name__} in backward: {e}")
        grads = tuple(None if x.grad is None else x.grad.clone() for x in inputs)
    modified = tuple(
        i
        for i, (x, b) in enumerate(zip(inputs, before))
        if i not in case.donate and not same_bytes(x, b)
    )
    return Outcome(
        tuple(r.detach().clone() for r in results), modified_inputs=modified, grads=grads
    )


def serve(ctx, host: str, port: int, first: int) -> int:
    """Worker: run cases `first`, `first + 1`, ... until `stop`, or until a
    case fails at run time (then the group may be broken: end, the test
    process starts a fresh launch). Returns the next case number."""
    from torch.distributed import TCPStore

    store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=IDLE_TIMEOUT_S))
    i = first
    while True:
        data = store.get(f"case/{i}")
        if data == b"stop":
            return i
        outcome = run_case(loads(data), ctx.rank)
        failed = outcome.error is not None and not outcome.compile_error
        store.set(f"failed/{i}/{ctx.rank}", b"1" if failed else b"0")
        store.set(f"outcome/{i}/{ctx.rank}", dumps(outcome))
        # Every rank ends the launch if any rank failed at run time, so that
        # no rank waits alone for a next case.
        flags = [store.get(f"failed/{i}/{r}") for r in range(ctx.world_size)]
        i += 1
        if b"1" in flags:
            return i


class RankServer:
    """The test-process side: hosts the store, (re)starts the launch, sends
    cases and collects every rank's outcome."""

    def __init__(self, world_size: int, case_timeout_s: float = 60.0) -> None:
        from torch.distributed import TCPStore

        from distir.runtime.launch import free_port

        self.world_size = world_size
        self.case_timeout_s = case_timeout_s
        self.port = free_port()
        self.store = TCPStore(
            "127.0.0.1", self.port, is_master=True, wait_for_workers=False,
            timeout=timedelta(seconds=case_timeout_s),
        )  # fmt: skip
        self.next_case = 0
        self.launches = 0
        self._thread: threading.Thread | None = None
        self._launch_error: BaseException | None = None
        self._ending = False

    def _start(self) -> None:
        import distir

        first = self.next_case

        def target() -> None:
            try:
                distir.launch(serve, self.world_size, "127.0.0.1", self.port, first,
                              pass_context=True, timeout=IDLE_TIMEOUT_S + 60,
                              collective_timeout=CASE_DEADLINE_S + 10)  # fmt: skip
            except BaseException as e:  # reported by the next `run`
                self._launch_error = e

        self._launch_error = None
        self._thread = threading.Thread(target=target, name="rank-server", daemon=True)
        self._thread.start()
        self.launches += 1

    def run(self, case: Case) -> list[Outcome]:
        """Every rank's outcome of `case`, in rank order."""
        if self._thread is not None and self._ending:
            # The ranks end their launch after a run-time failure: wait for
            # it (teardown is slow on a loaded machine), then start afresh.
            self._thread.join(timeout=120)
            assert not self._thread.is_alive(), "the previous launch did not end in 120 s"
            self._ending = False
        if self._thread is None or not self._thread.is_alive():
            self._start()
        i = self.next_case
        self.next_case += 1
        self.store.set(f"case/{i}", dumps(case))
        outcomes = []
        until = time.monotonic() + self.case_timeout_s
        for r in range(self.world_size):
            key = f"outcome/{i}/{r}"
            while not self.store.check([key]):
                if self._thread is not None and not self._thread.is_alive():
                    raise AssertionError(f"the ranks ended during case {case.name!r}: "
                                         f"{self._launch_error}")  # fmt: skip
                if time.monotonic() > until:
                    raise AssertionError(
                        f"case {case.name!r}: rank {r} did not report within "
                        f"{self.case_timeout_s:g} s (a hang)"
                    )
                time.sleep(0.01)
            outcomes.append(loads(self.store.get(key)))
        if any(o.error is not None and not o.compile_error for o in outcomes):
            self._ending = True  # the ranks end this launch; the next case starts a fresh one
        return outcomes

    def close(self) -> None:
        if self._thread is not None and self._ending:
            self._thread.join(timeout=120)
        elif self._thread is not None and self._thread.is_alive():
            self.store.set(f"case/{self.next_case}", b"stop")
            self._thread.join(timeout=30)
