"""`print-transfer-maps`: show the traffic of every mesh transfer before it runs.

For each `dist.transfer` the pass prints the computed transfer map — source
rank and slice, destination rank and slice, bytes, and whether the piece is a
partial sum added on arrival or a local copy — as `//` comment lines, so the
output of `distir-opt -p print-transfer-maps` is still valid IR. The module
itself is left unchanged.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.passes import ModulePass

from distir.ir.dialect import TransferOp
from distir.ir.layouts import format_transfer_map, transfer_map
from distir.ir.parsing import describe_op


def describe_transfer(op: TransferOp) -> str:
    src_mesh, src_layout, dst_mesh, dst_layout, shape = op.transfer_spec()
    element = op.input.type.element_type if isinstance(op.input.type, TensorType) else None
    width = getattr(getattr(element, "width", None), "data", None)
    if width is None:
        width = getattr(element, "bitwidth", 32)
    itemsize = max(1, width // 8)
    table = format_transfer_map(
        transfer_map(src_mesh, src_layout, dst_mesh, dst_layout, shape), itemsize
    )
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
