"""Torch implementation of the rank queries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distir.core.invocation import Invocation
from distir.ops.groups.ir import GroupSizeOp, RankOp
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation


class GroupQueryImplementation(Implementation):
    name = "group-query"
    operation_types = (RankOp, GroupSizeOp)

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        value = resources.rank if isinstance(invocation.op, RankOp) else resources.size
        return (torch.tensor(value, dtype=torch.int64),)


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The family's default Torch implementations, in priority order."""
    return [GroupQueryImplementation()]
