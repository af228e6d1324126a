"""The mesh-to-mesh transfer map: every destination gets exactly its slice.

The oracle for "its slice" is numpy: a random global integer tensor is cut
with ``numpy.array_split`` (independently of ``local_box``) into source
shards and expected destination shards; the map is executed by the pure
Python reference and must reproduce the expected shards exactly.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from distir.ir.layouts import Box, Layout, Mesh, local_box, shard_range
from distir.ops.transfer.ir import Transfer, format_transfer_map, transfer_map
from distir.ops.transfer.semantics import apply_transfer_map_reference

FAST = settings(max_examples=examples(1), deadline=None)


# -- the map, stated independently of the tensor's size ------------------------


def local_shapes(
    mesh: Mesh, layout: Layout, global_shape: Sequence[int]
) -> dict[int, tuple[int, ...]]:
    """The local shard shape of every rank of ``mesh``, keyed by global rank."""
    return {rank: local_box(mesh, layout, global_shape, rank).sizes for rank in mesh.ranks}


@dataclass(frozen=True)
class SymbolicTransferMap:
    """A transfer map in units of grid cells, independent of the tensor's size.

    Dim ``d`` of the tensor is cut into ``grid[d]`` cells, the lcm of its
    source and destination shard counts; ``transfers`` is the map of a tensor
    of shape ``grid`` (one element per cell). For any ``global_shape``
    divisible by ``grid`` the concrete map is ``concretize(global_shape)``.
    """

    grid: tuple[int, ...]
    transfers: tuple[Transfer, ...] = field(default_factory=tuple)

    def cell_shape(self, global_shape: Sequence[int]) -> tuple[int, ...]:
        """Elements per cell in each dim; ``ValueError`` when the shape is not divisible."""
        global_shape = tuple(global_shape)
        if len(global_shape) != len(self.grid) or any(
            size % cells for size, cells in zip(global_shape, self.grid)
        ):
            raise ValueError(f"global shape {global_shape} is not divisible by grid {self.grid}")
        return tuple(size // cells for size, cells in zip(global_shape, self.grid))

    def concretize(self, global_shape: Sequence[int]) -> list[Transfer]:
        """The concrete map for ``global_shape``: every transfer scaled by the cell shape."""
        cell = self.cell_shape(global_shape)
        scaled = (transfer.scaled(cell) for transfer in self.transfers)
        return [transfer for transfer in scaled if not transfer.box.is_empty]


def transfer_map_symbolic(
    src_mesh: Mesh, src_layout: Layout, dst_mesh: Mesh, dst_layout: Layout
) -> SymbolicTransferMap:
    """The shape-independent transfer map, with boxes in grid cells.

    The grid has ``lcm(src shards, dst shards)`` cells per tensor dim (a dim
    not sharded on a side counts one shard there), so for a divisible shape
    every source and destination shard is a whole number of cells and the
    concrete map is this one scaled by the cell size.
    """
    if len(src_layout.dims) != len(dst_layout.dims):
        raise ValueError(
            f"source layout has {len(src_layout.dims)} dims, destination {len(dst_layout.dims)}"
        )

    def parts(mesh: Mesh, axis: int | None) -> int:
        if axis is not None and axis >= mesh.ndim:
            raise ValueError(f"mesh axis {axis} is out of range for mesh @{mesh.name}")
        return 1 if axis is None else mesh.shape[axis]

    grid = tuple(
        math.lcm(parts(src_mesh, s), parts(dst_mesh, d))
        for s, d in zip(src_layout.dims, dst_layout.dims)
    )
    transfers = transfer_map(src_mesh, src_layout, dst_mesh, dst_layout, grid)
    return SymbolicTransferMap(grid, tuple(transfers))


# -- strategies ---------------------------------------------------------------


@st.composite
def mesh_shapes(draw, max_ranks: int = 8) -> tuple[int, ...]:
    if draw(st.booleans()):
        return (draw(st.integers(1, 4)),)
    rows = draw(st.integers(1, 4))
    cols = draw(st.integers(1, min(4, max_ranks // rows)))
    return (rows, cols)


@st.composite
def layouts(draw, mesh: Mesh, tensor_rank: int, *, allow_partial: bool) -> Layout:
    """Each mesh axis shards an unused tensor dim, replicates, or (source only) is partial."""
    dims: list[int | None] = [None] * tensor_rank
    partial: list[int] = []
    for axis in draw(st.permutations(range(mesh.ndim))):
        free = [d for d in range(tensor_rank) if dims[d] is None]
        choices = ["replicate"] + [("shard", d) for d in free]
        if allow_partial and not partial:
            choices.append("partial")
        choice = draw(st.sampled_from(choices))
        if choice == "partial":
            partial.append(axis)
        elif choice != "replicate":
            dims[choice[1]] = axis
    return Layout(tuple(dims), tuple(partial))


@st.composite
def transfer_cases(draw, *, allow_partial: bool = True, shape=None):
    """(src mesh, src layout, dst mesh, dst layout, global shape), meshes disjoint or not."""
    if shape is None:
        shape = tuple(draw(st.lists(st.integers(0, 9), min_size=1, max_size=3)))
    src_shape = draw(mesh_shapes())
    dst_shape = draw(mesh_shapes())
    pool = draw(st.permutations(range(8)))
    n_src, n_dst = math.prod(src_shape), math.prod(dst_shape)
    src_ranks = tuple(pool[:n_src])
    if n_src + n_dst <= 8 and draw(st.booleans()):
        dst_ranks = tuple(pool[n_src : n_src + n_dst])  # disjoint meshes
    else:
        dst_ranks = tuple(draw(st.permutations(range(8)))[:n_dst])  # may overlap
    src = Mesh("src", src_shape, src_ranks)
    dst = Mesh("dst", dst_shape, dst_ranks)
    src_layout = draw(layouts(src, len(shape), allow_partial=allow_partial))
    dst_layout = draw(layouts(dst, len(shape), allow_partial=False))
    return src, src_layout, dst, dst_layout, shape


# -- numpy oracle -------------------------------------------------------------


def expected_index(mesh: Mesh, layout: Layout, shape, rank) -> tuple[np.ndarray, ...]:
    """Index arrays of ``rank``'s local shard, via numpy.array_split."""
    coord = mesh.coordinate(rank)
    index = []
    for size, axis in zip(shape, layout.dims):
        whole = np.arange(size)
        index.append(
            whole if axis is None else np.array_split(whole, mesh.shape[axis])[coord[axis]]
        )
    return np.ix_(*index) if index else ()


