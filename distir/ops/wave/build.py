"""The builder helpers of the wave family: `make_combine_region` (a region ended by
`dist.yield`) and `wave`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.builder import ImplicitBuilder
from xdsl.ir import Attribute, Block, Region, SSAValue

from distir.ir.building import (
    Body,
    Value,
    as_values,
    located,
)
from distir.ops.wave.ir import WaveOp, YieldOp


@located
def make_combine_region(arg_types: Sequence[Attribute], combine: Body) -> Region:
    """A single-block region whose body `combine(*block_args)` builds,
    ended by a `dist.yield` of what it returns (`all_reduce(combine=...)`
    calls it; `wave` ends its body the same way)."""
    block = Block(arg_types=arg_types)
    with ImplicitBuilder(block):
        YieldOp(*as_values(combine(*block.args)))
    return Region(block)


@located
def wave(body: Callable[[], Value | Sequence[Value] | None]) -> tuple[SSAValue, ...]:
    """`dist.wave`: `body()` builds collectives and point-to-point ops, all
    submitted before any is awaited, and returns the values the wave
    yields; returns the wave's results (one per yielded value)."""
    block = Block()
    with ImplicitBuilder(block):
        values = as_values(body())
        YieldOp(*values)
    return tuple(WaveOp(Region(block), [v.type for v in values]).outputs)
