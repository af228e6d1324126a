"""`print-transfer-maps`: show the traffic of every mesh transfer before it runs.

For each `dist.transfer` the pass prints the computed transfer map — source
rank and slice, destination rank and slice, bytes, and whether the piece is a
partial sum added on arrival or a local copy — as `//` comment lines, so the
output of `distir-opt -p print-transfer-maps` is still valid IR. The module
itself is left unchanged.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.passes import ModulePass

from distir.ir.dialect import TransferOp
from distir.ir.layouts import Box
from distir.ir.parsing import describe_op
from distir.ir.transfers import Transfer


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


def describe_transfer(op: TransferOp) -> str:
    plan = op.transfer_plan()
    src_mesh, dst_mesh, shape = plan.source_mesh, plan.dest_mesh, plan.global_shape
    element = op.input.type.element_type if isinstance(op.input.type, TensorType) else None
    width = getattr(getattr(element, "width", None), "data", None)
    if width is None:
        width = getattr(element, "bitwidth", 32)
    itemsize = max(1, width // 8)
    table = format_transfer_map(plan.transfers, itemsize)
    title = (
        f"transfer map of {describe_op(op)}: @{src_mesh.name} {list(src_mesh.shape)} -> "
        f"@{dst_mesh.name} {list(dst_mesh.shape)}, global shape {list(shape)}"
    )
    return "\n".join(f"// {line}".rstrip() for line in [title, *table.splitlines()])


@dataclass(frozen=True)
class PrintTransferMapsPass(ModulePass):
    """Prints each transfer's map as IR comments (to stdout, or stderr)."""

    name = "print-transfer-maps"

    to_stderr: bool = False

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        stream = sys.stderr if self.to_stderr else sys.stdout
        for transfer in op.walk():
            if isinstance(transfer, TransferOp):
                print(describe_transfer(transfer), file=stream)