def partial_coordinate(mesh: Mesh, layout: Layout, rank: int) -> tuple[int, ...]:
    coord = mesh.coordinate(rank)
    return tuple(coord[a] for a in layout.partial)


def source_shards(mesh: Mesh, layout: Layout, tensor: np.ndarray, rng) -> dict:
    """Local shards of ``tensor``; a partial layout gets random integer addends per group.

    Addend ``p`` is a whole random tensor shared by every rank with partial
    coordinate ``p`` (so replicas agree); the last addend makes the sum exact.
    """
    group = [mesh.shape[a] for a in layout.partial]
    coords = list(np.ndindex(*group)) if group else [()]
    addends = {c: rng.integers(-50, 50, size=tensor.shape) for c in coords[:-1]}
    addends[coords[-1]] = tensor - sum(addends.values(), np.zeros_like(tensor))
    shards = {}
    for rank in mesh.ranks:
        local = addends[partial_coordinate(mesh, layout, rank)][
            expected_index(mesh, layout, tensor.shape, rank)
        ]
        shards[rank] = (local.shape, local.ravel().tolist())
    return shards


# -- the main property ---------------------------------------------------------


@FAST
@given(case=transfer_cases(), seed=st.integers(0, 2**32 - 1))
def test_every_destination_receives_exactly_its_slice(case, seed):
    src, src_layout, dst, dst_layout, shape = case
    rng = np.random.default_rng(seed)
    tensor = rng.integers(-1000, 1000, size=shape)
    transfers = transfer_map(src, src_layout, dst, dst_layout, shape)
    shards = source_shards(src, src_layout, tensor, rng)
    received = apply_transfer_map_reference(transfers, shards, local_shapes(dst, dst_layout, shape))
    assert set(received) == set(dst.ranks)
    for rank in dst.ranks:
        expected = tensor[expected_index(dst, dst_layout, shape, rank)]
        local_shape, values = received[rank]
        assert local_shape == expected.shape
        assert values == expected.ravel().tolist()


