"""Ownership: which memory a run may write, and what its results may share.

The rule (docs/python-api.md states it for callers), kept here and nowhere else:

- A run writes an input only when the caller donated it (`run(...,
  donate=...)`, as JAX's `donate_argnums`) *and* writing it cannot change
  what anything else reads: the input is contiguous (no stride-0 or
  overlapping layout) and its bytes overlap no other input's. A donated
  input that fails this is simply not written: donation is a permission,
  and the run gives the reference result either way (JAX refuses such
  donations; distir, whose callers pass views freely, declines them).
- A result shares storage with no input the run may not write, and with
  none of the program's own state (constants every run shares, casts and
  selects of them): such a result is returned as a copy.

A run reads an input's memory as its value, so an input whose memory is
not its value never reaches a collective (`plain_inputs`): a lazy negation
view (the negative bit, as `torch.tensor([1+2j]).conj().imag` has) or an
efficient zero tensor (no memory at all) runs on a copy of its value, and a
tensor with no dense memory (sparse, on the meta device) is refused naming
the input. Before, gloo summed a negation view's raw memory and wrote the
sum into a temporary: each rank returned its own donated input.

A queued run (`Program.run_async`) reads copies of its inputs made when it
was queued (`queued_inputs`): every input the caller did not donate, and
every input of a run that records gradients. A caller may then change an
input by any channel — an in-place op, `.data`, `.numpy()`, another tensor
on the same storage, `torch.inference_mode()` (none of which but the first
torch's version counter sees) — and the run computes with the values it was
given. A donated input is the run's from the call on: it is not copied (the
point of donating), and a change torch's version counter sees is refused by
every rank in the run's agreement (`ProgramInputError`).

Overlap means storage overlap: the same untyped storage and intersecting
byte ranges, so views, slices, expanded tensors and a tensor passed twice
are all caught, while disjoint slices of one buffer are not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.graph import increment_version
from xdsl.dialects import func
from xdsl.ir import BlockArgument, SSAValue

from distir.core.kernels import FRESH_RESULTS
from distir.errors import ProgramInputError
from distir.ir.facts import RunsBodyInPlace
from distir.transport.buffers import pooled_copy

Span = tuple[int, int, int]  # (storage address, first byte, one past the last byte)


def storage_span(x: Any) -> Span | None:
    """The bytes of its storage a tensor can read or write (None: none)."""
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        return None
    # torch strides are never negative: the last element is at sum((n-1)*s).
    last = sum((n - 1) * s for n, s in zip(x.shape, x.stride(), strict=True))
    start = x.storage_offset() * x.element_size()
    return (x.untyped_storage().data_ptr(), start, start + (last + 1) * x.element_size())


def storage_of(x: Any) -> int | None:
    """The address of the storage a tensor's elements live in (None: it
    has none)."""
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        return None
    return x.untyped_storage().data_ptr()


def overlap(a: Span | None, b: Span | None) -> bool:
    return (
        a is not None and b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]
    )


def _dense(x: Any) -> bool:
    """Whether writing `x` element by element touches each byte once."""
    return isinstance(x, torch.Tensor) and x.is_contiguous()


_NONE: frozenset[int] = frozenset()


@functools.lru_cache(maxsize=32)
def _all_of(count: int) -> frozenset[int]:
    return frozenset(range(count))


def is_plain(x: torch.Tensor) -> bool:
    """Whether a tensor's memory holds its value: dense (strided), not on
    the meta device, no negative bit, not an efficient zero tensor."""
    return x.layout is torch.strided and not (x.is_neg() or x._is_zerotensor() or x.is_meta)


def plain_inputs(inputs: Sequence[Any], what: str = "") -> Sequence[Any]:
    """`inputs`, each tensor one whose memory is its value: a negation view
    or an efficient zero tensor is replaced by a copy of its value
    (`clone`, which keeps autograd's graph to the caller's tensor); a
    tensor without dense memory raises `ProgramInputError` naming it (as
    input #i of `what`, the program's entry)."""
    if all(is_plain(x) for x in inputs if isinstance(x, torch.Tensor)):
        return inputs
    return tuple(_plain(f"{what} input #{i}".lstrip(), x) for i, x in enumerate(inputs))


def _plain(which: str, x: Any) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    if x.layout is not torch.strided:
        raise ProgramInputError(
            f"{which} is a {str(x.layout).removeprefix('torch.')} tensor: distir runs on "
            "dense (strided) tensors; pass x.to_dense()"
        )
    if x.is_meta:
        raise ProgramInputError(f"{which} is on the meta device: it holds no data to communicate")
    if x.is_neg() or x._is_zerotensor():
        return x.clone()  # its value in memory of its own
    return x


def donated_indices(donate: bool | Sequence[int], count: int) -> frozenset[int]:
    """The donated input indices (`donate=True`: all of them)."""
    if donate is True:
        return _all_of(count)
    if donate is False:
        return _NONE
    indices = frozenset(donate)
    bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < count]
    if bad:
        raise ProgramInputError(f"donate names inputs {sorted(bad)} of {count}")
    return indices


