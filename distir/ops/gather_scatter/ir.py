"""`dist.gather` and `dist.scatter`: rows along an axis, to and from a root.

`dist.gather` concatenates every rank's `x` along the axis, in rank order,
on the root; `dist.scatter` splits the root's `x` along the axis into P
parts and hands rank r part r. Each has an even form (every part the same
size) and an uneven one (`counts(%c : tensor<Pxi64>)`, the same on every
rank: part r has `counts[r]` rows). They are each other's transpose.

A gather's result on a rank other than the root is zeros of the result's
shape (a defined value, as the transpose of a broadcast keeps zeros off the
root): a program never reads a value the op did not define. A scatter's `x`
on a rank other than the root only supplies the message's shape and dtype;
every rank's `x` has the same shape.

The verifier refuses what the types already decide: an axis out of range,
a static root outside the group, rows that do not split into P equal parts
(even scatter) or are not P times the input's (even gather), counts whose
length is not the group size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects.builtin import I64, IntegerAttr, TensorType, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import CollectiveEffect
from distir.ir.collectives import (
    AlongAxisOp,
    verify_counts,
)
from distir.ir.facts import EveryRankEnters, OperandRole
from distir.ir.syntax import GroupRef
from distir.ir.transpose import Cotangents, Transposable, Transposer
from distir.ops.groups.ir import GroupName, group_property


def verify_rows(op: IRDLOperation, axis: int, part: int, whole: int, size: int | None) -> None:
    """`whole` rows on `axis` are P parts of `part` rows (either dynamic: no check)."""
    if whole >= 0 and size is not None and whole % size:
        raise VerifyException(
            f"'{op.name}' {whole} rows on axis {axis} do not split evenly over a group "
            f"of size {size}"
        )
    if part < 0 or whole < 0:
        return
    if size is not None:
        if part * size != whole:
            raise VerifyException(
                f"'{op.name}' parts of {part} rows on axis {axis} make {part * size} rows over "
                f"a group of size {size}, not {whole}"
            )
    elif part == 0 and whole != 0 or part and whole % part:
        raise VerifyException(
            f"'{op.name}' {whole} rows on axis {axis} are not a whole number of parts of {part}"
        )


class RootedRowsOp(AlongAxisOp, Transposable):
    """What the gather and the scatter share: an input, optional counts, an
    axis, a static root and a result (the base of both op classes)."""

    traits = traits_def(CollectiveEffect(), EveryRankEnters())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "counts": OperandRole.GATHER_COUNTS,
    }

    input = operand_def(TensorType)
    counts = opt_operand_def(TensorType)
    axis = prop_def(IntegerAttr[I64])
    root = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input (`counts` `(` $counts^ `:` type($counts) `)`)? `axis` $axis `root` $root "
        "custom<GroupRef>($group) attr-dict `:` type($input) `->` type($result)"
    )
    custom_directives = (GroupRef,)

    def __init__(
        self,
        input: SSAValue | Operation,
        result_type: TensorType,
        *,
        root: int,
        axis: int = 0,
        counts: SSAValue | Operation | None = None,
        group: GroupName = None,
    ):
        props: dict[str, Attribute] = {
            "axis": IntegerAttr(axis, i64),
            "root": IntegerAttr(root, i64),
        }
        group_property(props, group)
        super().__init__(
            operands=[SSAValue.get(input), [] if counts is None else [SSAValue.get(counts)]],
            result_types=[result_type],
            properties=props,
        )

    def _verify_common(self) -> tuple[TensorType, TensorType, int, int | None]:
        t_in, t_out, axis = self.verify_along_axis()
        self.verify_static_rank("root", self.root.value.data)
        size = self.static_group_size()
        if self.counts is not None:
            verify_counts(self, "counts", self.counts.type, size)
        return t_in, t_out, axis, size


@irdl_op_definition
class GatherOp(RootedRowsOp):
    """On the root, the concatenation along `axis` of every rank's `x`, in
    rank order; zeros of the same shape on every other rank.

    `%y = dist.gather %x axis 0 root 0 : tensor<2xf32> -> tensor<8xf32>` on
    a group of 4: rank 0 holds rows [2r, 2r+2) = rank r's `x`. The uneven
    form (`counts(%c : tensor<4xi64>)`) takes `counts[r]` rows from rank r.
    """

    name = "dist.gather"

    def verify_(self) -> None:
        t_in, t_out, axis, size = self._verify_common()
        if self.counts is None:
            verify_rows(self, axis, t_in.get_shape()[axis], t_out.get_shape()[axis], size)

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """The scatter of the root's cotangent: rank r's rows of it are
        rank r's gradient (the zeros elsewhere depend on no input)."""
        (ct,) = cotangents
        assert ct is not None
        counts = None if self.counts is None else t.primal(self.counts)
        back = ScatterOp(
            ct, self.input.type, root=self.root.value.data, axis=self.axis.value.data,  # type: ignore[arg-type]
            counts=counts, group=self.group,  # type: ignore[arg-type]
        )  # fmt: skip
        return [t.emit(back).results[0], None]


@irdl_op_definition
class ScatterOp(RootedRowsOp):
    """Part `rank` of the root's `x`, split along `axis` into P parts.

    `%y = dist.scatter %x axis 0 root 0 : tensor<8xf32> -> tensor<2xf32>`
    on a group of 4: rank r holds rows [2r, 2r+2) of rank 0's `x`. The
    uneven form (`counts(%c : tensor<4xi64>)`) gives rank r `counts[r]`
    rows, and every rank's `x` has `sum(counts)` rows.
    """

    name = "dist.scatter"

    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "counts": OperandRole.SCATTER_COUNTS,
    }

    def verify_(self) -> None:
        t_in, t_out, axis, size = self._verify_common()
        if self.counts is None:
            verify_rows(self, axis, t_out.get_shape()[axis], t_in.get_shape()[axis], size)

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """The gather of the cotangents to the root: the root's input
        reached every rank, the other ranks' inputs reached none."""
        (ct,) = cotangents
        assert ct is not None
        counts = None if self.counts is None else t.primal(self.counts)
        back = GatherOp(
            ct, self.input.type, root=self.root.value.data, axis=self.axis.value.data,  # type: ignore[arg-type]
            counts=counts, group=self.group,  # type: ignore[arg-type]
        )  # fmt: skip
        return [t.emit(back).results[0], None]
