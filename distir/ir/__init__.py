"""The `dist` dialect, its parser with source locations, and a Python builder."""

from distir.ir.dialect import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AllReduceOp,
    BroadcastOp,
    CollectiveEffect,
    CollectiveOp,
    Dist,
    GroupOp,
    GroupSizeOp,
    RankOp,
    ReductionKind,
    ReductionKindAttr,
    VariableAllToAllOp,
    YieldOp,
)
from distir.ir.parsing import describe_op, format_location, make_context, parse_file, parse_module

__all__ = [
    "AllGatherOp",
    "AllReduceAddCiphertextOp",
    "AllReduceOp",
    "BroadcastOp",
    "CollectiveEffect",
    "CollectiveOp",
    "Dist",
    "GroupOp",
    "GroupSizeOp",
    "RankOp",
    "ReductionKind",
    "ReductionKindAttr",
    "VariableAllToAllOp",
    "YieldOp",
    "describe_op",
    "format_location",
    "make_context",
    "parse_file",
    "parse_module",
]
