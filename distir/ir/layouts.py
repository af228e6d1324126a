"""Tensor layouts on device meshes and the transfer map between two meshes.

A *mesh* is an n-D grid of global ranks; a *layout* says how one logically
global tensor lives on a mesh: which tensor dim each mesh axis shards, which
axes replicate it, and which axes hold a *partial sum* of it. The transfer map
between a source (mesh, layout) and a destination (mesh, layout) lists, for
every destination rank, exactly the pieces it must receive and from whom, in
the spirit of Etha's M2M map and DTensor's redistribute, but across two groups
of ranks that may be disjoint or overlap.

Everything here is pure Python (no torch): the map is data that a pass can
lower to batched point-to-point sends and that tests can check without a
process group. ``apply_transfer_map_reference`` executes a map on flat lists
and is the oracle for any backend that implements one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

__all__ = [
    "Box",
    "Layout",
    "LocalShard",
    "Mesh",
    "SymbolicTransferMap",
    "Transfer",
    "apply_transfer_map_reference",
    "check_layout",
    "check_shape",
    "format_transfer_map",
    "local_box",
    "local_shapes",
    "shard_range",
    "transfer_map",
    "transfer_map_symbolic",
]

# A rank's local tensor for the reference executor: (shape, row-major values).
LocalShard = tuple[tuple[int, ...], list]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_shape(shape: Sequence[int], what: str = "global shape") -> tuple[int, ...]:
    """``shape`` as a tuple; ``ValueError`` unless it holds non-negative integers."""
    shape = tuple(shape)
    for size in shape:
        if not _is_int(size) or size < 0:
            raise ValueError(f"{what} {list(shape)} must hold non-negative integers")
    return shape


def shard_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """The ``(start, length)`` of chunk ``index`` when ``size`` elements split into ``parts``.

    Follows ``torch.tensor_split`` / ``numpy.array_split``: the first
    ``size % parts`` chunks hold ``size // parts + 1`` elements, the rest
    ``size // parts``; chunks are empty when ``size < parts``.
    """
    if parts < 1 or not 0 <= index < parts:
        raise ValueError(f"chunk {index} of {parts} does not exist")
    base, extra = divmod(size, parts)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


@dataclass(frozen=True)
class Mesh:
    """An n-D grid of global ranks, listed in row-major order.

    The coordinate of a rank is its index in ``ranks`` unravelled row-major
    over ``shape``. Ranks are distinct and non-negative; every axis has at
    least one rank. ``name`` is the symbol of the ``dist.mesh`` it describes,
    without the ``@`` (``train`` for ``@train``); errors call it ``@train``.
    The rules are checked here, once: ``dist.mesh`` and ``dist.transfer``
    verify by building these values.
    """

    name: str
    shape: tuple[int, ...]
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "ranks", tuple(self.ranks))
        if not self.shape:
            raise ValueError(f"mesh @{self.name} must have at least one axis")
        if any(not _is_int(size) or size < 1 for size in self.shape):
            raise ValueError(
                f"mesh @{self.name} shape {list(self.shape)} must hold positive integers"
            )
        if any(not _is_int(rank) or rank < 0 for rank in self.ranks):
            raise ValueError(f"mesh @{self.name} ranks must be non-negative integers")
        if len(self.ranks) != math.prod(self.shape):
            raise ValueError(
                f"mesh @{self.name} of shape {list(self.shape)} needs {math.prod(self.shape)} "
                f"ranks, got {len(self.ranks)}"
            )
        seen: set[int] = set()
        for rank in self.ranks:
            if rank in seen:
                raise ValueError(
                    f"mesh @{self.name} ranks must be distinct: rank {rank} appears twice"
                )
            seen.add(rank)

    @property
    def ndim(self) -> int:
        """Number of mesh axes."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of ranks in the mesh."""
        return len(self.ranks)

    def index(self, rank: int) -> int:
        """Position of global ``rank`` in ``ranks`` (its linear index in the mesh)."""
        try:
            return self.ranks.index(rank)
        except ValueError:
            raise ValueError(f"rank {rank} is not in mesh @{self.name}") from None

    def coordinate(self, rank: int) -> tuple[int, ...]:
        """The mesh coordinate of global ``rank``: its index unravelled row-major."""
        linear = self.index(rank)
        coord = []
        for size in reversed(self.shape):
            linear, position = divmod(linear, size)
            coord.append(position)
        return tuple(reversed(coord))

    def rank_at(self, coordinate: Sequence[int]) -> int:
        """The global rank at mesh ``coordinate``."""
        if len(coordinate) != self.ndim or any(
            not 0 <= c < s for c, s in zip(coordinate, self.shape)
        ):
            raise ValueError(f"coordinate {tuple(coordinate)} is outside mesh @{self.name}")
        linear = 0
        for c, s in zip(coordinate, self.shape):
            linear = linear * s + c
        return self.ranks[linear]


