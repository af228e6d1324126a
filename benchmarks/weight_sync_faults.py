"""Weight sync under injected faults: every fault ends in a named error on every
rank, within the deadline plus 2 s, with no partially published version, and
the next attempt goes on.

Four local gloo ranks, trainer on ranks 0-1, inference on 2-3, a small state
dict in mixed layouts (rows to columns, columns to rows, replicated to rows,
partial sums to columns, uneven and bf16 ones among them) in several buckets.
Each case publishes version 1, injects one fault into the sync of version 2,
and checks on every rank that took part:

- the sync raised a `WeightSyncFailed` subclass (a named error) within the
  deadline plus 2 s of the fault (a frozen rank: within 2 s of waking);
- every surviving receiver still holds version 1, equal to the oracle (the
  global tensors cut with plain torch), so no version was partly published;
- the next attempt succeeds: at once on the same group after a flipped byte;
  after a lost or frozen rank, once the survivors agreed with
  `distir.recover()` and planned again for the ranks that are left.

Faults: a flipped byte (one message changed on the wire after its sender took
its digest), a killed receiver, a killed sender (the process exits at a
chosen wait: a bucket or the vote), a frozen rank (it sleeps past the
deadline at a chosen wait, then goes on). `CASES` lists all 50;
tests/runtime/test_weight_sync.py runs a sample of every kind.

    python benchmarks/weight_sync_faults.py
"""

from __future__ import annotations

import os
import time
from collections import Counter

import torch

import distir
import distir.runtime.weight_sync as ws
from distir.ir.layouts import Mesh

TRAIN = (0, 1)
INFER = (2, 3)
#: seconds: the sync's deadline in a faulted attempt
DEADLINE_S = 3.0
#: the bound the failure path may add to it
GRACE_S = 2.0
BUCKET_BYTES = 512

# name -> (shape, source dtype, destination dtype, source dims, partial, destination dims)
TENSORS = {
    "rows_to_cols": ((6, 4), torch.float32, torch.float32, (0, None), False, (None, 0)),
    "cols_to_rows": ((4, 10), torch.bfloat16, torch.bfloat16, (None, 0), False, (0, None)),
    "replicated_to_rows": ((5, 3), torch.float32, torch.bfloat16, None, False, (0, None)),
    "partial_to_cols": ((7, 6), torch.float32, torch.float32, (None, None), True, (None, 0)),
    "uneven_rows": ((9, 5), torch.int64, torch.int64, (0, None), False, None),
    "big_rows_to_cols": ((32, 16), torch.float32, torch.float32, (0, None), False, (None, 0)),
}


def global_tensor(name: str, version: int) -> torch.Tensor:
    """Version ``version`` of a tensor: small integers, so that every partial
    sum and every cast is exact."""
    shape = TENSORS[name][0]
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    return torch.randint(-100, 100, shape, generator=g).to(torch.float64) + version


def cut(x: torch.Tensor, dims, ranks: tuple[int, ...], rank: int) -> torch.Tensor:
    """The shard of ``x`` that ``rank`` holds on a 1-D mesh over ``ranks``."""
    for d, axis in enumerate(dims or ()):
        if axis is not None:
            x = torch.tensor_split(x, len(ranks), dim=d)[ranks.index(rank)]
    return x.clone()


def declarations(train: tuple[int, ...], infer: tuple[int, ...]):
    src_mesh = Mesh("train", (len(train),), train)
    dst_mesh = Mesh("infer", (len(infer),), infer)
    source, dest = {}, {}
    for name, (shape, sdt, ddt, sdims, partial, ddims) in TENSORS.items():
        source[name] = ws.TensorLayout(src_mesh, shape, sdt, sdims, (0,) if partial else ())
        dest[name] = ws.TensorLayout(dst_mesh, shape, ddt, ddims)
    return source, dest


def shards(train: tuple[int, ...], rank: int, version: int) -> dict[str, torch.Tensor]:
    if rank not in train:
        return {}
    out = {}
    for name, (_, sdt, _, sdims, partial, _) in TENSORS.items():
        x = global_tensor(name, version)
        if partial:  # addends that differ per rank and sum to x
            noise = [
                torch.randint(-50, 50, x.shape, generator=torch.Generator().manual_seed(7 + i))
                for i in range(len(train))
            ]
            index = train.index(rank)
            x = x - sum(noise[1:]) if index == 0 else noise[index].to(torch.float64)
        out[name] = cut(x, sdims, train, rank).to(sdt)
    return out


