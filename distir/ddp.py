"""DDP communication hooks that aggregate gradients with distir programs.

PyTorch's `DistributedDataParallel` hands each gradient bucket (a flat
tensor) to a communication hook, `hook(state, bucket) -> Future[Tensor]`,
and writes the future's value back into the bucket. Each hook here puts a
distir program under that call, with distir's rules: the ranks agree on the
program (at every run, or for the sum hook once per bucket layout and then by
a digest checked after every bucket), every collective has a deadline, a failure poisons the
hook's process group and ends as a named error on every rank.

    state = SumHookState()                       # collective: every rank
    model = DistributedDataParallel(net)
    model.register_comm_hook(state, sum_hook)    # drop-in for DDP's default

- `sum_hook`: the bucket scaled by 1/world size exactly as DDP's default
  scales it (before the sum) and summed by a native distir all-reduce: bit
  for bit what DDP computes without a hook, at every world size. Ranks
  agree once per bucket layout (each bucket size's program is trusted: its
  plan is agreed at its first run) and check every bucket of every step
  with a 128-byte all-reduce of a digest of what each rank runs
  (`digest_words`), queued behind the bucket's sum.
- `program_hook`: any distir program mapping the bucket to the aggregated
  bucket (`ProgramHookState`), e.g. per-rank clipping then a sum, or
  majority-vote signSGD.
- `encrypted_hook`: the bucket packed into CKKS slots, encrypted under a
  threshold collective key (generated once, in `EncryptedHookState`), summed
  by the ciphertext all-reduce and decrypted collectively, then divided by
  the world size.

Every hook returns its future before its communication completes: programs
are submitted with `Program.run_async` (one distir worker per group, in
submission order, see `distir.runtime.concurrency`), and the encrypted hook
runs on one thread of its own. Programs are compiled once per bucket size
and dtype, so DDP's bucket rebuild after the first iteration only compiles
the new sizes. Each state runs on its own process group (created by the
state's constructor, a collective call), so the hook's exchanges can never
be interleaved with DDP's or the training loop's own collectives on the
default group.

A rank that dies during `loss.backward()` ends, on every survivor, as an
error from `backward()` within the deadline plus 2 s; the state keeps the
named distir error (`state.failure`); `with state.named_errors():` around
`backward()` raises it instead of DDP's RuntimeError. To go on
without the lost rank, every survivor calls `m = distir.recover()` and wraps
the model in a new DDP and a new state on `m.group`::

    except DistirError:
        unwrap(model)                      # the old DDP leaves the parameters
        m = distir.recover(deadline=...)   # longer than the hook's deadline
        model = DistributedDataParallel(net, process_group=m.group)
        state = SumHookState(group=m.group)
        model.register_comm_hook(state, sum_hook)
"""

# No `from __future__ import annotations`: DDP checks the hooks' annotations
# against the real `dist.GradBucket` and `Future[Tensor]` objects.
import concurrent.futures
import contextlib
import hashlib
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from distir.core.dtypes import ir_element_type
from distir.durations import Duration, seconds
from distir.errors import DistirError, ProgramMismatch
from distir.runtime.program import Program, compile

__all__ = [
    "EncryptedHookState",
    "HookState",
    "ProgramHookState",
    "encrypted_hook",
    "element_type",
    "SumHookState",
    "program_hook",
    "sum_hook",
    "unwrap",
]

#: torch dtype -> IR element type of the buckets a hook accepts
ELEMENT_TYPES = {
    dtype: ir_element_type(dtype)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
}


def element_type(dtype: torch.dtype) -> str:
    """The IR element type of a bucket dtype (a named error for others)."""
    try:
        return ELEMENT_TYPES[dtype]
    except KeyError:
        raise DistirError(
            f"DDP hook: gradient buckets of dtype {dtype} are not supported "
            f"(supported: {', '.join(str(d) for d in ELEMENT_TYPES)})"
        ) from None


@dataclass
class HookTiming:
    """When one hook call returned and when its future completed
    (`time.perf_counter()` seconds)."""

    bucket: int
    called: float
    returned: float
    completed: float | None = None