@dataclass(frozen=True)
class Layout:
    """How a global tensor lives on a mesh.

    ``dims[d]`` is the mesh axis that shards tensor dim ``d`` (split as
    ``numpy.array_split`` along that axis), or ``None`` when the dim is whole
    on every rank. A mesh axis shards at most one dim. Mesh axes listed in
    ``partial`` hold partial sums: the true tensor is the sum of the local
    values over the ranks that differ only along those axes. Any other mesh
    axis replicates the tensor. A partial axis cannot also shard a dim;
    ``partial`` is stored sorted.
    """

    dims: tuple[int | None, ...]
    partial: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(self.dims))
        object.__setattr__(self, "partial", tuple(sorted(self.partial)))
        check_layout(self.dims, self.partial)

    @property
    def sharding_axes(self) -> tuple[int, ...]:
        """Mesh axes that shard some tensor dim, in increasing order."""
        return tuple(sorted(axis for axis in self.dims if axis is not None))

    def replicated_axes(self, mesh: Mesh) -> tuple[int, ...]:
        """Mesh axes of ``mesh`` that neither shard nor hold partial sums."""
        taken = set(self.sharding_axes) | set(self.partial)
        return tuple(axis for axis in range(mesh.ndim) if axis not in taken)

    def check(self, mesh: Mesh, global_shape: Sequence[int]) -> None:
        """Raise ``ValueError`` unless this layout fits ``mesh`` and a tensor of ``global_shape``."""
        check_layout(self.dims, self.partial, mesh, global_shape)


def check_layout(
    dims: Sequence[int | None],
    partial: Sequence[int] = (),
    mesh: Mesh | None = None,
    global_shape: Sequence[int] | None = None,
) -> None:
    """Raise ``ValueError`` unless ``dims`` and ``partial`` make a valid
    layout (see ``Layout``), and, when given, one that fits ``mesh`` and a
    tensor of ``global_shape``.

    Every layout rule is written here, once: a ``Layout`` checks itself with
    it, and ``dist.transfer`` checks its layout properties with it, passing
    its meshes so that the errors name them.
    """
    if global_shape is not None:
        check_shape(global_shape, "global shape")
        if len(dims) != len(global_shape):
            raise ValueError(
                f"layout has {len(dims)} entries for a rank-{len(global_shape)} tensor"
            )
    used: dict[int, int] = {}
    for dim, axis in enumerate(dims):
        if axis is None:
            continue
        if not _is_int(axis) or axis < 0:
            raise ValueError(f"layout dim {dim} names mesh axis {axis!r}; axes are >= 0")
        if mesh is not None and axis >= mesh.ndim:
            raise ValueError(
                f"layout names a mesh axis that mesh @{mesh.name} (rank {mesh.ndim}) lacks: "
                f"dim {dim} is sharded over axis {axis}"
            )
        if axis in used:
            raise ValueError(
                f"layout shards two dims over one mesh axis: axis {axis} shards dims "
                f"{used[axis]} and {dim}"
            )
        used[axis] = dim
    if len(set(partial)) != len(partial):
        raise ValueError(f"partial {list(partial)} lists a mesh axis twice")
    of_mesh = "" if mesh is None else f" of @{mesh.name}"
    for axis in partial:
        if not _is_int(axis) or axis < 0:
            why = "axes are >= 0"
        elif axis in used:
            why = f"it shards tensor dim {used[axis]}"
        elif mesh is not None and axis >= mesh.ndim:
            why = f"@{mesh.name} has {mesh.ndim} axes"
        else:
            continue
        raise ValueError(
            f"partial axis {axis!r} must be a mesh axis{of_mesh} that shards no dim ({why})"
        )


