"""`dist.reduce` on the Torch backend: the transport's own reduce (gloo's
and NCCL's), into a copy of the input (the transport writes its buffer on
every rank). Float `max` and `min` reduce integer order keys, as the
native all-reduce does, because gloo's drop a NaN that is not first and tie
-0.0 with +0.0. Ranks other than the root return zeros.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distir.core.dtypes import element_dtype
from distir.core.invocation import Invocation
from distir.ops.all_reduce.torch.native import (
    C10D_REDUCTIONS,
    ELEMENT_TYPE_NAMES,
    ORDER_KEYS,
    c10d_reduction,
    from_order_keys,
    to_order_keys,
)
from distir.ops.reduce.ir import ReduceToRootOp
from distir.transport.groups import COLLECTIVE_DTYPES
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation


class NativeReduceImplementation(Implementation):
    name = "native-reduce"
    operation_types = (ReduceToRootOp,)

    def unsupported(self, op) -> str | None:
        if element_dtype(op.input.type) in COLLECTIVE_DTYPES:
            return None
        runnable = ", ".join(ELEMENT_TYPE_NAMES.values())
        return (
            f"reduce {op.kind.data} on {op.input.type.element_type} cannot run: the "
            f"gloo backend reduces {runnable} (widen the type)"
        )

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        resources.precondition(invocation, inputs)
        kind, root = invocation.properties["kind"], invocation.properties["root"]
        x = inputs[0]
        # Never the caller's memory: the transport writes its buffer.
        y = x.resolve_neg().contiguous()
        if y.data_ptr() == x.data_ptr() and y.numel():
            y = y.clone()
        if y.numel():
            if kind in ("max", "min") and x.dtype in ORDER_KEYS:
                keys = to_order_keys(y, kind)
                resources.reduce(keys, C10D_REDUCTIONS[kind], root, invocation, wait=True)
                if resources.rank == root:
                    y = from_order_keys(keys, y)
            else:
                resources.reduce(y, c10d_reduction(kind, x.dtype), root, invocation, wait=True)
        if resources.rank != root:
            return (torch.zeros_like(y),)
        return (y,)


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [NativeReduceImplementation()]
