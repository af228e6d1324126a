"""Semantics records of the rank queries (`dist.rank`, `dist.group_size`)."""

from __future__ import annotations

import torch

from distir.core.records import Inputs, OpSemantics, ReferenceCall, Results
from distir.ops.groups.ir import GroupSizeOp, RankOp


class RankSemantics(OpSemantics):
    op = RankOp

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        return (torch.tensor(call.me, dtype=torch.int64),)


class GroupSizeSemantics(OpSemantics):
    op = GroupSizeOp

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        return (torch.tensor(call.size, dtype=torch.int64),)


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (
    RankSemantics(),
    GroupSizeSemantics(),
)
