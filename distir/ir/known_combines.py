"""Combine regions that passes build and backends recognise by name.

A pass that builds a combine region a backend can run faster than the region
itself records it on the generic `dist.all_reduce` as the discardable
attribute `known_combine = "<name>"`. The backend then runs its own code for
that name, so the verifier holds the region to it: the region must be
structurally equivalent to what the builder here makes for the op's types
(`known_combine_error`). The builder is the only description of the region:
the pass calls it, the verifier compares with it.

- `modular-add`: `lower-ciphertext-add`'s per-limb modular addition of RNS
  limbs, `s = lhs + rhs; d = s - q; d + ((d >> 63) & q)`.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects import arith, tensor
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    IndexType,
    IntegerAttr,
    StringAttr,
    TensorType,
    i64,
)
from xdsl.dialects.linalg.ops import BroadcastOp
from xdsl.ir import Block, Operation, Region, SSAValue

#: Discardable attribute by which a pass records what a combine region is.
KNOWN_COMBINE = "known_combine"
MODULAR_ADD = "modular-add"


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


def modular_add_region(
    ciphertext_type: TensorType,
    moduli_type: TensorType,
    terminator: Callable[[SSAValue], Operation],
) -> Region:
    """The combine region `(lhs, rhs, q) -> (lhs + rhs) mod q` for reduced
    operands, on tensors of `ciphertext_type`, with moduli `[L]` broadcast
    inside it (`lower-ciphertext-add` documents why it is exact).

    `terminator` builds its `dist.yield`: that op is defined beside the
    all-reduce whose verifier calls this module, so it is passed in rather
    than imported (which would be an import cycle)."""
    t = ciphertext_type
    block = Block(arg_types=[t, t, moduli_type])
    lhs, rhs, limbs = block.args
    lhs.name_hint, rhs.name_hint, limbs.name_hint = "lhs", "rhs", "q_limbs"
    size_ops, sizes = dynamic_sizes(lhs)
    block.add_ops(size_ops)
    prelude, q = broadcast_moduli(lhs, limbs, sizes)
    block.add_ops(prelude)
    q.name_hint = "mod"

    def named(op: Operation, hint: str) -> Operation:
        op.results[0].name_hint = hint
        block.add_op(op)
        return op

    total = named(arith.AddiOp(lhs, rhs), "sum")
    minus_q = named(arith.SubiOp(total, q), "sum_minus_q")
    shift = named(_splat(block, lhs, 63, sizes), "c63")
    below_q = named(arith.ShRSIOp(minus_q, shift), "below_q")
    add_back = named(arith.AndIOp(below_q, q), "add_back")
    reduced = named(arith.AddiOp(minus_q, add_back), "reduced")
    block.add_op(terminator(reduced.results[0]))
    return Region(block)


def _splat(block: Block, like: SSAValue, value: int, sizes: list[SSAValue]) -> Operation:
    """A tensor of `like`'s type filled with `value`: a dense constant when
    the shape is static, else a `tensor.splat` of the dynamic `sizes`."""
    t = like.type
    assert isinstance(t, TensorType)
    if not sizes:
        return arith.ConstantOp(DenseIntOrFPElementsAttr.from_list(t, [value]))
    scalar = arith.ConstantOp(IntegerAttr(value, t.element_type))
    scalar.result.name_hint = f"c{value}_scalar"
    block.add_op(scalar)
    return tensor.SplatOp(scalar, sizes, t)


def known_combine(op: Operation) -> str | None:
    """The combine a pass recorded on a generic all-reduce (verified)."""
    attr = op.attributes.get(KNOWN_COMBINE)
    return attr.data if isinstance(attr, StringAttr) else None


def _is_modular_add_region(block: Block) -> bool:
    """Whether the block is what `modular_add_region` builds for its argument
    types (i64 limbs, one moduli extra)."""
    if len(block.args) != 3 or block.last_op is None:
        return False
    ct_type, _, moduli_type = (a.type for a in block.args)
    if not isinstance(ct_type, TensorType) or ct_type.element_type != i64:
        return False
    if not isinstance(moduli_type, TensorType) or moduli_type.get_num_dims() != 1:
        return False
    expected = modular_add_region(ct_type, moduli_type, type(block.last_op)).block
    # Structural equivalence compares ops, operands and properties, not
    # result types: a `tensor.empty` of another shape must not pass.
    return expected.is_structurally_equivalent(block) and all(
        [r.type for r in a.results] == [r.type for r in b.results]
        for a, b in zip(expected.walk(), block.walk())
    )


#: what each known combine's region must be
KNOWN_COMBINES: dict[str, Callable[[Block], bool]] = {MODULAR_ADD: _is_modular_add_region}


def known_combine_error(op: Operation) -> str | None:
    """Why an op's recorded `known_combine` does not hold, or None: backends
    run the recorded combine instead of the region, so the two must agree."""
    if KNOWN_COMBINE not in op.attributes:
        return None
    name = known_combine(op)
    check = KNOWN_COMBINES.get(name or "")
    if check is None:
        return (
            f"'{op.name}' records known_combine {op.attributes[KNOWN_COMBINE]}, but the "
            f"known combines are {', '.join(repr(k) for k in KNOWN_COMBINES)}"
        )
    if not op.regions or not op.regions[0].blocks or not check(op.regions[0].block):
        return (
            f"'{op.name}' records known_combine \"{name}\" but its combine region is "
            f"not that combine"
        )
    return None
