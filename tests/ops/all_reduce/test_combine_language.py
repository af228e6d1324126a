"""The ops a combine region is written in, on tensors, against their
definitions: comparisons (every predicate), select with a tensor condition,
the casts between integer and float widths, and the `math` dialect.

Expected values come from Python numbers and numpy, element by element, not
from the kernels' torch calls. Every op runs on one simulated rank.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_support import INTEGER_PREDICATES
from strategies import examples
from xdsl.dialects import math as math_dialect

import distir
from distir.core.kernels import LOCAL_KERNELS, MATH_TORCH_OPS
from distir.errors import DistirError
from distir.ir.parsing import parse_module
from distir.ir.tensor_arith import TENSOR_ARITH_OPS

N = 5
SETTINGS = settings(max_examples=examples(0.25), deadline=None)


def run1(source: str, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    (result,) = distir.compile(source).simulate([list(inputs)], timeout=10)
    return result if isinstance(result, tuple) else (result,)


def unary_program(op: str, src: str, dst: str, suffix: str = "") -> str:
    return f"""\
func.func @main(%a: tensor<{N}x{src}>) -> tensor<{N}x{dst}> {{
  %r = {op} %a : tensor<{N}x{src}>{suffix}
  func.return %r : tensor<{N}x{dst}>
}}
"""


floats = st.lists(
    st.floats(allow_nan=True, allow_infinity=True, width=32) | st.sampled_from([0.0, -0.0, 1.0]),
    min_size=N,
    max_size=N,
)


def ints(width: int):
    return st.lists(
        st.integers(-(1 << (width - 1)), (1 << (width - 1)) - 1), min_size=N, max_size=N
    )


# Comparisons ----------------------------------------------------------------------


def _ordered(fn):
    return lambda a, b: not (math.isnan(a) or math.isnan(b)) and fn(a, b)


def _unordered(fn):
    return lambda a, b: math.isnan(a) or math.isnan(b) or fn(a, b)


CMPF = {
    "false": lambda a, b: False,
    "oeq": _ordered(operator.eq),
    "ogt": _ordered(operator.gt),
    "oge": _ordered(operator.ge),
    "olt": _ordered(operator.lt),
    "ole": _ordered(operator.le),
    "one": _ordered(operator.ne),
    "ord": _ordered(lambda a, b: True),
    "ueq": _unordered(operator.eq),
    "ugt": _unordered(operator.gt),
    "uge": _unordered(operator.ge),
    "ult": _unordered(operator.lt),
    "ule": _unordered(operator.le),
    "une": _unordered(operator.ne),
    "uno": _unordered(lambda a, b: False),
    "true": lambda a, b: True,
}


@pytest.mark.parametrize("pred", sorted(CMPF))
@SETTINGS
@given(a=floats, b=floats)
def test_cmpf_on_tensors_follows_every_predicate(pred, a, b) -> None:
    source = f"""\
func.func @main(%a: tensor<{N}xf32>, %b: tensor<{N}xf32>) -> tensor<{N}xi1> {{
  %c = arith.cmpf {pred}, %a, %b : tensor<{N}xf32>
  func.return %c : tensor<{N}xi1>
}}
"""
    (c,) = run1(source, torch.tensor(a), torch.tensor(b))
    assert c.dtype == torch.bool and c.shape == (N,)
    assert c.tolist() == [CMPF[pred](x, y) for x, y in zip(a, b)]


CMPI = INTEGER_PREDICATES
INT_DTYPES = {8: torch.int8, 32: torch.int32, 64: torch.int64}


@pytest.mark.parametrize("pred", sorted(CMPI))
@pytest.mark.parametrize("width", [8, 64])
@SETTINGS
@given(data=st.data())
def test_cmpi_on_tensors_follows_every_predicate(pred, width, data) -> None:
    a, b = data.draw(ints(width)), data.draw(ints(width))
    source = f"""\
