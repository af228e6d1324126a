"""Weight sync: a state dict from a trainer on ranks 0-1 to inference ranks 2-3.

64 bf16 tensors (16 MiB in all, scaled down from the 256 MB of a real model
so that the run fits a small CPU machine) in four mixed layouts move as one
plan: a dense sync, a delta sync after 1 % of the elements changed, a sync
whose bucket is corrupted on the wire (refused, version kept) and its retry,
then a second launch in which a receiver is killed mid-sync (the survivors
keep their version). Every published shard is checked against the global
tensors cut with plain torch.

    python examples/weight_sync.py
"""

from __future__ import annotations

import os
import time

import torch

import distir
import distir.runtime.weight_sync as ws
from distir.ir.layouts import Mesh

TRAIN = Mesh("train", (2,), (0, 1))
INFER = Mesh("infer", (2,), (2, 3))
SHAPE = (512, 256)  # 128 Ki bf16 elements, 256 KiB per tensor
#: (source dims, source partial, destination dims), by tensor index mod 4
LAYOUTS = [
    ((0, None), (), (None, 0)),  # trainer rows -> inference columns
    ((None, 0), (), (0, None)),  # columns -> rows
    (None, (), (0, None)),  # replicated -> rows
    ((None, None), (0,), (None, 0)),  # partial sums -> columns
]
NAMES = [f"layer{i // 4}.w{i % 4}" for i in range(64)]


def configure(mb: int) -> None:
    """Size the state dict to ``mb`` MiB in all (64 tensors of 256 bf16 columns)."""
    global SHAPE
    SHAPE = (mb * 32, 256)


def declarations():
    source, dest = {}, {}
    for i, name in enumerate(NAMES):
        sdims, partial, ddims = LAYOUTS[i % 4]
        source[name] = ws.TensorLayout(TRAIN, SHAPE, torch.bfloat16, sdims, partial)
        dest[name] = ws.TensorLayout(INFER, SHAPE, torch.bfloat16, ddims)
    return source, dest


def global_weights(step: int) -> dict[str, torch.Tensor]:
    """The trainer's weights after ``step`` updates (step 1 changes 1 % of elements)."""
    out = {}
    for i, name in enumerate(NAMES):
        g = torch.Generator().manual_seed(i)
        w = torch.randn(SHAPE, generator=g).to(torch.bfloat16)
        if step >= 1:
            changed = torch.rand(SHAPE, generator=g) < 0.01
            w[changed] += 1
        out[name] = w
    return out


def cut(x: torch.Tensor, dims, index: int) -> torch.Tensor:
    for d, axis in enumerate(dims or ()):
        if axis is not None:
            x = torch.tensor_split(x, 2, dim=d)[index]
    return x


def shards(rank: int, step: int) -> dict[str, torch.Tensor]:
    if rank not in TRAIN.ranks:
        return {}
    index = TRAIN.ranks.index(rank)
    out = {}
    for i, (name, w) in enumerate(global_weights(step).items()):
        sdims, partial, _ = LAYOUTS[i % 4]
        if partial:  # two addends whose bf16 sum is exactly w
            w = w if index == 0 else torch.zeros_like(w)
        out[name] = cut(w, sdims, index).clone()
    return out


def matches(versions: ws.WeightVersions, rank: int, step: int) -> bool:
    if rank not in INFER.ranks:
        return True
    index = INFER.ranks.index(rank)
    return all(
        torch.equal(versions.weights[name], cut(w, LAYOUTS[i % 4][2], index))
        for i, (name, w) in enumerate(global_weights(step).items())
    )


def first_launch(ctx):
    plan = ws.plan_weight_sync(*declarations(), bucket_bytes=4 << 20)
    versions = ws.WeightVersions()
    lines = []

    def sync(step, delta, label):
        mine = shards(ctx.rank, step)
        start = time.perf_counter()
        try:
            plan.sync(mine, versions, delta=delta, timeout=30)
        except ws.WeightSyncFailed as e:
            lines.append(
                (
                    label,
                    f"{type(e).__name__}: {str(e).split(': ', 1)[1].split(';')[0]}; "
                    f"still version {versions.version}",
                    0,
                    0.0,
                )
            )
            return
        seconds = time.perf_counter() - start
        ok = "matches" if matches(versions, ctx.rank, step) else "DIFFERS"
        lines.append((label, f"version {versions.version}, {ok} the oracle",
                      versions.last_sent_bytes, seconds))  # fmt: skip

    sync(0, False, "dense sync")
    sync(1, True, "delta sync, 1 % changed")
    if ctx.rank == 0:  # corrupt one message of bucket 1 after its digest was taken
        real = ws.dist.batch_isend_irecv
        calls = []

        def corrupting(ops):
            calls.append(1)
            sends = [op for op in ops if op.op is ws.dist.isend]
            if len(calls) == 2 and sends:
                sends[0].tensor[100] ^= 1
            return real(ops)

        ws.dist.batch_isend_irecv = corrupting
        sync(0, False, "dense sync, byte flipped")
        ws.dist.batch_isend_irecv = real
    else:
        sync(0, False, "dense sync, byte flipped")
    sync(0, False, "retry")
    return plan.describe() if ctx.rank == 0 else None, lines


def killed_receiver(ctx):
    plan = ws.plan_weight_sync(*declarations(), bucket_bytes=4 << 20)
    versions = ws.WeightVersions()
    plan.sync(shards(ctx.rank, 0), versions, timeout=30)
    if ctx.rank == 3:
        real_wait = ws._wait

        def dying(work, timeout, what):
            if what == "bucket 1":
                os._exit(9)
            return real_wait(work, timeout, what)

        ws._wait = dying
    try:
        plan.sync(shards(ctx.rank, 1), versions, timeout=5)
        return "published (WRONG)"
    except ws.WeightSyncFailed:
        kept = matches(versions, ctx.rank, 0)
        return f"WeightSyncFailed, still version {versions.version}" + (
            ", intact" if kept else ", CHANGED"
        )


if __name__ == "__main__":
    results = distir.launch(first_launch, 4, pass_context=True, timeout=300)
    table, _ = results[0]
    head = table.splitlines()
    print("\n".join(head[:3] + head[3:7] + ["..."] + head[-1:]))
    for rank in (2, 3):
        print(f"receiver rank {rank}:")
        for label, what, _, _ in results[rank][1]:
            print(f"  {label}: {what}")
    print("bytes sent by the trainer ranks:")
    for k, (label, _, _, seconds) in enumerate(results[0][1]):
        sent = sum(results[r][1][k][2] for r in TRAIN.ranks)
        if "WeightSyncFailed" in results[0][1][k][1]:
            print(f"  {label}: not published")
        else:
            print(f"  {label}: {sent} bytes, {seconds:.2f} s")
    outcome = distir.launch(killed_receiver, 4, pass_context=True, timeout=300, tolerate=1)
    print(f"receiver rank 3 killed mid-sync: lost {sorted(outcome.lost)}")
    for rank, what in sorted(outcome.results.items()):
        print(f"  rank {rank}: {what}")
