"""Float constants written as MLIR writes them mean what MLIR means: a
hexadecimal element of a float `dense<...>` is the element's bit pattern
(how MLIR prints -inf, NaN and every value it cannot print exactly), for
every float type and every class of bit pattern; `inf`/`nan` words, which
MLIR has no literal for, are refused by name with the spelling to use.

The oracle is `struct`/numpy's reading of the same bits (bf16: the top half
of an f32), which shares no code with distir's parser."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.errors import CompileError

WIDTH = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
N = 4


def value_of(bits: int, element: str) -> float:
    if element == "bf16":
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0]
    form, unsigned = {"f16": ("e", "H"), "f32": ("f", "I"), "f64": ("d", "Q")}[element]
    return struct.unpack(f"<{form}", struct.pack(f"<{unsigned}", bits))[0]


def exponent_bits(element: str) -> int:
    return {"f16": 5, "bf16": 8, "f32": 8, "f64": 11}[element]


def patterns(element: str) -> st.SearchStrategy[int]:
    """Bit patterns of every class: ±0, subnormal, normal, largest, ±inf, NaN."""
    width, e = WIDTH[element], exponent_bits(element)
    m = width - 1 - e
    sign = st.sampled_from([0, 1 << (width - 1)])
    top = (1 << e) - 1
    classes = st.one_of(
        st.just(0),  # zero
        st.integers(1, (1 << m) - 1),  # subnormal
        st.tuples(st.integers(1, top - 1), st.integers(0, (1 << m) - 1)).map(
            lambda t: (t[0] << m) | t[1]
        ),  # normal
        st.just(((top - 1) << m) | ((1 << m) - 1)),  # the largest finite
        st.just(top << m),  # inf
        st.integers(1 << (m - 1), (1 << m) - 1).map(lambda f: (top << m) | f),  # quiet NaN
    )
    return st.tuples(sign, classes).map(lambda t: t[0] | t[1])


def program(bits: list[int], element: str) -> str:
    digits = WIDTH[element] // 4
    elements = ", ".join(f"0x{b:0{digits}X}" for b in bits)
    t = f"tensor<{N}x{element}>"
    return f"func.func @main() -> {t} {{\n  %c = arith.constant dense<[{elements}]> : {t}\n  func.return %c : {t}\n}}"


def same(got: float, want: float) -> bool:
    if math.isnan(want):  # a NaN stays a NaN (its payload is not kept)
        return math.isnan(got)
    return got == want and math.copysign(1, got) == math.copysign(1, want)


@pytest.mark.parametrize("element", sorted(WIDTH))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_hexadecimal_float_element_is_its_bit_pattern_and_round_trips(element, data):
    bits = [data.draw(patterns(element)) for _ in range(N)]
    compiled = distir.compile(program(bits, element))
    (value,) = compiled.simulate([[]])
    want = [value_of(b, element) for b in bits]
    assert all(same(g, w) for g, w in zip(value.tolist(), want)), (bits, value, want)
    # printed and read back: the same values
    (again,) = distir.compile(str(compiled.module)).simulate([[]])
    assert all(same(g, w) for g, w in zip(again.tolist(), want)), str(compiled.module)


@pytest.mark.parametrize("word", ["inf", "-inf", "nan"])
def test_inf_and_nan_words_are_refused_with_the_spelling_to_use(word):
    t = "tensor<2xf32>"
    text = f"func.func @main() -> {t} {{\n  %c = arith.constant dense<{word}> : {t}\n  func.return %c : {t}\n}}"
    with pytest.raises(CompileError, match=rf"2:29: .*MLIR has no '{word}' literal.*0xFF800000 -inf"):
        distir.compile(text)


@pytest.mark.parametrize(
    ("literal", "message"),
    [("0x1FF800000", "wider than f32"), ("-0x3F800000", "takes no sign")],
)
def test_a_bit_pattern_that_cannot_be_one_is_refused(literal, message):
    t = "tensor<2xf32>"
    text = f"func.func @main() -> {t} {{\n  %c = arith.constant dense<{literal}> : {t}\n  func.return %c : {t}\n}}"
    with pytest.raises(CompileError, match=message):
        distir.compile(text)


def test_integer_elements_keep_their_values():
    t = "tensor<2xi32>"
    text = f"func.func @main() -> {t} {{\n  %c = arith.constant dense<0x10> : {t}\n  func.return %c : {t}\n}}"
    assert distir.compile(text).simulate([[]])[0].tolist() == [16, 16]
