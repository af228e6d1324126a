"""The op table: every family of dist ops, in one list.

The dialect's op list (`distir.ir.dialect`), the builder helpers
(`distir.ir.builder.HELPERS`), the semantics records
(`distir.core.semantics.SEMANTICS`) and the default Torch
implementations (`distir.transport.implementations`) are derived from
`FAMILIES`; nothing else lists ops by hand. A family that runs has a
`semantics` module exporting `SEMANTICS` and a `torch` module (or package)
exporting `implementations(options)`; they are imported by name, from this
table, by the execution core and the backends, so this module (and the
dialect) stays torch-free.

Adding a family: a folder `distir/ops/<name>/` (`ir.py`, `build.py`,
`semantics.py`, `torch.py`, `__init__.py`), one `Family` line below, and its
helpers re-exported by `distir.ir.builder` (tests/test_layers.py lists what
else a new op needs: its oracle, strategies, bench family and test cases).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.irdl import IRDLOperation

from distir.ops.all_gather.ir import AllGatherOp
from distir.ops.all_reduce.ciphertext import AllReduceAddCiphertextOp
from distir.ops.all_reduce.ir import AllReduceOp
from distir.ops.all_to_all.ir import VariableAllToAllOp
from distir.ops.asserts.ir import AssertReducedOp, AssertUniformOp
from distir.ops.broadcast.ir import BroadcastOp
from distir.ops.gather_scatter.ir import GatherOp, ScatterOp
from distir.ops.groups.ir import GroupOp, GroupSizeOp, RankOp
from distir.ops.p2p.ir import RecvOp, SendOp, SendRecvOp
from distir.ops.reduce.ir import ReduceToRootOp
from distir.ops.reduce_scatter.ir import ReduceScatterOp
from distir.ops.replication.ir import PsumOp, PvaryOp
from distir.ops.shift.ir import ShiftOp
from distir.ops.transfer.ir import MeshOp, TransferOp
from distir.ops.wave.ir import WaveOp, YieldOp


@dataclass(frozen=True)
class Family:
    """One folder of `distir/ops/`: its name, its op classes in dialect
    order and the name of the builder helper of each (in its `build.py`,
    re-exported by `distir.ir.builder`, one per op); `runs` says it has semantics records and Torch implementations
    (a family of structural ops, as the wave and its terminator, has none)."""

    name: str
    ops: tuple[type[IRDLOperation], ...]
    helpers: tuple[str, ...]
    runs: bool = True

    @property
    def semantics_module(self) -> str:
        """The module holding the family's `SEMANTICS`."""
        return f"distir.ops.{self.name}.semantics"

    @property
    def torch_module(self) -> str:
        """The module holding the family's `implementations(options)`."""
        return f"distir.ops.{self.name}.torch"


FAMILIES: tuple[Family, ...] = (
    Family("groups", (GroupOp, RankOp, GroupSizeOp), ("declare_group", "rank", "group_size")),
    Family("transfer", (MeshOp, TransferOp), ("declare_mesh", "transfer")),
    Family("broadcast", (BroadcastOp,), ("broadcast",)),
    Family(
        "all_reduce",
        (AllReduceOp, AllReduceAddCiphertextOp),
        ("all_reduce", "all_reduce_add_ciphertext"),
    ),
    Family("all_gather", (AllGatherOp,), ("all_gather",)),
    Family("reduce_scatter", (ReduceScatterOp,), ("reduce_scatter",)),
    Family("all_to_all", (VariableAllToAllOp,), ("variable_all_to_all",)),
    Family("replication", (PsumOp, PvaryOp), ("psum", "pvary")),
    Family("gather_scatter", (GatherOp, ScatterOp), ("gather", "scatter")),
    Family("reduce", (ReduceToRootOp,), ("reduce",)),
    Family("shift", (ShiftOp,), ("shift",)),
    Family("p2p", (SendOp, RecvOp, SendRecvOp), ("send", "recv", "sendrecv")),
    Family("wave", (WaveOp, YieldOp), ("wave", "make_combine_region"), runs=False),
    Family("asserts", (AssertReducedOp, AssertUniformOp), ("assert_reduced", "assert_uniform")),
)


def dist_ops() -> tuple[type[IRDLOperation], ...]:
    """Every op class of the dist dialect, family by family."""
    return tuple(op for family in FAMILIES for op in family.ops)


def running_families() -> tuple[Family, ...]:
    """The families with semantics records and Torch implementations."""
    return tuple(family for family in FAMILIES if family.runs)


def helper_names() -> dict[type[IRDLOperation], str]:
    """Op class -> the name of its builder helper (`distir.ir.builder.HELPERS`
    resolves them; the table stays free of the builder, which the dialect
    does not need)."""
    return {
        op: helper
        for family in FAMILIES
        for op, helper in zip(family.ops, family.helpers, strict=True)
    }
