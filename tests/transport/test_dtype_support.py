"""Every native reduction kind x every element type the README lists: either
refused when the program is compiled (naming the op, its location and the
type) or run correctly on 2 gloo ranks, never a third outcome (a run-time
backend error, a wrong value). Data moves (broadcast, all-gather,
all-to-all) run every element type."""

from __future__ import annotations

import functools
import operator

import pytest
import torch

import distir
from distir.errors import CompileError
from distir.runtime.launch import LaunchError, launch
from tests.transport.dtype_cases import (
    DTYPES,
    ELEMENT_TYPES,
    KINDS,
    moves_source,
    native_source,
    run_matrix,
    values,
)

CASES = [(k, e) for k in KINDS for e in ELEMENT_TYPES] + [("moves", e) for e in ELEMENT_TYPES]
_outcome: list = []


def refusal(kind: str, element: str) -> str | None:
    """The compile-time error of a case, or None when it compiles."""
    try:
        distir.compile(native_source(kind, element) if kind != "moves" else moves_source(element))
    except CompileError as e:
        return f"{type(e).__name__}: {e}"
    return None


def outcomes() -> dict:
    """Every rank's result of every case that compiles (one launch for the
    module)."""
    if not _outcome:
        runnable = [case for case in CASES if refusal(*case) is None]
        try:
            _outcome.append(launch(run_matrix, 2, runnable, pass_context=True, timeout=100))
        except LaunchError as e:
            _outcome.append(e)
    if isinstance(_outcome[0], LaunchError):
        pytest.fail(f"the launch failed:\n{_outcome[0]}", pytrace=False)
    return _outcome[0]


def wrap(value: int, dtype: torch.dtype) -> int:
    """`value` as `dtype` stores it (two's complement wrap-around)."""
    bits = torch.iinfo(dtype).bits
    value &= (1 << bits) - 1
    return value - (1 << bits) if dtype.is_signed and value >> (bits - 1) else value


FOLDS = {"sum": operator.add, "prod": operator.mul, "min": min, "max": max,
         "band": operator.and_, "bor": operator.or_, "bxor": operator.xor}  # fmt: skip


def expected(kind: str, element: str) -> list:
    dtype = DTYPES[element]
    columns = zip(*(values(element, r).tolist() for r in range(2)))
    folded = [functools.reduce(FOLDS[kind], column) for column in columns]
    if dtype == torch.bool:
        return [bool(v) if kind != "bxor" else bool(v & 1) for v in folded]
    if dtype.is_floating_point:  # one operation: rounded once
        return torch.tensor(folded, dtype=torch.float64).to(dtype).tolist()
    return [wrap(int(v), dtype) for v in folded]


@pytest.mark.multirank
@pytest.mark.parametrize("kind, element", CASES[: len(KINDS) * len(ELEMENT_TYPES)])
def test_native_reduction_is_refused_at_compile_time_or_correct(kind, element):
    refused = refusal(kind, element)
    if refused is not None:
        for named in ("'dist.all_reduce'", "at <program>:2:3", element):
            assert named in refused, refused
        assert refused.startswith(("UnsupportedOpError", "CompileError: the program does not"))
        return
    for rank in range(2):
        y = outcomes()[rank][kind, element]
        assert y.dtype == DTYPES[element]
        assert y.tolist() == expected(kind, element), (kind, element, y)
        if y.dtype == torch.bool:  # a valid bool (gloo sums bools as bytes: 2, 3, ... 0)
            assert set(y.view(torch.uint8).tolist()) <= {0, 1}, (kind, y.view(torch.uint8))


@pytest.mark.multirank
@pytest.mark.parametrize("element", ELEMENT_TYPES)
def test_data_moves_run_every_element_type(element):
    x = [values(element, r) for r in range(2)]
    for rank in range(2):
        b, g, a, counts = outcomes()[rank]["moves", element]
        assert torch.equal(b, x[1])
        assert torch.equal(g, torch.cat(x))
        sent = [(2, 3), (4, 1)]  # rank r sends sent[r][q] rows to q
        parts = [x[q][sum(sent[q][:rank]) : sum(sent[q][: rank + 1])] for q in range(2)]
        assert torch.equal(a, torch.cat(parts)), (element, rank)
        assert counts.tolist() == [sent[q][rank] for q in range(2)]


def test_what_is_refused_is_what_gloo_cannot_run():
    refused = {(k, e) for k, e in CASES if refusal(k, e) is not None}
    gaps = {"i16", "si16", "ui16", "ui32", "ui64"}  # gloo: "Invalid scalar type"
    floats = {"f16", "bf16", "f32", "f64"}
    assert refused == {(k, e) for k in KINDS for e in gaps} | {
        (k, e) for k in ("band", "bor", "bxor") for e in floats
    }
