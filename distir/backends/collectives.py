"""Default Torch implementations of the collectives over torch.distributed.

The same code runs gloo on CPU tensors and NCCL on CUDA tensors. Every
implementation first takes its op's precondition from the group
(`ProcessGroupResource.precondition`: local checks, and the agreement
exchange when the op needs one), then moves the payload. Results come from
the shared buffer pool, or are the input itself when the runtime marks it
writable (donated, or an intermediate whose last use is this op): that is
how a native collective runs at the speed of the raw in-place call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from distir.backends.buffers import pooled_copy, pooled_empty
from distir.backends.groups import COLLECTIVE_DTYPES, ProcessGroupResource
from distir.backends.registry import Implementation, Invocation
from distir.he.modular import int64_sum_is_exact
from distir.he.rns import TorchRNSBackend
from distir.interpreters.dtypes import element_dtype
from distir.interpreters.kernels import fold_in_rank_order
from distir.ir.all_reduce import GATHER_FOLD, algorithm_applies
from distir.ir.attributes import REDUCTION_KINDS
from distir.ir.dialect import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AllReduceOp,
    AssertUniformOp,
    BroadcastOp,
    GroupSizeOp,
    RankOp,
    VariableAllToAllOp,
)
from distir.ir.facts import AgreementRidesWithPayload

#: the c10d reduction of each native kind, derived from the kinds' facts
C10D_REDUCTIONS = {
    kind: getattr(dist.ReduceOp, facts.c10d) for kind, facts in REDUCTION_KINDS.items()
}


#: i1 sums and products as or and and: gloo adds booleans as bytes (three
#: ranks' True make a bool holding 3, and 256 wrap to False)
_BOOLEAN_REDUCTIONS = {"sum": dist.ReduceOp.MAX, "prod": dist.ReduceOp.MIN}


def c10d_reduction(kind: str, dtype: torch.dtype) -> dist.ReduceOp:
    """The c10d reduction that computes native `kind` on `dtype` exactly."""
    if dtype == torch.bool and kind in _BOOLEAN_REDUCTIONS:
        return _BOOLEAN_REDUCTIONS[kind]
    return C10D_REDUCTIONS[kind]


#: how IR spells each dtype gloo reduces, for messages
_ELEMENT_TYPE_NAMES = {
    torch.bool: "i1", torch.int8: "i8", torch.uint8: "ui8", torch.int32: "i32",
    torch.int64: "i64", torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32",
    torch.float64: "f64",
}  # fmt: skip


def writable_result(x: torch.Tensor, position: int, writable: frozenset[int]) -> torch.Tensor:
    """`x` itself when the op may overwrite it, else a pooled copy."""
    if position in writable and x.is_contiguous():
        return x
    return pooled_copy(x)


def gather_stacked(
    x: torch.Tensor, res: ProcessGroupResource, invocation: Invocation
) -> torch.Tensor:
    """Every rank's `x` (same shape everywhere), stacked: shape [P, *x.shape]."""
    flat = x.contiguous().reshape(-1)
    out = pooled_empty((res.size * flat.numel(),), x)
    res.all_gather(out, flat, invocation, wait=True)
    return out.view(res.size, *x.shape)


def _awaiting(
    resources: ProcessGroupResource,
    work: object,
    invocation: Invocation,
    results: tuple[torch.Tensor, ...],
) -> Callable[[], tuple[torch.Tensor, ...]]:
    """The waiter of a submitted collective: completes it under the deadline."""

    def wait() -> tuple[torch.Tensor, ...]:
        resources.complete(work, invocation)
        return results

    return wait


class GroupQueryImplementation(Implementation):
    name = "group-query"
    operation_types = (RankOp, GroupSizeOp)

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        value = resources.rank if isinstance(invocation.op, RankOp) else resources.size
        return (torch.tensor(value, dtype=torch.int64),)