func.func @main(%a: tensor<{N}xi{width}>, %b: tensor<{N}xi{width}>) -> tensor<{N}xi1> {{
  %c = arith.cmpi {pred}, %a, %b : tensor<{N}xi{width}>
  func.return %c : tensor<{N}xi1>
}}
"""
    dtype = INT_DTYPES[width]
    (c,) = run1(source, torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype))
    fn, unsigned = CMPI[pred]
    mod = 1 << width
    assert c.tolist() == [fn(x % mod, y % mod) if unsigned else fn(x, y) for x, y in zip(a, b)]


SELECT = f"""\
func.func @main(%c: tensor<{N}xi1>, %a: tensor<{N}xf64>, %b: tensor<{N}xf64>) -> tensor<{N}xf64> {{
  %r = arith.select %c, %a, %b : tensor<{N}xi1>, tensor<{N}xf64>
  func.return %r : tensor<{N}xf64>
}}
"""


@SETTINGS
@given(c=st.lists(st.booleans(), min_size=N, max_size=N), a=floats, b=floats)
def test_select_with_a_tensor_condition_picks_element_by_element(c, a, b) -> None:
    (r,) = run1(
        SELECT,
        torch.tensor(c),
        torch.tensor(a, dtype=torch.float64),
        torch.tensor(b, dtype=torch.float64),
    )
    expected = [x if k else y for k, x, y in zip(c, a, b)]
    assert [str(v) for v in r.tolist()] == [str(v) for v in expected]  # NaN and -0.0 too


def test_select_prints_in_mlir_syntax() -> None:
    printed = str(parse_module(SELECT))
    assert f"arith.select %c, %a, %b : tensor<{N}xi1>, tensor<{N}xf64>" in printed
    assert str(parse_module(printed)) == printed


# Casts --------------------------------------------------------------------------------


def _wrap(value: int, width: int) -> int:
    if width == 1:
        return value & 1
    half = 1 << (width - 1)
    return (value + half) % (1 << width) - half


@SETTINGS
@given(a=ints(32))
def test_integer_casts_on_tensors(a) -> None:
    source = f"""\
func.func @main(%a: tensor<{N}xi32>) -> (tensor<{N}xi64>, tensor<{N}xi64>, tensor<{N}xi8>, tensor<{N}xi1>, tensor<{N}xf64>, tensor<{N}xf64>) {{
  %s = arith.extsi %a : tensor<{N}xi32> to tensor<{N}xi64>
  %u = arith.extui %a : tensor<{N}xi32> to tensor<{N}xi64>
  %t = arith.trunci %a : tensor<{N}xi32> to tensor<{N}xi8>
  %b = arith.trunci %a : tensor<{N}xi32> to tensor<{N}xi1>
  %f = arith.sitofp %a : tensor<{N}xi32> to tensor<{N}xf64>
  %g = arith.uitofp %a : tensor<{N}xi32> to tensor<{N}xf64>
  func.return %s, %u, %t, %b, %f, %g : tensor<{N}xi64>, tensor<{N}xi64>, tensor<{N}xi8>, tensor<{N}xi1>, tensor<{N}xf64>, tensor<{N}xf64>
}}
"""
    s, u, t, b, f, g = run1(source, torch.tensor(a, dtype=torch.int32))
    assert s.tolist() == a
    assert u.tolist() == [x % (1 << 32) for x in a]
    assert t.dtype == torch.int8 and t.tolist() == [_wrap(x, 8) for x in a]
    assert b.dtype == torch.bool and b.tolist() == [bool(x & 1) for x in a]
    assert f.tolist() == [float(x) for x in a]
    assert g.tolist() == [float(x % (1 << 32)) for x in a]


def test_i1_extends_as_mlir_reads_it() -> None:
    """true is 1 unsigned and -1 signed."""
    source = """\
func.func @main(%c: tensor<2xi1>) -> (tensor<2xi32>, tensor<2xi32>, tensor<2xf32>, tensor<2xf32>) {
  %s = arith.extsi %c : tensor<2xi1> to tensor<2xi32>
  %u = arith.extui %c : tensor<2xi1> to tensor<2xi32>
  %f = arith.sitofp %c : tensor<2xi1> to tensor<2xf32>
  %g = arith.uitofp %c : tensor<2xi1> to tensor<2xf32>
  func.return %s, %u, %f, %g : tensor<2xi32>, tensor<2xi32>, tensor<2xf32>, tensor<2xf32>
}
"""
    s, u, f, g = run1(source, torch.tensor([True, False]))
    assert s.tolist() == [-1, 0] and u.tolist() == [1, 0]
    assert f.tolist() == [-1.0, 0.0] and g.tolist() == [1.0, 0.0]


finite = st.lists(
    st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, width=32), min_size=N, max_size=N
)


@SETTINGS
@given(a=finite)
def test_float_casts_on_tensors(a) -> None:
    source = f"""\
