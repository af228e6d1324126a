"""The semantics record of `dist.reduce_scatter`: its precondition (the
axis splits into P equal parts, or into the op's counts, on every rank; a
dynamic input's layout and the extra operands are agreed) and its reference
rule, the rank-order fold every reduction is defined by (a native kind or the combine
region) sliced to this rank's part."""

from __future__ import annotations

from typing import Any

from distir.core.checks import Agreed, Precondition, fail
from distir.core.invocation import Invocation
from distir.core.kernels import NATIVE_FOLDS, fold_in_rank_order
from distir.core.records import (
    Inputs,
    OpSemantics,
    ReferenceCall,
    Results,
    same_layout,
)
from distir.ops.reduce_scatter.ir import ReduceScatterOp


def part_offsets(rows: int, size: int, counts: tuple[int, ...] | None) -> list[int]:
    """Where every rank's part starts along the axis, and the end: even
    parts of rows / size, or the counts."""
    parts = counts if counts is not None else (rows // size,) * size
    offsets = [0]
    for c in parts:
        offsets.append(offsets[-1] + c)
    return offsets


def check_split(inv: Invocation, x: Any, size: int) -> None:
    """That `x` splits into the op's parts on a group of `size`, else the
    op's named error. Every rank decides the same when the input's shape
    is static (its type) and agreed otherwise, so backends that skip the
    agreement of a static op run this check themselves."""
    axis, counts = inv.properties["axis"], inv.properties["counts"]
    if x.dim() <= axis:
        raise fail(inv, f"input of rank {x.dim()} has no axis {axis}")
    rows = x.shape[axis]
    if counts is None and rows % size:
        raise fail(
            inv, f"input has {rows} rows on axis {axis}, which do not split evenly "
            f"over a group of size {size}",
        )  # fmt: skip
    if counts is not None and len(counts) != size:
        raise fail(
            inv, f"counts {list(counts)} has {len(counts)} entries for a group of size {size}"
        )
    if counts is not None and sum(counts) != rows:
        raise fail(
            inv, f"counts {list(counts)} sum to {sum(counts)}, but the input has {rows} "
            f"rows on axis {axis}",
        )  # fmt: skip


class ReduceScatterSemantics(OpSemantics):
    op = ReduceScatterOp

    def decode(self, op: ReduceScatterOp) -> dict[str, Any]:
        return {
            "kind": None if op.is_generic else str(op.kind.data),  # type: ignore[union-attr]
            "axis": op.axis.value.data,
            "counts": op.count_list(),
        }

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        x = inputs[0]
        check_split(inv, x, size)
        agreed = [Agreed.layout("input layouts", x)] if inv.dynamic(0) else []
        agreed += [Agreed.tensor(f"extra operand #{i}", e) for i, e in enumerate(inputs[1:])]
        return Precondition(agreed=agreed)

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        _, everyone = call.agree(inputs)
        values = [ops[0] for ops in everyone]
        same_layout(call, values, "the input")
        values[0] = values[0].clone()
        props = call.invocation.properties
        if props["kind"] is not None:
            fold = NATIVE_FOLDS[props["kind"]]
            total = fold_in_rank_order(lambda a, b: (fold(a, b),), values)
        else:
            total = fold_in_rank_order(call.invocation.regions[0], values, inputs[1:])
        axis = props["axis"]
        offsets = part_offsets(total.shape[axis], call.size, props["counts"])
        start, stop = offsets[call.me], offsets[call.me + 1]
        return (total.narrow(axis, start, stop - start).clone(),)


#: the family's semantics records, one per op that runs
SEMANTICS: tuple[OpSemantics, ...] = (ReduceScatterSemantics(),)
