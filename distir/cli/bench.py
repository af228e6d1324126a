"""`distir-bench`: distir against raw torch.distributed, side by side.

    distir-bench --quick
    distir-bench --nproc 2 4 --sizes 16M 64M --json results.json --plot busbw.png

For every group size P it starts P local ranks (gloo over loopback; NCCL with
`--backend nccl`) and, for every family of rows and message size, times the
raw torch.distributed call and each distir variant in the same loop, one
after the other in every iteration, so that they see the same machine. The
time of an iteration is the maximum over ranks (a barrier before each call).
Each row reports the median and the min-max over iterations, algbw and busbw
(nccl-tests conventions: S is the whole buffer, the output for all-gather
and the input for all-to-all; busbw = algbw x 2(P-1)/P for all-reduces,
(P-1)/P for all-gather and all-to-all, 1 for broadcast) and the ratio of
medians against the raw baseline of its family:

  all_reduce   `dist.all_reduce sum` f32        vs dist.all_reduce, in place
  broadcast    `dist.broadcast root 0` f32      vs dist.broadcast
  all_gather   `dist.all_gather` f32            vs all_gather_into_tensor
  all_to_all   `dist.variable_all_to_all` f32   vs all_to_all_single with splits
  combine      a generic commutative combine on i64, (a + b) mod 2^32, as
               gather-fold, ring and halving-doubling vs a native i64 sum
  ciphertext   `dist.all_reduce_add_ciphertext`, 4 limbs with moduli < 2^60,
               per lowering (the automatic choice, exact-modular-sum, the
               deferral pass, lower-ciphertext-add + gather-fold or + ring)
               vs a native i64 sum of the same bytes
  ciphertext62 the same with moduli near 2^62 (no headroom to defer)
  wave         32 native f32 all-reduces of S/32 each, separate or with
               bucket-all-reduces, vs 32 dist.all_reduce calls

A dispatch check runs a 1-rank group through a chain of 1,000 small
all-reduces and reports the microseconds per op that `Program.run` adds over
calling torch.distributed directly.

Output: a table on the terminal (with a line per measurement while it
runs), a JSON file and, with matplotlib (extra `bench`), a PNG of busbw
against size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

KIB = 1 << 10
MIB = 1 << 20

FULL_SIZES = ("4K", "64K", "1M", "16M", "64M")
QUICK_SIZES = ("4K", "1M", "16M")
FAMILIES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_to_all",
    "combine",
    "ciphertext",
    "ciphertext62",
    "wave",
)
WAVE_MEMBERS = 32
MODULI_60 = ((1 << 60) - 93, (1 << 60) - 173, (1 << 59) - 55, (1 << 58) - 27)
MODULI_62 = ((1 << 62) - 57, (1 << 62) - 87, (1 << 62) - 117, (1 << 61) - 1)


def parse_size(text: str) -> int:
    """`4K`, `16M`, `1G` or a plain number of bytes."""
    units = {"K": KIB, "M": MIB, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def format_size(size: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", MIB), ("K", KIB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def iterations_for(size: int, quick: bool) -> tuple[int, int]:
    """(timed iterations, warm-up iterations) for a message size."""
    if quick:
        return (10, 2) if size <= 64 * KIB else (5, 1) if size <= MIB else (3, 1)
    if size <= 64 * KIB:
        return 30, 3
    if size <= MIB:
        return 15, 2
    return (7, 1) if size <= 16 * MIB else (5, 1)


def bus_factor(family: str, size: int) -> float:
    if family == "broadcast":
        return 1.0
    if family in ("all_gather", "all_to_all"):
        return (size - 1) / size
    return 2 * (size - 1) / size


###############################################################################
# The rows: programs, inputs and the raw baseline of every family
###############################################################################


@dataclass(frozen=True)
class Variant:
    name: str
    pipeline: str = ""
    implementations: dict[str, str] | None = None
    agreement: bool = True  # False: Program.run(..., agreement=False)


@dataclass
class Setup:
    """One family at one size on one rank: program text per variant, inputs,
    and the raw call (with an untimed reset before each timed call)."""

    texts: dict[str, str]
    inputs: tuple
    raw: Callable[[], Any]
    reset: Callable[[], Any] | None = None
    nbytes: int = 0


def _variants(family: str, size: int) -> tuple[Variant, ...]:
    select = "select-all-reduce-algorithm"
    if family == "combine":
        return (
            Variant("gather-fold", f"{select}{{commutative=gather-fold}}"),
            Variant("ring", select),
            Variant("halving-doubling", f"{select}{{commutative=halving-doubling}}"),
        )
    if family == "ciphertext":
        return (
            Variant("auto"),
            Variant("auto, no agreement", agreement=False),
            Variant("exact-modular-sum", "", {"dist.all_reduce_add_ciphertext": "exact-modular-sum"}),
            Variant("defer-pass", f"defer-modular-reduction{{max-group-size={size}}}"),
            Variant("lowered+gather-fold", "lower-ciphertext-add"),
            Variant("lowered+ring", f"lower-ciphertext-add,{select}"),
        )
    if family == "ciphertext62":
        return (
            Variant("auto"),
            Variant("exact-modular-sum", "", {"dist.all_reduce_add_ciphertext": "exact-modular-sum"}),
        )
    if family == "wave":
        return (Variant("separate"), Variant("bucketed", "bucket-all-reduces"))
    if family == "all_reduce":
        return (Variant("distir"), Variant("distir, no agreement", agreement=False))
    return (Variant("distir"),)


def _all_gather_single(dist):
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def make_setup(family: str, nbytes: int, size: int, rank: int, device: str) -> Setup:
    import torch
    import torch.distributed as dist

    gen = torch.Generator().manual_seed(1234 + rank)

    def f32(n: int):
        return torch.rand(n, generator=gen).to(device)

    if family in ("all_reduce", "broadcast"):
        n = max(1, nbytes // 4)
        t = f"tensor<{n}xf32>"
        x = f32(n)
        buf = x.clone()
        if family == "all_reduce":
            body = f"%y = dist.all_reduce sum %x : {t}"
            text = _program([("x", t)], body, [("y", t)])
            return Setup({v.name: text for v in _variants(family, size)}, (x,),
                         lambda: dist.all_reduce(buf), lambda: buf.copy_(x), n * 4)  # fmt: skip
        body = f"%y = dist.broadcast %x root 0 : {t}"
        return Setup({"distir": _program([("x", t)], body, [("y", t)])}, (x,),
                     lambda: dist.broadcast(buf, src=0), lambda: buf.copy_(x), n * 4)  # fmt: skip
    if family == "all_gather":
        m = max(1, nbytes // 4 // size)
        x = f32(m)
        out = torch.empty(m * size, device=device)
        gather = _all_gather_single(dist)
        body = f"%y = dist.all_gather %x axis 0 : tensor<{m}xf32> -> tensor<{m * size}xf32>"
        text = _program([("x", f"tensor<{m}xf32>")], body, [("y", f"tensor<{m * size}xf32>")])
        return Setup({"distir": text}, (x,), lambda: gather(out, x), None, m * size * 4)
    if family == "all_to_all":
        # Uneven splits: rank r sends w(r, j) units to j; every row and column
        # of w sums to P(P+1)/2, so each rank sends and receives about S.
        unit = max(1, nbytes // 4 // (size * (size + 1) // 2))

        def weight(a: int, b: int) -> int:
            return (a + b) % size + 1

        send = [weight(rank, j) * unit for j in range(size)]
        recv = [weight(j, rank) * unit for j in range(size)]
        n = sum(send)
        x = f32(n)
        out = torch.empty(sum(recv), device=device)
        counts = torch.tensor(send, dtype=torch.int64, device=device)
        body = (f"%y, %rc = dist.variable_all_to_all %x, %c axis 0 : tensor<{n}xf32>, "
                f"tensor<{size}xi64> -> tensor<?xf32>")  # fmt: skip
        text = _program([("x", f"tensor<{n}xf32>"), ("c", f"tensor<{size}xi64>")], body,
                        [("y", "tensor<?xf32>"), ("rc", f"tensor<{size}xi64>")])  # fmt: skip
        return Setup({"distir": text}, (x, counts),
                     lambda: dist.all_to_all_single(out, x, recv, send), None, n * 4)  # fmt: skip
    if family == "combine":
        n = max(1, nbytes // 8)
        t = f"tensor<{n}xi64>"
        x = torch.randint(0, 1 << 32, (n,), generator=gen).to(device)
        buf = x.clone()
        body = (f"%y = dist.all_reduce %x commutative : {t} combine(%a, %b) {{\n"
                f"    %s = arith.addi %a, %b : {t}\n"
                f"    %m = arith.constant dense<4294967295> : {t}\n"
                f"    %r = arith.andi %s, %m : {t}\n"
                f"    dist.yield %r : {t}\n  }}")  # fmt: skip
        text = _program([("x", t)], body, [("y", t)])
        return Setup({v.name: text for v in _variants(family, size)}, (x,),
                     lambda: dist.all_reduce(buf), lambda: buf.copy_(x), n * 8)  # fmt: skip
    if family in ("ciphertext", "ciphertext62"):
        moduli = MODULI_60 if family == "ciphertext" else MODULI_62
        bits = 60 if family == "ciphertext" else 62
        limbs = len(moduli)
        n = max(1, nbytes // 8 // limbs)
        t = f"tensor<{limbs}x{n}xi64>"
        q = torch.tensor(moduli, dtype=torch.int64)
        ct = (torch.randint(0, 1 << 62, (limbs, n), generator=gen) % q.view(-1, 1)).to(device)
        buf = ct.clone()
        body = (f"%y = dist.all_reduce_add_ciphertext %ct, %q max_modulus_bits {bits} : "
                f"{t}, tensor<{limbs}xi64>")  # fmt: skip
        text = _program([("ct", t), ("q", f"tensor<{limbs}xi64>")], body, [("y", t)])
        return Setup({v.name: text for v in _variants(family, size)}, (ct, q.to(device)),
                     lambda: dist.all_reduce(buf), lambda: buf.copy_(ct), limbs * n * 8)  # fmt: skip
    if family == "wave":
        m = max(1, nbytes // 4 // WAVE_MEMBERS)
        t = f"tensor<{m}xf32>"
        xs = [f32(m) for _ in range(WAVE_MEMBERS)]
        bufs = [x.clone() for x in xs]
        args = [(f"x{i}", t) for i in range(WAVE_MEMBERS)]
        body = "\n  ".join(f"%y{i} = dist.all_reduce sum %x{i} : {t}" for i in range(WAVE_MEMBERS))
        text = _program(args, body, [(f"y{i}", t) for i in range(WAVE_MEMBERS)])

        def raw_wave():
            for b in bufs:
                dist.all_reduce(b)

        def reset_wave():
            for b, x in zip(bufs, xs):
                b.copy_(x)

        return Setup({v.name: text for v in _variants(family, size)}, tuple(xs), raw_wave,
                     reset_wave, m * WAVE_MEMBERS * 4)  # fmt: skip
    raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")


def _program(args: Sequence[tuple[str, str]], body: str, results: Sequence[tuple[str, str]]) -> str:
    params = ", ".join(f"%{name}: {t}" for name, t in args)
    types = ", ".join(t for _, t in results)
    values = ", ".join(f"%{name}" for name, _ in results)
    return (
        f"func.func @main({params}) -> ({types}) {{\n  {body}\n"
        f"  func.return {values} : {types}\n}}\n"
    )


###############################################################################
# The rank side
###############################################################################


@dataclass(frozen=True)
class BenchConfig:
    sizes: tuple[int, ...]
    families: tuple[str, ...]
    quick: bool = False
    iters: int | None = None
    warmup: int | None = None
    backend: str = "gloo"


def _timer(device: str):
    import torch

    if device == "cuda":
        def sync():
            torch.cuda.synchronize()
    else:
        def sync():
            return None
    return sync


def bench_rank(context, config: BenchConfig) -> list[dict]:
    """Runs on every rank; returns the rows (identical on every rank)."""
    import torch
    import torch.distributed as dist

    import distir

    size, rank = context.world_size, context.rank
    device = "cuda" if config.backend == "nccl" else "cpu"
    sync = _timer(device)
    rows: list[dict] = []
    for family in config.families:
        for nbytes in config.sizes:
            setup = make_setup(family, nbytes, size, rank, device)
            variants = _variants(family, size)
            programs = {
                v.name: distir.compile(setup.texts[v.name], v.pipeline,
                                       implementations=v.implementations)  # fmt: skip
                for v in variants
            }
            iters, warm = iterations_for(nbytes, config.quick)
            iters = config.iters or iters
            warm = warm if config.warmup is None else config.warmup
            calls: list[tuple[str, Callable[[], Any], Callable[[], Any] | None]] = [
                ("raw", setup.raw, setup.reset)
            ]
            for v in variants:
                calls.append((v.name, _runner(programs[v.name], setup.inputs, v.agreement), None))
            times: dict[str, list[float]] = {name: [] for name, _, _ in calls}
            for i in range(warm + iters):
                for name, call, reset in calls:
                    if reset is not None:
                        reset()
                    sync()
                    dist.barrier()
                    start = time.perf_counter()
                    call()
                    sync()
                    elapsed = time.perf_counter() - start
                    if i >= warm:
                        times[name].append(elapsed)
            for name in times:  # the time of an iteration is its slowest rank
                t = torch.tensor(times[name], dtype=torch.float64, device=device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                times[name] = t.cpu().tolist()
            raw_median = statistics.median(times["raw"])
            for name, _, _ in calls:
                rows.append(_row(family, name, size, nbytes, setup.nbytes, times[name],
                                 raw_median, programs.get(name)))  # fmt: skip
            if rank == 0:
                _progress(family, size, nbytes, rows[-len(calls):])
            del setup, programs
    return rows


def _runner(program, inputs, agreement: bool) -> Callable[[], Any]:
    if agreement:
        def run():
            program.run(*inputs)  # the result is dropped, as a caller would
    else:
        def run():
            program.run(*inputs, agreement=False)

    return run


def _row(family, variant, size, nominal, nbytes, times, raw_median, program) -> dict:
    median = statistics.median(times)
    algbw = nbytes / median / 1e9 if median > 0 else 0.0
    plan = [name for _, name in program.plan_summary()] if program is not None else []
    return {
        "family": family,
        "variant": variant,
        "P": size,
        "size": nominal,
        "size_label": format_size(nominal),
        "bytes": nbytes,
        "median_ms": median * 1e3,
        "min_ms": min(times) * 1e3,
        "max_ms": max(times) * 1e3,
        "iterations": len(times),
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * bus_factor(family, size),
        "raw_median_ms": raw_median * 1e3,
        "ratio_to_raw": median / raw_median if raw_median > 0 else float("nan"),
        "implementations": sorted(set(plan)),
    }


def _progress(family: str, size: int, nbytes: int, rows: Sequence[dict]) -> None:
    parts = [f"{r['variant']} {r['median_ms']:.2f} ms" + ("" if r["variant"] == "raw"
             else f" ({r['ratio_to_raw']:.2f}x)") for r in rows]  # fmt: skip
    print(f"  P={size} {family:<12} {format_size(nbytes):>4}: " + " | ".join(parts),
          file=sys.stderr, flush=True)  # fmt: skip


def dispatch_rank(context, chain: int, repeats: int, backend: str) -> dict:
    """A 1-rank group: `chain` dependent all-reduces of 4 floats, as raw
    calls, through the op's implementation alone, through Program.run, and
    through Program.run with an implementation that reduces in place (what
    the runtime would run if it could donate dead intermediates): the last
    one isolates the runtime's own dispatch cost."""
    import torch
    import torch.distributed as dist

    import distir
    from distir.backends.groups import ProcessGroupResource
    from distir.backends.registry import Implementation, ImplementationRegistry
    from distir.interpreters.invocation import make_invocation
    from distir.ir.dialect import AllReduceOp

    class InPlaceSum(Implementation):
        name = "in-place-sum"
        operation_types = (AllReduceOp,)

        def execute(self, invocation, inputs, resources, *, in_place):
            dist.all_reduce(inputs[0], group=resources.group)
            return (inputs[0],)

    class NoCollective(Implementation):
        name = "no-collective"
        operation_types = (AllReduceOp,)

        def execute(self, invocation, inputs, resources, *, in_place):
            return (inputs[0],)

    device = "cuda" if backend == "nccl" else "cpu"
    sync = _timer(device)
    t = "tensor<4xf32>"
    body = "\n  ".join(f"%x{i + 1} = dist.all_reduce sum %x{i} : {t}" for i in range(chain))
    text = _program([("x0", t)], body, [(f"x{chain}", t)])
    start = time.perf_counter()
    program = distir.compile(text)
    compile_s = time.perf_counter() - start
    in_place = distir.compile(text, registry=ImplementationRegistry([InPlaceSum()]))
    no_collective = distir.compile(text, registry=ImplementationRegistry([NoCollective()]))
    x = torch.rand(4, device=device)
    scratch = x.clone()
    op = next(op for op in program.choices if op.name == "dist.all_reduce")
    implementation = program.choices[op]
    invocation = make_invocation(op)
    resource = ProcessGroupResource(None)

    def raw():
        for _ in range(chain):
            dist.all_reduce(scratch)

    def raw_out_of_place():
        y = x
        for _ in range(chain):
            y = torch.empty_like(y).copy_(y)
            dist.all_reduce(y)

    def implementation_only():
        y = x
        for _ in range(chain):
            (y,) = implementation.execute(invocation, (y,), resource, in_place=False)

    def program_run():
        program.run(x)

    def program_run_in_place():
        in_place.run(scratch)

    def program_run_without_collectives():
        no_collective.run(scratch)

    measured: dict[str, list[float]] = {}
    calls = [("raw", raw), ("raw_out_of_place", raw_out_of_place),
             ("implementation_only", implementation_only), ("program_run", program_run),
             ("program_run_in_place", program_run_in_place),
             ("program_run_without_collectives", program_run_without_collectives)]  # fmt: skip
    for _ in range(2):
        for _, call in calls:
            call()
    for _ in range(repeats):
        for name, call in calls:
            sync()
            start = time.perf_counter()
            call()
            sync()
            measured.setdefault(name, []).append((time.perf_counter() - start) / chain * 1e6)
    per_op = {name: statistics.median(v) for name, v in measured.items()}
    return {
        "chain": chain,
        "repeats": repeats,
        "compile_s": compile_s,
        "us_per_op": per_op,
        "min_us_per_op": {name: min(v) for name, v in measured.items()},
        "overhead_us_per_op": per_op["program_run"] - per_op["raw"],
        "overhead_vs_out_of_place_us_per_op": per_op["program_run"] - per_op["raw_out_of_place"],
        "runtime_dispatch_us_per_op": per_op["program_run_in_place"] - per_op["raw"],
        "implementation_us_per_op": per_op["implementation_only"] - per_op["raw"],
    }


