"""The report: the table, the JSON file and one busbw plot per family.

Everything here reads rows (the dicts `runner.make_row` builds), so saved
JSON files can be re-rendered without running anything:

    report = Report.load("bench-results/20250101-120000/results.json")
    print(format_table(report.rows))
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from distir.bench.families import DONATED, TINY, TRUSTED_DONATED
from distir.bench.runner import RAW
from distir.bench.sizes import format_size

RESULTS_JSON = "results.json"
TABLE_TXT = "table.txt"


@dataclass
class Report:
    meta: dict
    rows: list[dict] = field(default_factory=list)
    dispatch: dict | None = None

    def to_json(self) -> dict:
        return {
            "meta": self.meta,
            "rows": self.rows,
            "dispatch": self.dispatch,
            "cost_model": fit_cost_model(self.rows),
            "targets": check_targets(self.rows),
        }

    @classmethod
    def load(cls, path: str | Path) -> Report:
        data = json.loads(Path(path).read_text())
        return cls(data.get("meta", {}), data.get("rows", []), data.get("dispatch"))

    def wrong_rows(self) -> list[dict]:
        return [r for r in self.rows if r.get("check") == "WRONG"]


_COLUMNS = ("P", "family", "dtype", "op", "variant", "size", "median ms", "p25-p75 ms",
            "algbw GB/s", "busbw GB/s", "x raw", "check")  # fmt: skip
_LEFT = {"family", "dtype", "op", "variant", "check"}


def format_table(rows: Sequence[dict]) -> str:
    """The rows as aligned text; the check column only when some row was checked."""
    checked = any(r.get("check") is not None for r in rows)
    header = _COLUMNS if checked else _COLUMNS[:-1]
    lines = [header]
    for r in rows:
        line = (
            str(r["P"]), r["family"], r.get("dtype", ""), r.get("op", ""), r["variant"],
            r["size_label"], f"{r['median_ms']:.3f}",
            f"{r.get('q1_ms', r['min_ms']):.2f}-{r.get('q3_ms', r['max_ms']):.2f}",
            f"{r['algbw_GBps']:.3f}", f"{r['busbw_GBps']:.3f}",
            "" if r["variant"] == RAW else f"{r['ratio_to_raw']:.2f}",
            r.get("check") or "",
        )  # fmt: skip
        lines.append(line[: len(header)])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for k, line in enumerate(lines):
        cells = [c.ljust(w) if header[i] in _LEFT else c.rjust(w)
                 for i, (c, w) in enumerate(zip(line, widths))]  # fmt: skip
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


@dataclass(frozen=True)
class Target:
    """A ratio distir's latency targets hold a row to: the median of
    `variant` over the median of `baseline`, same family, P and size, for
    sizes in [min_size, max_size], at most `bound`."""

    family: str
    variant: str
    baseline: str
    bound: float
    min_size: int = 0
    max_size: int | None = None
    world_sizes: tuple[int, ...] | None = None


_KIB, _MIB = 1 << 10, 1 << 20
TRUSTED, VERIFIED = TRUSTED_DONATED.name, DONATED.name
#: distir's latency targets, as data: how much slower than raw torch.distributed
#: (or than the cheapest distir variant) a row may be.
TARGETS = (
    Target("all_reduce", TRUSTED, RAW, 1.10, 4 * _KIB, 4 * _KIB),
    Target("all_reduce", TRUSTED, RAW, 1.10, _MIB, _MIB),
    Target("broadcast", TRUSTED, RAW, 1.10, 4 * _KIB, 4 * _KIB),
    Target("broadcast", TRUSTED, RAW, 1.10, _MIB, _MIB),
    Target("all_reduce", VERIFIED, TINY, 1.10, 4 * _KIB, 4 * _KIB),
    Target("all_reduce", VERIFIED, RAW, 1.10, _MIB),
    Target("broadcast", VERIFIED, TINY, 1.10, 4 * _KIB, 4 * _KIB),
    Target("broadcast", VERIFIED, RAW, 1.10, _MIB),
    Target("all_to_all", "distir", RAW, 1.15),
    Target("all_to_all", "distir, donated", RAW, 1.15),
    Target("combine", "ring", RAW, 1.20, _MIB),
    Target("combine", "ring, donated", RAW, 1.20, _MIB),
    Target("ciphertext", "auto, donated", RAW, 1.15, 16 * _MIB, 16 * _MIB, (2,)),
    Target("ciphertext", "auto, donated", RAW, 1.35, 16 * _MIB, 16 * _MIB, (4,)),
    # gloo's reduce_scatter_tensor all-reduces the whole input: N·(P-1)/P
    # bytes per rank should take at most 0.7 of its time
    Target("reduce_scatter", "distir", RAW, 0.70, 16 * _MIB, 16 * _MIB, (2, 4)),
    Target("fsdp_step", "distir", RAW, 1.30, 16 * _MIB, 16 * _MIB),
)


def check_targets(rows: Sequence[dict], targets: Sequence[Target] = TARGETS) -> list[dict]:
    """Every (target, P, size, dtype, op) the rows cover: the ratio of
    medians, its bound and whether it was met."""
    by_key = {(r["family"], r["variant"], r["P"], r["size"], r.get("dtype"), r.get("op")): r
              for r in rows}  # fmt: skip
    found = []
    for t in targets:
        for r in rows:
            if (r["family"], r["variant"]) != (t.family, t.variant) or r["size"] < t.min_size:
                continue
            if (t.max_size is not None and r["size"] > t.max_size) or (
                t.world_sizes is not None and r["P"] not in t.world_sizes
            ):
                continue
            base = by_key.get((t.family, t.baseline, r["P"], r["size"], r.get("dtype"),
                               r.get("op")))  # fmt: skip
            if base is None or base["median_ms"] <= 0:
                continue
            ratio = r["median_ms"] / base["median_ms"]
            # The paired ratio against raw, rescaled to the baseline's.
            paired = r.get("paired_ratio", float("nan")) / base.get("paired_ratio", 1.0)
            found.append({"family": t.family, "variant": t.variant, "baseline": t.baseline,
                          "P": r["P"], "size_label": r["size_label"], "ratio": ratio,
                          "paired": paired, "bound": t.bound, "met": ratio <= t.bound})  # fmt: skip
    return found


def format_targets(checked: Sequence[dict]) -> str:
    """One line per checked target (empty when no row was covered)."""
    if not checked:
        return ""
    lines = ["latency targets: each line is a distir variant's median time over its baseline's "
             "(same P and size, run interleaved), the bound distir aims for, 'met' or 'MISSED' "
             "(slower than the bound on this machine), and `paired`: the median of the "
             "per-iteration ratios, less sensitive to a loaded machine:"]
    for c in checked:
        lines.append(
            f"  P={c['P']} {c['family']:<10} {c['size_label']:>4}  {c['variant']!r} / "
            f"{c['baseline']!r} = {c['ratio']:.2f} (<= {c['bound']:.2f}: "
            f"{'met' if c['met'] else 'MISSED'}; paired {c.get('paired', float('nan')):.2f})"
        )
    return "\n".join(lines)


def format_wrong(rows: Sequence[dict]) -> str:
    """One line per wrong row, with which ranks and why."""
    return "\n".join(
        f"WRONG RESULT: P={r['P']} {r['family']} {r.get('dtype', '')} {r.get('op', '')} "
        f"{r['variant']!r} {r['size_label']}: {r.get('check_detail', '')}"
        for r in rows
    )


def format_dispatch(d: dict) -> str:
    us = d["us_per_op"]
    return (
        f"dispatch (1 rank, chain of {d['chain']} all-reduces of 4 floats, median of "
        f"{d['repeats']}, us/op): raw in place {us['raw']:.1f}; raw out of place (empty + copy "
        f"+ all_reduce) {us['raw_out_of_place']:.1f}; Program.run {us['program_run']:.1f}; "
        f"Program.run, input donated {us['program_run_donated']:.1f}; Program.run with an "
        f"implementation that communicates nothing {us['program_run_without_collectives']:.1f}\n"
        f"  -> Program.run adds {d['overhead_us_per_op']:.1f} us/op over raw in place "
        f"({d['overhead_donated_us_per_op']:.1f} donated); the runtime's own dispatch costs "
        f"{d['runtime_dispatch_us_per_op']:.1f} us/op"
        + (
            "\n  (a negative overhead: the difference is below this machine's timing noise; "
            "distir's dispatch costs nothing measurable here)"
            if min(d["overhead_us_per_op"], d["overhead_donated_us_per_op"]) < 0
            else ""
        )
    )


def format_summary(rows: Sequence[dict]) -> str:
    """The line a user acts on: per message size, how distir's time compares
    with raw torch.distributed's (the median, over every distir row of that
    size, of its median over raw's), empty without such rows."""
    import statistics

    ratios: dict[int, list[float]] = {}
    for r in rows:
        # the baselines ("raw", "raw clone+op", "raw + tiny exchange", ...) are
        # torch.distributed's own; every other variant runs through distir
        if not r["variant"].startswith(RAW) and r.get("ratio_to_raw", 0) > 0:
            ratios.setdefault(r["size"], []).append(r["ratio_to_raw"])
    if not ratios:
        return ""
    parts = []
    for size in sorted(ratios):
        x = statistics.median(ratios[size])
        how = f"{(x - 1) * 100:.0f}% over raw" if x >= 1 else f"{(1 - x) * 100:.0f}% under raw"
        parts.append(f"{format_size(size)}: {x:.2f}x raw's time ({how})")
    return (
        "summary: at your message sizes distir costs " + "; ".join(parts) + " (the median of "
        "every distir variant's `x raw` column at that size; run with --sizes SIZE... for yours)"
    )


