"""Process groups: their module-level declarations and the rank queries.

An op without a `group` runs on the default (world) group; an op with
`group @name` runs on the group declared by the module-level
`dist.group @name`, in which every rank finds the subgroup that contains it.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    IndexType,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import HasParent, Pure, SymbolOpInterface, SymbolTable
from xdsl.utils.exceptions import VerifyException

from distir.ir.facts import DeclaresRanks, RankQuery, Structural, UniformResults
from distir.ir.syntax import GroupRef, RankLists

GroupName = SymbolRefAttr | str | None
"""A group as builders take it: a symbol, its name, or None for the world."""


def group_property(props: dict[str, Attribute], group: GroupName) -> None:
    """Sets the `group` property from a symbol or a name (None: the world)."""
    if group is not None:
        props["group"] = SymbolRefAttr(group) if isinstance(group, str) else group


@irdl_op_definition
class GroupOp(IRDLOperation, DeclaresRanks):
    """Declares a process group at module level.

    `dist.group @tp [[0, 1], [2, 3]]` partitions (part of) the world into
    subgroups of *global* ranks; on each rank, `@tp` denotes the subgroup that
    contains it. A single list, `[[0, 3]]`, is an ordinary subgroup. Every rank
    creates the declared groups in module order (the manifest order), because
    torch.distributed requires all ranks to create groups in the same order.
    """

    name = "dist.group"

    sym_name = prop_def(SymbolNameConstraint())
    subgroups = prop_def(ArrayAttr[DenseArrayBase])

    traits = traits_def(SymbolOpInterface(), HasParent(ModuleOp), Structural())

    assembly_format = "$sym_name custom<RankLists>($subgroups) attr-dict"
    custom_directives = (RankLists,)

    def __init__(self, sym_name: str, subgroups: Sequence[Sequence[int]]):
        super().__init__(
            properties={
                "sym_name": StringAttr(sym_name),
                "subgroups": ArrayAttr(
                    [DenseArrayBase.from_list(i64, list(ranks)) for ranks in subgroups]
                ),
            }
        )

    @property
    def rank_lists(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(part.get_values()) for part in self.subgroups.data)

    @property
    def uniform_size(self) -> int | None:
        """The size every subgroup has, when all have the same size."""
        sizes = {len(part) for part in self.rank_lists}
        return sizes.pop() if len(sizes) == 1 else None

    def subgroup_of(self, global_rank: int) -> tuple[int, ...] | None:
        return self.declaration().subgroup_of(global_rank)

    def declaration(self) -> GroupDeclaration:
        """What the runtime needs of this op: its name and subgroups."""
        return GroupDeclaration(self.sym_name.data, self.rank_lists)

    def declared_ranks(self) -> tuple[int, ...]:
        return tuple(sorted({r for part in self.rank_lists for r in part}))

    def declared_as(self) -> str:
        return f"group @{self.sym_name.data}"

    def verify_(self) -> None:
        parts = self.rank_lists
        if not parts:
            raise VerifyException(f"group @{self.sym_name.data} declares no subgroup")
        seen: set[int] = set()
        for part in parts:
            if not part:
                raise VerifyException(f"group @{self.sym_name.data} has an empty subgroup")
            for rank in part:
                if rank < 0:
                    raise VerifyException(f"group @{self.sym_name.data}: rank {rank} is negative")
                if rank in seen:
                    raise VerifyException(
                        f"group @{self.sym_name.data}: rank {rank} appears in more than one place"
                    )
                seen.add(rank)
            if list(part) != sorted(part):
                # torch.distributed numbers a group's members in ascending
                # global order, whatever order they are listed in.
                raise VerifyException(
                    f"group @{self.sym_name.data}: subgroup {list(part)} must list its "
                    f"ranks in ascending order ({sorted(part)}), the order that numbers "
                    "them within the group"
                )


def lookup_group(op: Operation, group: SymbolRefAttr | None) -> GroupOp | None:
    """The `dist.group` declaration an op refers to (None for the world group)."""
    if group is None:
        return None
    found = SymbolTable.lookup_symbol(op, group)
    if not isinstance(found, GroupOp):
        raise VerifyException(
            f"'{op.name}' names group {group} but no `dist.group` of that name "
            "is declared at module level"
        )
    return found


@dataclass(frozen=True)
class GroupDeclaration:
    """A `dist.group` as the runtime and the simulator use it: its name and
    its subgroups of global ranks (each ascending), with no IR attached."""

    name: str
    subgroups: tuple[tuple[int, ...], ...]

    def subgroup_of(self, global_rank: int) -> tuple[int, ...] | None:
        """The subgroup holding `global_rank`, or None."""
        for part in self.subgroups:
            if global_rank in part:
                return part
        return None


def group_declarations(module: ModuleOp) -> list[GroupDeclaration]:
    """The module's group declarations in manifest order."""
    return [op.declaration() for op in module.ops if isinstance(op, GroupOp)]