###############################################################################
# The parent: launch, print, save
###############################################################################


@dataclass
class Report:
    meta: dict
    rows: list[dict] = field(default_factory=list)
    dispatch: dict | None = None

    def to_json(self) -> dict:
        return {"meta": self.meta, "rows": self.rows, "dispatch": self.dispatch}


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def run_benchmark(args: argparse.Namespace) -> Report:
    from distir.runtime.launch import launch

    config = BenchConfig(
        sizes=tuple(parse_size(s) for s in args.sizes),
        families=tuple(args.families),
        quick=args.quick,
        iters=args.iters,
        warmup=args.warmup,
        backend=args.backend,
    )
    meta = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "backend": args.backend,
        "nproc": list(args.nproc),
        "sizes": [format_size(s) for s in config.sizes],
        "families": list(config.families),
        "quick": args.quick,
        "load_before": _load(),
    }
    try:
        import torch

        meta["torch"] = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    report = Report(meta)
    for nproc in args.nproc:
        print(f"distir-bench: P={nproc}, {args.backend}, sizes "
              f"{' '.join(meta['sizes'])} ...", file=sys.stderr, flush=True)  # fmt: skip
        per_rank = launch(bench_rank, nproc, config, backend=args.backend, pass_context=True,
                          timeout=args.timeout, collective_timeout=min(args.timeout, 300.0))  # fmt: skip
        report.rows.extend(per_rank[0])
    if args.dispatch_chain > 0:
        print(f"distir-bench: dispatch overhead, 1 rank, chain of {args.dispatch_chain} ops ...",
              file=sys.stderr, flush=True)  # fmt: skip
        report.dispatch = launch(dispatch_rank, 1, args.dispatch_chain, args.dispatch_repeats,
                                 args.backend, backend=args.backend, pass_context=True,
                                 timeout=args.timeout)[0]  # fmt: skip
    report.meta["load_after"] = _load()
    report.meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return report


