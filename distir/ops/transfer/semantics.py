"""The semantics record of `dist.transfer`, and the oracle of transfer maps.

Every rank of either mesh sends its source shard to the exchange, and each
destination rank builds its shard with `apply_transfer_map_reference`, the
oracle of transfer maps, on the same map (the op's `TransferPlan`) the Torch
backend executes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from distir.core.checks import Precondition, fail
from distir.core.invocation import Invocation
from distir.core.records import Inputs, OpSemantics, ReferenceCall, Results
from distir.ir.layouts import check_shape
from distir.ops.transfer.ir import Transfer, TransferOp, TransferPlan

#: A rank's local tensor for the reference executor: (shape, row-major values).
LocalShard = tuple[tuple[int, ...], list]


class TransferSemantics(OpSemantics):
    op = TransferOp

    def decode(self, op: TransferOp) -> dict[str, Any]:
        return {"plan": op.transfer_plan()}

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        # A source rank's shard must have the shape its layout gives it.
        plan: TransferPlan = inv.properties["plan"]
        x = inputs[0]
        if rank in plan.source_mesh.ranks:
            box = plan.source_box(rank)
            if tuple(x.shape) != tuple(box.sizes):
                raise fail(
                    inv,
                    f"rank {rank} of source mesh @{plan.source_mesh.name} holds a shard of "
                    f"shape {list(x.shape)}, but its layout gives it {list(box.sizes)}",
                )
        return Precondition()

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        (x,) = inputs
        plan: TransferPlan = call.invocation.properties["plan"]
        me = call.global_rank
        empty = torch.zeros(plan.outside_shape, dtype=x.dtype)
        call.agree(inputs)  # every rank of the op's group, as the runtime's exchange
        if me not in plan.members:
            return (empty,)
        everyone = dict(zip(plan.members, call.exchange(x, plan.members)))
        if me not in plan.dest_mesh.ranks:
            return (empty,)
        # Values stay 0-d tensors of the op's dtype, so partial sums round as
        # the tensor arithmetic of a real destination does.
        sources = {
            r: (tuple(everyone[r].shape), list(everyone[r].reshape(-1).unbind()))
            for r in plan.source_mesh.ranks
        }
        outputs = apply_transfer_map_reference(
            [t for t in plan.transfers if t.dst_rank == me], sources, {me: plan.dest_box(me).sizes}
        )
        out_shape, values = outputs[me]
        if not values:
            return (torch.empty(out_shape, dtype=x.dtype),)
        return (torch.stack(values).reshape(out_shape),)


def _strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _box_positions(shape: Sequence[int], offsets: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """Flat row-major positions in a tensor of ``shape`` of the box at ``offsets``."""
    if any(o < 0 or o + s > n for o, s, n in zip(offsets, sizes, shape)):
        raise ValueError(
            f"box at {tuple(offsets)} of size {tuple(sizes)} does not fit in shape {tuple(shape)}"
        )
    strides = _strides(shape)
    return [
        sum((o + i) * st for o, i, st in zip(offsets, index, strides))
        for index in itertools.product(*(range(s) for s in sizes))
    ]


def apply_transfer_map_reference(
    transfers: Iterable[Transfer],
    src_shards: Mapping[int, LocalShard],
    dst_shapes: Mapping[int, Sequence[int]],
) -> dict[int, LocalShard]:
    """Execute a transfer map on flat lists: the oracle for real implementations.

    ``src_shards[rank]`` is a source rank's local shard as ``(shape, values)``
    with values row-major; ``dst_shapes[rank]`` is each destination rank's
    local shape. Sources are only read (a rank in both meshes keeps separate
    source and destination buffers). A plain transfer copies its box; a
    partial one adds into it. Returns every destination's ``(shape, values)``.

    Raises ``ValueError`` if a source shard is missing or too small, if an
    element is copied twice or both copied and summed, or if a destination
    element receives nothing.
    """
    sources: dict[int, tuple[tuple[int, ...], list]] = {}
    for rank, (shape, values) in src_shards.items():
        shape = check_shape(shape, f"source rank {rank} shape")
        if len(values) != math.prod(shape):
            raise ValueError(f"source rank {rank} has {len(values)} values for shape {shape}")
        sources[rank] = (shape, list(values))
    outputs: dict[int, list] = {}
    modes: dict[int, list[str | None]] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    for rank, shape in dst_shapes.items():
        shapes[rank] = check_shape(shape, f"destination rank {rank} shape")
        outputs[rank] = [None] * math.prod(shapes[rank])
        modes[rank] = [None] * math.prod(shapes[rank])
    for t in transfers:
        if t.src_rank not in sources:
            raise ValueError(f"no source shard for rank {t.src_rank}")
        if t.dst_rank not in outputs:
            raise ValueError(f"no destination shape for rank {t.dst_rank}")
        src_shape, src_values = sources[t.src_rank]
        reads = _box_positions(src_shape, t.src_offsets, t.box.sizes)
        writes = _box_positions(shapes[t.dst_rank], t.dst_offsets, t.box.sizes)
        out, mode = outputs[t.dst_rank], modes[t.dst_rank]
        wanted = "add" if t.partial else "copy"
        for read, write in zip(reads, writes):
            if mode[write] is None:
                out[write] = src_values[read]
                mode[write] = wanted
            elif wanted == "add" and mode[write] == "add":
                out[write] = out[write] + src_values[read]
            else:
                raise ValueError(
                    f"destination rank {t.dst_rank} element {write} is written by a "
                    f"{mode[write]} and then by a {wanted} (from rank {t.src_rank})"
                )
    for rank, mode in modes.items():
        if None in mode:
            raise ValueError(f"destination rank {rank} element {mode.index(None)} receives nothing")
    return {rank: (shapes[rank], outputs[rank]) for rank in outputs}


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (TransferSemantics(),)