def holds(versions: ws.WeightVersions, infer: tuple[int, ...], rank: int, version: int) -> bool:
    """Whether ``versions`` holds exactly ``version`` (the oracle's shards)."""
    if rank not in infer:
        return versions.weights == {}
    return sorted(versions.weights) == sorted(TENSORS) and all(
        versions.weights[name].dtype == TENSORS[name][2]
        and torch.equal(
            versions.weights[name].to(torch.float64),
            cut(global_tensor(name, version), TENSORS[name][5], infer, rank),
        )
        for name in TENSORS
    )


def inject(fault: str, at: str, store, key: str) -> None:
    """Arm ``fault`` in this process: it strikes at this rank's wait ``at``
    ("wait 2": its third wait for a message of a bucket), before it posts
    the all-reduce ``at`` ("agreeing the inputs", "agreeing the digests"), or, for a flipped
    byte, at its post number ``at`` (of those that send), and records when
    in the store under ``key``."""
    if fault == "flipped byte":
        real_batch = ws.dist.batch_isend_irecv
        posts = []

        def flipping(ops):
            sends = [op for op in ops if op.op is ws.dist.isend]
            posts.append(bool(sends))
            if sum(posts) == int(at) + 1 and sends:
                store.set(key, repr(time.monotonic()))
                # A changed copy goes on the wire: a message may be a view
                # of the sender's own weights, which the fault must not touch.
                op = sends[-1]
                flipped = op.tensor.clone()
                raw = flipped.view(-1).view(torch.uint8)
                raw[len(posts) % raw.numel()] ^= 0x20
                ops = [
                    ws.dist.P2POp(o.op, flipped, o.peer, o.group, o.tag) if o is op else o
                    for o in ops
                ]
                ws.dist.batch_isend_irecv = real_batch  # one flip
            return real_batch(ops)

        ws.dist.batch_isend_irecv = flipping
        return
    if at.startswith("agreeing"):
        # Before the all-reduce is posted: once posted, gloo's own thread
        # completes it even while this rank's main thread is frozen.
        real_call = ws._call

        def faulty_call(post, what):
            if what == at:
                ws._call = real_call
                strike(fault, store, key)
            return real_call(post, what)

        ws._call = faulty_call
        return
    real_wait = ws._wait
    waits = []

    def faulty(work, end, what):
        if what.startswith("bucket "):
            waits.append(what)
        if what.startswith("bucket ") and len(waits) == int(at[5:]) + 1:
            ws._wait = real_wait
            strike(fault, store, key)
        return real_wait(work, end, what)

    ws._wait = faulty


def strike(fault: str, store, key: str) -> None:
    store.set(key, repr(time.monotonic()))
    if fault == "frozen rank":
        time.sleep(DEADLINE_S + 3.0)
        store.set("woke at", repr(time.monotonic()))
    else:
        os._exit(17)


