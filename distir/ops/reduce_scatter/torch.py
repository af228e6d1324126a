"""`dist.reduce_scatter` on the Torch backend: the transport's own
reduce-scatter (gloo's and NCCL's `reduce_scatter_tensor`), which sends
N·(P-1)/P bytes per rank where an all-reduce and a slice send twice that.

The axis is moved to the front (a copy unless it already is, contiguous),
so that each rank's part is one contiguous run of the message. Float `max`
and `min` reduce integer order keys, as the native all-reduce does, because
gloo's drop a NaN that is not first and tie -0.0 with +0.0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from distir.backends.groups import COLLECTIVE_DTYPES
from distir.backends.registry import Implementation
from distir.interpreters.dtypes import element_dtype
from distir.ops.all_reduce.torch.native import (
    C10D_REDUCTIONS,
    ELEMENT_TYPE_NAMES,
    ORDER_KEYS,
    c10d_reduction,
    from_order_keys,
    to_order_keys,
)
from distir.ops.reduce_scatter.ir import ReduceScatterOp


class NativeReduceScatterImplementation(Implementation):
    name = "native-reduce-scatter"
    operation_types = (ReduceScatterOp,)

    def unsupported(self, op) -> str | None:
        if element_dtype(op.input.type) in COLLECTIVE_DTYPES:
            return None
        runnable = ", ".join(ELEMENT_TYPE_NAMES.values())
        return (
            f"reduce_scatter {op.kind.data} on {op.input.type.element_type} cannot run: the "
            f"gloo backend reduces {runnable} (widen the type)"
        )

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        resources.precondition(invocation, inputs)
        kind, axis = invocation.properties["kind"], invocation.properties["axis"]
        x = inputs[0]
        # The transport reads its input and never writes it (gloo and NCCL),
        # but the order keys overwrite theirs: then never the caller's memory.
        front = x.movedim(axis, 0).resolve_neg().contiguous()
        keyed = kind in ("max", "min") and x.dtype in ORDER_KEYS
        if keyed and front.data_ptr() == x.data_ptr():
            front = front.clone()
        rows = front.shape[0] // resources.size
        out = torch.empty((rows, *front.shape[1:]), dtype=x.dtype, device=x.device)
        if front.numel() == 0:
            return (out.movedim(0, axis).contiguous(),)
        if keyed:
            keys = to_order_keys(front, kind)
            got = torch.empty((rows, *front.shape[1:]), dtype=keys.dtype, device=x.device)
            resources.reduce_scatter(got, keys, C10D_REDUCTIONS[kind], invocation, wait=True)
            from_order_keys(got, out)
        else:
            reduction = c10d_reduction(kind, x.dtype)
            resources.reduce_scatter(out, front, reduction, invocation, wait=True)
        return (out.movedim(0, axis).contiguous(),)


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [NativeReduceScatterImplementation()]