class BroadcastImplementation(Implementation):
    name = "broadcast"
    operation_types = (BroadcastOp,)

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        return self.start(invocation, inputs, resources, writable)()

    def start(self, invocation, inputs, resources, writable=frozenset()):
        x = inputs[0]
        root = invocation.properties["root"]
        if root is None:  # a dynamic root: checked and agreed on
            root = resources.precondition(invocation, inputs).decoded["root"]
        if resources.rank != root:
            y = x if 0 in writable and x.is_contiguous() else pooled_empty(x.shape, x)
            work = resources.broadcast(y, root, invocation)
            return _awaiting(resources, work, invocation, (y,))
        # The root sends straight from its input (a broadcast only reads it
        # there) and makes its own result while the message is in flight.
        source = x.contiguous()
        work = resources.broadcast(source, root, invocation)
        y = source if source is not x or 0 in writable else pooled_copy(x)
        return _awaiting(resources, work, invocation, (y,))


#: float dtype -> (its bits as a signed integer, the integer type reduced)
_ORDER_KEYS = {
    torch.float16: (torch.int16, torch.int32),  # gloo reduces no int16
    torch.bfloat16: (torch.int16, torch.int32),
    torch.float32: (torch.int32, torch.int32),
    torch.float64: (torch.int64, torch.int64),
}


def _flip_magnitude_(bits: torch.Tensor, width: int) -> torch.Tensor:
    """Flips the magnitude bits of negative values, in place: an involution
    that maps IEEE bit patterns onto integers in the floats' total order."""
    return bits.bitwise_xor_((bits >> (width - 1)) & ((1 << (width - 1)) - 1))


def to_order_keys(y: torch.Tensor, kind: str) -> torch.Tensor:
    """Integers whose max (min) is the IEEE maximum (minimum) of the floats
    `y`: -0.0 orders below +0.0, and every NaN becomes the largest (smallest)
    key, so it wins. Overwrites `y` when the keys have its width."""
    bits_dtype, wire_dtype = _ORDER_KEYS[y.dtype]
    width = torch.iinfo(bits_dtype).bits
    nan = torch.isnan(y)
    keys = _flip_magnitude_(y.view(bits_dtype), width).to(wire_dtype)
    limits = torch.iinfo(bits_dtype)
    return keys.masked_fill_(nan, limits.max if kind == "max" else limits.min)


