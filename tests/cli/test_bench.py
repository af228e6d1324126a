"""`distir-bench`: a tiny smoke run (P=2, 4 KiB, a few iterations) writes the
JSON report with a ratio against raw torch.distributed on every row; the
size parsing and table formatting it relies on behave."""

from __future__ import annotations

import json
import math

import pytest

from distir.cli import bench


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_tiny_run_writes_rows_with_ratios(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = bench.main([
        "--nproc", "2", "--sizes", "4K", "--iters", "2", "--warmup", "0",
        "--families", "all_reduce", "ciphertext", "wave",
        "--dispatch-chain", "20", "--dispatch-repeats", "2",
        "--json", str(out), "--plot", "none",
    ])  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert {r["family"] for r in rows} == {"all_reduce", "ciphertext", "wave"}
    for row in rows:
        assert row["P"] == 2 and row["size"] == 4096 and row["iterations"] == 2
        assert row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert math.isfinite(row["ratio_to_raw"]) and row["ratio_to_raw"] > 0
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])  # 2(P-1)/P = 1 at P=2
    variants = {(r["family"], r["variant"]) for r in rows}
    assert ("ciphertext", "auto") in variants and ("ciphertext", "raw") in variants
    auto = next(r for r in rows if r["family"] == "ciphertext" and r["variant"] == "auto")
    assert auto["implementations"] == ["ciphertext-auto"]
    assert report["dispatch"]["chain"] == 20 and "overhead_us_per_op" in report["dispatch"]
    printed = capsys.readouterr().out
    assert "x raw" in printed and "ciphertext" in printed and "dispatch" in printed


def test_sizes_parse_and_print_in_binary_units():
    assert [bench.parse_size(s) for s in ("4K", "64KiB", "16M", "1G", "100")] == [
        4096, 65536, 16 << 20, 1 << 30, 100,
    ]
    assert [bench.format_size(s) for s in (4096, 16 << 20, 100)] == ["4K", "16M", "100"]


def test_bus_bandwidth_follows_nccl_tests():
    assert bench.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bench.bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bench.bus_factor("broadcast", 4) == 1.0


def test_the_table_lines_up_and_leaves_the_raw_ratio_blank():
    row = {"P": 2, "family": "all_reduce", "variant": "raw", "size_label": "4K", "median_ms": 1.0,
           "min_ms": 0.5, "max_ms": 2.0, "algbw_GBps": 0.004, "busbw_GBps": 0.004,
           "ratio_to_raw": 1.0}  # fmt: skip
    table = bench.format_table([row, {**row, "variant": "distir", "ratio_to_raw": 1.25}])
    lines = table.splitlines()
    assert len({len(line) for line in lines[:2]}) == 1
    assert lines[2].endswith("0.004") and lines[3].endswith("1.25")
