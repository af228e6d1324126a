"""`print-transfer-maps`: show the traffic of every mesh transfer before it runs.

For each `dist.transfer` the pass prints the computed transfer map — source
rank and slice, destination rank and slice, bytes, and whether the piece is a
partial sum added on arrival or a local copy — as `//` comment lines, so the
output of `distir-opt -p print-transfer-maps` is still valid IR. The module
itself is left unchanged. The op formats its own map
(`DescribesPlan.describe_plan`, `TransferOp`'s in `ops/transfer/ir.py`): the pass
walks and prints.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from distir.ir.facts import DescribesPlan
from distir.ir.parsing import describe_op


@dataclass(frozen=True)
class PrintTransferMapsPass(ModulePass):
    """Prints each transfer's map as IR comments (to stdout, or stderr)."""

    name = "print-transfer-maps"

    to_stderr: bool = False

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        stream = sys.stderr if self.to_stderr else sys.stdout
        for planned in op.walk():
            if isinstance(planned, DescribesPlan):
                print(planned.describe_plan(describe_op(planned)), file=stream)
