"""Torch implementation of `dist.assert_uniform`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distir.ops.asserts.ir import AssertUniformOp
from distir.transport.registry import Implementation


class AssertUniformImplementation(Implementation):
    """Nothing but the agreement: every rank passes the same value."""

    name = "assert-uniform"
    operation_types = (AssertUniformOp,)

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        resources.precondition(invocation, inputs)
        return ()


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [AssertUniformImplementation()]
