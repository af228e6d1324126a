"""Meshes and mesh-to-mesh transfers: `dist.mesh`, `dist.transfer` and the
transfer map.

The rules of what a valid mesh and a valid layout are live in
`distir.ir.layouts`, once; the verifiers here build its `Mesh` and `Layout`
values and report its errors as the op's.

The transfer map between a source (mesh, layout) and a destination (mesh,
layout) lists, for every destination rank, exactly the pieces it must
receive and from whom, in the spirit of Etha's M2M map and DTensor's
redistribute, but across two groups of ranks that may be disjoint or
overlap. It is pure data (no torch), computed once per op at compile time
(`TransferOp.transfer_plan`): the Torch backend executes it as batched
point-to-point sends, the reference semantics applies it element by
element, and `print-transfer-maps` prints it (`TransferOp.describe_plan`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import ClassVar

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    I64,
    DenseArrayBase,
    ModuleOp,
    StringAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import HasParent, SymbolOpInterface, SymbolTable
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import CollectiveEffect
from distir.ir.facts import DeclaresRanks, DescribesPlan, EveryRankEnters, OperandRole, Structural
from distir.ir.layouts import Box, Layout, Mesh, check_layout, check_shape, local_box
from distir.ir.syntax import REPLICATED, MeshLayout
from distir.ir.transpose import Cotangents, Transposable, Transposer

Dims = Sequence[int | None]
"""A layout as builders take it: per tensor dim a mesh axis, or None (replicated)."""


@contextmanager
def _reported_as(prefix: str) -> Iterator[None]:
    """Turns a `layouts` ValueError into the op's VerifyException."""
    try:
        yield
    except ValueError as e:
        raise VerifyException(f"{prefix}{e}") from e


def _i64_array(values: Sequence[int]) -> DenseArrayBase:
    return DenseArrayBase.from_list(i64, list(values))


###############################################################################
# The transfer map
###############################################################################


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


###############################################################################
# The ops
###############################################################################


@irdl_op_definition
class MeshOp(IRDLOperation, DeclaresRanks):
    """Declares a mesh: an n-D grid of global ranks, in row-major order.

    `dist.mesh @train [2, 2] ranks [0, 1, 2, 3]`
    """

    name = "dist.mesh"

    sym_name = prop_def(SymbolNameConstraint())
    shape = prop_def(DenseArrayBase[I64])
    ranks = prop_def(DenseArrayBase[I64])

    traits = traits_def(SymbolOpInterface(), HasParent(ModuleOp), Structural())

    assembly_format = "$sym_name $shape `ranks` $ranks attr-dict"

    def __init__(self, sym_name: str, shape: Sequence[int], ranks: Sequence[int]):
        super().__init__(
            properties={
                "sym_name": StringAttr(sym_name),
                "shape": _i64_array(shape),
                "ranks": _i64_array(ranks),
            }
        )

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(self.shape.get_values())

    @property
    def rank_list(self) -> tuple[int, ...]:
        return tuple(self.ranks.get_values())

    def declared_ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.rank_list))

    def declared_as(self) -> str:
        return f"mesh @{self.sym_name.data}"

    def as_mesh(self) -> Mesh:
        """This declaration as a `layouts.Mesh` (ValueError if it is invalid)."""
        return Mesh(self.sym_name.data, self.mesh_shape, self.rank_list)

    def verify_(self) -> None:
        with _reported_as(""):
            self.as_mesh()


