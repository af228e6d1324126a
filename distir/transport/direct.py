"""An op whose kernel is one backend collective, said as data.

Most programs are one native all-reduce or broadcast. For such an op, on
operands of its declared type with nothing to check before the payload,
`execute` does only this: take the tensor the collective writes (the
operand itself when the runtime lets the op overwrite it, else a buffer
`out_of_place` makes), submit the process group's collective on it with
the options of the deadline the group's resource holds, wait for it under
that deadline (a backend error is a named distir error), and return it.

An implementation that can say so returns a `DirectCollective` from
`Implementation.direct` (at bind time, once per op and group). Its bound
kernel is `DirectCollective.kernel` (what `tests/transport/test_bound_kernels.py`
checks against `execute`), and a binding's specialised run
(`distir.runtime.specialised`) reads the same fields to submit the
collective itself: one Python call from the run to c10d instead of five
(each costs about five times its own time right after a barrier at P=2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from distir.core.block_compiler import DistKernel
from distir.core.invocation import Invocation
from distir.transport.groups import Options, ProcessGroupResource


@dataclass(frozen=True)
class DirectCollective:
    """One collective on an op's one operand, which the result is (or a
    buffer of its type): see the module docstring."""

    invocation: Invocation
    #: the op's group: the direct path submits to a c10d process group
    resource: ProcessGroupResource
    #: the process group's method (`pg.allreduce`, `pg.broadcast`)
    submit: Callable[..., dist.Work]
    #: its options class and the fields set on it (the reduction, the root)
    kind: type[Options]
    fields: tuple[tuple[str, object], ...]
    #: the operand's declared dtype (another goes through `execute`)
    dtype: torch.dtype
    #: the tensor the collective writes when the operand may not be
    #: overwritten; None: this operand takes `execute` (a root that copies
    #: its input while the message is in flight)
    out_of_place: Callable[[torch.Tensor], torch.Tensor | None]
    #: [the deadline last seen, (its options, their timeout)], as `options`
    #: leaves it: the options are looked up only when the resource's
    #: deadline changes (a specialised run reads it inline)
    current: list = field(default_factory=lambda: [None, None], compare=False, repr=False)
    #: the same for a collective submitted and not waited for (`asyncOp`
    #: set: the backend runs it on its own threads)
    current_async: list = field(default_factory=lambda: [None, None], compare=False, repr=False)

    @property
    def same_type(self) -> bool:
        """Whether the op's result has its operand's IR type (then a result
        made from an accepted operand needs no shape check)."""
        op = self.invocation.op
        return len(op.results) == 1 and op.results[0].type == op.operands[0].type

    def options(self, wait: bool = True) -> tuple[Options, timedelta]:
        """The backend's options and timeout for the deadline the resource
        holds now (an op's own `deadline_ms` wins, as everywhere), for a
        collective waited for on the calling thread or (`wait` False) not."""
        current = self.current if wait else self.current_async
        deadline = self.resource.deadline_s
        if current[0] != deadline:
            current[1] = self.resource._options(self.kind, self.invocation, wait, *self.fields)
            current[0] = deadline
        return current[1]

    def kernel(self, execute: Callable[..., tuple[torch.Tensor, ...]]) -> DistKernel:
        """The op's bound kernel: the collective on operands of the declared
        type, `execute(invocation, inputs, resources, writable)` on any
        other or where `out_of_place` says so."""
        invocation, resource, submit = self.invocation, self.resource, self.submit
        dtype, out_of_place, options = self.dtype, self.out_of_place, self.options

        def kernel(inputs: Sequence[torch.Tensor], writable: frozenset[int]):
            x = inputs[0]
            y = None
            if x.dtype is dtype:
                y = x if 0 in writable and x.is_contiguous() else out_of_place(x)
            if y is None:  # not the declared type, or a root that must copy
                return execute(invocation, inputs, resource, writable)
            resource._run(submit, ([y],), options(), invocation, True)
            return (y,)

        return kernel