def fit_cost_model(rows: Sequence[dict]) -> dict | None:
    """Least-squares constants of `ir.all_reduce.CostModel` (seconds per round,
    per byte sent, per byte combined) from the combine family's rows, the
    algorithms run on the same data side by side; None without such rows."""
    import numpy as np

    from distir.ops.all_reduce.ir import ALGORITHM_NEEDS, CostModel

    unit = (CostModel(1.0, 0.0, 0.0), CostModel(0.0, 1.0, 0.0), CostModel(0.0, 0.0, 1.0))
    lhs, rhs = [], []
    for r in rows:
        # combine-family variants are named by the algorithm they run
        algorithm = r["variant"]
        if r["family"] != "combine" or algorithm not in ALGORITHM_NEEDS or r["P"] < 2:
            continue
        lhs.append([m.seconds(algorithm, r["P"], r["bytes"]) for m in unit])
        rhs.append(r["median_ms"] / 1e3)
    if len(rhs) < 3:
        return None
    coeffs, *_ = np.linalg.lstsq(np.array(lhs), np.array(rhs), rcond=None)
    alpha, beta, gamma = (max(0.0, float(c)) for c in coeffs)
    return {"alpha_s": alpha, "beta_s_per_byte": beta, "gamma_s_per_byte": gamma,
            "rows": len(rhs)}  # fmt: skip


