"""Tensor layouts on device meshes.

A *mesh* is an n-D grid of global ranks; a *layout* says how one logically
global tensor lives on a mesh: which tensor dim each mesh axis shards, which
axes replicate it, and which axes hold a *partial sum* of it. `local_box`
says which part of the global tensor a rank holds. The transfer map between
two (mesh, layout) pairs is `distir.ops.transfer.ir`'s.

Everything here is pure Python (no torch), and every rule of what a valid
mesh and layout are is written here once: `dist.mesh` and `dist.transfer`
verify by building these values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Box",
    "Layout",
    "Mesh",
    "check_layout",
    "check_shape",
    "local_box",
    "shard_range",
]


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