@dataclass(frozen=True)
class Box:
    """A hyper-rectangle of a tensor: ``offsets[d] <= i[d] < offsets[d] + sizes[d]``."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", tuple(self.offsets))
        object.__setattr__(self, "sizes", tuple(self.sizes))
        if len(self.offsets) != len(self.sizes):
            raise ValueError(f"box has {len(self.offsets)} offsets but {len(self.sizes)} sizes")
        check_shape(self.sizes, "box sizes")

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self.sizes)

    @property
    def ends(self) -> tuple[int, ...]:
        """Exclusive upper bound per dim."""
        return tuple(o + s for o, s in zip(self.offsets, self.sizes))

    @property
    def numel(self) -> int:
        """Number of elements in the box."""
        return math.prod(self.sizes)

    @property
    def is_empty(self) -> bool:
        """True when the box holds no element."""
        return self.numel == 0

    def intersect(self, other: Box) -> Box | None:
        """The common part of two boxes, or ``None`` when they share no element."""
        if self.ndim != other.ndim:
            raise ValueError(f"cannot intersect boxes of rank {self.ndim} and {other.ndim}")
        offsets = tuple(max(a, b) for a, b in zip(self.offsets, other.offsets))
        ends = tuple(min(a, b) for a, b in zip(self.ends, other.ends))
        sizes = tuple(e - o for o, e in zip(offsets, ends))
        if any(size <= 0 for size in sizes) or self.is_empty or other.is_empty:
            return None
        return Box(offsets, sizes)

    def contains(self, other: Box) -> bool:
        """True when every element of ``other`` lies in this box."""
        return other.ndim == self.ndim and all(
            o >= so and e <= se
            for o, e, so, se in zip(other.offsets, other.ends, self.offsets, self.ends)
        )

    def relative_to(self, origin: Sequence[int]) -> tuple[int, ...]:
        """This box's offsets measured from ``origin`` (e.g. the start of a local shard)."""
        return tuple(o - base for o, base in zip(self.offsets, origin))

    def scaled(self, factors: Sequence[int]) -> Box:
        """This box with offsets and sizes multiplied per dim by ``factors``."""
        return Box(
            tuple(o * f for o, f in zip(self.offsets, factors)),
            tuple(s * f for s, f in zip(self.sizes, factors)),
        )

    def to_slices(self) -> tuple[slice, ...]:
        """The box as a tuple of Python slices, for numpy-style indexing."""
        return tuple(slice(o, e) for o, e in zip(self.offsets, self.ends))

    def __str__(self) -> str:
        return "[" + ", ".join(f"{o}:{e}" for o, e in zip(self.offsets, self.ends)) + "]"


def local_box(mesh: Mesh, layout: Layout, global_shape: Sequence[int], rank: int) -> Box:
    """The box of the global tensor that ``rank`` holds under ``layout`` on ``mesh``.

    A dim sharded over mesh axis ``a`` is cut as ``numpy.array_split`` into
    ``mesh.shape[a]`` chunks and the rank holds the chunk at its coordinate
    along ``a``; every other dim (replicated or partial axes) is held whole.
    """
    global_shape = check_shape(global_shape, "global shape")
    layout.check(mesh, global_shape)
    coord = mesh.coordinate(rank)
    offsets, sizes = [], []
    for size, axis in zip(global_shape, layout.dims):
        if axis is None:
            start, length = 0, size
        else:
            start, length = shard_range(size, mesh.shape[axis], coord[axis])
        offsets.append(start)
        sizes.append(length)
    return Box(tuple(offsets), tuple(sizes))


def local_shapes(
    mesh: Mesh, layout: Layout, global_shape: Sequence[int]
) -> dict[int, tuple[int, ...]]:
    """The local shard shape of every rank of ``mesh``, keyed by global rank."""
    return {rank: local_box(mesh, layout, global_shape, rank).sizes for rank in mesh.ranks}