class GroupMemberOp(IRDLOperation, ABC):
    """Base of every op that runs on a process group."""

    group = opt_prop_def(SymbolRefAttr)

    def group_declaration(self) -> GroupOp | None:
        return lookup_group(self, self.group)

    def static_group_size(self) -> int | None:
        """The group size when the IR proves it (declared, uniform subgroups)."""
        decl = self.group_declaration()
        return None if decl is None else decl.uniform_size

    def verify_group(self) -> None:
        # Only resolvable once the op sits inside a module.
        if self.group is not None and self.get_toplevel_object() is not self:
            top = self.get_toplevel_object()
            if isinstance(top, ModuleOp):
                lookup_group(self, self.group)

    @staticmethod
    def rank_operands(
        rank: int | SSAValue | Operation, name: str, props: dict[str, Attribute]
    ) -> list[SSAValue]:
        """A rank the op names (a root, a peer): a static one is recorded as
        property `name`; a dynamic one is the operand returned."""
        if isinstance(rank, int):
            props[name] = IntegerAttr(rank, i64)
            return []
        return [SSAValue.get(rank)]

    def verify_static_rank(self, what: str, rank: int) -> None:
        """A static rank the op names (a root, a peer) is a rank of its group:
        not negative, and below the group size when the IR proves it."""
        if rank < 0:
            raise VerifyException(f"'{self.name}' {what} must be >= 0, got {rank}")
        size = self.static_group_size()
        if size is not None and rank >= size:
            raise VerifyException(
                f"'{self.name}' {what} {rank} is outside group {self.group} of size {size}"
            )


###############################################################################
# Rank queries
###############################################################################


class _RankQueryOp(GroupMemberOp, RankQuery, ABC):
    result = result_def(IndexType)

    traits = traits_def(Pure())

    assembly_format = "custom<GroupRef>($group) attr-dict `:` type($result)"
    custom_directives = (GroupRef,)

    def __init__(self, group: GroupName = None):
        props: dict[str, Attribute] = {}
        group_property(props, group)
        super().__init__(result_types=[IndexType()], properties=props)

    def verify_(self) -> None:
        self.verify_group()


@irdl_op_definition
class RankOp(_RankQueryOp):
    """This process's rank within the group, in [0, group_size)."""

    name = "dist.rank"

    def value_on(self, rank: int, size: int) -> int:
        return rank


@irdl_op_definition
class GroupSizeOp(_RankQueryOp):
    """The number of ranks in the group."""

    name = "dist.group_size"

    traits = traits_def(Pure(), UniformResults())

    def value_on(self, rank: int, size: int) -> int:
        return size


def on_rank_ops(
    group: SymbolRefAttr | None, rank: SSAValue, kept: SSAValue, zeros: SSAValue
) -> list[Operation]:
    """The ops that compute `kept` on the rank of `group` equal to `rank` and
    `zeros` on every other (the last op's result): how a transpose rule
    sends a gradient to one rank (a broadcast's root)."""
    me = RankOp(group)
    is_it = arith.CmpiOp(me.result, rank, "eq")
    return [me, is_it, arith.SelectOp(is_it.result, kept, zeros)]
