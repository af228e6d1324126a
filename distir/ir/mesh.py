"""Meshes and mesh-to-mesh transfers.

The rules of what a valid mesh and a valid layout are live in
`distir.ir.layouts`, once; the verifiers here build its `Mesh` and `Layout`
values and report its errors as the op's. What a transfer moves (its
`TransferPlan`, with the map of `distir.ir.transfers`) is read from the op.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
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
from distir.ir.facts import EveryRankEnters, OperandRole
from distir.ir.layouts import Layout, Mesh, check_layout, check_shape, local_box
from distir.ir.syntax import REPLICATED, MeshLayout
from distir.ir.transfers import TransferPlan, transfer_map

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


@irdl_op_definition
class MeshOp(IRDLOperation):
    """Declares a mesh: an n-D grid of global ranks, in row-major order.

    `dist.mesh @train [2, 2] ranks [0, 1, 2, 3]`
    """

    name = "dist.mesh"

    sym_name = prop_def(SymbolNameConstraint())
    shape = prop_def(DenseArrayBase[I64])
    ranks = prop_def(DenseArrayBase[I64])

    traits = traits_def(SymbolOpInterface(), HasParent(ModuleOp))

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

    def as_mesh(self) -> Mesh:
        """This declaration as a `layouts.Mesh` (ValueError if it is invalid)."""
        return Mesh(self.sym_name.data, self.mesh_shape, self.rank_list)

    def verify_(self) -> None:
        with _reported_as(""):
            self.as_mesh()


@irdl_op_definition
class TransferOp(IRDLOperation):
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
