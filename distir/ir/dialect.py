"""The `dist` dialect: collective communication over process groups.

Every operation runs SPMD: each rank of the op's group executes it on its own
operands. Ranks that appear in IR (a broadcast root, a counts index) are ranks
*of the op's group*, never global ranks. An op without a `group` runs on the
default (world) group; an op with `group @name` runs on the group declared by
the module-level `dist.group @name` op, in which every rank finds the
subgroup that contains it.

The ops live with their family, one folder each under `distir/ops/`
(`distir.ops.table` lists them); `attributes` holds the reduction kinds and
their facts, effects, and `syntax` the custom directives the formats share.
This module holds the `Dist` dialect object, derived from the op table, and
re-exports every name, so `from distir.ir.dialect import X` works for all of
them.
"""

from __future__ import annotations

from xdsl.ir import Dialect

from distir.ir.attributes import (
    ASSUMED_GROUP_SIZE,
    BITWISE_KINDS,
    REDUCTION_KINDS,
    CollectiveEffect,
    RaisesEffect,
    ReductionKind,
    ReductionKindAttr,
    ReductionKindFacts,
)
from distir.ir.collectives import CollectiveOp
from distir.ir.syntax import REPLICATED
from distir.ops.all_gather.ir import AllGatherOp
from distir.ops.all_reduce.ciphertext import AllReduceAddCiphertextOp
from distir.ops.all_reduce.ir import AllReduceOp, CombineIsolatedFromAbove
from distir.ops.all_to_all.ir import VariableAllToAllOp
from distir.ops.asserts.ir import AssertReducedOp, AssertUniformOp
from distir.ops.broadcast.ir import BroadcastOp
from distir.ops.gather_scatter.ir import GatherOp, ScatterOp
from distir.ops.groups.ir import (
    GroupDeclaration,
    GroupMemberOp,
    GroupOp,
    GroupSizeOp,
    RankOp,
    group_declarations,
    lookup_group,
)
from distir.ops.p2p.ir import PEER_OPS, PeerOp, RecvOp, SendOp, SendRecvOp
from distir.ops.reduce.ir import ReduceToRootOp
from distir.ops.reduce_scatter.ir import ReduceScatterOp
from distir.ops.replication.ir import PsumOp, PvaryOp
from distir.ops.shift.ir import ShiftOp
from distir.ops.table import dist_ops
from distir.ops.transfer.ir import MeshOp, TransferOp
from distir.ops.wave.ir import WaveOp, YieldOp

#: the collectives (every rank of the group enters them), in dialect order
COLLECTIVE_OPS: tuple[type[CollectiveOp], ...] = tuple(
    op for op in dist_ops() if issubclass(op, CollectiveOp)
)


Dist = Dialect("dist", list(dist_ops()), [ReductionKindAttr])

__all__ = [
    "ASSUMED_GROUP_SIZE",
    "BITWISE_KINDS",
    "COLLECTIVE_OPS",
    "PEER_OPS",
    "REDUCTION_KINDS",
    "REPLICATED",
    "AllGatherOp",
    "AllReduceAddCiphertextOp",
    "AllReduceOp",
    "AssertReducedOp",
    "AssertUniformOp",
    "BroadcastOp",
    "CollectiveEffect",
    "CollectiveOp",
    "CombineIsolatedFromAbove",
    "Dist",
    "GatherOp",
    "GroupMemberOp",
    "GroupOp",
    "GroupSizeOp",
    "MeshOp",
    "PeerOp",
    "PsumOp",
    "PvaryOp",
    "RaisesEffect",
    "ReduceToRootOp",
    "ReduceScatterOp",
    "RankOp",
    "RecvOp",
    "ReductionKind",
    "ReductionKindAttr",
    "ReductionKindFacts",
    "ScatterOp",
    "SendOp",
    "SendRecvOp",
    "ShiftOp",
    "TransferOp",
    "VariableAllToAllOp",
    "WaveOp",
    "YieldOp",
    "dist_ops",
    "group_declarations",
    "GroupDeclaration",
    "lookup_group",
]