func.func @main(%a: tensor<{N}xf32>) -> (tensor<{N}xi64>, tensor<{N}xf64>, tensor<{N}xf16>, tensor<{N}xi32>, tensor<{N}xf32>) {{
  %i = arith.fptosi %a : tensor<{N}xf32> to tensor<{N}xi64>
  %e = arith.extf %a : tensor<{N}xf32> to tensor<{N}xf64>
  %h = arith.truncf %a : tensor<{N}xf32> to tensor<{N}xf16>
  %bits = arith.bitcast %a : tensor<{N}xf32> to tensor<{N}xi32>
  %back = arith.bitcast %bits : tensor<{N}xi32> to tensor<{N}xf32>
  func.return %i, %e, %h, %bits, %back : tensor<{N}xi64>, tensor<{N}xf64>, tensor<{N}xf16>, tensor<{N}xi32>, tensor<{N}xf32>
}}
"""
    i, e, h, bits, back = run1(source, torch.tensor(a))
    assert i.tolist() == [math.trunc(x) for x in a]
    assert e.tolist() == a  # exact
    with np.errstate(over="ignore"):
        assert h.numpy().tolist() == np.array(a, dtype=np.float32).astype(np.float16).tolist()
    assert bits.tolist() == np.array(a, dtype=np.float32).view(np.int32).tolist()
    assert back.tolist() == a


@SETTINGS
@given(a=st.lists(st.floats(0, 4e9, width=32), min_size=N, max_size=N))
def test_fptoui_reads_results_as_unsigned(a) -> None:
    (u,) = run1(
        unary_program("arith.fptoui", "f32", "i32", f" to tensor<{N}xi32>"), torch.tensor(a)
    )
    assert [x % (1 << 32) for x in u.tolist()] == [math.trunc(x) for x in a]


# math ---------------------------------------------------------------------------------

#: math op -> numpy function of float64 arrays, and the input domain
MATH_UNARY = {
    "absf": (np.abs, (-1e3, 1e3)),
    "acos": (np.arccos, (-1, 1)),
    "acosh": (np.arccosh, (1, 1e3)),
    "asin": (np.arcsin, (-1, 1)),
    "asinh": (np.arcsinh, (-1e3, 1e3)),
    "atan": (np.arctan, (-1e3, 1e3)),
    "atanh": (np.arctanh, (-0.99, 0.99)),
    "cbrt": (np.cbrt, (-1e3, 1e3)),
    "ceil": (np.ceil, (-1e3, 1e3)),
    "cos": (np.cos, (-1e2, 1e2)),
    "cosh": (np.cosh, (-20, 20)),
    "erf": (np.vectorize(math.erf), (-4, 4)),
    "exp": (np.exp, (-50, 50)),
    "exp2": (np.exp2, (-50, 50)),
    "expm1": (np.expm1, (-50, 50)),
    "floor": (np.floor, (-1e3, 1e3)),
    "log": (np.log, (1e-6, 1e6)),
    "log10": (np.log10, (1e-6, 1e6)),
    "log1p": (np.log1p, (-0.99, 1e6)),
    "log2": (np.log2, (1e-6, 1e6)),
    "round": (lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5), (-1e3, 1e3)),
    "roundeven": (np.rint, (-1e3, 1e3)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (1e-6, 1e6)),
    "sin": (np.sin, (-1e2, 1e2)),
    "sinh": (np.sinh, (-20, 20)),
    "sqrt": (np.sqrt, (0, 1e6)),
    "tan": (np.tan, (-1.5, 1.5)),
    "tanh": (np.tanh, (-20, 20)),
    "trunc": (np.trunc, (-1e3, 1e3)),
}
MATH_BINARY = {
    "atan2": (np.arctan2, (-1e3, 1e3)),
    "copysign": (np.copysign, (-1e3, 1e3)),
    "powf": (np.power, (0.1, 10)),
}


@pytest.mark.parametrize("name", sorted(MATH_UNARY))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_math_unary_ops_on_tensors(name, data) -> None:
    fn, (lo, hi) = MATH_UNARY[name]
    a = data.draw(st.lists(st.floats(lo, hi), min_size=N, max_size=N))
    # Halves where rounding modes differ.
    if name in ("round", "roundeven"):
        a[:2] = [2.5, -0.5]
    (r,) = run1(unary_program(f"math.{name}", "f64", "f64"), torch.tensor(a, dtype=torch.float64))
    np.testing.assert_allclose(r.numpy(), fn(np.array(a)), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("name", sorted(MATH_BINARY))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_math_binary_ops_on_tensors(name, data) -> None:
    fn, (lo, hi) = MATH_BINARY[name]
    a = data.draw(st.lists(st.floats(lo, hi), min_size=N, max_size=N))
    b = data.draw(st.lists(st.floats(lo, hi), min_size=N, max_size=N))
    source = f"""\