def faulted_sync(ctx, fault: str, victim: int, at: str, repeats: int = 1) -> dict:
    """One case on this rank: version 1, then version 2 with ``fault`` on
    ``victim`` (``repeats`` times for flipped bytes, each retried)."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    # Every piece that can travel alone does (these tensors are small), so
    # that faults strike views of the senders' shards and receives straight
    # into the staged tensors too.
    ws._ALONE_BYTES = 0
    plan = ws.plan_weight_sync(*declarations(TRAIN, INFER), bucket_bytes=BUCKET_BYTES)
    versions = ws.WeightVersions()
    plan.sync(shards(TRAIN, ctx.rank, 1), versions, timeout=30)
    report = {"v1": holds(versions, INFER, ctx.rank, 1), "attempts": []}
    for i in range(repeats):
        key = f"fault at {i}"
        if ctx.rank == victim:
            inject(fault, at, store, key)
        dist.barrier()
        attempt: dict = {}
        try:
            plan.sync(shards(TRAIN, ctx.rank, 2), versions, timeout=DEADLINE_S)
            attempt["error"] = None
        except (ws.WeightSyncFailed, distir.errors.Excluded) as e:
            attempt["error"] = type(e).__name__
            attempt["message"] = str(e)
        named = time.monotonic()
        fault_at = float(store.get(key))
        woke = ctx.rank == victim and fault == "frozen rank"
        since = float(store.get("woke at")) if woke else fault_at
        attempt["seconds"] = named - since
        attempt["bound"] = GRACE_S if woke else DEADLINE_S + GRACE_S
        attempt["kept"] = versions.version == 1 and holds(versions, INFER, ctx.rank, 1)
        report["attempts"].append(attempt)
        if fault == "flipped byte":
            # The group still works: the next attempt goes on at once.
            plan.sync(shards(TRAIN, ctx.rank, 2), versions, timeout=30)
            report["next"] = versions.version == 2 and holds(versions, INFER, ctx.rank, 2)
            versions = ws.WeightVersions()
            plan.sync(shards(TRAIN, ctx.rank, 1), versions, timeout=30)
    if fault == "flipped byte":
        return report
    try:
        # A survivor may wait in the old group until its own deadline before
        # it joins: the window is longer than the sync's deadline.
        m = distir.recover(deadline=2 * DEADLINE_S + 6.0, join_window=DEADLINE_S + 1.5)
    except distir.errors.Excluded as e:
        report["next"] = f"excluded: {type(e).__name__}"
        return report
    # Plan again for the ranks that are left; every survivor holds version 1.
    train = tuple(r for r in TRAIN if r in m.ranks)
    infer = tuple(r for r in INFER if r in m.ranks)
    again = ws.plan_weight_sync(*declarations(train, infer), bucket_bytes=BUCKET_BYTES)
    again.sync(shards(train, ctx.rank, 2), versions, timeout=30, group=m.group)
    report["next"] = versions.version == 2 and holds(versions, infer, ctx.rank, 2)
    report["members"] = m.ranks
    return report


def check(fault: str, victim: int, at: str, reports: dict[int, dict]) -> list[str]:
    """What went wrong in one case (nothing: every rank passed)."""
    problems = []
    for rank, report in sorted(reports.items()):
        if not report["v1"]:
            problems.append(f"rank {rank}: version 1 differs from the oracle")
        for attempt in report["attempts"]:
            if attempt["error"] is None:
                problems.append(f"rank {rank}: the faulted sync published")
            if attempt["seconds"] > attempt["bound"]:
                problems.append(
                    f"rank {rank}: named the error after {attempt['seconds']:.2f} s "
                    f"(bound {attempt['bound']:g} s)"
                )
            if not attempt["kept"]:
                problems.append(f"rank {rank}: version 1 not kept intact")
        frozen = fault == "frozen rank" and rank == victim
        if report.get("next") is not True and not (
            frozen and str(report.get("next")).startswith("excluded")
        ):
            problems.append(f"rank {rank}: the next attempt: {report.get('next')}")
    lost = fault.startswith("killed")
    expected = set(range(4)) - ({victim} if lost else set())
    if set(reports) != expected:
        problems.append(f"reports from ranks {sorted(reports)}, expected {sorted(expected)}")
    return problems


def run_case(fault: str, victim: int, at: str, repeats: int = 1) -> tuple[int, list[str]]:
    """Launch one case; returns (faults injected, problems)."""
    args = (fault, victim, at, repeats)
    if fault == "flipped byte":
        reports = dict(enumerate(distir.launch(faulted_sync, 4, *args, pass_context=True,
                                               timeout=300)))  # fmt: skip
    else:
        outcome = distir.launch(faulted_sync, 4, *args, pass_context=True, timeout=300, tolerate=1)
        reports = outcome.results
    return repeats, check(fault, victim, at, reports)


#: every injected fault: (kind, victim rank, where, how many in one launch)
CASES = [
    *[("flipped byte", victim, at, 5) for victim in TRAIN for at in ("0", "2")],
    *[("killed receiver", v, at, 1) for v in INFER
      for at in ("agreeing the inputs", "wait 0", "wait 2", "wait 4", "agreeing the digests")],
    *[("killed sender", v, at, 1) for v in TRAIN
      for at in ("agreeing the inputs", "wait 0", "wait 2", "wait 4", "agreeing the digests")],
    *[("frozen rank", v, at, 1) for v in (0, 3)
      for at in ("agreeing the inputs", "wait 0", "wait 2", "wait 4", "agreeing the digests")],
]  # fmt: skip


if __name__ == "__main__":
    counts: Counter = Counter()
    named: Counter = Counter()
    start = time.perf_counter()
    for fault, victim, at, repeats in CASES:
        injected, problems = run_case(fault, victim, at, repeats)
        counts[fault] += injected
        if not problems:
            named[fault] += injected
        for problem in problems:
            print(f"  {fault} on rank {victim} at {at}: {problem}")
    total = sum(counts.values())
    print(
        f"{sum(named.values())} of {total} injected faults ended in a named error on every "
        f"rank within the deadline + {GRACE_S:g} s, no partially published version, and "
        f"the next attempt succeeded ({time.perf_counter() - start:.0f} s)"
    )
    for fault in counts:
        print(f"  {fault}: {named[fault]} of {counts[fault]}")
