"""Rooted and open shard ops convert to dist's own rooted ops and move fewer
bytes than the collectives they replaced: a static-root `gather` is a
`dist.gather` (each member sends its piece once, to the root) where an
all-gather sent it to every member; a `scatter` is a `dist.scatter` (the
root sends each member its piece) where a broadcast sent the whole tensor;
a `reduce` is a `dist.reduce` where an all-reduce gave every member the
result; an open `shift` is a `dist.shift` (no message from a process whose
target lies off the axis) where a ring exchange sent every input.

The bytes are counted from the converted program with the textbook volumes
of each collective (the whole group's sends, the cheapest algorithm),
written here and not read from distir.
"""

from __future__ import annotations

from fractions import Fraction
from math import prod

import pytest

from distir.ir.parsing import parse_module
from distir.passes.convert_shard_to_dist import ConvertShardToDistPass

ELEMENT_BYTES = {"f32": 4, "f64": 8, "i32": 4, "i64": 8}


def nbytes(t) -> int:
    assert all(d >= 0 for d in t.get_shape()), t
    return prod(t.get_shape()) * ELEMENT_BYTES[str(t.element_type)]


def group_sizes(module) -> dict[str, int]:
    """Each declared group's size (all of its parts are the same size here)."""
    return {op.sym_name.data: len(op.subgroups.data[0].get_values()) for op in module.walk()
            if op.name == "dist.group"}  # fmt: skip


def sent_by_a_group(op, P: int) -> Fraction:
    """Bytes a group of P members sends in `op` (textbook lower bounds)."""
    name = op.name
    if name == "dist.all_gather":  # each member's piece to every other member
        return Fraction(P * (P - 1) * nbytes(op.operands[0].type))
    if name == "dist.gather":  # each non-root member's piece to the root
        return Fraction((P - 1) * nbytes(op.operands[0].type))
    if name == "dist.broadcast":  # the root's tensor to every other member
        return Fraction((P - 1) * nbytes(op.operands[0].type))
    if name == "dist.scatter":  # the root sends each other member its piece
        return Fraction((P - 1) * nbytes(op.results[0].type))
    if name == "dist.all_reduce":  # a ring: reduce-scatter then all-gather
        return Fraction(2 * (P - 1) * nbytes(op.operands[0].type))
    if name == "dist.reduce":  # each non-root contribution reaches the root once
        return Fraction((P - 1) * nbytes(op.operands[0].type))
    if name == "dist.shift":  # one message per member whose target is in the group
        offset = op.offset.value.data
        senders = P if op.rotate is not None else max(P - abs(offset), 0)
        if op.rotate is not None and offset % P == 0:
            senders = 0
        return Fraction(senders * nbytes(op.operands[0].type))
    return Fraction(0)


def converted_bytes(text: str, world: int) -> tuple[Fraction, list[str]]:
    module = parse_module(text)
    ConvertShardToDistPass().apply(None, module)  # type: ignore[arg-type]
    module.verify()
    sizes = group_sizes(module)
    total, names = Fraction(0), []
    for op in module.walk():
        group = op.properties.get("group")
        if group is None or op.name == "dist.rank":
            continue
        P = sizes[group.root_reference.data]
        names.append(op.name)
        total += sent_by_a_group(op, P) * (world // P)  # every group of the partition
    return total, names


GRID = "shard.grid @g(shape = {grid})\n"


def program(grid, t_in: str, t_out: str, body: str) -> str:
    return (GRID.format(grid="x".join(map(str, grid))) +
            f"func.func @main(%x: {t_in}) -> {t_out} {{\n  %y = {body}\n"
            f"  func.return %y : {t_out}\n}}\n")


# (op, grid, axes): the program, the dist op it becomes, and the bytes the
# replaced lowering moved (all-gather / broadcast / all-reduce / a ring
# exchange of every input), by the same textbook volumes
CASES = [((4,), (0,)), ((2, 2), (1, 0)), ((2, 3), (1,)), ((2, 2, 2), (2, 0))]


@pytest.mark.parametrize(("grid", "axes"), CASES)
@pytest.mark.parametrize("op", ["gather", "scatter", "reduce", "shift"])
def test_rooted_and_open_ops_move_fewer_bytes(op: str, grid, axes) -> None:
    P, world = prod(grid[a] for a in axes), prod(grid)
    root = [grid[a] - 1 for a in axes]
    listed = f"on @g grid_axes = {list(axes)}"
    piece, whole = "tensor<2x3xf32>", f"tensor<{2 * P}x3xf32>"
    piece_bytes, whole_bytes = 2 * 3 * 4, 2 * P * 3 * 4
    if op == "gather":
        text = program(grid, piece, whole,
                       f"shard.gather %x {listed} gather_axis = 0 root = {root} : ({piece}) -> {whole}")
        want, old = "dist.gather", P * (P - 1) * piece_bytes
    elif op == "scatter":
        text = program(grid, whole, piece,
                       f"shard.scatter %x {listed} scatter_axis = 0 root = {root} : ({whole}) -> {piece}")
        want, old = "dist.scatter", (P - 1) * whole_bytes
    elif op == "reduce":
        text = program(grid, piece, piece,
                       f"shard.reduce %x {listed} reduction = max root = {root} : ({piece}) -> {piece}")
        want, old = "dist.reduce", 2 * (P - 1) * piece_bytes
    else:
        text = program(grid, piece, piece,
                       f"shard.shift %x {listed} shift_axis = {axes[0]} offset = 1 : {piece} -> {piece}")
        P = grid[axes[0]]  # a shift moves along one grid axis
        want, old = "dist.shift", P * piece_bytes
    sent, names = converted_bytes(text, world)
    assert names == [want], names
    old *= world // P
    assert 0 < sent < old, (sent, old)
    # the drop: 1/P of the all-gather, 1/P of the broadcast, half the
    # all-reduce, and one message fewer per open end of the axis
    ratio = {"gather": Fraction(1, P), "scatter": Fraction(1, P), "reduce": Fraction(1, 2),
             "shift": Fraction(P - 1, P)}[op]
    assert sent == old * ratio, (op, sent, old)


def test_uneven_gather_to_a_static_root_is_a_dist_gather() -> None:
    """A gather dynamic along its axis gathers the lengths (a few integers)
    to everyone, then the rows to the root only."""
    t = "tensor<?x3xf32>"
    text = program((2, 2), t, t, f"shard.gather %x on @g grid_axes = [1, 0] gather_axis = 0 "
                   f"root = [1, 0] : ({t}) -> {t}")
    module = parse_module(text)
    ConvertShardToDistPass().apply(None, module)  # type: ignore[arg-type]
    module.verify()
    names = [op.name for op in module.walk() if op.name.startswith("dist.") and op.name not in
             ("dist.group", "dist.rank")]  # fmt: skip
    assert names == ["dist.all_gather", "dist.gather"], names
    counts, rows = (op for op in module.walk() if op.name in ("dist.all_gather", "dist.gather"))
    assert str(counts.results[0].type) == "tensor<4xi64>"
    # root [1, 0] over axes [1, 0] is the process at coordinates (0, 1): rank 1
    assert rows.counts is not None and rows.root.value.data == 1
