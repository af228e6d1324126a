"""Training through distir's collectives: a tensor-parallel MLP and a
mixture-of-experts layer, each checked against a single-process reference.

    python examples/tensor_parallel_mlp.py

The MLP `y = relu(x @ W1) @ W2` is split across P ranks column-then-row:
rank r holds columns r of W1 and rows r of W2, computes its partial product
locally, and one `dist.all_reduce sum` forms y. Its backward is the
transposed program (`distir-opt -p vjp` prints it): another sum all-reduce.

The mixture-of-experts layer routes each rank's tokens to one expert per
rank with a `dist.variable_all_to_all` (counts per peer, zeros included),
applies the expert there and sends the rows back with a second exchange of
the same program; its backward is the reverse exchanges with swapped counts.

Gradients are those of the whole SPMD computation: the objective is the sum
of every rank's loss. The MLP's loss is the same on every rank (its input is
replicated), so each rank contributes 1/P of it; each rank's MoE loss covers
its own tokens.
"""

from __future__ import annotations

import torch

import distir

ALL_REDUCE = """
func.func @main(%partial: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %y = dist.all_reduce sum %partial : tensor<?x?xf32>
  func.return %y : tensor<?x?xf32>
}"""

EXCHANGE = """
func.func @main(%rows: tensor<?x?xf32>, %send: tensor<?xi64>) -> (tensor<?x?xf32>, tensor<?xi64>) {
  %got, %recv = dist.variable_all_to_all %rows, %send axis 0 : tensor<?x?xf32>, tensor<?xi64> -> tensor<?x?xf32>
  func.return %got, %recv : tensor<?x?xf32>, tensor<?xi64>
}"""

STEPS, LR = 4, 0.1
BATCH, D_IN, HIDDEN, D_OUT = 8, 6, 8, 3
TOKENS, D_MODEL = 6, 4


def mlp_weights() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, D_IN, generator=g)
    target = torch.randn(BATCH, D_OUT, generator=g)
    w1 = torch.randn(D_IN, HIDDEN, generator=g) * 0.5
    w2 = torch.randn(HIDDEN, D_OUT, generator=g) * 0.5
    return x, target, w1, w2


def moe_data(P: int) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = [torch.randn(TOKENS, D_MODEL, generator=g) for _ in range(P)]
    targets = [torch.randn(TOKENS, D_MODEL, generator=g) for _ in range(P)]
    router = torch.randn(D_MODEL, P, generator=g)
    experts = torch.randn(P, D_MODEL, D_MODEL, generator=g) * 0.5
    return tokens, targets, router, experts


def mlp_worker(ctx) -> list[float]:
    P, r = ctx.world_size, ctx.rank
    program = distir.compile(ALL_REDUCE)
    x, target, w1, w2 = mlp_weights()
    cols = torch.tensor_split(torch.arange(HIDDEN), P)[r]
    w1 = w1[:, cols].clone().requires_grad_(True)  # column-parallel
    w2 = w2[cols, :].clone().requires_grad_(True)  # row-parallel
    losses = []
    for _ in range(STEPS):
        y = program.run(torch.relu(x @ w1) @ w2)  # one all-reduce forward
        loss = ((y - target) ** 2).mean()
        (loss / P).backward()  # its transpose, one all-reduce backward
        with torch.no_grad():
            for w in (w1, w2):
                w -= LR * w.grad
                w.grad = None
        losses.append(loss.item())
    return losses


def mlp_reference() -> list[float]:
    x, target, w1, w2 = mlp_weights()
    w1.requires_grad_(True)
    w2.requires_grad_(True)
    losses = []
    for _ in range(STEPS):
        loss = ((torch.relu(x @ w1) @ w2 - target) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for w in (w1, w2):
                w -= LR * w.grad
                w.grad = None
        losses.append(loss.item())
    return losses


def route(tokens: torch.Tensor, router: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's expert (its router argmax) and its gate (softmax weight)."""
    scores = torch.softmax(tokens @ router, dim=1)
    gate, expert = scores.max(dim=1)
    return expert, gate


def moe_worker(ctx) -> list[float]:
    P, r = ctx.world_size, ctx.rank
    exchange = distir.compile(EXCHANGE)
    tokens, targets, router, experts = moe_data(P)
    mine, target = tokens[r], targets[r]
    router = router.clone().requires_grad_(True)
    expert = experts[r].clone().requires_grad_(True)  # rank r hosts expert r
    losses = []
    for _ in range(STEPS):
        choice, gate = route(mine, router)
        order = torch.argsort(choice, stable=True)
        send = torch.bincount(choice, minlength=P)  # rows for each expert (zeros too)
        got, recv = exchange.run(mine[order], send)  # dispatch
        done, _ = exchange.run(torch.tanh(got @ expert), recv)  # and return
        out = torch.empty_like(done).index_copy(0, order, done) * gate[:, None]
        loss = ((out - target) ** 2).sum() / (P * TOKENS)
        loss.backward()
        # the router is replicated: its gradient is the sum over ranks
        router_grad = exchange_sum(router.grad, ctx)
        with torch.no_grad():
            router -= LR * router_grad
            expert -= LR * expert.grad
            router.grad = expert.grad = None
        losses.append(exchange_sum(loss.detach().reshape(1, 1), ctx).item())
    return losses


_SUM = distir.compile(ALL_REDUCE)


def exchange_sum(value: torch.Tensor, ctx) -> torch.Tensor:
    return _SUM.run(value.reshape(value.shape[0], -1)).reshape(value.shape)


def moe_reference(P: int) -> list[float]:
    tokens, targets, router, experts = moe_data(P)
    router.requires_grad_(True)
    experts.requires_grad_(True)
    x, target = torch.cat(tokens), torch.cat(targets)
    losses = []
    for _ in range(STEPS):
        choice, gate = route(x, router)
        out = torch.tanh(torch.einsum("td,tde->te", x, experts[choice])) * gate[:, None]
        loss = ((out - target) ** 2).sum() / (P * TOKENS)
        loss.backward()
        with torch.no_grad():
            router -= LR * router.grad
            experts -= LR * experts.grad
            router.grad = experts.grad = None
        losses.append(loss.item())
    return losses


#: how far a distributed loss may be from the single-process one: the sums
#: of partial products run in another order than one matmul, so the last
#: bits of a float32 differ (by ~1e-7 here), and by how much depends on the
#: order gloo adds in; what is stable, and printed, is the bound
TOLERANCE = 1e-5


def show(name: str, P: int, distributed: list[float], reference: list[float]) -> None:
    gap = max(abs(a - b) for a, b in zip(distributed, reference))
    steps = " ".join(f"{loss:.6f}" for loss in distributed)
    print(f"{name} on {P} ranks: losses {steps}; single process within {TOLERANCE:.0e}")
    assert gap <= TOLERANCE, (gap, distributed, reference)


def worker(ctx) -> tuple[list[float], list[float]]:
    return mlp_worker(ctx), moe_worker(ctx)


if __name__ == "__main__":
    print(distir.compile(ALL_REDUCE, "vjp"))
    for P in (2, 4):
        per_rank = distir.launch(worker, P, pass_context=True)
        assert all(mlp == per_rank[0][0] for mlp, _ in per_rank)
        show("tensor-parallel MLP", P, per_rank[0][0], mlp_reference())
        show("mixture of experts", P, per_rank[0][1], moe_reference(P))