@dataclass
class HookState:
    """What every distir hook keeps: its process group, its programs (one
    per bucket size and dtype), the first failure, and timings.

    Constructing a state is collective: every rank of `group` (default: the
    world) constructs it, in the same order, because it creates the hook's
    own process group (`separate_group=False` runs on `group` itself, which
    is only safe while nothing else communicates on it during backward).
    """

    group: Any = None
    deadline: Duration = 60.0
    separate_group: bool = True
    record_timings: bool = False
    failure: BaseException | None = field(default=None, init=False)
    timings: list[HookTiming] = field(default_factory=list, init=False)
    _programs: dict[tuple[int, torch.dtype], Program] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not dist.is_initialized():
            raise DistirError("DDP hook state: torch.distributed is not initialised")
        self.deadline_s = seconds(self.deadline, "deadline")
        ranks = dist.get_process_group_ranks(self.group or dist.group.WORLD)
        if self.separate_group:
            # Members only: survivors of a failed group can form one without the lost ranks.
            self.group = dist.new_group(ranks, use_local_synchronization=True)
        self.world_size = len(ranks)

    def program(self, buffer: torch.Tensor) -> Program:
        """The program for a bucket of this size and dtype (compiled once)."""
        key = (buffer.numel(), buffer.dtype)
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = self.compile(buffer.numel(), buffer.dtype)
        return program

    def compile(self, numel: int, dtype: torch.dtype) -> Program:
        raise NotImplementedError

    def check(self) -> None:
        """Raises the first named error a hook of this state saw."""
        if self.failure is not None:
            raise self.failure

    @contextlib.contextmanager
    def named_errors(self) -> Iterator[None]:
        """Turns DDP's RuntimeError around a failed hook into the named
        distir error behind it::

            with state.named_errors():
                loss.backward()          # raises e.g. CollectiveFailed
        """
        try:
            yield
        except RuntimeError as e:
            if self.failure is None:
                raise
            raise self.failure from e

    def _track(self, bucket: Any, called: float, future: torch.futures.Future) -> Any:
        """The future DDP gets: the result, with failures and timings kept."""
        timing = None
        if self.record_timings:
            timing = HookTiming(bucket.index(), called, time.perf_counter())
            self.timings.append(timing)

        def settle(done: torch.futures.Future) -> torch.Tensor:
            if timing is not None:
                timing.completed = time.perf_counter()
            try:
                return done.value()
            except BaseException as e:
                if self.failure is None:
                    self.failure = e
                raise

        return future.then(settle)


# ------------------------------------------------------ the step's digest
#
# Each bucket of the sum hook is summed in place, as DDP's default sums it
# (the same buffer, the same collective: bit for bit DDP's result at every
# world size and dtype), and followed by a tiny all-reduce of its digest:
# the digest of what this rank runs (the hook call's position on the
# state, the bucket's index, size and dtype) as bytes d, each sent as the
# int64 pair (d, d*d). After the sum every rank holds (sum d_r, sum d_r^2),
# which equal (P*d, P*d*d) for its own d exactly when every rank sent the
# same d (then sum (d_r - d)^2 = sum d_r^2 - 2 d sum d_r + P d^2 = 0): so
# every rank sees the same verdict, and integer sums are exact in any
# order. The digest's all-reduce is its own 128-byte message, not a
# trailer on the bucket: a trailer needs a copy of the bucket (a pass over
# the gradients, measured at 1.1-1.5 ms of a 12 ms step at 1M parameters
# on 2 ranks) and at 3 ranks or more moves gloo's chunk boundaries, which
# changes the order of the sum (an ulp off).

#: bytes of the digest a bucket is checked with
DIGEST_BYTES = 4
#: int64 words of the digest's all-reduce
DIGEST_WORDS = 2 * DIGEST_BYTES


def digest_words(digest: bytes) -> list[int]:
    """The words a digest is summed as: (d, d*d) per byte d."""
    return [w for d in digest for w in (d, d * d)]


def all_sent(sums: list[int], digest: bytes, world_size: int) -> bool:
    """Whether `sums` (of every rank's `digest_words`) say that every one
    of the `world_size` ranks sent `digest`."""
    return sums == [world_size * w for w in digest_words(digest)]


def _sum_program_text(numel: int, element: str) -> str:
    t = f"tensor<{numel}x{element}>"
    return (
        f"func.func @main(%g: {t}) -> {t} {{\n"
        f"  %s = dist.all_reduce sum %g : {t}\n"
        f"  func.return %s : {t}\n"
        "}\n"
    )


