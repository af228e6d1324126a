"""Kernels whose IEEE / MLIR definition is exact, against exact references
that share no code with distir: Python's `fractions` (every finite float is
a Fraction), rounded to the result type by choosing, among its neighbours,
the nearest (ties to the even significand).

- `math.fma`: a * b + c rounded once (f32, f16, bf16); refused on f64;
- `arith.fptoui` to 64 bits: the integer part, [2^63, 2^64) included;
- `math.cbrt`: within an ulp of the real cube root, exact on exact cubes;
- `math.round`: halves away from zero, the sign of zero kept.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from runtime_support import as_tuple

import distir
from distir.errors import UnsupportedOpError

N = 6
IR = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64"}


def run(source: str, *inputs: torch.Tensor) -> torch.Tensor:
    (result,) = distir.compile(source).simulate([list(inputs)], timeout=10)
    return as_tuple(result)[0]


def unary(op: str, dtype: torch.dtype, result: str | None = None) -> str:
    t = f"tensor<{N}x{IR[dtype]}>"
    r = result or t
    tail = f"{t} to {r}" if result else t
    return f"""
func.func @main(%a: {t}) -> {r} {{
  %r = {op} %a : {tail}
  func.return %r : {r}
}}"""


def floats_of(dtype: torch.dtype, **kwargs) -> st.SearchStrategy[float]:
    """Every value of `dtype` can be drawn (bf16: an f32 draw rounded)."""
    width = {torch.float16: 16, torch.float32: 32, torch.float64: 64, torch.bfloat16: 32}[dtype]
    if kwargs.get("allow_infinity", True) is False:
        largest = torch.finfo(dtype).max  # (bf16: f32 values past it round to inf)
        kwargs.setdefault("min_value", -largest)
        kwargs.setdefault("max_value", largest)
    values = st.floats(width=width, **kwargs)
    if dtype == torch.bfloat16:
        values = values.map(lambda v: torch.tensor(v).to(torch.bfloat16).item())
    return values


def nearest(q: Fraction, dtype: torch.dtype) -> float:
    """`q` rounded to nearest `dtype`, ties to even: the neighbours of a
    guess are candidates, the exact distance decides."""
    guess = torch.tensor(float(q), dtype=torch.float64).to(dtype)
    inf = torch.tensor(math.inf, dtype=dtype)
    candidates = [guess]
    for _ in range(2):
        candidates += [torch.nextafter(c, s) for c in list(candidates) for s in (inf, -inf)]
    finite = {c.item() for c in candidates if math.isfinite(c.item())}

    def key(v: float):
        bits = torch.tensor(v, dtype=dtype).view(
            {2: torch.int16, 4: torch.int32, 8: torch.int64}[torch.finfo(dtype).bits // 8]
        )
        return (abs(Fraction(v) - q), int(bits.item()) & 1)

    return min(finite, key=key)


# -- math.fma -------------------------------------------------------------------------


def fma_program(dtype: torch.dtype) -> str:
    t = f"tensor<{N}x{IR[dtype]}>"
    return f"""
func.func @main(%a: {t}, %b: {t}, %c: {t}) -> {t} {{
  %r = math.fma %a, %b, %c : {t}
  func.return %r : {t}
}}"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_fma_rounds_once(dtype, data):
    values = floats_of(dtype, allow_nan=False, allow_infinity=False)
    a, b, c = ([data.draw(values) for _ in range(N)] for _ in range(3))
    # TwoProduct's error term: c = -(a*b rounded), whose fma is the exact error
    product = (torch.tensor(a[:2], dtype=dtype) * torch.tensor(b[:2], dtype=dtype)).tolist()
    c[:2] = [-p if math.isfinite(p) else x for p, x in zip(product, c)]
    got = run(fma_program(dtype), *(torch.tensor(v, dtype=dtype) for v in (a, b, c)))
    for i in range(N):
        exact = Fraction(a[i]) * Fraction(b[i]) + Fraction(c[i])
        want = nearest(exact, dtype)
        largest = torch.finfo(dtype).max
        if abs(want) >= largest:  # beyond the type: rounds to ±inf or ±max
            continue
        assert got[i].item() == want, (a[i], b[i], c[i], got[i].item(), want)


