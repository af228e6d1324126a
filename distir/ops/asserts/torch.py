"""Torch implementation of `dist.assert_uniform`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distir.core.invocation import Invocation
from distir.ops.asserts.ir import AssertUniformOp
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation


class AssertUniformImplementation(Implementation):
    """Nothing but the agreement: every rank passes the same value."""

    name = "assert-uniform"
    operation_types = (AssertUniformOp,)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        resources.precondition(invocation, inputs)
        return ()


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [AssertUniformImplementation()]
