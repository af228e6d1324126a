"""The builder helpers of the transfer family: `declare_mesh`, `transfer`."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import TensorType
from xdsl.ir import SSAValue

from distir.ir.building import (
    Value,
    located,
    tensor_type,
)
from distir.ops.transfer.ir import MeshOp, TransferOp


@located
def declare_mesh(name: str, shape: Sequence[int], ranks: Sequence[int]) -> str:
    """`dist.mesh @name [shape] ranks [...]` (global ranks, row-major) at the
    current insertion point, which must be a module body; returns `name`.
    `build_program(meshes=...)` calls it."""
    MeshOp(name, shape, ranks)
    return name


@located
def transfer(
    x: Value,
    *,
    source_mesh: str,
    source_layout: Sequence[int | None],
    dest_mesh: str,
    dest_layout: Sequence[int | None],
    global_shape: Sequence[int],
    source_partial: Sequence[int] = (),
    result_type: TensorType | None = None,
) -> SSAValue:
    """Moves a global tensor of `global_shape` from its layout on one mesh to
    a layout on another. A layout gives, per tensor dim, the mesh axis that
    shards it or None (replicated); `source_partial` lists the source mesh
    axes that hold partial sums. The local shard is fully dynamic
    (`tensor<?x?xf32>`) unless `result_type` says otherwise."""
    element = SSAValue.get(x).type
    assert isinstance(element, TensorType)
    t = result_type or tensor_type(element.element_type, [None] * len(global_shape))
    return TransferOp(
        x,
        source_mesh=source_mesh,
        source_layout=source_layout,
        dest_mesh=dest_mesh,
        dest_layout=dest_layout,
        global_shape=global_shape,
        source_partial=source_partial,
        result_type=t,
    ).result