def format_table(rows: Sequence[dict]) -> str:
    header = ("P", "family", "variant", "size", "median ms", "min-max ms", "algbw GB/s",
              "busbw GB/s", "x raw")  # fmt: skip
    lines = [header]
    for r in rows:
        lines.append((
            str(r["P"]), r["family"], r["variant"], r["size_label"], f"{r['median_ms']:.3f}",
            f"{r['min_ms']:.2f}-{r['max_ms']:.2f}", f"{r['algbw_GBps']:.3f}",
            f"{r['busbw_GBps']:.3f}", "" if r["variant"] == "raw" else f"{r['ratio_to_raw']:.2f}",
        ))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    numeric = {0, 3, 4, 5, 6, 7, 8}
    out = []
    for k, line in enumerate(lines):
        cells = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))]
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_dispatch(d: dict) -> str:
    us = d["us_per_op"]
    return (
        f"dispatch (1 rank, chain of {d['chain']} all-reduces of 4 floats, median of "
        f"{d['repeats']}, us/op): raw in place {us['raw']:.1f}; raw out of place (empty + copy "
        f"+ all_reduce) {us['raw_out_of_place']:.1f}; native implementation alone "
        f"{us['implementation_only']:.1f}; Program.run {us['program_run']:.1f}; Program.run with "
        f"an in-place implementation {us['program_run_in_place']:.1f}; Program.run with an "
        f"implementation that communicates nothing {us['program_run_without_collectives']:.1f}\n"
        f"  -> Program.run adds {d['overhead_us_per_op']:.1f} us/op over raw in place "
        f"({d['overhead_vs_out_of_place_us_per_op']:.1f} over raw out of place); the runtime's "
        f"own dispatch adds {d['runtime_dispatch_us_per_op']:.1f} us/op"
    )