def test_fma_gives_twoproducts_error_term():
    a = torch.tensor([1 + 2**-23] * N, dtype=torch.float32)
    p = a * a
    got = run(fma_program(torch.float32), a, a, -p)
    exact = Fraction(1 + 2**-23) ** 2 - Fraction(p[0].item())
    assert got[0].item() == float(exact) != 0.0


def test_fma_on_f64_is_refused_by_name():
    with pytest.raises(UnsupportedOpError, match="'math.fma' at .*f64"):
        distir.compile(fma_program(torch.float64))


# -- arith.fptoui ------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["ui64", "i64"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_fptoui_to_64_bits_is_the_integer_part_up_to_2_to_the_64(target, dtype, data):
    top = torch.tensor(2.0**64, dtype=dtype).nextafter(torch.tensor(0.0, dtype=dtype)).item()
    values = floats_of(dtype, min_value=0.0, max_value=top)
    xs = [data.draw(values) for _ in range(N)]
    xs[:2] = [float(2**63), top]
    got = run(unary("arith.fptoui", dtype, f"tensor<{N}x{target}>"), torch.tensor(xs, dtype=dtype))
    bits = [v % 2**64 for v in got.view(torch.int64).tolist()]
    assert bits == [math.trunc(x) for x in xs], xs


# -- math.cbrt -------------------------------------------------------------------------


def _faithful(x: float, r: float, dtype: torch.dtype) -> bool:
    """r is one of the two `dtype` values around the real cube root of x."""
    t = torch.tensor(r, dtype=dtype)
    lo = torch.nextafter(t, torch.tensor(-math.inf, dtype=dtype)).item()
    hi = torch.nextafter(t, torch.tensor(math.inf, dtype=dtype)).item()
    if x < 0:
        return _faithful(-x, -r, dtype)
    return Fraction(lo) ** 3 <= Fraction(x) <= Fraction(hi) ** 3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
@example(data=None)
def test_cbrt_is_within_an_ulp_and_exact_on_cubes(dtype, data):
    if data is None:  # the case and the edges, every time
        xs = [64.0, -27.0, 2.0**-1074 if dtype == torch.float64 else 2.0**-149, 1e300 if dtype == torch.float64 else 1e38, 8.0, 0.001]
    else:
        xs = [data.draw(floats_of(dtype, allow_nan=False, allow_infinity=False)) for _ in range(N)]
        xs[0] = float(data.draw(st.integers(-(2**17), 2**17)) ** 3) if dtype == torch.float64 else float(
            data.draw(st.integers(-(2**8), 2**8)) ** 3
        )
    xs = [torch.tensor(x, dtype=dtype).item() for x in xs]
    got = run(unary("math.cbrt", dtype), torch.tensor(xs, dtype=dtype)).tolist()
    for x, r in zip(xs, got):
        if x == 0:
            assert r == 0 and math.copysign(1, r) == math.copysign(1, x)
            continue
        assert _faithful(x, r, dtype), (x, r)
        root = round(abs(Fraction(x)) ** Fraction(1, 3)) if abs(x) >= 1 else None
        if root is not None and Fraction(root) ** 3 == abs(Fraction(x)):
            assert r == math.copysign(root, x), (x, r)


def test_cbrt_of_the_special_values():
    xs = torch.tensor([-0.0, 0.0, math.inf, -math.inf, math.nan, -8.0])
    got = run(unary("math.cbrt", torch.float32), xs)
    assert got[:5].tolist()[:4] == [-0.0, 0.0, math.inf, -math.inf]
    assert math.copysign(1, got[0].item()) == -1 and math.isnan(got[4].item())
    assert got[5].item() == -2.0


# -- math.round ------------------------------------------------------------------------


def _round_away(x: float) -> float:
    q = Fraction(x)
    whole = math.floor(abs(q) + Fraction(1, 2))
    return math.copysign(float(whole), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_halves_away_from_zero_keeping_the_sign(dtype, data):
    xs = [data.draw(floats_of(dtype, allow_nan=False, allow_infinity=False)) for _ in range(N)]
    xs[:4] = [-0.0, 0.49999997, 8388609.0, -0.3]
    xs = [torch.tensor(x, dtype=dtype).item() for x in xs]
    got = run(unary("math.round", dtype), torch.tensor(xs, dtype=dtype)).tolist()
    for x, r in zip(xs, got):
        want = _round_away(x)
        assert r == want and math.copysign(1, r) == math.copysign(1, want), (x, r, want)
