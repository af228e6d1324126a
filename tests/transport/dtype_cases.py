"""Programs and the rank worker of the kind x element type matrix
(tests/transport/test_dtype_support.py). Imported by spawned ranks: torch
and distir only."""

from __future__ import annotations

from typing import Any

import torch

KINDS = ("sum", "prod", "min", "max", "band", "bor", "bxor")
#: every element type the README lists for tensors
ELEMENT_TYPES = (
    "i1", "i8", "i16", "i32", "i64", "si8", "si16", "si32", "si64",
    "ui8", "ui16", "ui32", "ui64", "f16", "bf16", "f32", "f64",
)  # fmt: skip


#: the torch dtype of each (core/dtypes.py's mapping, spelled out)
DTYPES = {
    "i1": torch.bool, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32,
    "i64": torch.int64, "si8": torch.int8, "si16": torch.int16, "si32": torch.int32,
    "si64": torch.int64, "ui8": torch.uint8, "ui16": torch.uint16, "ui32": torch.uint32,
    "ui64": torch.uint64, "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
    "f64": torch.float64,
}  # fmt: skip


def native_source(kind: str, element: str) -> str:
    t = f"tensor<5x{element}>"
    return (
        f"func.func @main(%x: {t}) -> {t} {{\n"
        f"  %y = dist.all_reduce {kind} %x : {t}\n"
        f"  func.return %y : {t}\n}}"
    )


def moves_source(element: str) -> str:
    t = f"tensor<5x{element}>"
    return (
        f"func.func @main(%x: {t}, %n: tensor<2xi64>) -> ({t}, tensor<10x{element}>, "
        f"tensor<?x{element}>, tensor<2xi64>) {{\n"
        f"  %b = dist.broadcast %x root 1 : {t}\n"
        f"  %g = dist.all_gather %x axis 0 : {t} -> tensor<10x{element}>\n"
        f"  %a, %c = dist.variable_all_to_all %x, %n axis 0 : {t}, tensor<2xi64> "
        f"-> tensor<?x{element}>\n"
        f"  func.return %b, %g, %a, %c : {t}, tensor<10x{element}>, tensor<?x{element}>, "
        f"tensor<2xi64>\n}}"
    )


def values(element: str, rank: int) -> torch.Tensor:
    """Rank r's input: wrap-around, signedness and ties included."""
    dtype = DTYPES[element]
    if dtype == torch.bool:
        return torch.tensor([[1, 0, 1, 0, 1], [1, 1, 0, 0, 1]][rank], dtype=dtype)
    if dtype.is_floating_point:
        return torch.tensor([[1.5, -2.0, 3.0, 100.0, 0.25], [3.0, 2.0, -1.0, 27.0, 4.0]][rank],
                            dtype=dtype)  # fmt: skip
    high = 200 if not dtype.is_signed else 100  # sums of 100 + 100 wrap in i8
    return torch.tensor([[1, 2, 3, high, 7], [3, 2, 1, high, 12]][rank]).to(dtype)


def run_matrix(ctx: Any, cases: list[tuple[str, str]]) -> dict:
    """Worker: runs every (kind, element type) case; returns {case: result}."""
    import distir

    out: dict = {}
    for kind, element in cases:
        source = native_source(kind, element) if kind != "moves" else moves_source(element)
        program = distir.compile(source)
        inputs = [values(element, ctx.rank)]
        if kind == "moves":
            inputs.append(torch.tensor([[2, 3], [4, 1]][ctx.rank]))
        out[kind, element] = program.run(*inputs)
    return out