@irdl_op_definition
class TransferOp(IRDLOperation, DescribesPlan, Transposable):
    """Moves a logically global tensor from one mesh layout to another.

    The global tensor has shape `global`. On the source mesh each tensor
    dimension is sharded over a mesh axis (`0`, `1`, ...) or replicated
    (`*`), in `torch.tensor_split` chunks; with `partial [a]` the source
    values are partial sums over mesh axis a. Every rank of either mesh
    runs the op: a source rank passes its local shard as `x` (others pass an
    empty tensor), and a destination rank gets its local shard of the
    destination layout (others get an empty tensor: size 0 along the
    result type's dynamic dims). Partial sources are
    summed on arrival, in source-rank order; replicated sources are read
    once, spread over the replicas.
    """

    name = "dist.transfer"

    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.SHARD}

    input = operand_def(TensorType)
    source_mesh = prop_def(SymbolRefAttr)
    source_layout = prop_def(DenseArrayBase[I64])
    source_partial = prop_def(DenseArrayBase[I64], default_value=_i64_array([]))
    dest_mesh = prop_def(SymbolRefAttr)
    dest_layout = prop_def(DenseArrayBase[I64])
    global_shape = prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    traits = traits_def(CollectiveEffect(), EveryRankEnters())

    assembly_format = (
        "$input `from` $source_mesh custom<MeshLayout>($source_layout) "
        "(`partial` $source_partial^)? `to` $dest_mesh custom<MeshLayout>($dest_layout) "
        "`global` $global_shape attr-dict `:` type($input) `->` type($result)"
    )
    custom_directives = (MeshLayout,)

    def __init__(
        self,
        input: SSAValue | Operation,
        *,
        source_mesh: str,
        source_layout: Dims,
        dest_mesh: str,
        dest_layout: Dims,
        global_shape: Sequence[int],
        source_partial: Sequence[int] = (),
        result_type: TensorType | None = None,
    ):
        input = SSAValue.get(input)

        def layout(dims: Dims) -> DenseArrayBase:
            return _i64_array([REPLICATED if d is None else d for d in dims])

        props: dict[str, Attribute] = {
            "source_mesh": SymbolRefAttr(source_mesh),
            "source_layout": layout(source_layout),
            "dest_mesh": SymbolRefAttr(dest_mesh),
            "dest_layout": layout(dest_layout),
            "global_shape": _i64_array(global_shape),
        }
        # No partial axes is the default, left implicit as the parser leaves it.
        if source_partial:
            props["source_partial"] = _i64_array(source_partial)
        super().__init__(
            operands=[input], result_types=[result_type or input.type], properties=props
        )

    def layouts(self) -> tuple[tuple[int | None, ...], tuple[int, ...], tuple[int | None, ...]]:
        """(source dims, source partial axes, destination dims), None = replicated."""

        def dims(attr: DenseArrayBase) -> tuple[int | None, ...]:
            return tuple(None if d == REPLICATED else d for d in attr.get_values())

        partial = tuple(self.source_partial.get_values())
        return dims(self.source_layout), partial, dims(self.dest_layout)

    def transfer_spec(self) -> tuple[Mesh, Layout, Mesh, Layout, tuple[int, ...]]:
        """(source Mesh, source Layout, destination Mesh, destination Layout,
        global shape) as `distir.ir.layouts` values."""
        src_op, dst_op = self.meshes()
        src_dims, partial, dst_dims = self.layouts()
        return (
            src_op.as_mesh(),
            Layout(src_dims, partial),
            dst_op.as_mesh(),
            Layout(dst_dims),
            tuple(self.global_shape.get_values()),
        )

    def source_shard_sizes(self, rank: int) -> tuple[int, ...] | None:
        """The sizes of the source shard `rank` holds, or None when `rank` is
        outside the source mesh (its input is then empty)."""
        src_mesh, src_layout, _, _, shape = self.transfer_spec()
        if rank not in src_mesh.ranks:
            return None
        return local_box(src_mesh, src_layout, shape, rank).sizes

    def transfer_plan(self) -> TransferPlan:
        """What this transfer moves, computed once at compile time and read by
        every executor: the meshes, layouts, global shape, transfer map and
        the result shape of a rank outside the destination mesh (size 0
        along the result type's dynamic dims, its static dims as declared)."""
        src_mesh, src_layout, dst_mesh, dst_layout, shape = self.transfer_spec()
        result_type = self.result.type
        assert isinstance(result_type, TensorType)
        return TransferPlan(
            src_mesh,
            src_layout,
            dst_mesh,
            dst_layout,
            shape,
            tuple(transfer_map(src_mesh, src_layout, dst_mesh, dst_layout, shape)),
            tuple(0 if d == DYNAMIC_INDEX else d for d in result_type.get_shape()),
        )

    def meshes(self) -> tuple[MeshOp, MeshOp]:
        found = []
        for ref in (self.source_mesh, self.dest_mesh):
            mesh = SymbolTable.lookup_symbol(self, ref)
            if not isinstance(mesh, MeshOp):
                raise VerifyException(
                    f"'dist.transfer' names mesh {ref} but no `dist.mesh` of that name is "
                    "declared at module level"
                )
            found.append(mesh)
        return found[0], found[1]

    def verify_(self) -> None:
        t_in, t_out = self.input.type, self.result.type
        assert isinstance(t_in, TensorType) and isinstance(t_out, TensorType)
        shape = tuple(self.global_shape.get_values())
        with _reported_as("'dist.transfer' "):
            check_shape(shape)
        for what, t in (("input", t_in), ("result", t_out)):
            if t.get_num_dims() != len(shape):
                raise VerifyException(
                    f"'dist.transfer' {what} {t} must have the rank of the global shape "
                    f"({len(shape)})"
                )
        if t_in.element_type != t_out.element_type:
            raise VerifyException("'dist.transfer' input and result element types differ")
        # Meshes resolve only once the op sits inside a module.
        in_module = isinstance(self.get_toplevel_object(), ModuleOp)
        meshes = self.meshes() if in_module else None
        src_dims, partial, dst_dims = self.layouts()
        for index, (what, dims, axes) in enumerate(
            (("source", src_dims, partial), ("destination", dst_dims, ()))
        ):
            with _reported_as(f"'dist.transfer' {what} "):
                mesh = None if meshes is None else meshes[index].as_mesh()
                check_layout(dims, axes, mesh, shape)

    def describe_plan(self, named: str) -> str:
        """The transfer map as `//` comment lines (valid IR around them): a
        title naming the op as `named` (its location is the parser's to
        format), both meshes and the global shape, then the table of
        `format_transfer_map` in the element type's bytes."""
        plan = self.transfer_plan()
        src_mesh, dst_mesh, shape = plan.source_mesh, plan.dest_mesh, plan.global_shape
        element = self.input.type.element_type if isinstance(self.input.type, TensorType) else None
        width = getattr(getattr(element, "width", None), "data", None)
        if width is None:
            width = getattr(element, "bitwidth", 32)
        itemsize = max(1, width // 8)
        table = format_transfer_map(plan.transfers, itemsize)
        title = (
            f"transfer map of {named}: @{src_mesh.name} {list(src_mesh.shape)} -> "
            f"@{dst_mesh.name} {list(dst_mesh.shape)}, global shape {list(shape)}"
        )
        return "\n".join(f"// {line}".rstrip() for line in [title, *table.splitlines()])

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """The transfer back (destination -> source), the cotangent partial
        over the mesh axes the destination replicates (a partial source
        receives the replicated cotangent, summed on arrival)."""
        (ct,) = cotangents
        assert ct is not None
        source_dims, _partial, dest_dims = self.layouts()
        _, dest_mesh = self.meshes()
        used = {d for d in dest_dims if d is not None}
        replicated = [a for a in range(len(dest_mesh.shape.get_values())) if a not in used]
        back = TransferOp(
            ct,
            source_mesh=self.dest_mesh.root_reference.data,
            source_layout=dest_dims,
            source_partial=replicated,
            dest_mesh=self.source_mesh.root_reference.data,
            dest_layout=source_dims,
            global_shape=self.global_shape.get_values(),
            result_type=self.input.type,  # type: ignore[arg-type]
        )
        return [t.emit(back).results[0]]