@dataclass
class SumHookState(HookState):
    """State of `sum_hook`: its programs (one per bucket size and dtype,
    and the digest's), and the hook calls so far (what the digest names)."""

    calls: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._step = _step_digest()
        text = _sum_program_text(DIGEST_WORDS, "i64")
        self._digest_program = compile(text, deadline=self.deadline_s, agreement=False)

    def compile(self, numel: int, dtype: torch.dtype) -> Program:
        # Trusted: agreed at its first run on the group, then checked by
        # the digest at every run.
        text = _sum_program_text(numel, element_type(dtype))
        return compile(text, deadline=self.deadline_s, agreement=False)

    def checked_sum(
        self, index: int, buffer: torch.Tensor, last: bool = True
    ) -> torch.futures.Future:
        """The sum of `buffer` / world size, in place; at the `last` bucket
        of a step, then the check of the step's digest (every bucket since
        the previous check). The future completes with `buffer` (the mean),
        or, at the last bucket, with `ProgramMismatch` on every rank when
        ranks sent different digests (the step fails: DDP waits for every
        bucket's future)."""
        numel, dtype = buffer.numel(), buffer.dtype
        # As DDP's reducer scales without a hook, before the sum (no overflow
        # in fp16): times 1/world size (a double, rounded to the gradient's
        # type), not a division, which differs by an ulp where 1/world size
        # is inexact (3, 5, 6, ...); tested bit for bit at 2, 3 and 4 ranks.
        buffer.mul_(1.0 / self.world_size)
        position = self.calls
        self.calls += 1
        self._step.update(f"{position}:{index}:{numel}:{dtype};".encode())
        program = self.program(buffer)
        if not last:
            return program.run_async(buffer, group=self.group, donate=True, on_backend_thread=True)
        digest = self._step.digest()
        self._step = _step_digest()
        # (from bytes: `torch.tensor` of a list costs about 20 us here)
        words = torch.frombuffer(
            bytearray(struct.pack(f"<{DIGEST_WORDS}q", *digest_words(digest))), dtype=torch.int64
        )
        # The digest's sum first, the last bucket's behind it (the same
        # order on every rank): the backend runs both at once, so the check
        # adds no round trip after the step's last bucket.
        checked_digest = self._digest_program.run_async(
            words, group=self.group, donate=True, on_backend_thread=True
        )
        summed = program.run_async(buffer, group=self.group, donate=True, on_backend_thread=True)

        # Completed by hand, not with `then`: an error raised in a `then`
        # callback reaches DDP as a RuntimeError, not as the named error.
        checked: torch.futures.Future = torch.futures.Future()

        def check(done: torch.futures.Future) -> None:
            if not summed.done():  # (the backend completes them in either order)
                summed.add_done_callback(lambda _: check(done))
                return
            try:
                sums = done.value()
                total = summed.value()
            except BaseException as e:  # noqa: BLE001 - handed to the future
                checked.set_exception(e)
                return
            if all_sent(sums.tolist(), digest, self.world_size):
                checked.set_result(total)
                return
            error = ProgramMismatch(
                f"DDP sum hook: ranks summed different buckets in the step ending at hook "
                f"call {position} (this rank: bucket {index} of {numel} {dtype} gradients); "
                "every rank must run the same steps with the same buckets (a model or DDP "
                "settings that differ between ranks break this)"
            )
            program.poison(self.group, error)
            checked.set_exception(error)

        checked_digest.add_done_callback(check)
        return checked


def _step_digest() -> Any:
    return hashlib.blake2b(digest_size=DIGEST_BYTES)


def sum_hook(state: SumHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default aggregation through a distir program: the bucket is
    divided by the world size, then summed (the future completes with the
    mean gradient)."""
    called = time.perf_counter()
    future = state.checked_sum(bucket.index(), bucket.buffer(), bucket.is_last())
    return state._track(bucket, called, future)


#: what `ProgramHookState.source` may be: IR text or a module or a compiled
#: program (for one bucket size), or a function of (numel, element type)
#: returning one of them (for every bucket size)
ProgramSourceFor = Any


@dataclass
class ProgramHookState(HookState):
    """State of `program_hook`: `source` maps a bucket to the aggregated
    bucket, `@main(tensor<N x T>) -> tensor<N x T>` for a bucket of N
    elements of type T (f32, f16, bf16, f64). `source` is a compiled
    `Program`, IR text or a module (for one bucket size), or a function
    `(numel, element_type) -> Program | text | module`, called once per
    bucket size and dtype: `element_type` is the bucket's IR element type
    as a string (`"f32"`, `"f16"`, `"bf16"`, `"f64"`), as written in
    `tensor<{numel}x{element_type}>`. The program's value is the new bucket as is (no
    division by the world size: a mean divides in the program)."""

    source: ProgramSourceFor = None
    pipeline: str = ""

    def compile(self, numel: int, dtype: torch.dtype) -> Program:
        source = self.source
        if callable(source) and not isinstance(source, Program):
            source = source(numel, element_type(dtype))
        if isinstance(source, Program):
            return source
        if source is None:
            raise DistirError("ProgramHookState: no program source given")
        return compile(source, self.pipeline, deadline=self.deadline_s)


def program_hook(
    state: ProgramHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """The bucket aggregated by the state's distir program."""
    called = time.perf_counter()
    buffer = bucket.buffer()
    program = state.program(buffer)
    future = program.run_async(buffer, group=state.group, donate=True)
    return state._track(bucket, called, future)


