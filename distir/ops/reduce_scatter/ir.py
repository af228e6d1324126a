"""`dist.reduce_scatter`: the reduction of every rank's `x`, split along an
axis, rank r keeping part r.

`y_r = slice_r(x_0 ⊕ x_1 ⊕ … ⊕ x_{P-1})`, folded in rank order as every
reduction (docs/reference/dialect.md). `slice_r` takes rows `[r·n/P, (r+1)·n/P)` of the axis
(even form: n a multiple of P), or, with `counts [c_0, …, c_{P-1}]` (uneven
form, static, one per rank, summing to n), rows `[c_0 + … + c_{r-1},
c_0 + … + c_r)`. It is the transpose of the all-gather (and that one's of
it): a sum reduce-scatter moves N·(P-1)/P bytes per rank where an
all-reduce and a slice move twice that.

`⊕` is a native reduction kind (`sum`, `max`, ...) or, as for the generic
all-reduce, a combine region on (lhs, rhs, extra...) of the input's type:
the rules of the region (one block, `commutative` when it holds, a recorded
`known_combine`) are the all-reduce's own (`ir.all_reduce.verify_combine`).
The verifier refuses what the types decide: an axis out of range, rows
that do not split into P equal parts, counts that do not sum to the rows
or do not number the group's ranks, a result whose rows are not the part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from xdsl.dialects import arith
from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    IntegerAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Operation, Region, SSAValue
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.utils.exceptions import VerifyException

from distir.ir.analysis import native_kind
from distir.ir.attributes import CollectiveEffect, ReductionKind, ReductionKindAttr
from distir.ir.collectives import (
    AlongAxisOp,
    is_integer_tensor,
)
from distir.ir.facts import EveryRankEnters, OperandRole
from distir.ir.syntax import CombineRegion, GroupRef, OptionalEnum
from distir.ir.transpose import Cotangents, NoDerivative, Transposable, Transposer
from distir.ops.all_gather.ir import AllGatherOp
from distir.ops.all_reduce.ir import CombineIsolatedFromAbove, verify_combine
from distir.ops.groups.ir import GroupName, group_property


@irdl_op_definition
class ReduceScatterOp(AlongAxisOp, Transposable):
    """`y = slice_rank(x_0 ⊕ … ⊕ x_{P-1})` along `axis`.

    `%y = dist.reduce_scatter sum %x axis 0 : tensor<8xf32> -> tensor<2xf32>`
    on a group of 4: rank r holds rows [2r, 2r+2) of the sum of every
    rank's `x`. `%y = dist.reduce_scatter %x counts [3, 1] axis 0 :
    tensor<4xi64> -> tensor<?xi64> combine(%a, %b) {...}` on a group of 2:
    rank 0 holds rows [0, 3), rank 1 row 3, of the fold of the region.
    Every rank's `x` has the same shape.
    """

    name = "dist.reduce_scatter"

    # Not UniformResults: every rank holds another part. The combine region
    # reads only its block arguments, as the all-reduce's.
    traits = traits_def(CollectiveEffect(), EveryRankEnters(), CombineIsolatedFromAbove())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "extras": OperandRole.UNIFORM,
    }

    input = operand_def(TensorType)
    extras = var_operand_def(TensorType)
    kind = opt_prop_def(ReductionKindAttr)
    counts = opt_prop_def(DenseArrayBase[I64])
    axis = prop_def(IntegerAttr[I64])
    commutative = opt_prop_def(UnitAttr)
    result = result_def(TensorType)
    combine = region_def()

    assembly_format = (
        "custom<OptionalEnum>($kind) $input (`,` $extras^)? (`counts` $counts^)? `axis` $axis "
        "custom<GroupRef>($group) (`commutative` $commutative^)? attr-dict "
        "`:` type($input) `->` type($result) (`,` type($extras)^)? "
        "custom<CombineRegion>($combine, ref(type($input)), ref(type($extras)))"
    )
    custom_directives = (OptionalEnum, GroupRef, CombineRegion)

    def __init__(
        self,
        input: SSAValue | Operation,
        result_type: TensorType,
        *,
        kind: ReductionKind | None = None,
        combine: Region | None = None,
        extras: Sequence[SSAValue | Operation] = (),
        commutative: bool = False,
        counts: Sequence[int] | None = None,
        axis: int = 0,
        group: GroupName = None,
    ):
        props: dict[str, Attribute] = {"axis": IntegerAttr(axis, i64)}
        if kind is not None:
            props["kind"] = ReductionKindAttr(kind)
        if commutative:
            props["commutative"] = UnitAttr()
        if counts is not None:
            props["counts"] = DenseArrayBase.from_list(i64, list(counts))
        group_property(props, group)
        super().__init__(
            operands=[SSAValue.get(input), [SSAValue.get(e) for e in extras]],
            result_types=[result_type],
            properties=props,
            regions=[combine if combine is not None else Region()],
        )

    @property
    def is_generic(self) -> bool:
        """True for the generic form (a combine region), False for a native kind."""
        return self.kind is None

    def count_list(self) -> tuple[int, ...] | None:
        """The rows of every rank's part (uneven form), or None (even)."""
        if self.counts is None:
            return None
        return tuple(self.counts.get_values())  # type: ignore[arg-type]

    def computed_kind(self) -> ReductionKind | None:
        """The native kind this reduce-scatter computes: its own, or that of
        a combine region that is one recognised commutative op."""
        if not self.is_generic:
            return self.kind.data  # type: ignore[union-attr]
        if len(self.combine.blocks) != 1:
            return None
        return native_kind(self.combine.block)

    def verify_(self) -> None:
        t_in, t_out, axis = self.verify_along_axis()
        if self.is_generic:
            verify_combine(self, t_in)
        else:
            self._verify_native(self.kind)  # type: ignore[arg-type]
        if self.counts is not None:
            self._verify_counts(axis, t_in, t_out)
        else:
            self._verify_even(axis, t_in, t_out)

    def _verify_native(self, kind: ReductionKindAttr) -> None:
        if self.combine.blocks:
            raise VerifyException(
                "'dist.reduce_scatter' takes a reduction kind or a combine region, not both"
            )
        if self.extras:
            raise VerifyException(
                "'dist.reduce_scatter' with a native kind takes no extra operands"
            )
        if kind.facts.integer_only and not is_integer_tensor(self.input.type):
            raise VerifyException(
                f"'dist.reduce_scatter' kind {kind.data} needs an integer element type, "
                f"got {self.input.type}"
            )

    def _verify_counts(self, axis: int, t_in: TensorType, t_out: TensorType) -> None:
        counts = self.count_list()
        assert counts is not None
        shown = f"[{', '.join(str(c) for c in counts)}]"
        if any(c < 0 for c in counts):
            raise VerifyException(f"'dist.reduce_scatter' counts {shown} has a negative count")
        size = self.static_group_size()
        if size is not None and len(counts) != size:
            raise VerifyException(
                f"'dist.reduce_scatter' counts {shown} has {len(counts)} entries for a group "
                f"of size {size}"
            )
        rows_in, rows_out = t_in.get_shape()[axis], t_out.get_shape()[axis]
        if rows_in >= 0 and sum(counts) != rows_in:
            raise VerifyException(
                f"'dist.reduce_scatter' counts {shown} sum to {sum(counts)}, but the input "
                f"has {rows_in} rows on axis {axis}"
            )
        if rows_out >= 0 and any(c != rows_out for c in counts):
            raise VerifyException(
                f"'dist.reduce_scatter' result has {rows_out} rows on axis {axis}, but the "
                f"counts {shown} give ranks other parts (make that dimension ?)"
            )

    def _verify_even(self, axis: int, t_in: TensorType, t_out: TensorType) -> None:
        rows_in, rows_out = t_in.get_shape()[axis], t_out.get_shape()[axis]
        if (
            rows_in >= 0
            and rows_out >= 0
            and (
                rows_out == 0
                and rows_in > 0
                or rows_out > 0
                and (rows_in == 0 or rows_in % rows_out)
            )
        ):
            raise VerifyException(
                f"'dist.reduce_scatter' result rows ({rows_out}) on axis {axis} must be "
                f"the input rows ({rows_in}) divided by the group size"
            )
        size = self.static_group_size()
        if size is None or rows_in < 0:
            return
        if rows_in % size:
            raise VerifyException(
                f"'dist.reduce_scatter' input has {rows_in} rows on axis {axis}, "
                f"which do not split evenly over a group of size {size}"
            )
        if rows_out >= 0 and rows_out != rows_in // size:
            raise VerifyException(
                f"'dist.reduce_scatter' result has {rows_out} rows on axis {axis}, "
                f"expected {rows_in} / {size} = {rows_in // size}"
            )

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """A sum reduce-scatter (native, or a combine recognised as one)
        transposes to the all-gather of the cotangent, even or with the same
        counts (every rank's input reached every part); other combines are
        not known to be linear."""
        (ct,) = cotangents
        assert ct is not None
        if self.computed_kind() is not ReductionKind.SUM:
            what = (
                f"the native {self.kind.data.value} reduce-scatter"  # type: ignore[union-attr]
                if not self.is_generic
                else "its combine (only a combine recognised as a sum is known to be linear)"
            )
            raise NoDerivative(f"{what} has no derivative")
        axis = self.axis.value.data
        counts = self.count_list()
        counts_value = None
        if counts is not None:
            counts_type = TensorType(i64, [len(counts)])
            constant = arith.ConstantOp(DenseIntOrFPElementsAttr.from_list(counts_type, counts))
            counts_value = t.emit(constant).results[0]
        gathered = AllGatherOp(
            ct,
            self.input.type,
            axis=axis,
            counts=counts_value,
            group=self.group,  # type: ignore[arg-type]
        )
        return [t.emit(gathered).results[0], *([None] * len(self.extras))]


def sum_reduce_scatter(
    value: SSAValue, result_type: TensorType, axis: int, group: GroupName
) -> ReduceScatterOp:
    """The native sum reduce-scatter of `value` along `axis` (what the even
    all-gather's transpose reduces its cotangent with)."""
    return ReduceScatterOp(value, result_type, kind=ReductionKind.SUM, axis=axis, group=group)
