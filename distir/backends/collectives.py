"""Default Torch implementations of the collectives over torch.distributed
(the all-reduce's are the package `backends.all_reduce`), and the list an
execution owner registers (`distributed_operation_contributions`).

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

from distir.backends.all_reduce import (
    CombineCiphertextAddImplementation,
    ExactCiphertextAddImplementation,
    GatherFoldAllReduceImplementation,
    NativeAllReduceImplementation,
    algorithm_contributions,
)
from distir.backends.buffers import pooled_copy, pooled_empty
from distir.backends.direct import DirectCollective
from distir.backends.groups import COLLECTIVE_DTYPES
from distir.backends.registry import Implementation
from distir.backends.results import awaiting, gather_stacked, integer_tensor
from distir.interpreters.dtypes import element_dtype
from distir.ir.dialect import (
    AllGatherOp,
    AssertUniformOp,
    BroadcastOp,
    GroupSizeOp,
    RankOp,
    VariableAllToAllOp,
)
from distir.ir.facts import AgreementRidesWithPayload


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
        x, root = inputs[0], self._root(invocation, inputs, resources)
        y = self._written(x, root, resources.rank, writable)
        if y is None:  # the root's own copy overlaps the message
            return self._start_root(x, root, invocation, resources)()
        # Submitted and completed in one call, without a waiter.
        resources.broadcast(y, root, invocation, wait=True)
        return (y,)

    def direct(self, invocation, resources):
        root = invocation.properties["root"]
        dtype = element_dtype(invocation.op.operands[0].type)
        if root is None or dtype not in COLLECTIVE_DTYPES:
            return None
        # A static root and a type the backend moves as it is: `execute`'s
        # hot path with what it looks up on every run resolved now.
        written, rank, nothing = self._written, resources.rank, frozenset()
        return DirectCollective(
            invocation, resources, resources.pg.broadcast, dist.BroadcastOptions,
            (("rootRank", root), ("rootTensor", 0)), dtype,
            lambda x: written(x, root, rank, nothing),
        )  # fmt: skip

    def start(self, invocation, inputs, resources, writable=frozenset()):
        x, root = inputs[0], self._root(invocation, inputs, resources)
        y = self._written(x, root, resources.rank, writable)
        if y is None:
            return self._start_root(x, root, invocation, resources)
        work = resources.broadcast(y, root, invocation)
        return awaiting(resources, work, invocation, (y,))

    @staticmethod
    def _root(invocation, inputs, resources) -> int:
        root = invocation.properties["root"]
        if root is None:  # a dynamic root: checked and agreed on
            root = resources.precondition(invocation, inputs).decoded["root"]
        return root

    @staticmethod
    def _written(x, root: int, rank: int, writable) -> torch.Tensor | None:
        """The tensor the broadcast writes (a receiver) or sends from (the
        root) that is also the result; None for a root that must copy."""
        if rank != root:
            return x if 0 in writable and x.is_contiguous() else pooled_empty(x.shape, x)
        # The root sends straight from its input (a broadcast only reads it there).
        source = x.contiguous()
        return source if source is not x or 0 in writable else None

    @staticmethod
    def _start_root(x, root: int, invocation, resources):
        """A root that may not write its input sends from it and makes its
        own result while the message is in flight."""
        work = resources.broadcast(x, root, invocation)
        return awaiting(resources, work, invocation, (pooled_copy(x),))


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
            send_t = integer_tensor(send, torch.int64, x.device)
            recv_t = torch.empty_like(send_t)
            resources.all_to_all(recv_t, send_t, [1] * size, [1] * size, invocation, wait=True)
            recv = recv_t.tolist()
        # Rows along dim 0 need no movedim (4 us each way, every run).
        rows_in = (x if axis == 0 else x.movedim(axis, 0)).contiguous()
        out = pooled_empty((sum(recv), *rows_in.shape[1:]), x)
        resources.all_to_all(out, rows_in, recv, send, invocation, wait=True)
        counts = integer_tensor(recv, send_counts.dtype, send_counts.device)
        return (out if axis == 0 else out.movedim(0, axis), counts)


def distributed_operation_contributions(
    *, ciphertext_add: Callable[..., torch.Tensor] | None = None
) -> list[Implementation]:
    """The implementations an execution owner registers, in priority order.

    `ciphertext_add`, a prepared RNS add combine (see
    `distir.he.rns.prepare_ciphertext_add_combine`), contributes a
    specialised ciphertext implementation; without it the automatic
    ciphertext sum is used.
    """
    from distir.backends.gather_scatter import GatherImplementation, ScatterImplementation
    from distir.backends.mesh import TransferImplementation
    from distir.backends.p2p import p2p_contributions
    from distir.backends.reduce import NativeReduceImplementation
    from distir.backends.reduce_scatter import (
        ReduceScatterImplementation,
        schedule_contributions,
    )
    from distir.backends.replication import PsumImplementation, PvaryImplementation
    from distir.backends.shift import ShiftImplementation

    contributions: list[Implementation] = [
        GroupQueryImplementation(),
        BroadcastImplementation(),
        NativeAllReduceImplementation(),
        GatherFoldAllReduceImplementation(),
        ExactCiphertextAddImplementation(),
        AssertUniformImplementation(),
        AllGatherImplementation(),
        ReduceScatterImplementation(),
        *schedule_contributions(),
        GatherImplementation(),
        ScatterImplementation(),
        NativeReduceImplementation(),
        ShiftImplementation(),
        PvaryImplementation(),
        PsumImplementation(),
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
