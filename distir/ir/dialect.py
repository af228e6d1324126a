"""The `dist` dialect: collective communication over process groups.

Every operation runs SPMD: each rank of the op's group executes it on its own
operands. Ranks that appear in IR (a broadcast root, a counts index) are ranks
*of the op's group*, never global ranks. An op without a `group` runs on the
default (world) group; an op with `group @name` runs on the group declared by
the module-level `dist.group @name` op, in which every rank finds the
subgroup that contains it.

The ops live with their family, each with its semantics, syntax and
verifier: `attributes` (reduction kinds and their facts, effects), `groups`
(group declarations, rank queries), `all_reduce`, `collectives` (the other
collectives), `p2p`, `mesh` (meshes and
transfers); `syntax` holds the custom directives their formats share. This
module holds the `Dist` dialect object and re-exports every name, so
`from distir.ir.dialect import X` works for all of them.
"""

from __future__ import annotations

from xdsl.ir import Dialect
from xdsl.irdl import IRDLOperation

from distir.ir.all_reduce import AllReduceOp, CombineIsolatedFromAbove
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
from distir.ir.collectives import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AssertReducedOp,
    AssertUniformOp,
    BroadcastOp,
    CollectiveOp,
    VariableAllToAllOp,
    WaveOp,
    YieldOp,
)
from distir.ir.gather_scatter import GatherOp, ScatterOp
from distir.ir.groups import (
    GroupMemberOp,
    GroupOp,
    GroupSizeOp,
    RankOp,
    group_declarations,
    lookup_group,
)
from distir.ir.mesh import MeshOp, TransferOp
from distir.ir.p2p import PEER_OPS, PeerOp, RecvOp, SendOp, SendRecvOp
from distir.ir.reduce import ReduceToRootOp
from distir.ir.reduce_scatter import ReduceScatterOp
from distir.ir.replication import PsumOp, PvaryOp
from distir.ir.shift import ShiftOp
from distir.ir.syntax import REPLICATED

COLLECTIVE_OPS: tuple[type[CollectiveOp], ...] = (
    BroadcastOp,
    AllReduceOp,
    AllReduceAddCiphertextOp,
    AllGatherOp,
    ReduceScatterOp,
    VariableAllToAllOp,
    PsumOp,
    PvaryOp,
    GatherOp,
    ScatterOp,
    ReduceToRootOp,
    ShiftOp,
)

_OPS: tuple[type[IRDLOperation], ...] = (
    GroupOp,
    MeshOp,
    RankOp,
    GroupSizeOp,
    *COLLECTIVE_OPS,
    *PEER_OPS,
    WaveOp,
    TransferOp,
    AssertReducedOp,
    AssertUniformOp,
    YieldOp,
)


def dist_ops() -> tuple[type[IRDLOperation], ...]:
    """Every op class of the dist dialect, in the order `Dist` registers them."""
    return _OPS


Dist = Dialect("dist", list(_OPS), [ReductionKindAttr])

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
    "lookup_group",
]
