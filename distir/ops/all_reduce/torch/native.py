"""The native all-reduce: the backend's own collective for a reduction kind."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from distir.core.dtypes import IR_ELEMENT_TYPES, element_dtype
from distir.core.invocation import Invocation
from distir.ir.attributes import REDUCTION_KINDS
from distir.ops.all_reduce.ir import AllReduceOp
from distir.transport.buffers import pooled_copy
from distir.transport.direct import DirectCollective
from distir.transport.groups import COLLECTIVE_DTYPES, ProcessGroupResource
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation
from distir.transport.results import awaiting, writable_result

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
ELEMENT_TYPE_NAMES = {
    dtype: name for dtype, name in IR_ELEMENT_TYPES.items() if dtype in COLLECTIVE_DTYPES
}


#: float dtype -> (its bits as a signed integer, the integer type reduced)
ORDER_KEYS = {
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
    bits_dtype, wire_dtype = ORDER_KEYS[y.dtype]
    width = torch.iinfo(bits_dtype).bits
    nan = torch.isnan(y)
    keys = _flip_magnitude_(y.view(bits_dtype), width).to(wire_dtype)
    limits = torch.iinfo(bits_dtype)
    return keys.masked_fill_(nan, limits.max if kind == "max" else limits.min)


def from_order_keys(keys: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Writes the floats that `keys` encode into `y` (a NaN key decodes to a
    NaN) and returns `y`."""
    bits_dtype, _ = ORDER_KEYS[y.dtype]
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
        runnable = ", ".join(n for d, n in ELEMENT_TYPE_NAMES.items() if d in self.element_dtypes)
        return (
            f"native {op.kind.data} on {element} cannot run: the gloo backend reduces "
            f"{runnable} (write a generic all-reduce, or widen the type)"
        )

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        kind = invocation.properties["kind"]
        if kind in ("max", "min") and inputs[0].dtype in ORDER_KEYS:
            return self.start(invocation, inputs, resources, writable)()
        # Submitted and completed in one call, without a waiter: this is
        # the hot path of the most common program.
        resources.precondition(invocation, inputs)
        y = writable_result(inputs[0], 0, writable)
        resources.all_reduce(y, c10d_reduction(kind, y.dtype), invocation, wait=True)
        return (y,)

    def direct(self, invocation: Invocation, resources: Transport) -> DirectCollective | None:
        if not isinstance(resources, ProcessGroupResource):
            return None  # one c10d collective: only on a process group
        kind = invocation.properties["kind"]
        dtype = element_dtype(invocation.op.operands[0].type)
        if invocation.options.get("agree") or (kind in ("max", "min") and dtype in ORDER_KEYS):
            return None
        # Nothing to check before the payload, one reduction: `execute`'s
        # hot path with what it looks up on every run resolved now.
        return DirectCollective(
            invocation, resources, resources.pg.allreduce, dist.AllreduceOptions,
            (("reduceOp", c10d_reduction(kind, dtype)),), dtype, pooled_copy,
        )  # fmt: skip

    def start(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> Callable[[], tuple[torch.Tensor, ...]]:
        resources.precondition(invocation, inputs)
        kind = invocation.properties["kind"]
        y = writable_result(inputs[0], 0, writable)
        if kind in ("max", "min") and y.dtype in ORDER_KEYS:
            keys = to_order_keys(y, kind)
            work = resources.all_reduce(keys, C10D_REDUCTIONS[kind], invocation)

            def decode() -> tuple[torch.Tensor, ...]:
                resources.complete(work, invocation)
                return (from_order_keys(keys, y),)

            return decode
        work = resources.all_reduce(y, c10d_reduction(kind, y.dtype), invocation)
        return awaiting(resources, work, invocation, (y,))
