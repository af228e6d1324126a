"""Arith ops that act element by element on same-shaped tensors.

Shared by the pass that chooses all-reduce algorithms (a combine region of
such ops can be evaluated piece by piece) and by the ring implementations
that evaluate it on chunks.
"""

from __future__ import annotations

from xdsl.dialects import arith, math
from xdsl.ir import Operation

from distir.ir import tensor_arith

ELEMENTWISE_OPS: tuple[type[Operation], ...] = (
    arith.AddiOp, arith.SubiOp, arith.MuliOp, arith.DivSIOp, arith.DivUIOp,
    arith.RemSIOp, arith.RemUIOp, arith.AndIOp, arith.OrIOp, arith.XOrIOp,
    arith.ShLIOp, arith.ShRSIOp, arith.ShRUIOp, arith.MaxSIOp, arith.MinSIOp,
    arith.MaxUIOp, arith.MinUIOp, arith.AddfOp, arith.SubfOp, arith.MulfOp,
    arith.DivfOp, arith.NegfOp, arith.MaximumfOp, arith.MinimumfOp,
    arith.MaxnumfOp, arith.MinnumfOp, arith.ExtSIOp, arith.ExtUIOp,
    arith.TruncIOp, arith.SIToFPOp, arith.FPToSIOp, arith.ExtFOp, arith.TruncFOp,
    arith.BitcastOp,
    # Comparisons and casts typed on tensors; a select counts only with an
    # i1 tensor condition of the operands' shape (a scalar condition picks a
    # whole operand), which the region's shape check enforces.
    *tensor_arith.TENSOR_ARITH_OPS.values(),
    # math: every op of the dialect acts element by element.
    *math.Math.operations,
)  # fmt: skip
