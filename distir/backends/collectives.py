"""Torch implementations of every dist op over torch.distributed.

The same code runs gloo on CPU tensors and NCCL on CUDA tensors: helper
tensors (counts, gather buffers) are made on the device of the inputs.
Results never alias inputs: `in_place` is declared unsupported everywhere
except where an implementation says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from distir.backends.buffers import pooled_copy, pooled_empty
from distir.backends.groups import (
    ProcessGroupResource,
    ciphertext_descriptor,
    describe_descriptor,
    explain_ciphertexts,
    explain_layouts,
    tensor_descriptor,
)
from distir.backends.registry import Implementation, Invocation
from distir.errors import OpError
from distir.he.rns import TorchRNSBackend
from distir.interpreters.checks import (
    check_axis_rows,
    check_ciphertext,
    check_counts,
    check_root,
    deferred_sum_is_exact,
)
from distir.ir.dialect import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AllReduceOp,
    BroadcastOp,
    GroupSizeOp,
    RankOp,
    VariableAllToAllOp,
)

NATIVE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}


# torch 2.13 renamed all_gather_into_tensor (and deprecated the old name).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gather_stacked(
    x: torch.Tensor, res: ProcessGroupResource, invocation: Invocation
) -> torch.Tensor:
    """Every rank's `x` (same shape everywhere), stacked: shape [P, *x.shape]."""
    flat = x.contiguous().reshape(-1)
    out = pooled_empty((res.size * flat.numel(),), x)
    res.complete(_all_gather_single(out, flat, group=res.group, async_op=True), invocation)
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


def _attempt(check: Callable[[], object]) -> BaseException | None:
    """Runs a local check, returning its error instead of raising it, so that
    the rank can still tell its peers before they enter the payload."""
    try:
        check()
    except OpError as e:
        return e
    return None


class GroupQueryImplementation(Implementation):
    name = "group-query"
    operation_types = (RankOp, GroupSizeOp)

    def execute(self, invocation, inputs, resources, *, in_place):
        value = resources.rank if isinstance(invocation.op, RankOp) else resources.size
        return (torch.tensor(value, dtype=torch.int64),)


class BroadcastImplementation(Implementation):
    name = "broadcast"
    operation_types = (BroadcastOp,)

    def execute(self, invocation, inputs, resources, *, in_place):
        return self.start(invocation, inputs, resources)()

    def start(self, invocation, inputs, resources):
        x = inputs[0]
        root = invocation.properties["root"]
        if root is None:
            root = int(inputs[1])
        error = _attempt(lambda: check_root(invocation, root, resources.size))

        def explain(rows: list[list[int]]) -> str:
            shown = "; ".join(
                f"rank {r}: root {row[0]}, {describe_descriptor(row[1:])}"
                for r, row in enumerate(rows)
            )
            return f"ranks disagree on the root or the message layout ({shown})"

        resources.agree(invocation, lambda: [root, *tensor_descriptor(x)], error, x.device, explain)
        if resources.rank != root:
            y = pooled_empty(x.shape, x)
            work = dist.broadcast(y, group=resources.group, group_src=root, async_op=True)
            return _awaiting(resources, work, invocation, (y,))
        # The root sends straight from its input (a broadcast only reads it
        # there) and makes its own result while the message is in flight.
        source = x.contiguous()
        work = dist.broadcast(source, group=resources.group, group_src=root, async_op=True)
        y = pooled_copy(x) if source is x else source
        return _awaiting(resources, work, invocation, (y,))


class NativeAllReduceImplementation(Implementation):
    name = "native"
    operation_types = (AllReduceOp,)

    def matches(self, op) -> bool:
        return isinstance(op, AllReduceOp) and op.kind is not None

    def execute(self, invocation, inputs, resources, *, in_place):
        return self.start(invocation, inputs, resources)()

    def start(self, invocation, inputs, resources):
        x = inputs[0]
        resources.agree(invocation, lambda: tensor_descriptor(x), None, x.device,
                        explain_layouts("input layouts"))
        y = pooled_copy(x)
        work = dist.all_reduce(
            y, op=NATIVE_OPS[invocation.properties["kind"]], group=resources.group, async_op=True
        )
        return _awaiting(resources, work, invocation, (y,))


def fold_in_rank_order(
    combine: Callable[..., tuple[torch.Tensor, ...]],
    values: Sequence[torch.Tensor],
    extras: Sequence[torch.Tensor],
) -> torch.Tensor:
    acc = values[0]
    for value in values[1:]:
        (acc,) = combine(acc, value, *extras)
    return acc


