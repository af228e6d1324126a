"""The world sizes a program can run on, read from its IR before any rank starts.

A program's IR often pins down how many ranks it needs:

- a `dist.group` or `dist.mesh` names global ranks, so the world must have
  at least `max(rank) + 1` of them;
- an op on the world group whose per-rank counts have a static length
  (`dist.variable_all_to_all` send counts `tensor<4xi64>`, uneven
  `dist.all_gather` counts `tensor<4xi64>`: operands whose role in
  `distir.ir.facts` is `SEND_COUNTS`, `GATHER_COUNTS` or
  `SCATTER_COUNTS`) needs exactly that many ranks, and so does an even `dist.all_gather` whose input and result
  rows along its axis are both static (result rows = P x input rows);
- an op on a declared group that every rank executes (it sits in the entry
  function, outside control flow) needs every rank to be in one of the
  group's subgroups, so the world can be no larger than the ranks the group
  covers;
- a collective a pass proved exact only for a bounded group (its
  `assumed_max_group_size` attribute) runs on at most that many ranks when
  it is on the world group.

`check_world_size(module, nproc)` raises `WorldSizeError` naming the first
requirement `nproc` breaks and where it comes from, so `distir-run` refuses
`--nproc 3` for a four-rank program at once instead of after starting
every rank. This module imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, SymbolRefAttr, TensorType
from xdsl.ir import Operation

from distir.errors import DistirError, count
from distir.ir.dialect import ASSUMED_GROUP_SIZE, group_declarations
from distir.ir.facts import (
    DeclaresRanks,
    ImpliesGroupSize,
    OperandRole,
    RunsBodyInPlace,
    operand_roles,
)
from distir.ir.parsing import describe_op, function_named, reachable_functions

#: what an operand of each counting role holds, for messages
_COUNT_ROLES = {
    OperandRole.SEND_COUNTS: "send counts",
    OperandRole.GATHER_COUNTS: "gather counts",
    OperandRole.SCATTER_COUNTS: "scatter counts",
}


class WorldSizeError(DistirError):
    """The program cannot run on the requested number of ranks."""


@dataclass(frozen=True)
class WorldSizeRequirement:
    """One constraint a program puts on its world size, and why.

    `exactly`, `at_least` and `at_most` bound the world size; `reason` says
    which op or declaration imposes the bound. A group or mesh declaration
    also keeps the ranks it names, so that its message lists the ranks a
    too-small world lacks.
    """

    reason: str
    exactly: int | None = None
    at_least: int = 1
    at_most: int | None = None
    #: for declarations: their name (`mesh @infer`) and the ranks they name
    declaration: str | None = None
    named_ranks: tuple[int, ...] = ()
    #: no world size satisfies the IR (types that contradict each other)
    never: bool = False

    def allows(self, world_size: int) -> bool:
        if self.never:
            return False
        if self.exactly is not None and world_size != self.exactly:
            return False
        if world_size < self.at_least:
            return False
        return self.at_most is None or world_size <= self.at_most

    def explain(self, world_size: int) -> str:
        """Why `world_size` ranks do not satisfy this requirement."""
        if self.declaration is not None:
            missing = ", ".join(str(r) for r in self.named_ranks if r >= world_size)
            noun = "rank" if "," not in missing else "ranks"
            return (
                f"{self.declaration} names {noun} {missing} but the program runs on "
                f"{count(world_size, 'rank')}"
            )
        if self.never:
            return f"this program cannot run on any number of ranks: {self.reason}"
        if self.exactly is not None:
            return f"this program needs {count(self.exactly, 'rank')}, not {world_size}: {self.reason}"
        if world_size < self.at_least:
            return (
                f"this program needs at least {count(self.at_least, 'rank')}, not {world_size}: "
                f"{self.reason}"
            )
        return f"this program runs on at most {count(self.at_most, 'rank')}, not {world_size}: {self.reason}"


def _runs_on_every_rank(op: Operation, entry: func.FuncOp) -> bool:
    """Whether every rank executes `op`: it sits in the entry function's body,
    at most inside waves, not under control flow nor in a combine region."""
    parent = op.parent_op()
    while parent is not None and parent is not entry:
        if not isinstance(parent, RunsBodyInPlace):
            return False
        parent = parent.parent_op()
    return parent is entry


def _declarations(module: ModuleOp) -> Iterator[WorldSizeRequirement]:
    for op in module.ops:
        if not isinstance(op, DeclaresRanks):
            continue
        ranks, what = op.declared_ranks(), op.declared_as()
        if ranks:
            yield WorldSizeRequirement(
                reason=f"{what} names rank {ranks[-1]}",
                at_least=ranks[-1] + 1,
                declaration=what,
                named_ranks=ranks,
            )


def _static_count_length(t: object) -> int | None:
    if isinstance(t, TensorType) and t.get_num_dims() == 1:
        (n,) = t.get_shape()
        return n if n >= 0 else None
    return None


def _world_group_op(op: Operation) -> Iterator[WorldSizeRequirement]:
    """What an op on the world group says about the world size."""
    for value, role in operand_roles(op):
        n = _static_count_length(value.type)
        if role in _COUNT_ROLES and n is not None:
            yield WorldSizeRequirement(
                reason=f"{describe_op(op)} takes {_COUNT_ROLES[role]} {value.type} "
                "(one per rank)",
                exactly=n,
            )
    implied = op.implied_group_size() if isinstance(op, ImpliesGroupSize) else None
    if implied is not None:
        why, size = implied
        reason = f"{describe_op(op)} {why}"
        if size is None:
            yield WorldSizeRequirement(reason=reason, never=True)
        else:
            yield WorldSizeRequirement(reason=reason, exactly=size)
    assumed = op.attributes.get(ASSUMED_GROUP_SIZE)
    if isinstance(assumed, IntegerAttr):
        limit = assumed.value.data
        yield WorldSizeRequirement(
            reason=f"{describe_op(op)} was lowered assuming at most {limit} ranks "
            f"({ASSUMED_GROUP_SIZE} = {limit})",
            at_most=limit,
        )


def _coverage(module: ModuleOp, op: Operation, group: SymbolRefAttr) -> WorldSizeRequirement | None:
    """An op on a declared group that every rank runs: every rank must be in
    one of the group's subgroups."""
    name = group.root_reference.data
    decl = next((d for d in group_declarations(module) if d.name == name), None)
    if decl is None:
        return None
    covered = {r for part in decl.subgroups for r in part}
    first_gap = next(r for r in range(len(covered) + 1) if r not in covered)
    return WorldSizeRequirement(
        reason=f"{describe_op(op)} runs on every rank on group @{name}, which has no "
        f"subgroup for rank {first_gap}",
        at_most=first_gap,
    )


