"""Mesh-to-mesh transfer: a weight matrix from a training mesh to an inference mesh.

The 4x6 weight matrix W lives on mesh @train [2, 2] (ranks 0-3) with its rows
sharded over axis 0 and *partial sums* over axis 1 (the replica axis: the two
ranks of a row block each hold an addend, as after a data-parallel backward
pass). It moves to mesh @infer [3] (ranks 3-5; rank 3 is in both meshes),
sharded by columns. The program is examples/mesh_transfer.mlir; this script
prints its transfer map, runs it on 6 local gloo ranks and checks that every
destination rank holds exactly its column block of W.

    python examples/mesh_transfer.py
"""

from __future__ import annotations

from pathlib import Path

import torch

import distir
from distir.ir.dialect import TransferOp
from distir.ir.parsing import describe_op

PROGRAM = Path(__file__).with_name("mesh_transfer.mlir")
WEIGHTS = torch.arange(24, dtype=torch.float32).reshape(4, 6)


def source_shard(rank: int) -> torch.Tensor:
    """Rank r of @train holds rows 2*(r // 2) .. +2, as one of two addends."""
    if rank >= 4:
        return torch.empty(0, 0)  # not on the source mesh
    row_block, replica = divmod(rank, 2)
    rows = WEIGHTS[2 * row_block : 2 * row_block + 2]
    g = torch.Generator().manual_seed(row_block)
    first = torch.randint(-50, 50, rows.shape, generator=g).to(torch.float32)
    return first if replica == 0 else rows - first


def rank_main(ctx) -> torch.Tensor:
    return distir.compile(PROGRAM).run(source_shard(ctx.rank))


if __name__ == "__main__":
    program = distir.compile(PROGRAM)
    transfer = next(op for op in program.module.walk() if isinstance(op, TransferOp))
    print(transfer.describe_plan(describe_op(transfer)))
    results = distir.launch(rank_main, 6, pass_context=True)
    columns = {3: slice(0, 2), 4: slice(2, 4), 5: slice(4, 6)}
    ok = True
    for rank, result in enumerate(results):
        if rank in columns:
            expected = WEIGHTS[:, columns[rank]]
            same = torch.equal(result, expected)
            ok &= same
            print(f"rank {rank}: received {list(result.shape)} = W[:, {columns[rank].start}:"
                  f"{columns[rank].stop}]: {'yes' if same else 'NO'}")
        else:
            print(f"rank {rank}: source only, result {list(result.shape)}")
    raise SystemExit(0 if ok else 1)
