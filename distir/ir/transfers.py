"""The transfer map of a `dist.transfer`: which piece of the global tensor
each destination rank receives, and from whom.

The transfer map between a source (mesh, layout) and a destination (mesh,
layout) lists, for every destination rank, exactly the pieces it must
receive and from whom, in the spirit of Etha's M2M map and DTensor's
redistribute, but across two groups of ranks that may be disjoint or
overlap. It is pure data (no torch), computed once per op at compile time
(`TransferOp.transfer_plan`): the Torch backend executes it as batched
point-to-point sends, the reference semantics applies it element by
element, and `print-transfer-maps` prints it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from distir.ir.layouts import Box, Layout, Mesh, check_shape, local_box

__all__ = ["Transfer", "TransferPlan", "transfer_map"]


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
class TransferPlan:
    """Everything a `dist.transfer` moves, decided at compile time: both
    meshes and layouts, the global shape, the transfer map, and the shape of
    the (empty) result of a rank outside the destination mesh."""

    source_mesh: Mesh
    source_layout: Layout
    dest_mesh: Mesh
    dest_layout: Layout
    global_shape: tuple[int, ...]
    transfers: tuple[Transfer, ...]
    #: size 0 along the result type's dynamic dims, its static dims as declared
    outside_shape: tuple[int, ...]

    @property
    def members(self) -> tuple[int, ...]:
        """The global ranks of either mesh, in increasing order."""
        return tuple(sorted(set(self.source_mesh.ranks) | set(self.dest_mesh.ranks)))

    def dest_box(self, rank: int) -> Box:
        """The box of the global tensor that destination `rank` receives."""
        return local_box(self.dest_mesh, self.dest_layout, self.global_shape, rank)

    def source_box(self, rank: int) -> Box:
        """The box of the global tensor that source `rank` holds."""
        return local_box(self.source_mesh, self.source_layout, self.global_shape, rank)