def queued_inputs(inputs: Sequence[Any], donate: bool | Sequence[int]) -> tuple[Any, ...]:
    """The inputs a queued run reads (see the module docstring): a copy of
    each one not donated (a differentiable copy where it requires grad, so
    gradients reach the caller's tensor), the donated ones themselves unless
    the run records gradients."""
    try:
        donated = donated_indices(donate, len(inputs))
    except ProgramInputError:  # the run refuses it, on every rank at once
        donated = _NONE
    recorded = any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs)
    queued = []
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor) or (i in donated and not recorded):
            queued.append(x)
        elif x.requires_grad:
            queued.append(x.clone())
        elif x.layout != torch.strided or x.device.type == "meta":
            queued.append(x)  # no dense memory to copy: the run refuses it by name
        else:
            queued.append(pooled_copy(x))
    return tuple(queued)


def writable_inputs(inputs: Sequence[Any], donate: bool | Sequence[int]) -> frozenset[int]:
    """The inputs this run may overwrite: donated, dense, and overlapping no
    other input (donated or not)."""
    donated = donated_indices(donate, len(inputs))
    if not donated:
        return donated
    if len(inputs) == 1:  # nothing else to overlap: only the layout matters
        x = inputs[0]  # `_dense(x)`, inline: this runs on every donated run
        return donated if isinstance(x, torch.Tensor) and x.is_contiguous() else _NONE
    spans = [storage_span(x) for x in inputs]
    return frozenset(
        i
        for i in donated
        if _dense(inputs[i])
        and not any(overlap(spans[i], spans[j]) for j in range(len(inputs)) if j != i)
    )


def donation_for(
    donate: bool, count: int, contiguous: bool = False
) -> frozenset[int] | Callable[[Sequence[Any]], frozenset[int]]:
    """`writable_inputs` specialised for a binding's runs with `donate`
    (True or False) on `count` inputs (`distir.runtime.specialised`):
    nothing donated is the constant empty set; one donated input is
    writable when it is contiguous (nothing else to overlap), always when
    the guard before this one accepts only contiguous inputs
    (`contiguous`); otherwise the full check on every run."""
    if donate is False or count == 0:
        return _NONE
    if count == 1:
        everything = _all_of(1)
        if contiguous:
            return everything

        def one(inputs: Sequence[Any]) -> frozenset[int]:
            return everything if inputs[0].is_contiguous() else _NONE

        return one
    return functools.partial(writable_inputs, donate=donate)


def mark_written_for(count: int) -> Callable[[Sequence[Any], frozenset[int]], None]:
    """`mark_written` specialised for a binding of `count` inputs: with one
    input, the written set is all of them, and its counter advances
    directly (what `increment_version` does after wrapping a tensor)."""
    if count != 1:
        return mark_written
    advance = torch._C._increment_version

    def one(inputs: Sequence[Any], writable: frozenset[int]) -> None:
        if writable:
            advance(inputs)

    return one


def owned_results_for(
    count: int, maybe_shared: frozenset[int]
) -> Callable[[tuple[torch.Tensor, ...], Sequence[Any], frozenset[int]], tuple[torch.Tensor, ...]]:
    """`owned_results` specialised for a binding of `count` inputs and the
    result positions `maybe_shared` (`distir.runtime.specialised`): when no
    result may be program state, a run whose every input is writable has
    nothing to copy (a result may share only a writable input's memory);
    otherwise the full check."""
    if maybe_shared:
        return functools.partial(owned_results, maybe_shared=maybe_shared)

    def owned(
        results: tuple[torch.Tensor, ...], inputs: Sequence[Any], writable: frozenset[int]
    ) -> tuple[torch.Tensor, ...]:
        if len(writable) == count:
            return results
        return owned_results(results, inputs, writable, maybe_shared)

    return owned