def from_order_keys(keys: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Writes the floats that `keys` encode into `y` (a NaN key decodes to a
    NaN) and returns `y`."""
    bits_dtype, _ = _ORDER_KEYS[y.dtype]
    bits = keys.to(bits_dtype)
    _flip_magnitude_(bits, torch.iinfo(bits_dtype).bits)
    if bits.data_ptr() != y.data_ptr():
        y.view(bits_dtype).copy_(bits)
    return y


class NativeAllReduceImplementation(Implementation):
    """The backend's own all-reduce. Float `max` and `min` reduce integer
    order keys (`to_order_keys`), because gloo's drop a NaN that is not
    first and tie -0.0 with +0.0: same message size, one collective."""

    name = "native"
    operation_types = (AllReduceOp,)
    #: element types the backend reduces natively
    element_dtypes = COLLECTIVE_DTYPES

    def matches(self, op) -> bool:
        return isinstance(op, AllReduceOp) and not op.is_generic

    def unsupported(self, op) -> str | None:
        dtype = element_dtype(op.input.type)
        if dtype in self.element_dtypes:
            return None
        element = op.input.type.element_type
        runnable = ", ".join(n for d, n in _ELEMENT_TYPE_NAMES.items() if d in self.element_dtypes)
        return (
            f"native {op.kind.data} on {element} cannot run: the gloo backend reduces "
            f"{runnable} (write a generic all-reduce, or widen the type)"
        )

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        return self.start(invocation, inputs, resources, writable)()

    def start(self, invocation, inputs, resources, writable=frozenset()):
        resources.precondition(invocation, inputs)
        kind = invocation.properties["kind"]
        y = writable_result(inputs[0], 0, writable)
        if kind in ("max", "min") and y.dtype in _ORDER_KEYS:
            keys = to_order_keys(y, kind)
            work = resources.all_reduce(keys, C10D_REDUCTIONS[kind], invocation)

            def decode() -> tuple[torch.Tensor, ...]:
                resources.complete(work, invocation)
                return (from_order_keys(keys, y),)

            return decode
        work = resources.all_reduce(y, c10d_reduction(kind, y.dtype), invocation)
        return _awaiting(resources, work, invocation, (y,))


class GatherFoldAllReduceImplementation(Implementation):
    """Baseline generic all-reduce: gather everything, fold in rank order.
    Correct for any associative combine; P×N temporary memory."""

    name = GATHER_FOLD
    operation_types = (AllReduceOp,)

    def matches(self, op) -> bool:
        # It folds the region; a native kind has none.
        return isinstance(op, AllReduceOp) and op.is_generic and algorithm_applies(self.name, op)

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        x, *extras = inputs
        resources.precondition(invocation, inputs)
        stacked = gather_stacked(x, resources, invocation)
        result = fold_in_rank_order(invocation.regions[0], stacked.unbind(0), extras)
        if resources.size == 1:
            result = pooled_copy(result)
        return (result,)


class ExactCiphertextAddImplementation(Implementation):
    """Per-limb modular sum, exact: a native int64 sum plus one remainder when
    P·(q_max−1) fits in int64, otherwise gather and fold with a modular add."""

    name = "exact-modular-sum"
    operation_types = (AllReduceAddCiphertextOp,)

    def __init__(self) -> None:
        self.rns = TorchRNSBackend()

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        ct, moduli = inputs
        q_max = resources.precondition(invocation, inputs).decoded["q_max"]
        if int64_sum_is_exact(resources.size, q_max):
            y = writable_result(ct, 0, writable)
            resources.all_reduce(y, dist.ReduceOp.SUM, invocation, wait=True)
            torch.remainder(y, moduli.to(y.device).view(-1, 1), out=y)
            return (y,)
        stacked = gather_stacked(ct, resources, invocation)
        acc = pooled_copy(stacked[0])
        for other in stacked.unbind(0)[1:]:
            self.rns.add_mod_(acc, other, moduli)
        return (acc,)


class CombineCiphertextAddImplementation(Implementation):
    """Ciphertext sum through an RNS backend's prepared add combine (see
    `distributed_operation_contributions(ciphertext_add=...)`)."""

    name = "rns-combine"
    operation_types = (AllReduceAddCiphertextOp,)
    priority = 1

    def __init__(self, combine: Callable[..., torch.Tensor]):
        self.combine = combine

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        ct, moduli = inputs
        resources.precondition(invocation, inputs)
        stacked = gather_stacked(ct, resources, invocation)
        acc = pooled_copy(stacked[0])
        in_place_add = getattr(self.combine, "in_place", None)
        for other in stacked.unbind(0)[1:]:
            acc = in_place_add(acc, other, moduli) if in_place_add else self.combine(
                acc, other, moduli
            )
        return (acc,)


class AssertUniformImplementation(Implementation):
    """Nothing but the agreement: every rank passes the same value."""

    name = "assert-uniform"
    operation_types = (AssertUniformOp,)

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        resources.precondition(invocation, inputs)
        return ()


class AllGatherImplementation(Implementation):
    name = "all-gather"
    operation_types = (AllGatherOp,)

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        axis = invocation.properties["axis"]
        x = inputs[0]
        pre = resources.precondition(invocation, inputs)
        if len(inputs) == 1:
            stacked = gather_stacked(x, resources, invocation)
            if axis == 0:
                return (stacked.flatten(0, 1) if x.dim() else stacked,)
            return (torch.cat(stacked.unbind(0), dim=axis),)
        counts = pre.decoded["counts"]
        # gloo has no uneven all-gather: pad every part to the largest, gather, slice.
        widest = max(counts)
        padded_shape = list(x.shape)
        padded_shape[axis] = widest
        padded = torch.zeros(padded_shape, dtype=x.dtype, device=x.device)
        padded.narrow(axis, 0, x.shape[axis]).copy_(x)
        stacked = gather_stacked(padded, resources, invocation)
        parts = [stacked[r].narrow(axis, 0, c) for r, c in enumerate(counts)]
        return (torch.cat(parts, dim=axis),)


class VariableAllToAllImplementation(Implementation):
    """Counts, then rows. When the run agreement carried the send counts
    (`Plan.counts_in_agreement`, in a run that agreed), the receive counts
    are already known: only the rows move. Otherwise, with agreement, one
    exchange carries every rank's "accepted" flag, its layout digest and its
    send counts, so receive counts and the check cost one exchange; without
    it, an all-to-all of the counts."""

    name = "all-to-all-single"
    operation_types = (VariableAllToAllOp,)

    def unsupported(self, op):
        # The op agrees in its counts exchange (or the run agreement carries
        # its counts) because it declares that its agreement rides with them.
        if not op.has_trait(AgreementRidesWithPayload):
            return f"{self.name} agrees in its count exchange, which {op.name} does not declare"
        return None

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        x, send_counts = inputs
        axis = invocation.properties["axis"]
        size, me = resources.size, resources.rank
        pre = resources.local_precondition(invocation, inputs)
        send = pre.decoded.get("send", [0] * size)
        options = invocation.options
        if options.get("counts_in_agreement") and resources.hoisted:
            recv = resources.agreed_counts  # agreed with the run, with `pre`
        elif resources.agreement and options.get("agree", False):
            rows = resources.exchange_rows([int(pre.ok), pre.digest(), *send], invocation)
            if any(row[0] != 1 or row[1] != rows[0][1] for row in rows):
                resources.explain(invocation, pre, rows)
            recv = [row[2 + me] for row in rows]
        else:
            if pre.error is not None:
                raise pre.error
            send_t = torch.tensor(send, dtype=torch.int64, device=x.device)
            recv_t = torch.empty_like(send_t)
            resources.all_to_all(recv_t, send_t, [1] * size, [1] * size, invocation, wait=True)
            recv = recv_t.tolist()
        rows_in = x.movedim(axis, 0).contiguous()
        out = pooled_empty((sum(recv), *rows_in.shape[1:]), x)
        resources.all_to_all(out, rows_in, recv, send, invocation, wait=True)
        counts = torch.tensor(recv, dtype=send_counts.dtype, device=send_counts.device)
        return (out.movedim(0, axis), counts)


def distributed_operation_contributions(
    *, ciphertext_add: Callable[..., torch.Tensor] | None = None
) -> list[Implementation]:
    """The implementations an execution owner registers, in priority order.

    `ciphertext_add`, a prepared RNS add combine (see
    `distir.he.rns.prepare_ciphertext_add_combine`), contributes a
    specialised ciphertext implementation; without it the automatic
    ciphertext sum is used.
    """
    from distir.backends.algorithms import algorithm_contributions
    from distir.backends.mesh import TransferImplementation
    from distir.backends.p2p import p2p_contributions

    contributions: list[Implementation] = [
        GroupQueryImplementation(),
        BroadcastImplementation(),
        NativeAllReduceImplementation(),
        GatherFoldAllReduceImplementation(),
        ExactCiphertextAddImplementation(),
        AssertUniformImplementation(),
        AllGatherImplementation(),
        VariableAllToAllImplementation(),
    ]
    if ciphertext_add is not None:
        contributions.append(CombineCiphertextAddImplementation(ciphertext_add))
    # The registry takes a requested name first (the op's `algorithm`, or
    # the runtime's default choice for a generic all-reduce), else the
    # highest priority, and on a tie the earliest contribution:
    # ciphertext-auto has priority 1, so it replaces exact-modular-sum (0)
    # by default, while a prepared `ciphertext_add` (rns-combine, also 1,
    # contributed earlier) still wins.
    contributions.extend(algorithm_contributions())
    contributions.extend(p2p_contributions())
    contributions.append(TransferImplementation())
    return contributions