@dataclass(frozen=True)
class Transfer:
    """One piece of a mesh-to-mesh transfer: ``box`` of the global tensor, src -> dst.

    ``src_offsets`` and ``dst_offsets`` locate the box inside the source's and
    the destination's local shards. When ``partial`` is true the piece is one
    addend of a partial sum and the destination adds it on arrival; otherwise
    it is a plain copy and no other transfer writes those elements.
    ``src_rank == dst_rank`` is a local copy.
    """

    src_rank: int
    dst_rank: int
    box: Box
    src_offsets: tuple[int, ...]
    dst_offsets: tuple[int, ...]
    partial: bool = False

    @property
    def numel(self) -> int:
        """Number of elements carried."""
        return self.box.numel

    @property
    def is_local(self) -> bool:
        """True when source and destination are the same rank (no communication)."""
        return self.src_rank == self.dst_rank

    def scaled(self, factors: Sequence[int]) -> Transfer:
        """This transfer with every box coordinate multiplied per dim by ``factors``."""
        return replace(
            self,
            box=self.box.scaled(factors),
            src_offsets=tuple(o * f for o, f in zip(self.src_offsets, factors)),
            dst_offsets=tuple(o * f for o, f in zip(self.dst_offsets, factors)),
        )


def _sort_key(transfer: Transfer) -> tuple:
    return (transfer.dst_rank, transfer.box.offsets, transfer.src_rank)


@dataclass(frozen=True)
class _SourceShard:
    """The ranks of the source mesh that hold one shard (one source box).

    ``groups[r]`` is the partial group of replica ``r``: the ranks that differ
    only along partial axes (a single rank when the layout is not partial).
    Replicas are numbered row-major over the replicated axes.
    """

    box: Box
    groups: tuple[tuple[int, ...], ...]


def _source_shards(mesh: Mesh, layout: Layout, global_shape: tuple[int, ...]) -> list[_SourceShard]:
    sharding = layout.sharding_axes
    replicated = layout.replicated_axes(mesh)
    partial = layout.partial
    members: dict[tuple, dict[tuple, list[tuple[tuple, int]]]] = {}
    for rank in mesh.ranks:
        coord = mesh.coordinate(rank)
        shard_key = tuple(coord[a] for a in sharding)
        replica_key = tuple(coord[a] for a in replicated)
        partial_key = tuple(coord[a] for a in partial)
        members.setdefault(shard_key, {}).setdefault(replica_key, []).append((partial_key, rank))
    shards = []
    for shard_key in sorted(members):
        replicas = members[shard_key]
        groups = tuple(tuple(rank for _, rank in sorted(replicas[key])) for key in sorted(replicas))
        box = local_box(mesh, layout, global_shape, groups[0][0])
        shards.append(_SourceShard(box, groups))
    return shards