def plot(rows: Sequence[dict], path: str) -> bool:
    """busbw against size: one panel per (P, family), raw dashed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("distir-bench: matplotlib is missing (pip install 'distir[bench]'); no plot",
              file=sys.stderr)  # fmt: skip
        return False
    sizes_p = sorted({r["P"] for r in rows})
    families = [f for f in FAMILIES if any(r["family"] == f for r in rows)]
    fig, axes = plt.subplots(len(sizes_p), len(families), squeeze=False,
                             figsize=(3.4 * len(families), 3.0 * len(sizes_p)))  # fmt: skip
    for i, p in enumerate(sizes_p):
        for j, family in enumerate(families):
            ax = axes[i][j]
            mine = [r for r in rows if r["P"] == p and r["family"] == family]
            for variant in dict.fromkeys(r["variant"] for r in mine):
                points = sorted((r["size"], r["busbw_GBps"]) for r in mine if r["variant"] == variant)
                ax.plot([s for s, _ in points], [b for _, b in points], marker="o", markersize=3,
                        linestyle="--" if variant == "raw" else "-", label=variant)  # fmt: skip
            ax.set_xscale("log", base=2)
            ax.set_title(f"{family}, P={p}", fontsize=9)
            ax.set_xlabel("size (bytes)", fontsize=8)
            ax.set_ylabel("busbw (GB/s)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=6)
            ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distir-bench",
        description="Time distir's collectives against raw torch.distributed, side by side.",
    )
    parser.add_argument("--quick", action="store_true",
                        help=f"P=2 and 4, sizes {' '.join(QUICK_SIZES)}, few iterations "
                             "(under 2 minutes)")  # fmt: skip
    parser.add_argument("--nproc", type=int, nargs="+", default=None,
                        help="group sizes to run (default 2 4)")  # fmt: skip
    parser.add_argument("--sizes", nargs="+", default=None,
                        help=f"message sizes (default {' '.join(FULL_SIZES)})")  # fmt: skip
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES,
                        metavar="FAMILY", help=f"rows to run (default all: {' '.join(FAMILIES)})")  # fmt: skip
    parser.add_argument("--iters", type=int, default=None, help="timed iterations per row")
    parser.add_argument("--warmup", type=int, default=None, help="untimed iterations per row")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--json", default="distir-bench.json", help="where to write the results")
    parser.add_argument("--plot", default="distir-bench-busbw.png",
                        help="where to write the busbw plot ('none' to skip)")  # fmt: skip
    parser.add_argument("--dispatch-chain", type=int, default=1000,
                        help="ops in the dispatch-overhead chain (0 to skip)")  # fmt: skip
    parser.add_argument("--dispatch-repeats", type=int, default=15)
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds one group size may take")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.nproc is None:
        args.nproc = [2, 4]
    if args.sizes is None:
        args.sizes = list(QUICK_SIZES if args.quick else FULL_SIZES)
    if any(p < 1 for p in args.nproc):
        print("distir-bench: --nproc values must be >= 1", file=sys.stderr)
        return 2
    start = time.perf_counter()
    from distir.errors import DistirError

    try:
        report = run_benchmark(args)
    except DistirError as e:
        print(f"distir-bench: {e}", file=sys.stderr)
        return 1
    report.meta["wall_s"] = round(time.perf_counter() - start, 1)
    print(format_table(report.rows))
    if report.dispatch is not None:
        print()
        print(format_dispatch(report.dispatch))
    with open(args.json, "w") as f:
        json.dump(report.to_json(), f, indent=1)
    print(f"\nresults: {args.json}", end="")
    if args.plot.lower() != "none" and plot(report.rows, args.plot):
        print(f", plot: {args.plot}", end="")
    print(f" ({report.meta['wall_s']} s; load average before {report.meta['load_before']}, "
          f"after {report.meta['load_after']})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