def world_size_requirements(module: ModuleOp, entry: str = "main") -> list[WorldSizeRequirement]:
    """Every constraint `module`'s IR puts on the world size it runs on, in
    program order: declarations first, then the ops of the entry function and
    the functions it calls."""
    found = list(_declarations(module))
    entry_op = function_named(module, entry)
    for function in reachable_functions(module, entry):
        for op in function.walk():
            group = op.properties.get("group")
            if group is None:
                if op.name.startswith("dist."):
                    found.extend(_world_group_op(op))
            elif (
                isinstance(group, SymbolRefAttr)
                and entry_op is not None
                and _runs_on_every_rank(op, entry_op)
            ):
                coverage = _coverage(module, op, group)
                if coverage is not None:
                    found.append(coverage)
    return found


def check_declarations(module: ModuleOp, world_size: int) -> None:
    """Declared groups and meshes must name ranks of the base group only.

    Every rank runs the same (agreed) program on a base group of the same
    size, so every rank raises this same error, before any collective."""
    for req in _declarations(module):
        if not req.allows(world_size):
            raise DistirError(
                f"{req.explain(world_size)} (declare ranks of the group it runs on; after "
                "distir.recover, compile it again for the new group size)"
            )


def world_size_range(module: ModuleOp, entry: str = "main") -> tuple[int, int | None]:
    """The smallest and largest world size the IR allows (None: no upper
    bound); the smallest is larger than the largest when none works."""
    low, high = 1, None
    for req in world_size_requirements(module, entry):
        if req.never:
            return 1, 0
        bounds = [(req.exactly, req.exactly)] if req.exactly is not None else []
        bounds.append((req.at_least, req.at_most))
        for lo, hi in bounds:
            low = max(low, lo)
            if hi is not None:
                high = hi if high is None else min(high, hi)
    return low, high


def check_world_size(module: ModuleOp, world_size: int, entry: str = "main") -> None:
    """Raises `WorldSizeError` if `module` cannot run on `world_size` ranks,
    naming the first requirement that fails and the op or declaration
    behind it, e.g. "mesh @infer names ranks 4, 5 but the program runs on
    4 ranks"."""
    for req in world_size_requirements(module, entry):
        if not req.allows(world_size):
            raise WorldSizeError(req.explain(world_size))
