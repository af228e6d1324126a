"""Weight sync against a hand-written batch_isend_irecv of the same byte map.

Four local gloo ranks, the state dict of examples/weight_sync.py (64 bf16
tensors, 16 MiB, trainer on ranks 0-1, inference on 2-3). Side by side, the
median of REPEATS runs each:

- hand-written: for each bucket of the plan, one preallocated message per
  (src, dst) pair, posted with `batch_isend_irecv` and awaited (no packing,
  no digests, no vote);
- dense sync: `WeightSyncPlan.sync` (packing, digests, the vote, publishing);
- delta sync with 1 % of the elements changed.

    python benchmarks/weight_sync.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import distir
import distir.runtime.weight_sync as ws

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import weight_sync as example  # noqa: E402

REPEATS = 5


def hand_written(plan: ws.WeightSyncPlan, me: int) -> None:
    for bucket in plan.buckets:
        ops = []
        for src, dst in bucket.messages:
            if me in (src, dst):
                buffer = torch.empty(bucket.message_bytes((src, dst)), dtype=torch.uint8)
                op = dist.isend if src == me else dist.irecv
                ops.append(dist.P2POp(op, buffer, dst if src == me else src))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()


def measure(ctx):
    plan = ws.plan_weight_sync(*example.declarations(), bucket_bytes=4 << 20)
    base, changed = example.shards(ctx.rank, 0), example.shards(ctx.rank, 1)
    times: dict[str, list[float]] = {"hand-written": [], "dense sync": [], "delta sync": []}
    sent = {}
    for _ in range(REPEATS):
        dist.barrier()
        start = time.perf_counter()
        hand_written(plan, ctx.rank)
        dist.barrier()
        times["hand-written"].append(time.perf_counter() - start)
        versions = ws.WeightVersions()
        dist.barrier()
        start = time.perf_counter()
        plan.sync(base, versions, timeout=60)
        dist.barrier()
        times["dense sync"].append(time.perf_counter() - start)
        sent["dense sync"] = versions.last_sent_bytes
        dist.barrier()
        start = time.perf_counter()
        plan.sync(changed, versions, delta=True, timeout=60)
        dist.barrier()
        times["delta sync"].append(time.perf_counter() - start)
        sent["delta sync"] = versions.last_sent_bytes
    return {k: statistics.median(v) for k, v in times.items()}, sent


if __name__ == "__main__":
    results = distir.launch(measure, 4, pass_context=True, timeout=600)
    medians = results[0][0]
    dense_bytes = sum(results[r][1]["dense sync"] for r in example.TRAIN.ranks)
    delta_bytes = sum(results[r][1]["delta sync"] for r in example.TRAIN.ranks)
    hand = medians["hand-written"]
    print(f"hand-written batch_isend_irecv: {hand * 1e3:.1f} ms, {dense_bytes} bytes")
    print(
        f"dense sync: {medians['dense sync'] * 1e3:.1f} ms "
        f"({hand / medians['dense sync']:.2f}x the hand-written throughput)"
    )
    print(
        f"delta sync (1 % changed): {medians['delta sync'] * 1e3:.1f} ms, {delta_bytes} bytes "
        f"({100 * delta_bytes / dense_bytes:.1f} % of dense, "
        f"{medians['dense sync'] / medians['delta sync']:.2f}x dense's speed)"
    )
