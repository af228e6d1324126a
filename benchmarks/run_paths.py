"""The layers of a small run, as paired ratios against the raw c10d call.

At P local gloo ranks (default 2), for a 4 KiB (or `--bytes`) f32
all-reduce and broadcast, each iteration runs, in a rotated order and each
after a `dist.barrier()`, the raw in-place `dist.all_reduce` /
`dist.broadcast` and one donated, trusted (`agreement=False`) distir run
through each path a run can take:

- `direct`: the binding's specialised run, which submits the one
  collective itself (`distir.runtime.specialised`, `DirectCollective`);
- `chain`: the specialised run through the block's bound kernel (the
  specialised run before it inlined the collective: four more Python calls);
- `general`: `Program.run` with `specialise = False` (every rule in full);
- `verified`: the specialised run of a program with agreement at every run
  (its direct collective after the run's one agreement exchange), beside
  `raw + tiny`: one 8-word `all_to_all_single` and the raw call.

A row reports, on rank 0, the median over iterations of (variant time / raw
time of the same iteration): the pairing cancels most of what load on a
shared machine does to both.

    python benchmarks/run_paths.py [--iterations 400] [--nproc 2] [--bytes 4096]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from distir.runtime.launch import launch

VARIANTS = ("raw", "direct", "chain", "general", "verified", "raw + tiny")


def _program(kind: str, n: int, agreement: bool):
    import distir

    t = f"tensor<{n}xf32>"
    body = {
        "all_reduce": f"%y = dist.all_reduce sum %x : {t}",
        "broadcast": f"%y = dist.broadcast %x root 0 : {t}",
    }[kind]
    return distir.compile(
        f"func.func @main(%x: {t}) -> {t} {{\n  {body}\n  func.return %y : {t}\n}}",
        agreement=agreement,
    )


def rank_main(ctx, iterations: int, n: int) -> dict:
    import torch.distributed as dist

    from distir.runtime.specialised import direct_collective

    out = {}
    for kind in ("all_reduce", "broadcast"):
        direct = _program(kind, n, agreement=False)
        chain = _program(kind, n, agreement=False)
        general = _program(kind, n, agreement=False)
        general.specialise = False
        verified = _program(kind, n, agreement=True)
        buffers = {v: torch.rand(n) for v in VARIANTS}
        tiny = torch.zeros(8 * ctx.world_size, dtype=torch.int64)
        for program in (direct, chain, general, verified):
            for _ in range(2):  # the general run that binds, then the specialised one
                program.run(torch.rand(n), donate=True)
        # `chain`: its specialised run made again without the direct collective
        binding = chain._bindings[None]
        binding.direct.clear()
        binding.specialised.clear()
        chain.run(torch.rand(n), donate=True)
        assert direct_collective(direct._bindings[None]) is not None
        assert direct_collective(binding) is None
        raw = (
            (lambda t: dist.all_reduce(t))
            if kind == "all_reduce"
            else (lambda t: dist.broadcast(t, 0))
        )
        programs = {"direct": direct, "chain": chain, "general": general, "verified": verified}
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for it in range(iterations):
            order = VARIANTS[it % len(VARIANTS) :] + VARIANTS[: it % len(VARIANTS)]
            for v in order:
                dist.barrier()
                t0 = time.perf_counter()
                if v == "raw":
                    raw(buffers[v])
                elif v == "raw + tiny":
                    dist.all_to_all_single(tiny.clone(), tiny)
                    raw(buffers[v])
                else:
                    buffers[v] = programs[v].run(buffers[v], donate=True)
                times[v].append(time.perf_counter() - t0)
        skip = min(10, iterations // 10)
        out[kind] = {
            v: statistics.median(
                t / r for t, r in zip(times[v][skip:], times["raw"][skip:], strict=True)
            )
            for v in VARIANTS
        }
        out[kind]["raw us"] = statistics.median(times["raw"][skip:]) * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--bytes", type=int, default=4096)
    args = parser.parse_args()
    results = launch(rank_main, args.nproc, args.iterations, args.bytes // 4,
                     pass_context=True, timeout=1200)[0]  # fmt: skip
    print(f"P={args.nproc}, {args.bytes} B f32, {args.iterations} iterations: median of "
          "per-iteration ratios to raw (rank 0)")  # fmt: skip
    for kind, row in results.items():
        cells = ", ".join(f"{v} {row[v]:.2f}x" for v in VARIANTS)
        print(f"{kind:10} raw {row['raw us']:.0f} us; {cells}")


if __name__ == "__main__":
    main()