func.func @main(%a: tensor<{N}xf64>, %b: tensor<{N}xf64>) -> tensor<{N}xf64> {{
  %r = math.{name} %a, %b : tensor<{N}xf64>
  func.return %r : tensor<{N}xf64>
}}
"""
    (r,) = run1(source, torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64))
    np.testing.assert_allclose(r.numpy(), fn(np.array(a), np.array(b)), rtol=1e-12)


@SETTINGS
@given(c=finite, n=ints(8))
def test_fpowi_and_absi(c, n) -> None:
    # math.fma: tests/core/test_exact_kernels.py (one rounding, exactly)
    source = f"""\
func.func @main(%c: tensor<{N}xf64>, %n: tensor<{N}xi32>) -> (tensor<{N}xf64>, tensor<{N}xi32>) {{
  %p = math.fpowi %c, %n : tensor<{N}xf64>, tensor<{N}xi32>
  %i = math.absi %n : tensor<{N}xi32>
  func.return %p, %i : tensor<{N}xf64>, tensor<{N}xi32>
}}
"""
    n = [v % 7 - 3 for v in n]
    c = [v if v != 0 else 1.0 for v in c]
    p, i = run1(source, torch.tensor(c, dtype=torch.float64), torch.tensor(n, dtype=torch.int32))
    np.testing.assert_allclose(p.numpy(), np.array(c) ** np.array(n, dtype=np.float64), rtol=1e-9)
    assert i.tolist() == [abs(v) for v in n]


def test_every_math_kernel_and_tensor_arith_op_has_a_property_test_here() -> None:
    tested = {f"math.{n}" for n in (*MATH_UNARY, *MATH_BINARY, "fpowi", "absi")}
    assert {op.name for op in MATH_TORCH_OPS} == tested
    assert math_dialect.FmaOp in LOCAL_KERNELS  # tested exactly in test_exact_kernels.py
    for op in TENSOR_ARITH_OPS.values():
        assert op in LOCAL_KERNELS, op.name


def test_math_ops_without_a_kernel_are_the_bit_counts_and_ipowi() -> None:
    missing = {op.name for op in math_dialect.Math.operations if op not in LOCAL_KERNELS}
    assert missing == {"math.ctlz", "math.cttz", "math.ctpop", "math.ipowi"}


# Verification -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "%r = arith.select %c, %a, %a : tensor<3xi1>, tensor<4xf32>",
            "condition tensor<3xi1> must be i1 or have the shape of the result tensor<4xf32>",
        ),
        (
            "%r = arith.trunci %i : tensor<4xi32> to tensor<4xi64>",
            "the result's bit width must be smaller than the operand's",
        ),
        (
            "%r = arith.extf %a : tensor<4xf32> to tensor<2xf64>",
            "operand and result must have the same shape",
        ),
    ],
)
def test_ill_typed_tensor_ops_are_located_errors(line, message) -> None:
    source = f"""\