class GatherFoldAllReduceImplementation(Implementation):
    """Baseline generic all-reduce: gather everything, fold in rank order.
    Correct for any associative combine; P×N temporary memory."""

    name = "gather-fold"
    operation_types = (AllReduceOp,)

    def matches(self, op) -> bool:
        return isinstance(op, AllReduceOp) and op.kind is None

    def execute(self, invocation, inputs, resources, *, in_place):
        x, *extras = inputs
        resources.agree(invocation, lambda: tensor_descriptor(x), None, x.device,
                        explain_layouts("input layouts"))
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

    def execute(self, invocation, inputs, resources, *, in_place):
        ct, moduli = inputs
        q_max = [0]

        def check() -> None:
            q_max[0] = check_ciphertext(invocation, ct, moduli)

        error = _attempt(check)
        descriptor = ciphertext_descriptor(ct, moduli) if error is None else [0] * 11
        resources.agree(invocation, descriptor, error, ct.device, explain_ciphertexts)
        q_col = moduli.view(-1, 1)
        if deferred_sum_is_exact(resources.size, q_max[0]):
            y = pooled_copy(ct)
            resources.complete(
                dist.all_reduce(y, op=dist.ReduceOp.SUM, group=resources.group, async_op=True),
                invocation,
            )
            torch.remainder(y, q_col, out=y)
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

    def execute(self, invocation, inputs, resources, *, in_place):
        ct, moduli = inputs
        error = _attempt(lambda: check_ciphertext(invocation, ct, moduli))
        descriptor = ciphertext_descriptor(ct, moduli) if error is None else [0] * 11
        resources.agree(invocation, descriptor, error, ct.device, explain_ciphertexts)
        stacked = gather_stacked(ct, resources, invocation)
        acc = pooled_copy(stacked[0])
        in_place_add = getattr(self.combine, "in_place", None)
        for other in stacked.unbind(0)[1:]:
            acc = in_place_add(acc, other, moduli) if in_place_add else self.combine(
                acc, other, moduli
            )
        return (acc,)


class AllGatherImplementation(Implementation):
    name = "all-gather"
    operation_types = (AllGatherOp,)

    def execute(self, invocation, inputs, resources, *, in_place):
        axis = invocation.properties["axis"]
        x = inputs[0]
        if len(inputs) == 1:
            resources.agree(invocation, lambda: tensor_descriptor(x), None, x.device,
                            explain_layouts("input layouts"))
            stacked = gather_stacked(x, resources, invocation)
            if axis == 0:
                return (stacked.reshape(-1, *x.shape[1:]) if x.dim() else stacked,)
            return (torch.cat(stacked.unbind(0), dim=axis),)
        counts: list[int] = []

        def check() -> None:
            counts.extend(check_counts(invocation, "counts", inputs[1], resources.size))
            check_axis_rows(invocation, x, axis, counts[resources.rank],
                            f"counts[{resources.rank}]")

        error = _attempt(check)
        descriptor = [*(counts or [0] * resources.size), *tensor_descriptor(x, skip_axis=axis)]

        def explain(rows: list[list[int]]) -> str:
            p = resources.size
            if any(row[:p] != rows[0][:p] for row in rows):
                shown = "; ".join(f"rank {r}: {row[:p]}" for r, row in enumerate(rows))
                return f"ranks pass different counts ({shown})"
            return explain_layouts("input layouts")([row[p:] for row in rows])

        resources.agree(invocation, descriptor, error, x.device, explain)
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
    name = "all-to-all-single"
    operation_types = (VariableAllToAllOp,)

    def execute(self, invocation, inputs, resources, *, in_place):
        x, send_counts = inputs
        axis = invocation.properties["axis"]
        send: list[int] = []

        def check() -> None:
            send.extend(check_counts(invocation, "send counts", send_counts, resources.size))
            check_axis_rows(invocation, x, axis, sum(send), "the sum of send counts")

        error = _attempt(check)
        resources.agree(invocation, lambda: tensor_descriptor(x, skip_axis=axis), error, x.device,
                        explain_layouts("row layouts"))
        send_t = torch.tensor(send, dtype=torch.int64, device=x.device)
        recv_t = torch.empty_like(send_t)
        resources.complete(
            dist.all_to_all_single(recv_t, send_t, group=resources.group, async_op=True),
            invocation,
        )
        recv = recv_t.tolist()
        rows = x.movedim(axis, 0).contiguous()
        out = pooled_empty((sum(recv), *rows.shape[1:]), x)
        work = dist.all_to_all_single(
            out,
            rows,
            output_split_sizes=recv,
            input_split_sizes=send,
            group=resources.group,
            async_op=True,
        )
        resources.complete(work, invocation)
        return (out.movedim(0, axis), recv_t.to(send_counts.dtype))


def distributed_operation_contributions(
    *, ciphertext_add: Callable[..., torch.Tensor] | None = None
) -> list[Implementation]:
    """The implementations an execution owner registers, in priority order.

    `ciphertext_add`, a prepared RNS add combine (see
    `distir.he.rns.prepare_ciphertext_add_combine`), contributes a
    specialised ciphertext implementation; without it the exact modular sum
    is used.
    """
    contributions: list[Implementation] = [
        GroupQueryImplementation(),
        BroadcastImplementation(),
        NativeAllReduceImplementation(),
        GatherFoldAllReduceImplementation(),
        ExactCiphertextAddImplementation(),
        AllGatherImplementation(),
        VariableAllToAllImplementation(),
    ]
    if ciphertext_add is not None:
        contributions.append(CombineCiphertextAddImplementation(ciphertext_add))
    # Point-to-point algorithms (ring, halving-doubling, recursive-doubling,
    # ciphertext-auto), appended last. The registry takes a requested name
    # first, else the highest priority, and on a tie the earliest contribution:
    # the all-reduce algorithms have priority 0 and come after native and
    # gather-fold, so they run only when the op's `algorithm` (or
    # `implementations=`) names them; ciphertext-auto has priority 1, so it
    # replaces exact-modular-sum (0) by default, while a prepared
    # `ciphertext_add` (rns-combine, also 1, contributed earlier) still wins.
    from distir.backends.ring import ring_contributions

    contributions.extend(ring_contributions())
    # Point-to-point ops and mesh transfers: one implementation each.
    from distir.backends.p2p import p2p_contributions

    contributions.extend(p2p_contributions())
    return contributions


__all__ = [
    "Invocation",
    "distributed_operation_contributions",
]
