"""`dist.pvary` and `dist.psum` on the Torch backend: a copy, and the
native sum all-reduce (the transport's own, as `dist.all_reduce sum`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distir.core.dtypes import element_dtype
from distir.core.invocation import Invocation
from distir.ops.all_reduce.torch.native import NativeAllReduceImplementation
from distir.ops.replication.ir import PsumOp, PvaryOp
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation
from distir.transport.results import writable_result


class PvaryImplementation(Implementation):
    """The identity: moves nothing (its backward is the collective) but the
    agreement that every rank passes the same input."""

    name = "pvary"
    operation_types = (PvaryOp,)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        resources.precondition(invocation, inputs)
        return (writable_result(inputs[0], 0, writable),)


class PsumImplementation(NativeAllReduceImplementation):
    """The native sum all-reduce (its decoded kind is always "sum")."""

    name = "psum"
    operation_types = (PsumOp,)

    def matches(self, op) -> bool:
        return isinstance(op, PsumOp)

    def unsupported(self, op) -> str | None:
        if element_dtype(op.input.type) in self.element_dtypes:
            return None
        return (
            f"psum on {op.input.type.element_type} cannot run: the gloo backend sums "
            "i8, u8, i32, i64, f16, bf16, f32 and f64 (widen the type)"
        )


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [PvaryImplementation(), PsumImplementation()]