@FAST
@given(case=transfer_cases())
def test_local_box_matches_array_split(case):
    src, src_layout, _, _, shape = case
    for rank in src.ranks:
        box = local_box(src, src_layout, shape, rank)
        index = expected_index(src, src_layout, shape, rank)
        expected = np.arange(math.prod(shape)).reshape(shape)[index]
        assert box.sizes == expected.shape
        assert np.array_equal(np.arange(math.prod(shape)).reshape(shape)[box.to_slices()], expected)


@FAST
@given(case=transfer_cases())
def test_each_element_arrives_once_or_once_per_partial_group_member(case):
    src, src_layout, dst, dst_layout, shape = case
    transfers = transfer_map(src, src_layout, dst, dst_layout, shape)
    group_size = math.prod(src.shape[a] for a in src_layout.partial)

    senders: dict[tuple[int, tuple[int, ...]], list[int]] = defaultdict(list)
    for t in transfers:
        assert not t.box.is_empty
        assert t.partial == (group_size > 1)
        src_box = local_box(src, src_layout, shape, t.src_rank)
        dst_box = local_box(dst, dst_layout, shape, t.dst_rank)
        assert src_box.contains(t.box) and dst_box.contains(t.box)
        assert t.src_offsets == t.box.relative_to(src_box.offsets)
        assert t.dst_offsets == t.box.relative_to(dst_box.offsets)
        for index in np.ndindex(*t.box.sizes):
            element = tuple(o + i for o, i in zip(t.box.offsets, index))
            senders[(t.dst_rank, element)].append(t.src_rank)

    def non_partial_coordinate(rank):
        coord = src.coordinate(rank)
        return tuple(c for a, c in enumerate(coord) if a not in src_layout.partial)

    expected_elements = {
        (rank, element)
        for rank in dst.ranks
        for element in np.ndindex(*local_box(dst, dst_layout, shape, rank).sizes)
    }
    assert len(senders) == len(expected_elements)  # nothing missed
    for (rank, element), ranks in senders.items():
        box = local_box(dst, dst_layout, shape, rank)
        assert box.contains(Box(element, (1,) * len(element)))
        # exactly one member of one partial group each (a group of one when not partial)
        assert len(ranks) == len(set(ranks)) == group_size
        assert len({non_partial_coordinate(r) for r in ranks}) == 1
        assert {partial_coordinate(src, src_layout, r) for r in ranks} == set(
            np.ndindex(*[src.shape[a] for a in src_layout.partial])
        )


@FAST
@given(case=transfer_cases())
def test_map_is_sorted_and_deterministic(case):
    transfers = transfer_map(*case)
    assert transfers == sorted(transfers, key=lambda t: (t.dst_rank, t.box.offsets, t.src_rank))
    assert transfers == transfer_map(*case)


# -- replicas -------------------------------------------------------------------