func.func @main(%a: tensor<4xf32>, %c: tensor<3xi1>, %i: tensor<4xi32>) {{
  {line}
  func.return
}}
"""
    with pytest.raises(DistirError) as info:
        distir.compile(source)
    assert message in str(info.value)
    assert "<program>:2:3" in str(info.value)


# What the new ops allow the all-reduce algorithms -----------------------------------------


def _region(body: str, commutative: bool = True) -> str:
    return f"""\
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {{
  %y = dist.all_reduce %x {"commutative" if commutative else ""} : tensor<4xf32> combine(%a, %b) {{
{body}
  }}
  func.return %y : tensor<4xf32>
}}
"""


ELEMENTWISE_SELECT = """\
    %e = math.exp %a : tensor<4xf32>
    %c = arith.cmpf olt, %e, %b : tensor<4xf32>
    %i = arith.fptosi %b : tensor<4xf32> to tensor<4xi32>
    %f = arith.sitofp %i : tensor<4xi32> to tensor<4xf32>
    %r = arith.select %c, %a, %f : tensor<4xi1>, tensor<4xf32>
    dist.yield %r : tensor<4xf32>"""

WHOLE_SELECT = """\
    %zero = arith.constant 0 : index
    %a0 = tensor.extract %a[%zero] : tensor<4xf32>
    %b0 = tensor.extract %b[%zero] : tensor<4xf32>
    %c = arith.cmpf ogt, %a0, %b0 : f32
    %r = arith.select %c, %a, %b : tensor<4xf32>
    dist.yield %r : tensor<4xf32>"""


@pytest.mark.parametrize(
    ("body", "algorithms"),
    [
        (ELEMENTWISE_SELECT, ("ring", "halving-doubling", "recursive-doubling", "gather-fold")),
        # A scalar condition picks whole operands: no chunking.
        (WHOLE_SELECT, ("recursive-doubling", "gather-fold")),
    ],
    ids=["tensor-condition", "scalar-condition"],
)
def test_which_algorithms_a_combine_of_the_new_ops_allows(body, algorithms) -> None:
    from distir.ir.dialect import AllReduceOp
    from distir.ops.all_reduce.ir import candidate_algorithms, elementwise_combine

    (op,) = [o for o in parse_module(_region(body)).walk() if isinstance(o, AllReduceOp)]
    assert candidate_algorithms(elementwise_combine(op), True) == algorithms


# What the block compiler does not accept is a compile error ---------------------------------


def test_every_unsupported_class_is_rejected_at_compile_time_naming_the_op() -> None:
    from distir.errors import UnsupportedOpError
    from distir.ir import builder as b
    from distir.ir.parsing import NO_KERNEL

    # Results in pairs (arith's *_extended ops), in a combine region.
    extended = _region("""\
    %lo, %hi = arith.mulsi_extended %a, %b : tensor<4xi32>
    dist.yield %lo : tensor<4xi32>""").replace("f32", "i32")
    with pytest.raises(UnsupportedOpError, match=r"'arith.mulsi_extended' at <program>:3:5"):
        distir.compile(extended)
    # A math op without a kernel, built from Python: located at the builder call.
    module = b.build_program(
        lambda x: b.all_reduce(x, combine=lambda p, q: b.math("ctpop", b.arith("addi", p, q))),
        [b.tensor_type("i32", [4])],
    )
    with pytest.raises(
        UnsupportedOpError, match=rf"'math.ctpop' at {__file__}:\d+:\d+: {NO_KERNEL}"
    ):
        distir.compile(module)


def test_the_ops_without_a_kernel_are_exactly_those_listed_for_distir_opt() -> None:
    from distir.ir.parsing import NO_KERNEL_OPS, make_context

    registered = [
        op
        for dialect in make_context().loaded_dialects
        if dialect.name in ("arith", "math")
        for op in dialect.operations
    ]
    assert {op for op in registered if op not in LOCAL_KERNELS} == NO_KERNEL_OPS


@pytest.mark.slow  # starts distir-opt
def test_distir_opt_rejects_an_op_without_a_kernel_where_it_is(tmp_path) -> None:
    import subprocess
    import sys

    path = tmp_path / "p.mlir"
    path.write_text(
        _region("""\
    %s = arith.addi %a, %b : tensor<4xi32>
    %c = math.ctpop %s : tensor<4xi32>
    dist.yield %c : tensor<4xi32>""").replace("f32", "i32")
    )
    done = subprocess.run([sys.executable, "-m", "distir.cli.opt", str(path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"{path}:4:5: error: 'math.ctpop' has no kernel in distir: no program can run it\n"
    ), done.stderr
