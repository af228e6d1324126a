"""Torch implementation of `dist.variable_all_to_all`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distir.core.invocation import Invocation
from distir.ir.facts import AgreementRidesWithPayload
from distir.ops.all_to_all.ir import VariableAllToAllOp
from distir.transport.buffers import pooled_empty
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation
from distir.transport.results import integer_tensor


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

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
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


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [VariableAllToAllImplementation()]