@FAST
@given(case=transfer_cases())
def test_replicas_are_spread_and_local_replicas_copy_locally(case):
    src, src_layout, dst, dst_layout, shape = case
    transfers = transfer_map(src, src_layout, dst, dst_layout, shape)
    replicated = src_layout.replicated_axes(src)
    replicas = math.prod(src.shape[a] for a in replicated)

    def shard_and_replica(rank):
        coord = src.coordinate(rank)
        shard = tuple(coord[a] for a in src_layout.sharding_axes)
        return shard, tuple(coord[a] for a in replicated)

    # per source shard: replica -> remote readers, and piece -> replicas of its remote readers
    remote_readers: dict[tuple, dict[tuple, set]] = defaultdict(lambda: defaultdict(set))
    piece_readers: dict[tuple, dict[tuple, set]] = defaultdict(lambda: defaultdict(set))
    for t in transfers:
        shard, replica = shard_and_replica(t.src_rank)
        if t.dst_rank in src.ranks and shard_and_replica(t.dst_rank)[0] == shard:
            # a destination that holds this shard itself reads its own replica
            assert shard_and_replica(t.dst_rank)[1] == replica
        else:
            remote_readers[shard][replica].add(t.dst_rank)
            piece_readers[shard][(t.box, t.dst_rank)].add(replica)
    for shard, by_replica in remote_readers.items():
        loads = [len(by_replica.get(r, ())) for r in by_replica]
        loads += [0] * (replicas - len(loads))
        assert max(loads) - min(loads) <= 1
        same_piece: dict[Box, list[tuple]] = defaultdict(list)
        for (box, _), chosen in piece_readers[shard].items():
            assert len(chosen) == 1  # one replica (group) per reader
            same_piece[box] += chosen
        for chosen in same_piece.values():
            assert len(set(chosen)) == min(len(chosen), replicas)


def test_replicas_are_read_round_robin():
    src = Mesh("train", (2,), (0, 1))
    dst = Mesh("serve", (4,), (2, 3, 4, 5))
    transfers = transfer_map(src, Layout((None,)), dst, Layout((None,)), (5,))
    assert [(t.src_rank, t.dst_rank) for t in transfers] == [(0, 2), (1, 3), (0, 4), (1, 5)]


def test_replicas_are_spread_even_when_readers_are_not_adjacent_in_the_mesh():
    # the two readers of each box sit at dst indices (0, 2) and (1, 3): an
    # index-mod-replicas rule would send both to replica 0.
    src = Mesh("train", (2,), (0, 1))
    dst = Mesh("serve", (2, 2), (2, 3, 4, 5))
    transfers = transfer_map(src, Layout((None,)), dst, Layout((1,)), (4,))
    assert [(t.src_rank, t.dst_rank, str(t.box)) for t in transfers] == [
        (0, 2, "[0:2]"),
        (0, 3, "[2:4]"),
        (1, 4, "[0:2]"),
        (1, 5, "[2:4]"),
    ]


def test_a_destination_that_holds_a_replica_copies_it_locally():
    mesh = Mesh("m", (2, 2), (0, 1, 2, 3))
    layout = Layout((0, None))
    transfers = transfer_map(mesh, layout, mesh, layout, (4, 3))
    assert all(t.is_local for t in transfers)
    assert [t.dst_rank for t in transfers] == [0, 1, 2, 3]
    # overlap: rank 1 holds a replica and reads it locally; the remote reader
    # gets the replica that serves no local copy
    src = Mesh("train", (2,), (0, 1))
    dst = Mesh("serve", (2,), (7, 1))
    transfers = transfer_map(src, Layout((None,)), dst, Layout((None,)), (3,))
    assert [(t.src_rank, t.dst_rank) for t in transfers] == [(1, 1), (0, 7)]


# -- shape independence ----------------------------------------------------------


@FAST
@given(
    case=transfer_cases(shape=(1, 1, 1)),
    rank=st.integers(1, 3),
    multiples=st.lists(st.integers(0, 3), min_size=3, max_size=3),
)
def test_concrete_map_is_the_symbolic_map_scaled(case, rank, multiples):
    src, src_layout, dst, dst_layout, _ = case
    src_layout = Layout(src_layout.dims[:rank], src_layout.partial)
    dst_layout = Layout(dst_layout.dims[:rank])
    symbolic = transfer_map_symbolic(src, src_layout, dst, dst_layout)
    for d, (s, t) in enumerate(zip(src_layout.dims, dst_layout.dims)):
        src_parts = 1 if s is None else src.shape[s]
        dst_parts = 1 if t is None else dst.shape[t]
        assert symbolic.grid[d] == math.lcm(src_parts, dst_parts)
    shape = tuple(g * m for g, m in zip(symbolic.grid, multiples[:rank]))
    concrete = transfer_map(src, src_layout, dst, dst_layout, shape)
    assert concrete == symbolic.concretize(shape)
    cell = symbolic.cell_shape(shape)
    assert concrete == [t.scaled(cell) for t in symbolic.transfers if all(cell)]


