"""Weight sync against hand-written batch_isend_irecv exchanges of the same byte map.

Four local gloo ranks, the state dict of examples/weight_sync.py (64 bf16
tensors, trainer on ranks 0-1, inference on 2-3; ``--mb`` sets the total
size, 16 MiB by default). Side by side, the median of REPEATS runs each:

- raw wire: for each bucket of the plan, one preallocated message per
  (src, dst) pair, posted with `batch_isend_irecv` and awaited: the bytes
  move, no weight does (no packing, no unpacking, no digests, no vote);
- hand-written sync: what a caller writes without distir for the same byte
  map: per message, `torch.cat` of the flattened pieces, `batch_isend_irecv`,
  and on arrival each piece copied (or added) into fresh destination
  tensors; no integrity check, no versions;
- the raw wire plus, one layer at a time, the passes a verified sync adds
  (in preallocated buffers): packing the pieces into messages, then the digest
  of every message on both sides, then copying the pieces out into fresh
  destination tensors; each layer's cost is its row minus the row above;
- dense sync: `WeightSyncPlan.sync` (pipelined packing, pieces alone as
  views / straight into the staged tensors, digests of every segment on
  both sides, the vote, publishing), in steady state (one `WeightVersions`
  over the repeats, as in a training loop: a sync reuses the packed
  segments' buffers of the sync before);
- the same with ``WeightVersions(install="swap")`` (the destination tensors
  double-buffered: a sync stages into the version before the current one);
- delta sync with 1 % of the elements changed (each repeat against the
  version before, which differs in 1 % of the elements);
- fp8 sync: the same state dict as float8_e4m3fn with block scales on the
  wire (bytes into the receivers about half of dense's).

    python benchmarks/weight_sync.py [--mb 16]
"""

from __future__ import annotations

import argparse
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

REPEATS = 7


def raw_wire(plan: ws.WeightSyncPlan, me: int, buffers: dict) -> None:
    for bucket in plan.buckets:
        ops = []
        for src, dst in bucket.messages:
            if me in (src, dst):
                buffer = buffers[(bucket.index, src, dst)]
                op = dist.isend if src == me else dist.irecv
                ops.append(dist.P2POp(op, buffer, dst if src == me else src))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()


def layered(plan: ws.WeightSyncPlan, me: int, shards: dict, buffers: dict, layers: int) -> None:
    """The raw wire plus the first ``layers`` of: packing, digests, copy-out."""
    schedule = plan._schedule(me)
    out = {}
    if layers >= 3:
        for name, (sizes, dtype, zero) in schedule.staged.items():
            out[name] = (torch.zeros if zero else torch.empty)(sizes, dtype=dtype)
    for i, bucket in enumerate(plan.buckets):
        if layers >= 1:
            for o in schedule.outgoing[i]:
                src, dst = me, o.dst
                buffer = plan._pack(o, shards, {}, None, buffers[(bucket.index, src, dst)])
                if layers >= 2:
                    ws._digest(buffer)
        ops = []
        for src, dst in bucket.messages:
            if me in (src, dst):
                buffer = buffers[(bucket.index, src, dst)]
                op = dist.isend if src == me else dist.irecv
                ops.append(dist.P2POp(op, buffer, dst if src == me else src))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        for inc in schedule.incoming[i]:
            buffer = buffers[(bucket.index, inc.src, me)]
            if layers >= 2:
                ws._digest(buffer)
            if layers >= 3:
                for name, slices, offset, nbytes, sizes, partial, _, _ in inc.pieces:
                    dtype = plan.source[name].dtype
                    piece = buffer[offset : offset + nbytes].view(dtype).view(sizes)
                    target = out[name][slices]
                    target.add_(piece) if partial else target.copy_(piece)


LAYERS = ("raw wire + packing", "... + digests both sides", "... + copy-out")


def hand_written(plan: ws.WeightSyncPlan, me: int, shards: dict) -> dict:
    out = {}
    for name in plan.names:
        box = plan.dest_box(name, me)
        if box is not None:
            out[name] = torch.zeros(box.sizes, dtype=plan.dest[name].dtype)
    for bucket in plan.buckets:
        ops, arrivals = [], []
        for (src, dst), pieces in bucket.messages.items():
            if src == me:
                parts = []
                for p in pieces:
                    t = p.transfer
                    index = tuple(slice(o, o + s) for o, s in zip(t.src_offsets, t.box.sizes))
                    parts.append(shards[p.name][index].reshape(-1).view(torch.uint8))
                ops.append(dist.P2POp(dist.isend, torch.cat(parts), dst))
            elif dst == me:
                buffer = torch.empty(sum(p.nbytes for p in pieces), dtype=torch.uint8)
                ops.append(dist.P2POp(dist.irecv, buffer, src))
                arrivals.append((pieces, buffer))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        for pieces, buffer in arrivals:
            at = 0
            for p in pieces:
                t = p.transfer
                index = tuple(slice(o, o + s) for o, s in zip(t.dst_offsets, t.box.sizes))
                dtype = plan.source[p.name].dtype
                piece = buffer[at : at + p.nbytes].view(dtype).view(t.box.sizes)
                target = out[p.name][index]
                target.add_(piece) if t.partial else target.copy_(piece)
                at += p.nbytes
    return out


def timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def measure(ctx, mb: int, repeats: int = REPEATS):
    example.configure(mb)
    plan = ws.plan_weight_sync(*example.declarations(), bucket_bytes=4 << 20)
    fp8 = ws.plan_weight_sync(
        *example.declarations(), bucket_bytes=4 << 20, wire=torch.float8_e4m3fn
    )
    base, changed = example.shards(ctx.rank, 0), example.shards(ctx.rank, 1)
    buffers = {
        (b.index, src, dst): torch.empty(b.message_bytes((src, dst)), dtype=torch.uint8)
        for b in plan.buckets
        for src, dst in b.messages
        if ctx.rank in (src, dst)
    }
    times: dict[str, list[float]] = {}
    sent = {}
    dense_v, delta_v, fp8_v = ws.WeightVersions(), ws.WeightVersions(), ws.WeightVersions()
    swap_v = ws.WeightVersions(install="swap")
    plan.sync(base, delta_v, delta=True, timeout=60)
    for r in range(repeats):
        times.setdefault("raw wire", []).append(timed(lambda: raw_wire(plan, ctx.rank, buffers)))
        for n, label in enumerate(LAYERS, 1):
            times.setdefault(label, []).append(
                timed(lambda n=n: layered(plan, ctx.rank, base, buffers, n))
            )
        times.setdefault("hand-written sync", []).append(
            timed(lambda: hand_written(plan, ctx.rank, base))
        )
        times.setdefault("dense sync", []).append(
            timed(lambda: plan.sync(base, dense_v, timeout=60))
        )
        sent["dense sync"] = dense_v.last_sent_bytes
        times.setdefault("dense sync, swap", []).append(
            timed(lambda: plan.sync(base, swap_v, timeout=60))
        )
        now = changed if r % 2 == 0 else base
        times.setdefault("delta sync", []).append(
            timed(lambda now=now: plan.sync(now, delta_v, delta=True, timeout=60))
        )
        sent["delta sync"] = delta_v.last_sent_bytes
        times.setdefault("fp8 sync", []).append(timed(lambda: fp8.sync(base, fp8_v, timeout=60)))
    return {k: statistics.median(v) for k, v in times.items()}, sent


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=16, help="total state dict size in MiB")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="runs of each, interleaved")
    args = parser.parse_args()
    mb, REPEATS = args.mb, args.repeats
    results = distir.launch(measure, 4, mb, REPEATS, pass_context=True, timeout=900)
    medians = results[0][0]
    dense_bytes = sum(results[r][1]["dense sync"] for r in example.TRAIN.ranks)
    delta_bytes = sum(results[r][1]["delta sync"] for r in example.TRAIN.ranks)
    raw, hand, dense = medians["raw wire"], medians["hand-written sync"], medians["dense sync"]
    example.configure(mb)
    plan = ws.plan_weight_sync(*example.declarations(), bucket_bytes=4 << 20)
    fp8 = ws.plan_weight_sync(
        *example.declarations(), bucket_bytes=4 << 20, wire=torch.float8_e4m3fn
    )
    into = sum(plan.bytes_into(r) for r in example.INFER.ranks)
    fp8_into = sum(fp8.bytes_into(r) for r in example.INFER.ranks)
    print(f"state dict: 64 bf16 tensors, {mb} MiB; {dense_bytes} bytes on the wire")
    print(f"raw wire (bytes only):  {raw * 1e3:7.1f} ms")
    for label in LAYERS:
        print(f"  {label:<24}{medians[label] * 1e3:7.1f} ms ({raw / medians[label]:.2f}x raw)")
    print(f"hand-written sync:      {hand * 1e3:7.1f} ms")
    print(
        f"dense sync:             {dense * 1e3:7.1f} ms "
        f"({raw / dense:.2f}x the raw wire's throughput, {hand / dense:.2f}x the hand-written)"
    )
    swap = medians["dense sync, swap"]
    print(
        f"dense sync, install=swap: {swap * 1e3:5.1f} ms "
        f"({raw / swap:.2f}x the raw wire's throughput, {hand / swap:.2f}x the hand-written)"
    )
    print(
        f"delta sync (1 % changed): {medians['delta sync'] * 1e3:5.1f} ms, {delta_bytes} bytes "
        f"({100 * delta_bytes / dense_bytes:.1f} % of dense, "
        f"{dense / medians['delta sync']:.2f}x dense's speed)"
    )
    print(
        f"fp8 sync: {medians['fp8 sync'] * 1e3:.1f} ms, {fp8_into} bytes into the receivers "
        f"({fp8_into / into:.3f}x dense's {into}; {fp8.wire_bytes} bytes in all with the "
        "pre-stage of partial addends between trainer ranks)"
    )
