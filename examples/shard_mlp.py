"""An MLP partitioned over a 2-D grid, written in MLIR's `shard` dialect and
run by distir on 4 local gloo ranks, checked against numpy.

    python examples/shard_mlp.py

The grid `@mesh` is 2x2: axis 0 splits the batch (data parallel), axis 1
splits the hidden layer (tensor parallel). Each process slices its batch
rows out of the replicated input (`shard.all_slice`, no communication),
multiplies by its columns of W1 and rows of W2, sums the partial products
over axis 1 (`shard.all_reduce`) and gathers the batch back over axis 0
(`shard.all_gather`). `convert-shard-to-dist` turns the shard ops into dist
ops and distir differentiates through them; the two processes that hold the
same weight shard add their gradients (`shard.all_reduce` over axis 0, data
parallelism), so a few steps of gradient descent run the same on the grid as
in one numpy process.
"""

from __future__ import annotations

import numpy as np
import torch

import distir

GRID = (2, 2)
BATCH, D_IN, HIDDEN, D_OUT = 8, 6, 8, 3
STEPS, LR = 3, 0.05

SLICE_BATCH = """
shard.grid @mesh(shape = 2x2)
func.func @main(%x: tensor<8x6xf32>) -> tensor<4x6xf32> {
  %rows = shard.all_slice %x on @mesh grid_axes = [0] slice_axis = 0 : tensor<8x6xf32> -> tensor<4x6xf32>
  func.return %rows : tensor<4x6xf32>
}
"""

COMBINE = """
shard.grid @mesh(shape = 2x2)
func.func @main(%partial: tensor<4x3xf32>) -> tensor<8x3xf32> {
  %y = shard.all_reduce %partial on @mesh grid_axes = [1] reduction = sum : tensor<4x3xf32> -> tensor<4x3xf32>
  %all = shard.all_gather %y on @mesh grid_axes = [0] gather_axis = 0 : tensor<4x3xf32> -> tensor<8x3xf32>
  func.return %all : tensor<8x3xf32>
}
"""


SUM_GRADIENTS = """
shard.grid @mesh(shape = 2x2)
func.func @main(%g1: tensor<6x4xf32>, %g2: tensor<4x3xf32>) -> (tensor<6x4xf32>, tensor<4x3xf32>) {
  %s1 = shard.all_reduce %g1 on @mesh grid_axes = [0] : tensor<6x4xf32> -> tensor<6x4xf32>
  %s2 = shard.all_reduce %g2 on @mesh grid_axes = [0] : tensor<4x3xf32> -> tensor<4x3xf32>
  func.return %s1, %s2 : tensor<6x4xf32>, tensor<4x3xf32>
}
"""


def data() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, D_IN)).astype(np.float32)
    target = rng.standard_normal((BATCH, D_OUT)).astype(np.float32)
    w1 = (rng.standard_normal((D_IN, HIDDEN)) * 0.5).astype(np.float32)
    w2 = (rng.standard_normal((HIDDEN, D_OUT)) * 0.5).astype(np.float32)
    return x, target, w1, w2


def worker(ctx) -> dict:
    slice_batch = distir.compile(SLICE_BATCH, "convert-shard-to-dist")
    combine = distir.compile(COMBINE, "convert-shard-to-dist")
    sum_gradients = distir.compile(SUM_GRADIENTS, "convert-shard-to-dist")
    x, target, w1, w2 = (torch.from_numpy(a) for a in data())
    tp = ctx.rank % GRID[1]  # this process's coordinate on axis 1
    cols = slice(tp * HIDDEN // GRID[1], (tp + 1) * HIDDEN // GRID[1])
    w1 = w1[:, cols].clone().requires_grad_(True)
    w2 = w2[cols, :].clone().requires_grad_(True)
    losses = []
    for _ in range(STEPS):
        rows = slice_batch.run(x)
        y = combine.run(torch.relu(rows @ w1) @ w2)
        loss = ((y - target) ** 2).mean()
        # Every process computes the same loss: the objective distir
        # differentiates is the sum over processes, so each takes 1/P.
        (loss / ctx.world_size).backward()
        # The two processes of a column of the grid hold the same weight
        # shard and saw different rows: their gradients add (data parallel).
        g1, g2 = sum_gradients.run(w1.grad, w2.grad)
        with torch.no_grad():
            for w, g in ((w1, g1), (w2, g2)):
                w -= LR * g
                w.grad = None
        losses.append(loss.item())
    return {"losses": losses, "w1": w1.detach().numpy(), "w2": w2.detach().numpy(), "tp": tp}


def reference() -> tuple[list[float], np.ndarray, np.ndarray]:
    """The same steps in one numpy process, gradients by hand."""
    x, target, w1, w2 = (a.astype(np.float64) for a in data())
    losses = []
    for _ in range(STEPS):
        h = x @ w1
        a = np.maximum(h, 0)
        y = a @ w2
        losses.append(float(((y - target) ** 2).mean()))
        dy = 2 * (y - target) / y.size
        dw2 = a.T @ dy
        dh = (dy @ w2.T) * (h > 0)
        dw1 = x.T @ dh
        w1, w2 = w1 - LR * dw1, w2 - LR * dw2
    return losses, w1, w2


def main() -> None:
    results = distir.launch(worker, 4, pass_context=True)
    losses, w1, w2 = reference()
    worst = 0.0
    for r in results:
        cols = slice(r["tp"] * HIDDEN // GRID[1], (r["tp"] + 1) * HIDDEN // GRID[1])
        worst = max(worst, float(np.abs(np.array(r["losses"]) - losses).max()),
                    float(np.abs(r["w1"] - w1[:, cols]).max()),
                    float(np.abs(r["w2"] - w2[cols, :]).max()))
    print("losses on the grid:  ", " ".join(f"{v:.6f}" for v in results[0]["losses"]))
    print("losses in numpy:     ", " ".join(f"{v:.6f}" for v in losses))
    print(f"largest difference (losses and weights, all 4 processes): {worst:.1e}")
    assert worst < 1e-5, worst
    print("the 2x2 grid matches numpy within 1e-5")


if __name__ == "__main__":
    main()