def test_symbolic_map_refuses_indivisible_shapes():
    src = Mesh("a", (2,), (0, 1))
    dst = Mesh("b", (3,), (2, 3, 4))
    symbolic = transfer_map_symbolic(src, Layout((0,)), dst, Layout((0,)))
    assert symbolic.grid == (6,)
    with pytest.raises(ValueError, match="not divisible by grid"):
        symbolic.concretize((8,))


# -- boxes, meshes, validation -----------------------------------------------------


def test_box_intersection():
    a = Box((0, 2), (4, 4))
    assert a.intersect(Box((2, 0), (4, 4))) == Box((2, 2), (2, 2))
    assert a.intersect(Box((4, 0), (1, 9))) is None  # touching, not overlapping
    assert a.intersect(Box((1, 3), (0, 1))) is None  # empty box
    assert Box((1, 1), (0, 3)).is_empty and Box((1, 1), (0, 3)).numel == 0
    assert str(Box((0, 4), (2, 4))) == "[0:2, 4:8]"
    with pytest.raises(ValueError, match="rank 2 and 1"):
        a.intersect(Box((0,), (1,)))


def test_uneven_shards_follow_array_split():
    assert [shard_range(5, 3, i) for i in range(3)] == [(0, 2), (2, 2), (4, 1)]
    assert [shard_range(2, 4, i) for i in range(4)] == [(0, 1), (1, 1), (2, 0), (2, 0)]


def test_mesh_coordinates_are_row_major():
    mesh = Mesh("m", (2, 3), (10, 11, 12, 13, 14, 15))
    assert mesh.coordinate(14) == (1, 1)
    assert mesh.rank_at((0, 2)) == 12