def format_cost_model(fit: dict) -> str:
    return (
        f"cost model fit ({fit['rows']} combine rows): alpha {fit['alpha_s'] * 1e6:.0f} us per "
        f"round, beta {fit['beta_s_per_byte'] * 1e9:.2f} ns per byte sent, gamma "
        f"{fit['gamma_s_per_byte'] * 1e9:.2f} ns per byte combined (ir.all_reduce.CostModel)"
    )


def plot_path(out: Path, family: str) -> Path:
    return out / f"busbw-{family}.png"


def plot_family(rows: Sequence[dict], family: str, path: str | Path, backend: str = "") -> None:
    """busbw against message size for one family: one line per variant and
    P (and dtype/op when several ran), raw in black, log-2 size axis labelled
    4K, 1M, ...; 9 x 5.5 inches at 120 dpi."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r["family"] == family]
    kinds = sorted({(r.get("dtype", ""), r.get("op", "")) for r in mine})
    sizes_p = sorted({r["P"] for r in mine})
    variants = list(dict.fromkeys(r["variant"] for r in mine))
    colors = plt.get_cmap("tab10")
    styles = ("-", "--", ":", "-.")
    markers = ("o", "s", "^", "D")
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for vi, variant in enumerate(variants):
        for pi, p in enumerate(sizes_p):
            for kind in kinds:
                points = sorted((r["size"], r["busbw_GBps"]) for r in mine
                                if r["variant"] == variant and r["P"] == p
                                and (r.get("dtype", ""), r.get("op", "")) == kind)  # fmt: skip
                if not points:
                    continue
                label = f"{variant}, P={p}"
                if len(kinds) > 1:
                    label += ", " + " ".join(x for x in kind if x)
                ax.plot([s for s, _ in points], [b for _, b in points], label=label,
                        color="black" if variant == RAW else colors(vi % 10),
                        linestyle=styles[pi % len(styles)], marker=markers[pi % len(markers)],
                        markersize=5, linewidth=2 if variant == RAW else 1.5)  # fmt: skip
    ticks = sorted({r["size"] for r in mine})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [format_size(s) for s in ticks])
    ax.minorticks_off()
    ax.set_xlabel("message size S (bytes, nccl-tests convention)", fontsize=11)
    ax.set_ylabel("bus bandwidth (GB/s)", fontsize=11)
    what = " ".join(" ".join(x for x in kind if x) for kind in kinds) if len(kinds) == 1 else ""
    ax.set_title(f"{family} {what}: busbw against size" + (f" ({backend})" if backend else ""),
                 fontsize=12)  # fmt: skip
    ax.tick_params(labelsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save(report: Report, out: Path, *, plots: bool = True) -> list[Path]:
    """Writes results.json, table.txt and busbw-<family>.png into `out`;
    returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / RESULTS_JSON, out / TABLE_TXT]
    written[0].write_text(json.dumps(report.to_json(), indent=1))
    text = format_table(report.rows)
    if report.dispatch is not None:
        text += "\n\n" + format_dispatch(report.dispatch)
    fit = fit_cost_model(report.rows)
    if fit is not None:
        text += "\n\n" + format_cost_model(fit)
    targets = format_targets(check_targets(report.rows))
    if targets:
        text += "\n\n" + targets
    if report.wrong_rows():
        text += "\n\n" + format_wrong(report.wrong_rows())
    written[1].write_text(text + "\n")
    if not plots:
        return written
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("distir-bench: matplotlib is missing (pip install 'distir[bench]'); no plots",
              file=sys.stderr)  # fmt: skip
        return written
    for family in dict.fromkeys(r["family"] for r in report.rows):
        path = plot_path(out, family)
        plot_family(report.rows, family, path, report.meta.get("backend", ""))
        written.append(path)
    return written
