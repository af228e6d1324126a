"""Weight sync: a state dict from a trainer on ranks 0-1 to inference ranks 2-3.

64 bf16 tensors (256 MiB in all; ``--mb`` sets another total) in four mixed
layouts move as one plan, in one launch of four local gloo ranks:

1. a dense sync (version 1);
2. a delta sync after a small update (every 97th element changed);
3. an fp8 sync (float8_e4m3fn on the wire, block scales) after another update;
4. a receiver (rank 3) killed in the middle of the next sync: every survivor
   names the error and keeps the fp8 version intact; the survivors agree on
   who is left (`distir.recover()`), plan again for ranks 0-1 -> 2, and the
   sync succeeds.

Every published shard is checked against the global tensors cut with plain
torch (exactly, or within the fp8 bound stated in `plan_weight_sync`).

    python examples/weight_sync.py [--mb 256]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import distir
import distir.runtime.weight_sync as ws
from distir.ir.layouts import Mesh

TRAIN = Mesh("train", (2,), (0, 1))
INFER = Mesh("infer", (2,), (2, 3))
SHAPE = (8192, 256)  # 2 Mi bf16 elements, 4 MiB per tensor: 256 MiB in all
TIMEOUT_S = 40.0  # set by configure
BUCKET_BYTES = 16 << 20
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
    global SHAPE, TIMEOUT_S
    SHAPE = (mb * 32, 256)
    # A sync's deadline: the killed sync's survivors that were not talking
    # to the dead rank wait it out, so it is sized to the state (the slowest
    # sync measured, fp8 at 256 MiB on a loaded 2-core machine, took 8 s).
    TIMEOUT_S = 8 + mb / 8


def declarations(infer: Mesh = INFER, wire: torch.dtype | None = None):
    source, dest = {}, {}
    for i, name in enumerate(NAMES):
        sdims, partial, ddims = LAYOUTS[i % 4]
        source[name] = ws.TensorLayout(TRAIN, SHAPE, torch.bfloat16, sdims, partial)
        dest[name] = ws.TensorLayout(infer, SHAPE, torch.bfloat16, ddims)
    return source, dest


_base: dict[str, torch.Tensor] = {}


def global_weights(step: int) -> dict[str, torch.Tensor]:
    """The trainer's weights after ``step`` updates; each update changes a
    strided ~1 % of the elements."""
    if not _base:
        for i, name in enumerate(NAMES):
            g = torch.Generator().manual_seed(i)
            _base[name] = torch.randn(SHAPE, generator=g).to(torch.bfloat16)
    out = {}
    for name, w in _base.items():
        w = w.clone()
        for k, stride in enumerate((97, 89, 83)[:step]):
            w.view(-1)[k::stride] += 1
        out[name] = w
    return out


def cut(x: torch.Tensor, dims, index: int, parts: int = 2) -> torch.Tensor:
    for d, axis in enumerate(dims or ()):
        if axis is not None:
            x = torch.tensor_split(x, parts, dim=d)[index]
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


def error(versions: ws.WeightVersions, rank: int, step: int, infer: Mesh = INFER) -> float:
    """The largest |published - oracle| / the tensor's absolute maximum (0: exact)."""
    if rank not in infer.ranks:
        return 0.0
    index, parts = infer.ranks.index(rank), len(infer.ranks)
    worst = 0.0
    for i, (name, w) in enumerate(global_weights(step).items()):
        want = cut(w, LAYOUTS[i % 4][2], index, parts).to(torch.float32)
        got = versions.weights[name].to(torch.float32)
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    return worst


def line_up(group) -> None:
    """A barrier (an all-reduce; the group `distir.recover()` forms waits as
    long as the job's collectives)."""
    torch.distributed.all_reduce(torch.zeros(1), group=group)


def rank_main(ctx, mb: int):
    configure(mb)
    lines: list[tuple[str, str, int, float]] = []
    plan = ws.plan_weight_sync(*declarations(), bucket_bytes=BUCKET_BYTES)
    fp8 = ws.plan_weight_sync(*declarations(), bucket_bytes=BUCKET_BYTES, wire=torch.float8_e4m3fn)
    versions = ws.WeightVersions()

    def sync(label, which, step, delta=False, group=None, infer=INFER):
        mine = shards(ctx.rank, step)
        line_up(group)  # time the sync alone, not the ranks' oracle checks
        start = time.perf_counter()
        which.sync(mine, versions, delta=delta, timeout=TIMEOUT_S, group=group)
        seconds = time.perf_counter() - start
        err = error(versions, ctx.rank, step, infer)
        what = "equal to the oracle" if err == 0 else f"within {err:.3f} x amax of the oracle"
        lines.append((label, f"version {versions.version}, {what}", versions.last_sent_bytes,
                      seconds))  # fmt: skip

    # delta=True on the first sync too: it goes dense (nothing to compare
    # against yet) and keeps its messages for the delta after it
    sync("dense sync", plan, 0, delta=True)
    sync("delta sync, 1 % changed", plan, 1, delta=True)
    sync("fp8 sync", fp8, 2)
    kept = {name: w.clone() for name, w in versions.weights.items()}
    if ctx.rank == 3:  # killed while waiting for its second bucket
        real_wait, waits = ws._wait, []

        def dying(work, end, what):
            waits.append(what)
            if len(waits) == 3:
                os._exit(9)
            return real_wait(work, end, what)

        ws._wait = dying
    try:
        sync("dense sync, rank 3 killed", plan, 3)  # the line-up is before the kill
    except ws.WeightSyncFailed as e:
        same = all(torch.equal(kept[n], w) for n, w in versions.weights.items())
        # WeightSyncPeerLost or WeightSyncTimeout, by when gloo notices the loss
        named = f"WeightSyncFailed ({'group broken' if e.group_broken else 'group works'})"
        lines.append(("dense sync, rank 3 killed", f"{named}, still version "
                      f"{versions.version}{', intact' if same else ', CHANGED'}", 0, 0.0))  # fmt: skip
    m = distir.recover(deadline=75)
    left = Mesh("infer", (1,), tuple(r for r in INFER.ranks if r in m.ranks))
    again = ws.plan_weight_sync(*declarations(left), bucket_bytes=BUCKET_BYTES)
    sync(f"after recover (ranks {list(m.ranks)})", again, 3, group=m.group, infer=left)
    return (plan.describe() if ctx.rank == 0 else None), lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="state dict size in MiB")
    mb = parser.parse_args().mb
    outcome = distir.launch(rank_main, 4, mb, pass_context=True, timeout=900, tolerate=1)
    results = outcome.results
    head = results[0][0].splitlines()
    print("\n".join(head[:3] + head[3:7] + ["..."] + head[-1:]))
    print(f"receivers (rank 3 is killed in the fourth sync; lost: {sorted(outcome.lost)}):")
    for rank in (2, 3):
        if rank in results:
            for label, what, _, _ in results[rank][1]:
                print(f"  rank {rank}: {label}: {what}")
    print("bytes sent by the trainer ranks, time of rank 0:")
    for k, (label, what, _, seconds) in enumerate(results[0][1]):
        if "WeightSyncFailed" in what:
            print(f"  {label}: {what.split(',')[0]} on rank 0, nothing published")
        else:
            sent = sum(results[r][1][k][2] for r in TRAIN.ranks)
            print(f"  {label}: {sent} bytes, {seconds:.2f} s")


if __name__ == "__main__":
    main()