MESH = Mesh("m", (2, 2), (0, 1, 2, 3))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Mesh("m", (2, 2), (0, 1, 2)), "needs 4 ranks, got 3"),
        (lambda: Mesh("m", (2,), (3, 3)), "ranks must be distinct: rank 3 appears twice"),
        (lambda: Mesh("m", (2,), (0, -1)), "non-negative"),
        (lambda: Mesh("m", (0,), ()), "positive integers"),
        (lambda: Mesh("m", (), (0,)), "at least one axis"),
        (lambda: Layout((0, 0)), "shards two dims over one mesh axis: axis 0 shards dims 0 and 1"),
        (
            lambda: Layout((0, None), (0,)),
            r"partial axis 0 must be a mesh axis that shards no dim \(it shards tensor dim 0\)",
        ),
        (lambda: Layout((None,), (-1,)), r"partial axis -1 must be .* \(axes are >= 0\)"),
        (lambda: Layout((None,), (1, 1)), "lists a mesh axis twice"),
        (lambda: Layout((-1,)), "axes are >= 0"),
        (
            lambda: local_box(MESH, Layout((0,)), (4, 4), 0),
            "layout has 1 entries for a rank-2 tensor",
        ),
        (
            lambda: local_box(MESH, Layout((2, None)), (4, 4), 0),
            r"layout names a mesh axis that mesh @m \(rank 2\) lacks: dim 0 is sharded over axis 2",
        ),
        (
            lambda: local_box(MESH, Layout((None,), (5,)), (4,), 0),
            r"partial axis 5 must be a mesh axis of @m that shards no dim \(@m has 2 axes\)",
        ),
        (lambda: local_box(MESH, Layout((None,)), (4,), 9), "rank 9 is not in mesh @m"),
        (lambda: local_box(MESH, Layout((None,)), (-4,), 0), "non-negative integers"),
        (
            lambda: transfer_map(MESH, Layout((0,)), MESH, Layout((None,), (0,)), (4,)),
            "destination layout is partial",
        ),
    ],
)
def test_validation_errors(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_reference_rejects_double_writes_and_gaps():
    box = Box((0,), (2,))
    copy = Transfer(0, 1, box, (0,), (0,))
    shards = {0: ((2,), [5, 6])}
    with pytest.raises(ValueError, match="written by a copy and then by a copy"):
        apply_transfer_map_reference([copy, copy], shards, {1: (2,)})
    with pytest.raises(ValueError, match="receives nothing"):
        apply_transfer_map_reference([copy], shards, {1: (3,)})
    added = Transfer(0, 1, box, (0,), (0,), partial=True)
    assert apply_transfer_map_reference([added, added], shards, {1: (2,)}) == {1: ((2,), [10, 12])}


# -- the printed table ---------------------------------------------------------------

EXPECTED_TABLE = """\
src rank | src slice  | -> | dst rank | dst slice  | bytes | note
---------+------------+----+----------+------------+-------+----------------------------
       0 | [0:2, 0:2] | -> |        4 | [0:2, 0:2] |    16 | partial (summed on arrival)
       1 | [0:2, 0:2] | -> |        4 | [0:2, 0:2] |    16 | partial (summed on arrival)
       2 | [2:4, 0:2] | -> |        4 | [2:4, 0:2] |    16 | partial (summed on arrival)
       3 | [2:4, 0:2] | -> |        4 | [2:4, 0:2] |    16 | partial (summed on arrival)
       0 | [0:2, 2:4] | -> |        5 | [0:2, 2:4] |    16 | partial (summed on arrival)
       1 | [0:2, 2:4] | -> |        5 | [0:2, 2:4] |    16 | partial (summed on arrival)
       2 | [2:4, 2:4] | -> |        5 | [2:4, 2:4] |    16 | partial (summed on arrival)
       3 | [2:4, 2:4] | -> |        5 | [2:4, 2:4] |    16 | partial (summed on arrival)
       0 | [0:2, 4:6] | -> |        6 | [0:2, 4:6] |    16 | partial (summed on arrival)
       1 | [0:2, 4:6] | -> |        6 | [0:2, 4:6] |    16 | partial (summed on arrival)
       2 | [2:4, 4:6] | -> |        6 | [2:4, 4:6] |    16 | partial (summed on arrival)
       3 | [2:4, 4:6] | -> |        6 | [2:4, 4:6] |    16 | partial (summed on arrival)
12 transfers, 192 bytes, 0 local"""


def test_format_rows_sharded_partial_source_to_column_sharded_destination():
    # rows 0:2 live on ranks 0 and 1 as two addends, rows 2:4 on ranks 2 and 3;
    # each destination takes two columns of all four rows: 4 pieces of 2x2 int32
    src = Mesh("train", (2, 2), (0, 1, 2, 3))
    dst = Mesh("serve", (3,), (4, 5, 6))
    transfers = transfer_map(src, Layout((0, None), (1,)), dst, Layout((None, 0)), (4, 6))
    assert format_transfer_map(transfers) == EXPECTED_TABLE


def test_format_marks_local_copies_and_prints_local_coordinates():
    mesh = Mesh("m", (2,), (0, 1))
    transfers = transfer_map(mesh, Layout((0,)), Mesh("n", (1,), (1,)), Layout((None,)), (4,))
    assert format_transfer_map(transfers, itemsize=8, coordinates="local") == (
        "src rank | src slice | -> | dst rank | dst slice | bytes | note\n"
        "---------+-----------+----+----------+-----------+-------+-----------\n"
        "       0 | [0:2]     | -> |        1 | [0:2]     |    16 |\n"
        "       1 | [0:2]     | -> |        1 | [2:4]     |    16 | local copy\n"
        "2 transfers, 32 bytes, 1 local"
    )