# ---------------------------------------------------------------- encryption


class _ThresholdKey:
    """The one adapter between the encrypted hook and `distir.aggregation.threshold`:
    key generation (t-of-N, once per hook state), encryption, aggregation
    of committed ciphertexts and collective decryption (each spends one unit
    of the key's decryption budget)."""

    def __init__(self, group: Any, deadline_s: float, threshold: int | None = None):
        from distir.aggregation import threshold as ta

        self.ta = ta
        self.group = group
        self.deadline_s = deadline_s
        size = dist.get_world_size(group)
        # The ranks are the receivers of their gradients' sum: decryption to
        # the ranks, whose risk (a rank's crafted gradient reveals the key)
        # the README's threat model states, is the point of this hook.
        self.parameters = ta.ThresholdParameters(
            parties=size, threshold=threshold, decrypt_to_ranks=True
        )
        self.share = ta.generate_keys(self.parameters, group=group, deadline=deadline_s)
        self.context = self.share.public_key.context()
        self.slots = self.parameters.poly_modulus_degree // 2

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of `values` (float64, any length), through one
        ciphertext per `slots` values, one committed and checked sum of
        them all and one collective decryption (a protocol call has a fixed
        number of rounds, so a bucket costs the rounds of one ciphertext)."""
        import tenseal as ts

        ta = self.ta
        chunks = values.split(self.slots)
        encrypted = [ts.ckks_vector(self.context, c.tolist()) for c in chunks]
        total = ta.aggregate(encrypted, self.share, group=self.group, deadline=self.deadline_s)
        decrypted = ta.decrypt(total, self.share, group=self.group, deadline=self.deadline_s)
        return torch.cat(
            [torch.tensor(d[: c.numel()], dtype=torch.float64) for d, c in zip(decrypted, chunks)]
        )


@dataclass
class EncryptedHookState(HookState):
    """State of `encrypted_hook`: the threshold collective key (generated
    here, once: collective) and the thread the hook's work runs on."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.key = _ThresholdKey(self.group, self.deadline_s)
        # One thread, the same name on every rank: its runs pair by name
        # (distir.runtime.concurrency), in submission order.
        self._worker = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="distir-encrypted-hook"
        )
        self._lock = threading.Lock()

    def encrypted_mean(self, buffer: torch.Tensor) -> torch.Tensor:
        values = buffer.detach().to(torch.float64).reshape(-1)
        total = self.key.sum(values) if values.numel() else values.clone()
        return (total / self.world_size).to(buffer.dtype)

    def close(self) -> None:
        """Stops the hook's thread (after its queued work)."""
        self._worker.shutdown(wait=True)


def encrypted_hook(
    state: EncryptedHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """The bucket's mean over ranks, computed under encryption: no rank ever
    sees another rank's gradient, only the (decrypted) sum."""
    called = time.perf_counter()
    buffer = bucket.buffer()
    future: torch.futures.Future = torch.futures.Future()

    def work() -> None:
        try:
            result = state.encrypted_mean(buffer)
        except BaseException as e:  # noqa: BLE001 - handed to the future
            future.set_exception(e)
        else:
            future.set_result(result)

    state._worker.submit(work)
    return state._track(bucket, called, future)


def unwrap(ddp: torch.nn.parallel.DistributedDataParallel) -> None:
    """Detaches `ddp` from its module's parameters, before the module is
    wrapped again on another group (after `distir.recover` or `distir.grow`).

    DDP's reducer hooks every parameter's gradient accumulation; an old DDP
    that is merely dropped keeps them until the garbage collector breaks its
    reference cycles, and if its last step was cut short after the forward
    (a failure in the backward), its reducer still expects a backward and
    reduces each gradient again, on its old group (tests/ddp/test_unwrap.py). Removing its hooks takes microseconds where the full collection
    that also frees it took about a second in a process holding distir's IR
    (benchmarks/elastic_times.py); the rest of it is freed whenever Python
    collects."""
    ddp._remove_autograd_hooks()
