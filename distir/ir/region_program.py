"""A combine region compiled once: the one form every reader of it runs.

A generic all-reduce's (or reduce-scatter's) combine region is read three
ways: the verifier evaluates it exactly to refute a wrong `commutative`
marker (`ir.analysis`), the execution core runs it whole as local kernels
(`core.block_compiler.compile_local_region`, at plan time), and the
algorithms run it tile by tile on flat ranges
(`ops.all_reduce.torch.combines.RegionCombine`). All three read the same
`RegionProgram`, made once per region (`region_program`, kept on the
block): every value a slot, every op one step with its operand and result
slots and its role, in order. The core gives each step its kernel once;
the algorithms reuse those kernels; the analysis evaluates the steps with
exact arithmetic. Torch-free, as the IR is.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from xdsl.dialects import arith, tensor
from xdsl.dialects.builtin import IndexType, TensorType
from xdsl.dialects.linalg.ops import BroadcastOp as LinalgBroadcastOp
from xdsl.ir import Block, Operation, SSAValue

#: the ops that end a region's block
_TERMINATORS = ("dist.yield", "scf.yield", "func.return")


class Role(enum.Enum):
    """What a step is to a tile-by-tile evaluation of the region."""

    #: computes elements (an arith op, a math op, ...)
    COMPUTE = "compute"
    #: an `arith.constant` of a tensor or scalar
    CONSTANT = "constant"
    #: a size or a broadcast target (`tensor.dim`, `tensor.empty`, an index
    #: constant): nothing to compute per element
    SIZE = "size"
    #: `linalg.broadcast` of one of the region's extras to the operands' shape
    BROADCAST = "broadcast"
    #: `tensor.splat` of a scalar (its sizes are not read per element)
    SPLAT = "splat"


@dataclass(frozen=True)
class RegionStep:
    op: Operation
    role: Role
    #: the slots of its operands
    operands: tuple[int, ...]
    #: the slots of its results
    results: tuple[int, ...]
    #: for a BROADCAST: (the extra's index among the extras, its dimensions)
    broadcast: tuple[int, tuple[int, ...]] | None = None


@dataclass(frozen=True)
class RegionProgram:
    """A region's block as steps over slots: slots 0..n_args-1 are the
    block's arguments (lhs, rhs, then the extras), each result gets the
    next slot."""

    n_args: int
    steps: tuple[RegionStep, ...]
    n_slots: int
    #: the slots its terminator returns; None: the block has no terminator
    returned: tuple[int, ...] | None
    #: value -> its slot (an op with a region of its own reads values of
    #: this block through it)
    slots: dict[SSAValue, int]

    @property
    def result(self) -> int | None:
        """The one slot a combine yields (None without a single one)."""
        returned = self.returned
        return returned[0] if returned is not None and len(returned) == 1 else None


def _shape(t: object) -> tuple[int, ...] | None:
    return tuple(t.get_shape()) if isinstance(t, TensorType) else None


def broadcast_extra(op: Operation, block: Block) -> tuple[int, tuple[int, ...]] | None:
    """(extra index, broadcast dimensions) when `op` is a `linalg.broadcast`
    of one of the region's extras to the operands' shape."""
    if not isinstance(op, LinalgBroadcastOp):
        return None
    source = op.operands[0]
    if source not in block.args[2:] or _shape(op.results[0].type) != _shape(block.args[0].type):
        return None
    return block.args.index(source) - 2, tuple(op.dimensions.get_values())


def _role(op: Operation, block: Block) -> tuple[Role, tuple[int, tuple[int, ...]] | None]:
    if isinstance(op, tensor.DimOp | tensor.EmptyOp):
        return Role.SIZE, None
    if isinstance(op, arith.ConstantOp):
        index = isinstance(op.result.type, IndexType)
        return (Role.SIZE if index else Role.CONSTANT), None
    found = broadcast_extra(op, block)
    if found is not None:
        return Role.BROADCAST, found
    if isinstance(op, tensor.SplatOp):
        return Role.SPLAT, None
    return Role.COMPUTE, None


def _snapshot(block: Block) -> tuple:
    """What a compiled region depends on: its ops, their operands and
    attributes (a pass that rewrites the region changes one of these)."""
    return tuple(
        (op, tuple(op.operands), tuple(op.properties.items()), tuple(op.attributes.items()))
        for op in block.ops
    )


class Compilations:
    """How many regions this process compiled (tests read it)."""

    count = 0


def region_program(block: Block) -> RegionProgram:
    """`block`'s compiled form, made once and kept on the block (made again
    only if the block was rewritten since)."""
    snapshot = _snapshot(block)
    kept = getattr(block, "_distir_region_program", None)
    if kept is not None and kept[0] == snapshot:
        return kept[1]
    program = _compile(block)
    block._distir_region_program = (snapshot, program)  # type: ignore[attr-defined]
    return program


def _compile(block: Block) -> RegionProgram:
    Compilations.count += 1
    slots: dict[SSAValue, int] = {arg: i for i, arg in enumerate(block.args)}
    n_slots = len(block.args)
    steps: list[RegionStep] = []
    returned: tuple[int, ...] | None = None
    for op in block.ops:
        # A value from outside the block (only a malformed region reads
        # one) gets a slot nothing fills: readers find it empty.
        operands = []
        for v in op.operands:
            if v not in slots:
                slots[v] = n_slots
                n_slots += 1
            operands.append(slots[v])
        if op.name in _TERMINATORS:
            returned = tuple(operands)
            break
        role, broadcast = _role(op, block)
        results = []
        for result in op.results:
            slots[result] = n_slots
            results.append(n_slots)
            n_slots += 1
        steps.append(RegionStep(op, role, tuple(operands), tuple(results), broadcast))
    return RegionProgram(len(block.args), tuple(steps), n_slots, returned, slots)