def input_versions(inputs: Sequence[Any]) -> tuple[int | None, ...]:
    """Each input tensor's version counter, which every in-place torch op
    advances (None: not a tensor, or an inference tensor, which has none)."""
    return tuple(_version(x) for x in inputs)


def _version(x: Any) -> int | None:
    if not isinstance(x, torch.Tensor) or x.is_inference():
        return None
    return x._version


def check_unchanged(inputs: Sequence[Any], versions: Sequence[int | None], what: str) -> None:
    """Raises `ProgramInputError` naming the first input modified in place
    since `versions` were read (`Program.run_async` reads them when it
    queues a run, and this runs when the run starts: a run reads its inputs
    when it executes, so a change in between would silently be computed
    with)."""
    for i, (x, version) in enumerate(zip(inputs, versions)):
        if version is not None and x._version != version:
            raise ProgramInputError(
                f"{what}: input #{i} was modified in place after run_async queued the run "
                "and before the run started; a queued run reads its inputs when it "
                "executes (as torch.distributed's async collectives do): leave them "
                "unchanged until its future completes, or pass a copy"
            )


def mark_written(inputs: Sequence[Any], writable: frozenset[int]) -> None:
    """Tells autograd that a run may overwrite the inputs in `writable`
    (donated, so the caller gave up their values): their version counters
    advance, as every in-place torch op's do, so a value autograd saved from
    one of them is refused in backward ("modified by an inplace operation")
    instead of used after the run overwrote it. Collectives write memory
    torch does not track: `dist.all_reduce(x)` leaves x's counter alone,
    and a backward through x's old value then silently used the sum."""
    if writable:
        increment_version([inputs[i] for i in writable])


def owned_results(
    results: tuple[torch.Tensor, ...],
    inputs: Sequence[Any],
    writable: frozenset[int],
    maybe_shared: frozenset[int],
) -> tuple[torch.Tensor, ...]:
    """`results`, copying any that shares storage with an input the run may
    not write, or (positions in `maybe_shared`, see `results_maybe_shared`)
    that may be program state and is not a writable input's memory."""
    kept = []
    for i, x in enumerate(inputs):  # a loop, not a comprehension: this runs on every run
        if i not in writable and (storage := storage_of(x)) is not None:
            kept.append((storage, x))
    if not kept and not maybe_shared:
        return results
    # Overlap needs the same storage: compare storages first (one pointer
    # per tensor) and byte ranges only within one (this runs on every run).
    kept_storages = {storage for storage, _ in kept}
    given: list[Span | None] | None = None
    owned = []
    for position, r in enumerate(results):
        storage = storage_of(r)
        shared = position in maybe_shared
        if storage is not None and (storage in kept_storages or shared):
            span = storage_span(r)
            if any(overlap(span, storage_span(x)) for _, x in kept):
                r = r.clone()
            elif shared:
                if given is None:
                    given = [storage_span(inputs[i]) for i in writable]
                if not any(overlap(span, s) for s in given):
                    r = r.clone()
        owned.append(r)
    return tuple(owned)


def results_maybe_shared(function: func.FuncOp) -> frozenset[int]:
    """Result positions of `function` that may share memory with the
    program's own state: returned values that are neither entry arguments
    (checked against the inputs at run time) nor made fresh by their op.
    Collectives return pooled buffers or a writable operand; constants are
    shared by every run; casts, selects, broadcasts, control flow and calls
    may return any of these."""
    ret = function.body.block.last_op
    if not isinstance(ret, func.ReturnOp):
        return frozenset()
    return frozenset(
        position
        for position, value in enumerate(ret.operands)
        if not isinstance(value, BlockArgument) and not _fresh(value)
    )


def _fresh(value: SSAValue) -> bool:
    owner = value.owner
    if isinstance(owner, RunsBodyInPlace):  # its result is what its body yields
        inner = owner.yielded()[value.index]
        if isinstance(inner, BlockArgument):
            return False
        return inner.owner.parent_op() is owner or _fresh(inner)
    return type(owner) in FRESH_RESULTS or owner.name.startswith("dist.")
