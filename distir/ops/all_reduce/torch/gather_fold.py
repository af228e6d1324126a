"""The baseline generic all-reduce: gather every rank's tensor, fold in rank order."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from distir.core.invocation import Invocation
from distir.core.kernels import fold_in_rank_order
from distir.ops.all_reduce.ir import GATHER_FOLD, AllReduceOp, algorithm_applies
from distir.transport.buffers import pooled_copy
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation
from distir.transport.results import gather_stacked


class GatherFoldAllReduceImplementation(Implementation):
    """Baseline generic all-reduce: gather everything, fold in rank order.
    Correct for any associative combine; P×N temporary memory."""

    name = GATHER_FOLD
    operation_types = (AllReduceOp,)

    def matches(self, op) -> bool:
        # It folds the region; a native kind has none.
        return isinstance(op, AllReduceOp) and op.is_generic and algorithm_applies(self.name, op)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        x, *extras = inputs
        resources.precondition(invocation, inputs)
        stacked = gather_stacked(x, resources, invocation)
        result = fold_in_rank_order(invocation.regions[0], stacked.unbind(0), extras)
        if resources.size == 1:
            result = pooled_copy(result)
        return (result,)
