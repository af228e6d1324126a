"""The wave op, which submits several collectives before awaiting any, and
`dist.yield`, which ends a wave or a combine region."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects.builtin import (
    TensorType,
)
from xdsl.dialects.utils import AbstractYieldOperation
from xdsl.ir import Attribute, Block, Operation, Region
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    region_def,
    traits_def,
    var_result_def,
)
from xdsl.traits import IsTerminator, OpTrait, Pure
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import (
    CollectiveEffect,
)
from distir.ir.collectives import CollectiveOp
from distir.ir.facts import (
    EveryRankEnters,
    RunsBodyInPlace,
    Structural,
)
from distir.ops.p2p.ir import PeerOp

###############################################################################
# Waves and the region terminator
###############################################################################


@irdl_op_definition
class WaveOp(IRDLOperation, RunsBodyInPlace):
    """Submits every collective of its body, in order, before awaiting any.

    The body holds collectives and point-to-point ops only, each reading
    values defined before the wave (none reads another's result), and ends
    in `dist.yield`; the wave's results are the yielded values, available
    once every op of the wave completed. Ranks with nothing to send still
    submit the whole wave (zero-size payloads), so peers never wait on them.
    """

    name = "dist.wave"

    outputs = var_result_def(TensorType)
    body = region_def("single_block")

    traits = traits_def(CollectiveEffect(), EveryRankEnters(), Structural())

    assembly_format = "$body attr-dict (`:` type($outputs)^)?"

    def __init__(self, body: Region, result_types: Sequence[Attribute]):
        super().__init__(result_types=[list(result_types)], regions=[body])

    def body_block(self) -> Block:
        return self.body.block

    def verify_(self) -> None:
        block = self.body.block
        inner = set()
        for op in block.ops:
            if isinstance(op, YieldOp):
                continue
            if not isinstance(op, CollectiveOp | PeerOp):
                raise VerifyException(
                    f"'dist.wave' may hold only collectives and point-to-point ops, "
                    f"found '{op.name}'"
                )
            for value in op.operands:
                if value in inner:
                    raise VerifyException(
                        f"'{op.name}' in a 'dist.wave' reads the result of another op "
                        "of the same wave; results exist only after the wave"
                    )
            inner.update(op.results)
        last = block.last_op
        if not isinstance(last, YieldOp):
            raise VerifyException("'dist.wave' body must end in `dist.yield`")
        if [v.type for v in last.arguments] != [r.type for r in self.outputs]:
            raise VerifyException(
                "'dist.wave' must yield values of its result types "
                f"({', '.join(str(r.type) for r in self.outputs)})"
            )


@dataclass(frozen=True)
class HasParentNamed(OpTrait):
    """xDSL's `HasParent`, by op name: the all-reduce is defined in a module
    that imports this one (for `CollectiveOp` and `YieldOp`), so its class
    cannot be named here without an import cycle."""

    names: tuple[str, ...]

    def verify(self, op: Operation) -> None:
        parent = op.parent_op()
        if parent is None or parent.name in self.names:  # detached: not checked
            return
        names = ", ".join(f"'{name}'" for name in self.names)
        raise VerifyException(f"'{op.name}' expects parent op to be one of {names}")


@irdl_op_definition
class YieldOp(AbstractYieldOperation[Attribute]):
    """Terminates a combine region (the combined value) or a wave (its results)."""

    name = "dist.yield"

    traits = traits_def(IsTerminator(), HasParentNamed(("dist.all_reduce", "dist.reduce_scatter", "dist.wave")), Pure(), Structural())


def wave_around(ops: Sequence[Operation]) -> WaveOp:
    """A wave whose body is `ops` (detached; none reads another's result),
    yielding every result of them in order: the wave's results stand for
    those values outside it (its builder for passes: the transposed wave)."""
    body = Block()
    values = [r for op in ops for r in op.results]
    body.add_ops([*ops, YieldOp(*values)])
    return WaveOp(Region(body), [v.type for v in values])
