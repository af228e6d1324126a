"""Which payload layouts keep a riding digest's sum bit-identical to DDP's.

`distir.ddp.sum_hook` lets an 8-element digest ride at the end of each
bucket only at 2 ranks: at 3 and 4 the longer payload moves gloo's
segment boundaries, an element lands in a segment whose ring reduction
starts at another rank, and its sum differs from DDP's default by an ulp.
This trial sums random buckets (values spread over many binades, so that
the order of addition shows) of N elements with `dist.all_reduce` (DDP's
default) and, on the same values, each candidate payload, and lists the
(N, seed) whose gradients differ from the default in any bit:

- `append`: the gradients, then the 8 riding elements (today's layout);
- `segments K`: the gradients cut into K chunks of ceil(N/K), each followed
  by ceil(8/K) riding slots (the digest's 8 in the first of them), so that
  for K = gloo's segment count every chunk keeps its segment: K = P, and
  `gloo K` = `gloo_segments(N)`, the count gloo's ring all-reduce cuts N
  elements into as this trial infers it (below).

Measured (torch 2.13 CPU, 2 cores; N = 5 ... 6,000,001, 3 seeds each):
`append` differs at 3 and 4 ranks for most N below 2^20 (bit-identical at
3M and 6M, where 8 more elements rarely move a boundary across an element
whose order shows); `segments P` differs at P=3 for small N and at P=4
from 3M; `gloo K` is bit-identical at P=3 and P=4 for every N tried. So
the order of a sum depends only on which rank's chunk of gloo's ring an
element lies in, and gloo cuts a buffer of B bytes into
roundUp(max(ceil(B / 1 MiB), 2P), P) segments of equal size (rounded up to
an element), P consecutive groups of them forming the ranks' chunks: a
layout that puts each of those segments' gradients in a segment of its own
with riding slots after it keeps DDP's bits, as long as the slots do not
change the segment count (B' = B + slots·4 below the next MiB multiple).
The 1 MiB and the minimum of two segments per rank, inferred here from
these measurements, are what gloo's source says (gloo/allreduce.cc `ring`,
`kMaxSegmentSize` in gloo/allreduce.h); tests/ddp/test_riding_layout.py
checks the layout against a model of that ring.

    python benchmarks/riding_layout.py [--nproc 3 4]
"""

from __future__ import annotations

import argparse
import math

import torch

from distir.runtime.launch import launch

SIZES = [5, 97, 4099, 262147, 1048577, 3000001, 6000001]
RIDING = 8


def gloo_segments(n: int, size: int, element_bytes: int = 4) -> int:
    """The segments gloo's ring all-reduce cuts `n` elements into at `size`
    ranks, as inferred above."""
    wanted = max(-(-n * element_bytes // (1 << 20)), 2 * size)
    return -(-wanted // size) * size


def _layouts(g: torch.Tensor, size: int) -> dict:
    n = g.numel()
    out = {"append": (torch.cat([g, torch.zeros(RIDING)]), lambda t: t[:n])}
    for segments in (size, gloo_segments(n, size)):
        chunk, pad = math.ceil(n / segments), math.ceil(RIDING / segments)
        flat = torch.zeros(segments * chunk)
        flat[:n] = g
        payload = torch.zeros(segments, chunk + pad)
        payload[:, :chunk] = flat.view(segments, chunk)
        name = f"segments {segments}" if segments == size else f"gloo {segments}"
        out[name] = (
            payload.reshape(-1),
            lambda t, s=segments, c=chunk, p=pad: t.view(s, c + p)[:, :c].reshape(-1)[:n],
        )
    return out


def rank_main(ctx, sizes: list[int]) -> dict[str, list[int]]:
    import torch.distributed as dist

    differ: dict[str, list[int]] = {}
    for n in sizes:
        for seed in range(3):
            gen = torch.Generator().manual_seed(seed * 100 + ctx.rank)
            g = torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 6)
            default = g.clone()
            dist.all_reduce(default)
            for name, (payload, gradients) in _layouts(g, ctx.world_size).items():
                dist.all_reduce(payload)
                if not torch.equal(gradients(payload), default):
                    differ.setdefault(name, []).append(n)
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[3, 4])
    args = parser.parse_args()
    for size in args.nproc:
        differ = launch(rank_main, size, SIZES, pass_context=True, timeout=900)[0]
        print(f"P={size}: sizes N (one per seed of 3) whose sum differs from DDP's default:")
        for name in ["append", f"segments {size}"]:
            print(f"  {name:12} {differ.get(name, []) or 'none (bit-identical)'}")
        gloo = sorted(k for k in differ if k.startswith("gloo"))
        print(f"  gloo K       {[(k, differ[k]) for k in gloo] or 'none (bit-identical)'}")


if __name__ == "__main__":
    main()