def transfer_map(
    src_mesh: Mesh,
    src_layout: Layout,
    dst_mesh: Mesh,
    dst_layout: Layout,
    global_shape: Sequence[int],
) -> list[Transfer]:
    """Every piece each destination rank needs to build its local shard from the source.

    If the source is not partial, each element of each destination's local
    box arrives exactly once, from one source rank. If the source is partial
    over axes A, it arrives once from every member of one partial group (the
    ranks differing only along A), as transfers marked ``partial`` that the
    destination sums (a partial group of one rank is a plain copy).

    When a source shard has several replicas (partial groups, if partial),
    each destination reading it picks one: a destination that is itself a
    member of one (the meshes overlap) reads that one, so part of the data is
    a local copy; the other readers, ordered by the piece they need and then
    by destination-mesh index, take the replicas round-robin, starting with
    those that serve no local reader. Destinations needing the same piece thus
    read from different replicas, and the remote reads of a shard are
    balanced across its replicas to within one. The choice depends only on
    which boxes intersect, so it is the same for every shape divisible by the
    symbolic grid.

    Empty pieces are omitted. The list is sorted by (dst rank, box offsets,
    src rank).
    """
    global_shape = check_shape(global_shape, "global shape")
    src_layout.check(src_mesh, global_shape)
    dst_layout.check(dst_mesh, global_shape)
    if dst_layout.partial:
        raise ValueError(
            f"destination layout is partial over mesh axes {dst_layout.partial}; "
            "a transfer must deliver whole values"
        )
    dst_boxes = [
        (rank, local_box(dst_mesh, dst_layout, global_shape, rank)) for rank in dst_mesh.ranks
    ]
    transfers: list[Transfer] = []
    for shard in _source_shards(src_mesh, src_layout, global_shape):
        readers = [
            (rank, dst_box, piece)
            for rank, dst_box in dst_boxes
            if (piece := shard.box.intersect(dst_box)) is not None
        ]
        local_replica = {
            rank: replica for replica, group in enumerate(shard.groups) for rank in group
        }
        serving_local = {local_replica[rank] for rank, _, _ in readers if rank in local_replica}
        rotation = [r for r in range(len(shard.groups)) if r not in serving_local]
        rotation += sorted(serving_local)
        # Readers of the same piece are consecutive in the round-robin order, so
        # they land on different replicas, and every replica serves within one
        # reader of the others.
        remote = sorted(
            (i for i, (rank, _, _) in enumerate(readers) if rank not in local_replica),
            key=lambda i: (readers[i][2].offsets, readers[i][2].sizes, i),
        )
        chosen = dict(local_replica)
        for turn, i in enumerate(remote):
            chosen[readers[i][0]] = rotation[turn % len(rotation)]
        for rank, dst_box, piece in readers:
            group = shard.groups[chosen[rank]]
            for src_rank in group:
                transfers.append(
                    Transfer(
                        src_rank=src_rank,
                        dst_rank=rank,
                        box=piece,
                        src_offsets=piece.relative_to(shard.box.offsets),
                        dst_offsets=piece.relative_to(dst_box.offsets),
                        partial=len(group) > 1,
                    )
                )
    transfers.sort(key=_sort_key)
    return transfers


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
        global_shape = check_shape(global_shape, "global shape")
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


def format_transfer_map(
    transfers: Iterable[Transfer], itemsize: int = 4, *, coordinates: str = "global"
) -> str:
    """A fixed-width table of a transfer map, one row per transfer, and a total line.

    Columns: ``src rank | src slice | -> | dst rank | dst slice | bytes | note``.
    Slices print numpy-style (``[0:2, 4:8]``) in global coordinates, or, with
    ``coordinates="local"``, inside the source's and the destination's local
    shards. The note is ``partial (summed on arrival)`` and/or ``local copy``.
    """
    if coordinates not in ("global", "local"):
        raise ValueError(f"coordinates must be 'global' or 'local', not {coordinates!r}")
    transfers = list(transfers)
    header = ("src rank", "src slice", "->", "dst rank", "dst slice", "bytes", "note")
    rows = []
    for t in transfers:
        if coordinates == "global":
            src_slice = dst_slice = str(t.box)
        else:
            src_slice = str(Box(t.src_offsets, t.box.sizes))
            dst_slice = str(Box(t.dst_offsets, t.box.sizes))
        notes = []
        if t.partial:
            notes.append("partial (summed on arrival)")
        if t.is_local:
            notes.append("local copy")
        rows.append(
            (
                str(t.src_rank),
                src_slice,
                "->",
                str(t.dst_rank),
                dst_slice,
                str(t.numel * itemsize),
                ", ".join(notes),
            )
        )
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    right_aligned = {0, 3, 5}

    def line(cells: Sequence[str]) -> str:
        padded = (
            cell.rjust(width) if i in right_aligned else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths))
        )
        return " | ".join(padded).rstrip()

    lines = [line(header), "-+-".join("-" * width for width in widths)]
    lines += [line(row) for row in rows]
    total_bytes = sum(t.numel for t in transfers) * itemsize
    local = sum(1 for t in transfers if t.is_local)
    lines.append(f"{len(transfers)} transfers, {total_bytes} bytes, {local} local")
    return "\n".join(lines)


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
