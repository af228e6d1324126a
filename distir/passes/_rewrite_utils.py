"""Helpers shared by distir's rewrite patterns."""

from __future__ import annotations

from collections.abc import Iterable

from xdsl.dialects import arith, tensor
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    DenseArrayBase,
    IndexType,
    IntegerAttr,
    LocationAttr,
    TensorType,
    i64,
)
from xdsl.dialects.linalg.ops import BroadcastOp
from xdsl.ir import Operation, SSAValue


def with_location(ops: Iterable[Operation], location: LocationAttr) -> None:
    """Stamp the source op's location on ops a rewrite creates, so that errors
    raised later (a verifier, a backend) still point at the source line."""
    for op in ops:
        for nested in op.walk():
            nested.location = location


def dynamic_sizes(value: SSAValue) -> tuple[list[Operation], list[SSAValue]]:
    """`tensor.dim` ops reading the dynamic dimensions of `value`, and the sizes."""
    t = value.type
    assert isinstance(t, TensorType)
    ops: list[Operation] = []
    sizes: list[SSAValue] = []
    for dim, size in enumerate(t.get_shape()):
        if size == DYNAMIC_INDEX:
            index = arith.ConstantOp(IntegerAttr(dim, IndexType()))
            size_op = tensor.DimOp(value, index)
            index.result.name_hint = f"c{dim}"
            size_op.result.name_hint = f"dim{dim}"
            ops += [index, size_op]
            sizes.append(size_op.result)
    return ops, sizes


def broadcast_moduli(
    ciphertext: SSAValue, moduli: SSAValue, sizes: list[SSAValue] | None = None
) -> tuple[list[Operation], SSAValue]:
    """Ops that broadcast `moduli : tensor<Lxi64>` to the ciphertext's type
    `tensor<...xLxNxi64>` along every dimension but the limb one (-2), and the
    broadcast value.

    arith ops on tensors never broadcast, so a combine region or a remainder
    that works limb-wise needs the moduli in the ciphertext's own shape.
    Dynamic sizes of the target are `sizes`, or read off the ciphertext with
    `tensor.dim`; when the moduli's length and the ciphertext's limb dimension
    disagree only in being static or dynamic, a `tensor.cast` reconciles them
    (linalg.broadcast wants identical mapped sizes).
    """
    ct_type = ciphertext.type
    mod_type = moduli.type
    assert isinstance(ct_type, TensorType) and isinstance(mod_type, TensorType)
    shape = ct_type.get_shape()
    limb_dim = len(shape) - 2
    hint = moduli.name_hint or "moduli"
    ops: list[Operation] = []

    if mod_type.get_shape()[0] != shape[limb_dim]:
        cast = tensor.CastOp(moduli, TensorType(mod_type.element_type, [shape[limb_dim]]))
        cast.dest.name_hint = f"{hint}_cast"
        ops.append(cast)
        moduli = cast.dest

    if sizes is None:
        size_ops, sizes = dynamic_sizes(ciphertext)
        ops += size_ops
    empty = tensor.EmptyOp(sizes, ct_type)
    broadcast = BroadcastOp(
        moduli,
        empty.tensor,
        DenseArrayBase.from_list(i64, [d for d in range(len(shape)) if d != limb_dim]),
    )
    empty.tensor.name_hint = "empty"
    ops += [empty, broadcast]
    result = broadcast.result[0]
    result.name_hint = f"{hint}_bcast"
    return ops, result
