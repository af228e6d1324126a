"""A Megatron-style tensor-parallel MLP trained with distir's f and g,
checked against a single-process reference at every step.

    python examples/megatron_mlp.py

The block is `y = LayerNorm(x) -> Linear(W1, b1) -> GELU -> Linear(W2) + b2`.
Over P ranks, rank r holds columns r of W1 and b1 (column-parallel) and
rows r of W2 (row-parallel); the layer norm's scale and shift and the
output bias b2 are replicated (every rank holds the same copy):

    h = distir.pvary(layer_norm(x))                 # f: identity forward
    y = distir.psum(gelu(h @ W1_r + b1_r) @ W2_r)   # g: sum forward
    loss = mse(y + b2, target)                      # the same on every rank
    loss.backward()

f's backward sums the input's gradient over ranks (so the layer norm's
replicated parameters get their whole gradient), g's passes the output's
gradient on unchanged (so b2 and the shards get theirs, not P times it):
every parameter's gradient equals the single-process model's, replicated
ones included, with no collective written by hand and no `loss / P`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import distir

STEPS, LR = 4, 0.1
BATCH, D_MODEL, HIDDEN = 8, 6, 8

#: how far a distributed gradient or loss may be from the single-process
#: one (float32): the row-parallel sum adds P partial products where one
#: matmul adds them in another order, so the last bits differ (by ~1e-7
#: here); the bound, not the gap, is what is stable and printed
TOLERANCE = 1e-5


def model() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(BATCH, D_MODEL, generator=g),
        "target": torch.randn(BATCH, D_MODEL, generator=g),
        "ln_scale": 1 + 0.1 * torch.randn(D_MODEL, generator=g),
        "ln_shift": 0.1 * torch.randn(D_MODEL, generator=g),
        "w1": torch.randn(D_MODEL, HIDDEN, generator=g) * 0.5,
        "b1": 0.1 * torch.randn(HIDDEN, generator=g),
        "w2": torch.randn(HIDDEN, D_MODEL, generator=g) * 0.5,
        "b2": 0.1 * torch.randn(D_MODEL, generator=g),
    }


#: parameter -> how rank r's copy is cut from the whole (None: replicated)
SHARDING = {
    "ln_scale": None,
    "ln_shift": None,
    "w1": (1,),  # columns
    "b1": (0,),
    "w2": (0,),  # rows
    "b2": None,
}


def shard(name: str, whole: torch.Tensor, P: int, r: int) -> torch.Tensor:
    axes = SHARDING[name]
    if axes is None:
        return whole.clone()
    return torch.tensor_split(whole, P, dim=axes[0])[r].clone()


def forward(p: dict[str, torch.Tensor], x: torch.Tensor, parallel: bool) -> torch.Tensor:
    h = F.layer_norm(x, (D_MODEL,), p["ln_scale"], p["ln_shift"])
    if parallel:
        h = distir.pvary(h)  # f
    partial = F.gelu(h @ p["w1"] + p["b1"]) @ p["w2"]
    y = distir.psum(partial) if parallel else partial  # g
    return y + p["b2"]


def train(params: dict[str, torch.Tensor], data: dict[str, torch.Tensor], parallel: bool):
    """STEPS steps of SGD; per step the loss and every parameter's gradient."""
    losses, grads = [], []
    for _ in range(STEPS):
        loss = F.mse_loss(forward(params, data["x"], parallel), data["target"])
        loss.backward()
        grads.append({k: v.grad.clone() for k, v in params.items()})
        with torch.no_grad():
            for v in params.values():
                v -= LR * v.grad
                v.grad = None
        losses.append(loss.item())
    return losses, grads


def worker(ctx) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    whole = model()
    params = {
        k: shard(k, whole[k], ctx.world_size, ctx.rank).requires_grad_(True) for k in SHARDING
    }
    return train(params, whole, parallel=True)


def reference() -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    whole = model()
    params = {k: whole[k].clone().requires_grad_(True) for k in SHARDING}
    return train(params, whole, parallel=False)


def largest_gap(P: int, per_rank, ref_grads) -> float:
    """The largest difference, over steps, ranks, parameters and elements,
    between a rank's gradient and its cut of the reference's."""
    gap = 0.0
    for r, (_, grads) in enumerate(per_rank):
        for step, ref in zip(grads, ref_grads):
            for k, g in step.items():
                gap = max(gap, (g - shard(k, ref[k], P, r)).abs().max().item())
    return gap


if __name__ == "__main__":
    ref_losses, ref_grads = reference()
    for P in (2, 4):
        per_rank = distir.launch(worker, P, pass_context=True)
        losses = per_rank[0][0]
        assert all(r[0] == losses for r in per_rank), "ranks disagree on the loss"
        loss_gap = max(abs(a - b) for a, b in zip(losses, ref_losses))
        grad_gap = largest_gap(P, per_rank, ref_grads)
        assert loss_gap <= TOLERANCE and grad_gap <= TOLERANCE, (loss_gap, grad_gap)
        print(
            f"Megatron MLP on {P} ranks: losses {' '.join(f'{x:.6f}' for x in losses)}; "
            f"every gradient (layer norm, b2 replicated) = single process within {TOLERANCE:.0e}"
        )
