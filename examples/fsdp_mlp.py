"""Fully sharded data parallel (ZeRO-3) training written with distir
programs, checked against a single-process reference.

    python examples/fsdp_mlp.py

A two-layer MLP `y = relu(x @ W1) @ W2` trains on P = 4 local gloo ranks.
Each parameter is flattened and split in P equal shards: rank r holds shard
r of W1 and of W2, and nothing else between steps. For the forward, each
layer's full weight is gathered just before it is used by one run of a
distir `dist.all_gather` program on the shard, which requires grad. That
run is one autograd node whose backward is the transposed program
(`distir-opt -p vjp` prints it): a `dist.reduce_scatter sum`, so after
`backward()` each shard's `.grad` is already its slice of the gradient
summed over the ranks; no hand-written gradient collective. SGD then
updates the shards in place.

The rule for matching a single process: distir's gradients are those of the
whole SPMD computation, whose objective is the SUM of every rank's loss.
Rank r's loss is the mean over its own batch of B rows; the reference's
loss is the mean over the global batch of P*B rows, which is the mean of
the ranks' losses, i.e. 1/P times their sum. So each rank calls
`(loss / P).backward()`, and the reference trains on the concatenated
batch with its plain mean loss.

The example checks, for every step, each rank's shard gradient against the
slice of the reference's gradient, the global loss (the mean of the ranks'
losses) against the reference's, and the final shards against the slices
of the reference's final parameters, all within TOLERANCE.
"""

from __future__ import annotations

import torch

import distir

GATHER = """
func.func @main(%shard: tensor<?xf32>) -> tensor<?xf32> {
  %full = dist.all_gather %shard axis 0 : tensor<?xf32> -> tensor<?xf32>
  func.return %full : tensor<?xf32>
}"""

P, STEPS, LR = 4, 4, 0.1
BATCH, D_IN, HIDDEN, D_OUT = 4, 6, 8, 3  # BATCH rows per rank
SHAPES = ((D_IN, HIDDEN), (HIDDEN, D_OUT))  # W1, W2: numels 48 and 24, split in 4

#: how far the distributed results may be from the single-process ones: the
#: ranks' gradients are summed by gloo in another order than one backward
#: over the global batch adds them in, so the last bits of a float32 differ
#: (by ~1e-7 here, the order depends on gloo); what is stable, and printed,
#: is the bound
TOLERANCE = 1e-5


def data() -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The global batch (P*BATCH rows), its targets and the initial weights."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(P * BATCH, D_IN, generator=g)
    target = torch.randn(P * BATCH, D_OUT, generator=g)
    weights = [torch.randn(*shape, generator=g) * 0.5 for shape in SHAPES]
    return x, target, weights


def forward(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w1) @ w2


def worker(ctx) -> tuple[list[float], list[list[torch.Tensor]], list[torch.Tensor]]:
    """One rank: its losses, its shards' gradients at each step, its final shards."""
    r = ctx.rank
    assert ctx.world_size == P
    gather = distir.compile(GATHER)
    x, target, weights = data()
    mine = slice(r * BATCH, (r + 1) * BATCH)
    x, target = x[mine], target[mine]  # this rank's own batch
    shards = [w.flatten().chunk(P)[r].clone().requires_grad_(True) for w in weights]
    losses, grads = [], []
    for _ in range(STEPS):
        # gather each layer's weight for the forward, from the shards
        w1, w2 = (gather.run(s).view(shape) for s, shape in zip(shards, SHAPES))
        loss = ((forward(x, w1, w2) - target) ** 2).mean()
        (loss / P).backward()  # each all-gather's backward: a sum reduce-scatter
        grads.append([s.grad.clone() for s in shards])
        with torch.no_grad():
            for s in shards:
                s -= LR * s.grad
                s.grad = None
        losses.append(loss.item())
    return losses, grads, [s.detach() for s in shards]


def reference() -> tuple[list[float], list[list[torch.Tensor]], list[torch.Tensor]]:
    """Plain torch in one process on the global batch: losses, gradients, weights."""
    x, target, weights = data()
    for w in weights:
        w.requires_grad_(True)
    losses, grads = [], []
    for _ in range(STEPS):
        loss = ((forward(x, *weights) - target) ** 2).mean()
        loss.backward()
        grads.append([w.grad.flatten().clone() for w in weights])
        with torch.no_grad():
            for w in weights:
                w -= LR * w.grad
                w.grad = None
        losses.append(loss.item())
    return losses, grads, [w.detach().flatten() for w in weights]


def main() -> None:
    print(distir.compile(GATHER, "vjp"))
    per_rank = distir.launch(worker, P, pass_context=True)
    ref_losses, ref_grads, ref_weights = reference()
    # the global loss is the mean of the ranks' losses (equal batch sizes)
    losses = [sum(rank[0][i] for rank in per_rank) / P for i in range(STEPS)]
    loss_gap = max(abs(a - b) for a, b in zip(losses, ref_losses))
    grad_gap = max(
        (rank_grads[i][k] - ref_grads[i][k].chunk(P)[r]).abs().max().item()
        for r, (_, rank_grads, _) in enumerate(per_rank)
        for i in range(STEPS)
        for k in range(len(SHAPES))
    )
    weight_gap = max(
        (shards[k] - ref_weights[k].chunk(P)[r]).abs().max().item()
        for r, (_, _, shards) in enumerate(per_rank)
        for k in range(len(SHAPES))
    )
    numels = " and ".join(str(w.numel() // P) for w in ref_weights)
    print(
        f"FSDP MLP on {P} ranks: each rank holds {numels} of the {HIDDEN * (D_IN + D_OUT)} weights"
    )
    print(f"global loss per step: {' '.join(f'{loss:.6f}' for loss in losses)}")
    print(
        f"shard gradients (the all-gathers' reduce-scatters): single process within {TOLERANCE:.0e}"
    )
    print(f"losses and final parameters: single process within {TOLERANCE:.0e}")
    assert grad_gap <= TOLERANCE, grad_gap
    assert loss_gap <= TOLERANCE, (losses, ref_losses)
    assert weight_gap <= TOLERANCE, weight_gap


if __name__ == "__main__":
    main()
