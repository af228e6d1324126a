"""Threshold aggregation of 1M floats: each step timed against the plaintext all-reduce.

For P local gloo ranks (threshold t = P//2 + 1) every rank encrypts its
update of S floats as ceil(S/4096) CKKS ciphertexts (N = 8192) and the
protocol runs once: key generation, encryption, aggregation (commitments
and the ciphertext all-reduce), decryption by all P ranks, and the key
switch to an outside receiver; the baseline is one `dist.all_reduce` of the
same S floats as float32. Every step starts after a barrier; its time is
the maximum over ranks. Each rank's peak resident memory (``ru_maxrss``)
is read after aggregation and at the end, and the table gives the largest
over ranks: ``--stream-mb`` sets what `aggregate` holds of every rank's
ciphertexts at once (``distir.aggregation.threshold.STREAM_BYTES``; 0 for
all of them, as before it streamed), several values run side by side.
Results go to stdout as a Markdown table.

    python benchmarks/threshold_aggregation.py [--nproc 2 4 8] [--size 1048576] [--stream-mb 32 0]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import time

import numpy as np
import torch

from distir.runtime.launch import launch

SLOTS = 4096


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rank_main(
    ctx, threshold: int, size: int, receiver_key: torch.Tensor, stream_bytes: int
) -> dict:
    import tenseal as ts
    import torch.distributed as dist

    from distir.aggregation import threshold as ta

    ta.STREAM_BYTES = stream_bytes
    times: dict[str, float] = {}
    peaks = {"start": _peak_mb()}

    def step(name, fn):
        dist.barrier()
        start = time.perf_counter()
        out = fn()
        times[name] = time.perf_counter() - start
        return out

    values = np.random.default_rng(ctx.rank).normal(size=size) * 0.01
    plain = torch.from_numpy(values.astype(np.float32))
    step("plaintext all-reduce", lambda: dist.all_reduce(plain))
    params = ta.ThresholdParameters(
        parties=ctx.world_size, threshold=threshold, decrypt_to_ranks=True
    )
    share = step("key generation", lambda: ta.generate_keys(params, deadline=600))
    context = share.public_key.context()
    chunks = [values[i : i + SLOTS].tolist() for i in range(0, size, SLOTS)]
    encrypted = step("encryption", lambda: [ts.ckks_vector(context, c) for c in chunks])
    total = step("aggregation", lambda: ta.aggregate(encrypted, share, deadline=600))
    peaks["aggregation"] = _peak_mb()
    decrypted = step("decryption", lambda: ta.decrypt(total, share, deadline=600))
    step("key switch", lambda: ta.switch_key(total, share, receiver_key, deadline=600))
    flat = np.concatenate([np.array(d) for d in decrypted])[:size]
    peaks["end"] = _peak_mb()
    return {
        "times": times,
        "peaks": peaks,
        "decrypted": flat if ctx.rank == 0 else None,
        "values": values,
        "bytes": int(total.limbs.numel() * 8),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--stream-mb", type=int, nargs="+", default=[32])
    args = parser.parse_args()

    from distir.he import threshold as th
    from distir.he.seal import public_key_limbs

    steps = [
        "plaintext all-reduce",
        "key generation",
        "encryption",
        "aggregation",
        "decryption",
        "key switch",
    ]
    print(
        f"{args.size} floats ({math.ceil(args.size / SLOTS)} ciphertexts of {SLOTS} slots, "
        "CKKS N=8192), seconds, max over ranks; peak RSS per rank in MB (largest rank: at "
        f"start, after aggregation, at the end); load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print()
    print(
        "| P | t | stream MB | "
        + " | ".join(steps)
        + " | max abs error | peak RSS start / aggregation / end |"
    )
    print("|---|---|---|" + "---|" * (len(steps) + 2))
    for nproc, stream_mb in [(p, m) for p in args.nproc for m in args.stream_mb]:
        threshold = nproc // 2 + 1
        params = th.ThresholdParameters(parties=nproc, threshold=threshold)
        receiver = th.receiver_context(params)
        reports = launch(
            rank_main,
            nproc,
            threshold,
            args.size,
            public_key_limbs(receiver),
            (stream_mb << 20) if stream_mb else 1 << 62,
            pass_context=True,
            timeout=3600,
            collective_timeout=900,
        )
        plain = sum(r["values"] for r in reports)
        err = float(np.abs(reports[0]["decrypted"] - plain).max())
        cells = [f"{max(r['times'][s] for r in reports):.3g}" for s in steps]
        peaks = " / ".join(
            f"{max(r['peaks'][k] for r in reports):.0f}" for k in ("start", "aggregation", "end")
        )
        print(
            f"| {nproc} | {threshold} | {stream_mb or 'all'} | "
            + " | ".join(cells)
            + f" | {err:.1e} | {peaks} |",
            flush=True,
        )
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
