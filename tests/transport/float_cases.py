"""Programs and the rank worker of the float-contract tests.

Imported by spawned ranks: torch and distir only (no pytest, no hypothesis).
Every variant of one reduction (native, generic region, each algorithm,
each pipeline) is one entry of `VARIANTS`; the parent compares every rank's
result of every variant with the contract (tests/transport/test_float_contract.py).
"""

from __future__ import annotations

from typing import Any

import torch

#: arith op of a generic combine -> the native kind `recognize-native-reductions`
#: may turn it into (None: stays generic)
REGIONS = {
    "maximumf": "max",
    "minimumf": "min",
    "maxnumf": None,
    "minnumf": None,
    "addf": "sum",
    "mulf": "prod",
}
#: what each variant's result must equal: the contract of one reduction
CONTRACT = {
    "max": "maximumf",
    "min": "minimumf",
    "sum": "addf",
    "prod": "mulf",
    **{op: op for op in REGIONS},
}

ALGORITHMS = ("ring", "halving-doubling", "recursive-doubling", "gather-fold")
PIPELINES = ("", "recognize-native-reductions", "recognize-native-reductions,bucket-all-reduces")


def native_source(kind: str, t: str) -> str:
    return (
        f"func.func @main(%x: {t}) -> {t} {{\n"
        f"  %y = dist.all_reduce {kind} %x : {t}\n"
        f"  func.return %y : {t}\n}}"
    )


def generic_source(op: str, t: str, commutative: bool) -> str:
    marker = " commutative" if commutative else ""
    return (
        f"func.func @main(%x: {t}) -> {t} {{\n"
        f"  %y = dist.all_reduce %x{marker} : {t} combine(%a, %b) {{\n"
        f"    %c = arith.{op} %a, %b : {t}\n"
        f"    dist.yield %c : {t}\n"
        f"  }}\n"
        f"  func.return %y : {t}\n}}"
    )


def variants(t: str) -> list[tuple[str, str, str, dict[str, str]]]:
    """(name, source, pipeline, implementations) of the ways to run each
    reduction on tensor type `t`: native with and without passes; generic
    by two algorithms (whole-tensor and chunked; rotated order when
    commutative) and after `recognize-native-reductions`."""
    found = []
    for kind in ("max", "min", "sum", "prod"):
        for pipeline in PIPELINES[::2]:
            found.append((f"{kind} | {pipeline or '-'}", native_source(kind, t), pipeline, {}))
    for op in REGIONS:
        for commutative in (False, True):
            source = generic_source(op, t, commutative)
            label = f"{op}{' commutative' if commutative else ''}"
            algorithms = ("ring", "recursive-doubling") if commutative else ALGORITHMS[1:4:2]
            for algorithm in algorithms:
                found.append((f"{label} | {algorithm}", source, "", {"dist.all_reduce": algorithm}))
            found.append((f"{label} | {PIPELINES[1]}", source, PIPELINES[1], {}))
    return found


def run_variants(ctx: Any, draws: list[tuple[str, str, list[torch.Tensor]]]) -> list[dict]:
    """Worker: for every draw (tensor type, dtype name, inputs per rank), run
    every variant on this rank; returns {variant name: result} per draw."""
    import distir

    out = []
    for t, _dtype, per_rank in draws:
        results = {}
        for name, source, pipeline, implementations in variants(t):
            program = distir.compile(source, pipeline, implementations=implementations)
            results[name] = program.run(per_rank[ctx.rank])
        out.append(results)
    return out
