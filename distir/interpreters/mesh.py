"""Run-time meaning of mesh transfers: the reference rule.

Every rank of either mesh sends its source shard to the exchange, and each
destination rank builds its shard with `layouts.apply_transfer_map_reference`,
the oracle of transfer maps, on the same map the Torch backend executes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from distir.interpreters.checks import Precondition, fail, precondition
from distir.interpreters.invocation import Invocation
from distir.interpreters.reference import SimulatedCall, reference
from distir.ir.dialect import TransferOp
from distir.ir.layouts import apply_transfer_map_reference, local_box


def outside_shape(invocation: Invocation) -> list[int]:
    """The result of a rank outside the destination mesh: empty, size 0 along
    the result type's dynamic dims (its static dims as declared; zeros of
    the declared shape when no dim is dynamic)."""
    return [0 if d is None else d for d in invocation.result_shapes[0]]


def check_source_shard(invocation: Invocation, x: torch.Tensor, rank: int) -> None:
    """A source rank's shard must have the shape its layout gives it."""
    src_mesh, src_layout, _, _, shape, _ = invocation.properties["plan"]
    if rank in src_mesh.ranks:
        box = local_box(src_mesh, src_layout, shape, rank)
        if tuple(x.shape) != tuple(box.sizes):
            raise fail(
                invocation,
                f"rank {rank} of source mesh @{src_mesh.name} holds a shard of shape "
                f"{list(x.shape)}, but its layout gives it {list(box.sizes)}",
            )


@precondition(TransferOp)
def transfer_precondition(
    inv: Invocation, inputs: Sequence[torch.Tensor], size: int, rank: int
) -> Precondition:
    check_source_shard(inv, inputs[0], rank)
    return Precondition()


@reference(TransferOp)
def transfer_reference(call: SimulatedCall, inputs: Sequence[torch.Tensor]):
    (x,) = inputs
    inv = call.invocation
    src_mesh, src_layout, dst_mesh, dst_layout, shape, transfers = inv.properties["plan"]
    me = call.simulated.rank
    members = tuple(sorted(set(src_mesh.ranks) | set(dst_mesh.ranks)))
    empty = torch.zeros(outside_shape(inv), dtype=x.dtype)
    call.agree(inputs)  # every rank of the op's group, as the runtime's exchange
    if me not in members:
        return (empty,)
    everyone = dict(zip(members, call.exchange(x, members)))
    if me not in dst_mesh.ranks:
        return (empty,)
    # Values stay 0-d tensors of the op's dtype, so partial sums round as
    # the tensor arithmetic of a real destination does.
    sources = {
        r: (tuple(everyone[r].shape), list(everyone[r].reshape(-1).unbind()))
        for r in src_mesh.ranks
    }
    mine = local_box(dst_mesh, dst_layout, shape, me).sizes
    outputs = apply_transfer_map_reference(
        [t for t in transfers if t.dst_rank == me], sources, {me: mine}
    )
    out_shape, values = outputs[me]
    if not values:
        return (torch.empty(out_shape, dtype=x.dtype),)
    return (torch.stack(values).reshape(out_shape),)
