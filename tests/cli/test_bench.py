"""`distir-bench`: a tiny checked run at P=2 writes the table, the JSON rows
and one plot per family into a fresh directory (never loose files in the
current one); a deliberately wrong variant fails the check loudly; sizes,
sweeps, bus factors, the (dtype, op) cases, the result comparison and the
table behave."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from distir.bench import cli
from distir.bench.families import FAMILIES, Case, Setup, all_reduce_setup
from distir.bench.report import format_table
from distir.bench.runner import compare
from distir.bench.sizes import format_size, parse_size, size_sweep

NATIVE = ("all_reduce", "broadcast", "all_gather", "all_to_all")


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_a_checked_tiny_run_fills_a_timestamped_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = cli.main([
        "--nproc", "2", "--sizes", "4K", "-n", "2", "-w", "0", "-c",
        "--dispatch-chain", "20", "--dispatch-repeats", "2", "--timeout", "60",
    ])  # fmt: skip
    assert code == 0
    # Nothing loose in the current directory: one timestamped folder under bench-results/.
    assert [p.name for p in tmp_path.iterdir()] == ["bench-results"]
    (out,) = (tmp_path / "bench-results").iterdir()
    report = json.loads((out / "results.json").read_text())
    rows = report["rows"]
    assert list(dict.fromkeys(r["family"] for r in rows)) == list(FAMILIES)
    for row in rows:
        assert {"family", "variant", "P", "size_label", "ratio_to_raw"} <= row.keys()
        assert row["P"] == 2 and row["size_label"] == "4K" and row["iterations"] == 2
        assert row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert math.isfinite(row["ratio_to_raw"]) and row["ratio_to_raw"] > 0
        assert row["paired_ratio"] > 0 and (row["variant"] != "raw" or row["paired_ratio"] == 1)
        assert row["min_ms"] <= row["q1_ms"] <= row["median_ms"] <= row["q3_ms"] <= row["max_ms"]
        assert row["busbw_GBps"] == pytest.approx(
            row["algbw_GBps"] * FAMILIES[row["family"]].bus_factor(2)
        )
        expected = {"raw": "ref"}.get(row["variant"], "ok")
        if row["family"] in ("combine", "ciphertext", "ciphertext62") and row["variant"] == "raw":
            expected = "n/a"  # raw is a plain i64 sum there; the reference is exact
        assert row["check"] == expected, row
    variants = {(r["family"], r["variant"]) for r in rows}
    for family in NATIVE:
        assert {(family, "raw"), (family, "raw clone+op"), (family, "distir, donated")} <= variants
    assert {("combine", "ring, donated"), ("ciphertext", "auto, donated"),
            ("all_reduce", "distir, no agreement"), ("wave", "bucketed")} <= variants  # fmt: skip
    assert ("combine", "raw clone+op") not in variants
    # The baselines of the latency targets: a verified run against raw plus one
    # tiny exchange, the all-to-all against raw that exchanges its counts first.
    assert {("all_reduce", "raw + tiny exchange"), ("broadcast", "raw + tiny exchange"),
            ("all_to_all", "raw, splits given"),
            ("broadcast", "distir, no agreement, donated")} <= variants  # fmt: skip
    covered = {(t["family"], t["variant"], t["baseline"]) for t in report["targets"]}
    assert ("all_reduce", "distir, donated", "raw + tiny exchange") in covered
    auto = next(r for r in rows if r["family"] == "ciphertext" and r["variant"] == "auto")
    assert auto["implementations"] == ["ciphertext-auto"]
    assert report["dispatch"]["chain"] == 20 and "overhead_us_per_op" in report["dispatch"]
    import matplotlib.image

    for family in FAMILIES:
        height, width = matplotlib.image.imread(out / f"busbw-{family}.png").shape[:2]
        assert 900 <= width <= 1400 and 500 <= height <= 900  # one legible panel
    printed = capsys.readouterr().out
    header = printed.splitlines()[0].split()
    assert header[-3:] == ["x", "raw", "check"] and "dispatch" in printed
    assert (out / "table.txt").read_text().splitlines()[0] == printed.splitlines()[0]


def wrong_all_reduce_setup(case: Case) -> Setup:
    """The all_reduce family with a program that computes max, not sum."""
    setup = all_reduce_setup(case)
    assert " sum " in setup.program
    return dataclasses.replace(setup, program=setup.program.replace(" sum ", " max "))


WRONG = dataclasses.replace(FAMILIES["all_reduce"], name="wrong", setup=wrong_all_reduce_setup)


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_wrong_variant_fails_the_check_loudly(tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["--nproc", "2", "--sizes", "4K", "-n", "1", "-w", "0", "-c", "--families",
                     "wrong", "--dispatch-chain", "0", "--no-plots", "--out", str(out),
                     "--timeout", "60"],
                    registry={"wrong": WRONG})  # fmt: skip
    assert code == 1
    rows = json.loads((out / "results.json").read_text())["rows"]
    verdicts = {r["variant"]: r["check"] for r in rows}
    assert verdicts == {"raw": "ref", "raw clone+op": "ok", "raw + tiny exchange": "ok",
                        "distir": "WRONG", "distir, no agreement": "WRONG",
                        "distir, donated": "WRONG", "distir, no agreement, donated": "WRONG"}  # fmt: skip
    detail = next(r["check_detail"] for r in rows if r["variant"] == "distir")
    assert "rank 0: result #0:" in detail and "rank 1: result #0:" in detail
    captured = capsys.readouterr()
    assert "WRONG RESULT" in captured.err and "'distir, donated'" in captured.err
    assert captured.out.count("WRONG") == 4
    assert "WRONG RESULT" in (out / "table.txt").read_text()


def _sizes(*argv: str) -> list[str]:
    parser = cli.build_parser()
    return [format_size(s) for s in cli.resolve_sizes(parser.parse_args(list(argv)), parser)]


def test_sizes_sweep_like_nccl_tests():
    assert _sizes("-b", "4K", "-e", "1M", "-f", "4") == ["4K", "16K", "64K", "256K", "1M"]
    assert _sizes("-b", "1K", "-e", "5K") == ["1K", "2K", "4K"]  # the default factor is 2
    assert _sizes("-b", "1M") == ["1M"] and _sizes("-e", "64K") == ["64K"]
    assert _sizes("--sizes", "4K", "16M") == ["4K", "16M"]
    assert _sizes() == list(cli.FULL_SIZES) and _sizes("--quick") == list(cli.QUICK_SIZES)
    for bad in (["-b", "1M", "-e", "4K"], ["-b", "4K", "-e", "1M", "-f", "1"],
                ["--sizes", "4K", "-b", "4K"], ["-b", "4Q"]):  # fmt: skip
        with pytest.raises(SystemExit):
            _sizes(*bad)
    with pytest.raises(ValueError, match="stepfactor"):
        size_sweep(1, 8, 1)


def test_sizes_parse_and_print_in_binary_units():
    assert [parse_size(s) for s in ("4K", "64KiB", "16M", "1G", "100")] == [
        4096, 65536, 16 << 20, 1 << 30, 100,
    ]  # fmt: skip
    assert [format_size(s) for s in (4096, 16 << 20, 100, 1536)] == ["4K", "16M", "100", "1536"]
    with pytest.raises(ValueError):
        parse_size("0")


def test_default_output_directories_never_collide(tmp_path):
    first = cli.default_out(tmp_path)
    first.mkdir()
    second = cli.default_out(tmp_path)
    assert second.parent == tmp_path and second != first and not second.exists()


def test_bus_factors_follow_nccl_tests():
    assert FAMILIES["all_reduce"].bus_factor(4) == pytest.approx(1.5)
    assert FAMILIES["ciphertext"].bus_factor(4) == pytest.approx(1.5)
    assert FAMILIES["all_gather"].bus_factor(4) == pytest.approx(0.75)
    assert FAMILIES["all_to_all"].bus_factor(4) == pytest.approx(0.75)
    assert FAMILIES["broadcast"].bus_factor(4) == 1.0


def test_dtype_and_op_apply_where_a_family_has_the_choice():
    requested = (["float32", "int64"], ["sum", "max"])
    assert FAMILIES["all_reduce"].cases(*requested) == [
        ("float32", "sum"), ("float32", "max"), ("int64", "sum"), ("int64", "max"),
    ]  # fmt: skip
    assert FAMILIES["broadcast"].cases(*requested) == [("float32", ""), ("int64", "")]
    assert FAMILIES["wave"].cases(*requested) == [("float32", "sum"), ("int64", "sum")]
    assert FAMILIES["combine"].cases(*requested) == [("int64", "")]


def test_results_compare_exactly_for_integers_and_within_ulps_for_floats():
    ints = torch.arange(10)
    assert compare((ints,), (ints.clone(),), 2) is None
    assert "1 of 10 elements differ" in compare((ints + (ints == 3),), (ints,), 2)
    floats = torch.rand(100)
    assert compare((floats * (1 + 2**-23),), (floats,), 2) is None  # rounding of another order
    assert "differ" in compare((floats + 1e-3,), (floats,), 2)
    assert "expected" in compare((floats,), (floats, ints), 2)
    assert "(10,)" in compare((floats[:10],), (floats,), 2)


def test_targets_compare_medians_of_the_same_p_size_and_dtype():
    from distir.bench.report import check_targets, format_targets

    def row(variant, median, size=4096, p=2):
        return {"family": "all_reduce", "variant": variant, "P": p, "size": size,
                "size_label": format_size(size), "dtype": "float32", "op": "sum",
                "median_ms": median}  # fmt: skip

    rows = [row("raw", 1.0), row("raw + tiny exchange", 2.0), row("distir, donated", 2.1),
            row("distir, no agreement, donated", 1.2), row("raw", 4.0, p=4),
            row("distir, no agreement, donated", 4.2, p=4)]  # fmt: skip
    found = {(t["variant"], t["baseline"], t["P"]): (round(t["ratio"], 3), t["met"])
             for t in check_targets(rows)}  # fmt: skip
    assert found == {
        ("distir, no agreement, donated", "raw", 2): (1.2, False),
        ("distir, no agreement, donated", "raw", 4): (1.05, True),
        ("distir, donated", "raw + tiny exchange", 2): (1.05, True),
    }
    assert "MISSED" in format_targets(check_targets(rows)) and format_targets([]) == ""
    assert "issue" not in format_targets(check_targets(rows))


def test_the_table_lines_up_and_shows_the_check_only_when_checked():
    row = {"P": 2, "family": "all_reduce", "dtype": "float32", "op": "sum", "variant": "raw",
           "size_label": "4K", "median_ms": 1.0, "min_ms": 0.5, "max_ms": 2.0,
           "algbw_GBps": 0.004, "busbw_GBps": 0.004, "ratio_to_raw": 1.0, "check": None}  # fmt: skip
    rows = [row, {**row, "variant": "distir", "ratio_to_raw": 1.25}]
    lines = format_table(rows).splitlines()
    assert len({len(line) for line in lines[:2]}) == 1 and "check" not in lines[0]
    assert lines[2].endswith("0.004") and lines[3].endswith("1.25")
    checked = format_table([{**rows[0], "check": "ref"}, {**rows[1], "check": "WRONG"}])
    assert checked.splitlines()[0].endswith("check") and checked.endswith("1.25  WRONG")


def test_bind_to_core_pins_the_calling_thread_only_when_every_rank_gets_a_cpu():
    # In a thread of its own: affinity is per thread, and the test process
    # must stay unbound.
    import os
    import threading

    from distir.bench.runner import bind_to_core

    cpus = sorted(os.sched_getaffinity(0))
    seen: dict[str, object] = {}

    def probe() -> None:
        seen["too many"] = bind_to_core(0, len(cpus) + 1)
        seen["after too many"] = os.sched_getaffinity(0)
        seen["last rank"] = bind_to_core(len(cpus) - 1, len(cpus))
        seen["bound"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join(10)
    assert seen == {
        "too many": None,
        "after too many": set(cpus),
        "last rank": cpus[-1],
        "bound": {cpus[-1]},
    }
    assert os.sched_getaffinity(0) == set(cpus)


@pytest.mark.slow
def test_bind_threads_places_gloos_workers_with_the_rank_and_its_event_loops_on_the_next_cpu():
    # In a fresh interpreter: the placement applies to every thread of the
    # process by name. Threads named as gloo names its own stand in for them.
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import os, threading
        from distir.bench.runner import GLOO_LOOP, GLOO_WORKER, bind_threads

        def native_id_named(name, started, done):
            with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
                f.write(name)
            started.set()
            done.wait(30)

        done, tids = threading.Event(), {}
        for name in (GLOO_WORKER, GLOO_LOOP, "bystander"):
            started = threading.Event()
            t = threading.Thread(target=native_id_named, args=(name, started, done))
            t.start()
            started.wait(30)
            tids[name] = t.native_id
        cpus = sorted(os.sched_getaffinity(0))
        everything = set(cpus)
        too_many = bind_threads(0, len(cpus) + 1)
        untouched = {n: os.sched_getaffinity(t) for n, t in tids.items()}
        rank = len(cpus) - 1
        bound = bind_threads(rank, len(cpus))
        placed = {n: os.sched_getaffinity(t) for n, t in tids.items()}
        done.set()
        assert too_many is None and all(a == everything for a in untouched.values()), untouched
        assert bound == cpus[rank] and os.sched_getaffinity(0) == {cpus[rank]}
        assert placed == {GLOO_WORKER: {cpus[rank]}, GLOO_LOOP: {cpus[0]},
                          "bystander": everything}, placed
        print("placed", placed)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "placed" in done.stdout


@pytest.mark.multirank
@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_the_timeline_probe_stamps_every_collective_of_distirs_rows():
    # benchmarks/timeline.py wraps ProcessGroupResource._run and the submit
    # of DirectCollective (a specialised run's own): it must keep up with
    # their signatures, and print three stamps per
    # collective (submit, submit returned, completed) plus the end.
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "timeline.py"
    done = subprocess.run([sys.executable, str(script), "--iters", "3"], capture_output=True,
                          text=True, timeout=110)  # fmt: skip
    assert done.returncode == 0, done.stderr
    stamps = {}
    for line in done.stdout.splitlines():
        if " rank 0: " in line:
            name, values = line.split(" rank 0: ")
            stamps[name.strip()] = [float(v) for v in values.split()]
    assert len(stamps["all-reduce, distir trusted donated"]) == 3 + 1
    assert len(stamps["broadcast, distir trusted donated"]) == 3 + 1
    assert len(stamps["variable all-to-all, distir verified"]) == 2 * 3 + 1  # row, payload
    assert len(stamps["all-reduce, raw"]) == 1
    for values in stamps.values():
        assert values == sorted(values) and values[-1] > 0
    assert done.stdout.count("slowest rank:") == len(stamps)


def test_binding_is_skipped_where_the_platform_has_no_cpu_affinity(monkeypatch):
    import os

    from distir.bench.runner import bind_threads, bind_to_core

    monkeypatch.delattr(os, "sched_setaffinity")
    assert bind_to_core(0, 1) is None
    assert bind_threads(0, 1) is None


@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_threads_are_placed_once_the_rows_made_their_groups(one_rank_world, warmup):
    # The variants make their process groups (and gloo their threads) at
    # their first run: the placement must come after it, warm-up or not.
    from distir.bench.runner import Call, time_calls

    runs: list[str] = []
    calls = [Call("raw", run=lambda: runs.append("raw")),
             Call("distir", run=lambda: runs.append("distir"))]  # fmt: skip
    settled_after: list[int] = []
    times = time_calls(calls, 4, warmup, "cpu", settle=lambda: settled_after.append(len(runs)))
    assert settled_after == [2 * max(warmup, 1)]
    assert {name: len(t) for name, t in times.items()} == {"raw": 4, "distir": 4}


def test_the_summary_gives_distirs_cost_over_raw_per_size_from_distir_rows_only():
    from distir.bench.report import format_summary

    def row(variant, size, ratio):
        return {"variant": variant, "size": size, "ratio_to_raw": ratio}

    rows = [row("raw", 4096, 1.0), row("raw clone+op", 4096, 3.0), row("distir", 4096, 1.2),
            row("distir, donated", 4096, 1.4), row("distir, donated", 4096, 1.6),
            row("distir", 1 << 20, 0.9)]  # fmt: skip
    line = format_summary(rows)
    # the medians by hand: (1.2, 1.4, 1.6) -> 1.4 at 4K, 0.9 at 1M; raw rows left out
    assert "4K: 1.40x raw's time (40% over raw)" in line
    assert "1M: 0.90x raw's time (10% under raw)" in line
    assert format_summary([row("raw", 4096, 1.0)]) == ""


def test_a_negative_dispatch_overhead_is_explained():
    from distir.bench.report import format_dispatch

    us = {"raw": 10.0, "raw_out_of_place": 11.0, "program_run": 9.5,
          "program_run_donated": 9.0, "program_run_without_collectives": 2.0}  # fmt: skip
    d = {"chain": 10, "repeats": 3, "us_per_op": us, "overhead_us_per_op": -0.5,
         "overhead_donated_us_per_op": -1.0, "runtime_dispatch_us_per_op": 2.0}  # fmt: skip
    assert "below this machine's timing noise" in format_dispatch(d)
    d.update(overhead_us_per_op=0.5, overhead_donated_us_per_op=0.2)
    assert "noise" not in format_dispatch(d)
