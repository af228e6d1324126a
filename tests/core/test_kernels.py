"""Local (non-communicating) ops compile to kernels that compute what the
arith / tensor / linalg / scf / func semantics say.

Expected values come from Python integers and floats: signed results are
wrapped to the op's width, unsigned ops reinterpret the operands modulo
2^width. Programs run through `Program.simulate` with one rank (plus a few
ranks where a collective sits in a loop), so no process is started.
"""

from __future__ import annotations

import math
import operator

import pytest
import torch
from runtime_support import INTEGER_PREDICATES, as_tuple, location

import distir
from distir.errors import CompileError, UnsupportedOpError

INT_DTYPES = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def run1(source: str, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Compile and run on a single simulated rank."""
    (result,) = distir.compile(source).simulate([list(inputs)], timeout=10)
    return as_tuple(result)


def wrap(value: int, width: int) -> int:
    """Two's complement wrap of a Python int to `width` bits."""
    half = 1 << (width - 1)
    return (value + half) % (1 << width) - half


def unsigned(value: int, width: int) -> int:
    return value % (1 << width)


def trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


# Integer arithmetic on tensors --------------------------------------------------

SIGNED_BINARY = {
    "addi": operator.add,
    "subi": operator.sub,
    "muli": operator.mul,
    "andi": operator.and_,
    "ori": operator.or_,
    "xori": operator.xor,
    "maxsi": max,
    "minsi": min,
    "divsi": trunc_div,
    "remsi": lambda a, b: a - b * trunc_div(a, b),
    "shli": lambda a, b: a << b,
    "shrsi": lambda a, b: a >> b,
}

UNSIGNED_BINARY = {
    "divui": operator.floordiv,
    "remui": operator.mod,
    "maxui": max,
    "minui": min,
    "shrui": lambda a, b: a >> b,
}

LHS = [-7, 9, 100, -1, 2**20 + 3, -(2**25), 5]
RHS = [3, 2, 7, 1, 5, 3, 6]  # positive: valid divisors and shift amounts


def binary_program(op: str, width: int, n: int) -> str:
    t = f"tensor<{n}xi{width}>"
    return f"""\
func.func @main(%a: {t}, %b: {t}) -> {t} {{
  %r = arith.{op} %a, %b : {t}
  func.return %r : {t}
}}
"""


@pytest.mark.parametrize("width", [32, 64])
@pytest.mark.parametrize("op", sorted(SIGNED_BINARY))
def test_signed_integer_binary_ops(op, width) -> None:
    dtype = INT_DTYPES[width]
    a, b = torch.tensor(LHS, dtype=dtype), torch.tensor(RHS, dtype=dtype)
    (r,) = run1(binary_program(op, width, len(LHS)), a, b)
    expected = [wrap(SIGNED_BINARY[op](x, y), width) for x, y in zip(LHS, RHS)]
    assert r.dtype == dtype
    assert r.tolist() == expected


@pytest.mark.parametrize("width", [8, 32, 64])
@pytest.mark.parametrize("op", sorted(UNSIGNED_BINARY))
def test_unsigned_integer_binary_ops_reinterpret_negative_operands(op, width) -> None:
    dtype = INT_DTYPES[width]
    lhs = [wrap(v, width) for v in LHS]
    rhs = [3, 2, 7, 1, 5, 3, -2]  # -2 is the largest-but-one unsigned value
    if op == "shrui":
        rhs = [3, 2, 7, 1, 5, 3, 0]
    a, b = torch.tensor(lhs, dtype=dtype), torch.tensor(rhs, dtype=dtype)
    (r,) = run1(binary_program(op, width, len(lhs)), a, b)
    expected = [
        wrap(UNSIGNED_BINARY[op](unsigned(x, width), unsigned(y, width)), width)
        for x, y in zip(lhs, rhs)
    ]
    assert r.dtype == dtype
    assert r.tolist() == expected


def test_remui_shrsi_and_maxsi_in_one_program() -> None:
    source = """\
func.func @main(%a: tensor<4xi64>, %b: tensor<4xi64>) -> tensor<4xi64> {
  %r = arith.remui %a, %b : tensor<4xi64>
  %s = arith.shrsi %a, %r : tensor<4xi64>
  %m = arith.maxsi %s, %r : tensor<4xi64>
  func.return %m : tensor<4xi64>
}
"""
    lhs, rhs = [-64, 77, 1000, -5], [5, 10, 7, 3]
    (m,) = run1(source, torch.tensor(lhs), torch.tensor(rhs))
    expected = []
    for x, y in zip(lhs, rhs):
        r = wrap(unsigned(x, 64) % y, 64)
        expected.append(max(x >> r, r))
    assert m.tolist() == expected


# Comparisons, extension, select ---------------------------------------------------

PREDICATES = INTEGER_PREDICATES

COMPARE_EXTEND = """\
func.func @main(%a: i{w}, %b: i{w}) -> (i1, i{w}) {{
  %c = arith.cmpi {pred}, %a, %b : i{w}
  %e = arith.extui %c : i1 to i{w}
  %m = arith.muli %e, %a : i{w}
  %s = arith.subi %b, %m : i{w}
  func.return %c, %s : i1, i{w}
}}
"""

PAIRS = [(-1, 1), (1, -1), (3, 3), (-5, -2), (7, 2)]


def _compare(pred: str, a: int, b: int, width: int) -> bool:
    fn, is_unsigned = PREDICATES[pred]
    return fn(unsigned(a, width), unsigned(b, width)) if is_unsigned else fn(a, b)


@pytest.mark.parametrize("pred", sorted(PREDICATES))
def test_cmpi_extui_muli_subi_on_i32(pred) -> None:
    source = COMPARE_EXTEND.format(w=32, pred=pred)
    program = distir.compile(source)
    for a, b in PAIRS:
        inputs = [torch.tensor(a, dtype=torch.int32), torch.tensor(b, dtype=torch.int32)]
        ((c, s),) = program.simulate([inputs])
        expected = _compare(pred, a, b, 32)
        assert bool(c) is expected, (pred, a, b)
        assert c.dtype == torch.bool
        assert int(s) == b - int(expected) * a


@pytest.mark.parametrize("pred", sorted(PREDICATES))
def test_cmpi_on_i64_with_non_negative_operands(pred) -> None:
    program = distir.compile(COMPARE_EXTEND.format(w=64, pred=pred))
    for a, b in [(0, 1), (1, 0), (2**62, 2**62), (5, 2**40)]:
        ((c, s),) = program.simulate([[torch.tensor(a), torch.tensor(b)]])
        assert bool(c) is _compare(pred, a, b, 64), (pred, a, b)
        assert int(s) == b - int(bool(c)) * a


@pytest.mark.parametrize("pred", ["ult", "ule", "ugt", "uge"])
def test_unsigned_cmpi_on_i64_with_the_sign_bit_set(pred) -> None:
    program = distir.compile(COMPARE_EXTEND.format(w=64, pred=pred))
    for a, b in [(-1, 1), (1, -1), (-(2**63), 2**63 - 1)]:
        ((c, _s),) = program.simulate([[torch.tensor(a), torch.tensor(b)]])
        assert bool(c) is _compare(pred, a, b, 64), (pred, a, b)


SELECT = """\
func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>, %i: index) -> tensor<3xf32> {
  %two = arith.constant 2 : index
  %c = arith.cmpi slt, %i, %two : index
  %s = arith.select %c, %a, %b : tensor<3xf32>
  func.return %s : tensor<3xf32>
}
"""


@pytest.mark.parametrize("i", [0, 1, 2, 5])
def test_select_with_a_scalar_condition(i) -> None:
    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-1.0, -2.0, -3.0])
    (s,) = run1(SELECT, a, b, torch.tensor(i))
    assert torch.equal(s, a if i < 2 else b)


# Floats and casts --------------------------------------------------------------

FLOAT_BINARY = {
    "addf": operator.add,
    "subf": operator.sub,
    "mulf": operator.mul,
    "divf": operator.truediv,
}


@pytest.mark.parametrize("op", sorted(FLOAT_BINARY))
def test_float_binary_ops_on_f64(op) -> None:
    lhs, rhs = [1.5, -2.25, 1e300, 0.1], [0.5, 4.0, 1e10, 0.2]
    source = binary_program(op, 64, 4).replace("i64", "f64")
    (r,) = run1(source, torch.tensor(lhs, dtype=torch.float64), torch.tensor(rhs, dtype=torch.float64))
    assert r.tolist() == [FLOAT_BINARY[op](x, y) for x, y in zip(lhs, rhs)]


def test_float_min_max_nan_semantics() -> None:
    source = """\
func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) {
  %x = arith.maximumf %a, %b : tensor<3xf32>
  %n = arith.maxnumf %a, %b : tensor<3xf32>
  %m = arith.minnumf %a, %b : tensor<3xf32>
  func.return %x, %n, %m : tensor<3xf32>, tensor<3xf32>, tensor<3xf32>
}
"""
    nan = float("nan")
    a, b = torch.tensor([nan, 1.0, -3.0]), torch.tensor([2.0, nan, 4.0])
    x, n, m = run1(source, a, b)
    # maximumf propagates NaN; maxnumf / minnumf return the number.
    assert math.isnan(x[0]) and math.isnan(x[1]) and x[2] == 4.0
    assert n.tolist() == [2.0, 1.0, 4.0]
    assert m.tolist() == [2.0, 1.0, -3.0]


# xDSL 0.74 types the integer casts on scalars only; truncf also on tensors.
CASTS = """\
func.func @main(%a: i32, %f: f64, %fs: tensor<4xf64>) -> (i64, i8, f32, i32, f32, tensor<4xf32>) {
  %ext = arith.extsi %a : i32 to i64
  %tr = arith.trunci %a : i32 to i8
  %fp = arith.sitofp %a : i32 to f32
  %si = arith.fptosi %f : f64 to i32
  %tf = arith.truncf %f : f64 to f32
  %tfs = arith.truncf %fs : tensor<4xf64> to tensor<4xf32>
  func.return %ext, %tr, %fp, %si, %tf, %tfs : i64, i8, f32, i32, f32, tensor<4xf32>
}
"""


@pytest.mark.parametrize(("i", "f"), [(-300, -2.7), (127, 2.7), (128, 0.5), (70000, -0.5)])
def test_casts(i, f) -> None:
    fs = torch.tensor([f, 1 / 3, -1e-3, 1e20], dtype=torch.float64)
    ext, tr, fp, si, tf, tfs = run1(
        CASTS, torch.tensor(i, dtype=torch.int32), torch.tensor(f, dtype=torch.float64), fs
    )
    assert ext.dtype == torch.int64 and int(ext) == i
    assert tr.dtype == torch.int8 and int(tr) == wrap(i, 8)
    assert fp.dtype == torch.float32 and float(fp) == float(i)
    assert si.dtype == torch.int32 and int(si) == math.trunc(f)
    assert tf.dtype == torch.float32 and float(tf) == torch.tensor(f, dtype=torch.float32).item()
    assert tfs.dtype == torch.float32 and tfs.tolist() == fs.to(torch.float32).tolist()


def test_extui_and_index_cast_on_scalars() -> None:
    source = """\
func.func @main(%a: i8, %i: index) -> (i32, i64, index) {
  %u = arith.extui %a : i8 to i32
  %j = arith.index_cast %i : index to i64
  %k = arith.index_cast %j : i64 to index
  func.return %u, %j, %k : i32, i64, index
}
"""
    u, j, k = run1(source, torch.tensor(-3, dtype=torch.int8), torch.tensor(41))
    assert u.dtype == torch.int32 and int(u) == unsigned(-3, 8)
    assert j.dtype == torch.int64 and int(j) == 41 and int(k) == 41


# Constants ------------------------------------------------------------------------


def test_constants_dense_splat_dense_list_and_scalars() -> None:
    source = """\
func.func @main() -> (tensor<2x3xi64>, tensor<2x2xf32>, tensor<3xi1>, tensor<2xi8>, index, i1, f64, tensor<i32>, tensor<1x1xi64>) {
  %splat = arith.constant dense<7> : tensor<2x3xi64>
  %list = arith.constant dense<[[1.0, 2.5], [-3.5, 4.0]]> : tensor<2x2xf32>
  %bools = arith.constant dense<[true, false, true]> : tensor<3xi1>
  %extremes = arith.constant dense<[-128, 127]> : tensor<2xi8>
  %index = arith.constant 5 : index
  %flag = arith.constant true
  %float = arith.constant -2.5 : f64
  %zero_d = arith.constant dense<3> : tensor<i32>
  %one = arith.constant dense<[[9]]> : tensor<1x1xi64>
  func.return %splat, %list, %bools, %extremes, %index, %flag, %float, %zero_d, %one : tensor<2x3xi64>, tensor<2x2xf32>, tensor<3xi1>, tensor<2xi8>, index, i1, f64, tensor<i32>, tensor<1x1xi64>
}
"""
    splat, lst, bools, extremes, index, flag, fl, zero_d, one = run1(source)
    assert splat.shape == (2, 3) and splat.dtype == torch.int64 and set(splat.reshape(-1).tolist()) == {7}
    assert lst.dtype == torch.float32 and lst.tolist() == [[1.0, 2.5], [-3.5, 4.0]]
    assert bools.dtype == torch.bool and bools.tolist() == [True, False, True]
    assert extremes.dtype == torch.int8 and extremes.tolist() == [-128, 127]
    assert index.dim() == 0 and index.dtype == torch.int64 and int(index) == 5
    assert flag.dtype == torch.bool and bool(flag) is True
    assert fl.dtype == torch.float64 and float(fl) == -2.5
    assert zero_d.dim() == 0 and zero_d.dtype == torch.int32 and int(zero_d) == 3
    assert one.shape == (1, 1) and one.tolist() == [[9]]


# Tensor ops and linalg.broadcast -----------------------------------------------------


def test_extract_from_elements_dim_and_empty() -> None:
    source = """\
func.func @main(%a: tensor<?x3xi64>) -> (tensor<2xi64>, index, index, tensor<?x3xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %x01 = tensor.extract %a[%c0, %c1] : tensor<?x3xi64>
  %x10 = tensor.extract %a[%c1, %c0] : tensor<?x3xi64>
  %pair = tensor.from_elements %x10, %x01 : tensor<2xi64>
  %rows = tensor.dim %a, %c0 : tensor<?x3xi64>
  %cols = tensor.dim %a, %c1 : tensor<?x3xi64>
  %buf = tensor.empty(%rows) : tensor<?x3xf32>
  func.return %pair, %rows, %cols, %buf : tensor<2xi64>, index, index, tensor<?x3xf32>
}
"""
    a = torch.arange(15).reshape(5, 3) * 7
    pair, rows, cols, buf = run1(source, a)
    assert pair.tolist() == [a[1, 0].item(), a[0, 1].item()]
    assert (int(rows), int(cols)) == (5, 3)
    assert buf.shape == (5, 3) and buf.dtype == torch.float32


def test_insert_splat_slice_concat_reshape() -> None:
    source = """\
func.func @main(%a: tensor<2x3xi64>, %v: i64) -> (tensor<2x3xi64>, tensor<3x4xi64>, tensor<1x2xi64>, tensor<4x3xi64>, tensor<3x2xi64>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %ins = tensor.insert %v into %a[%c1, %c0] : tensor<2x3xi64>
  %sp = tensor.splat %v : tensor<3x4xi64>
  %sl = tensor.extract_slice %a[1, 1] [1, 2] [1, 1] : tensor<2x3xi64> to tensor<1x2xi64>
  %cat = tensor.concat dim(0) %a, %ins : (tensor<2x3xi64>, tensor<2x3xi64>) -> tensor<4x3xi64>
  %shape = arith.constant dense<[3, 2]> : tensor<2xi64>
  %rs = tensor.reshape %a(%shape) : (tensor<2x3xi64>, tensor<2xi64>) -> tensor<3x2xi64>
  func.return %ins, %sp, %sl, %cat, %rs : tensor<2x3xi64>, tensor<3x4xi64>, tensor<1x2xi64>, tensor<4x3xi64>, tensor<3x2xi64>
}
"""
    a = torch.arange(6).reshape(2, 3)
    original = a.clone()
    ins, sp, sl, cat, rs = run1(source, a, torch.tensor(-9))
    expected_ins = original.clone()
    expected_ins[1, 0] = -9
    assert torch.equal(a, original), "tensor.insert must not write its operand"
    assert torch.equal(ins, expected_ins)
    assert torch.equal(sp, torch.full((3, 4), -9))
    assert sl.tolist() == [[original[1, 1].item(), original[1, 2].item()]]
    assert torch.equal(cat, torch.cat([original, expected_ins]))
    assert rs.tolist() == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize("dims", [[0], [1], [0, 2]])
def test_linalg_broadcast_adds_the_listed_dimensions(dims) -> None:
    out_shape = [2, 3, 4][: 2 if dims != [0, 2] else 3]
    kept = [s for d, s in enumerate(out_shape) if d not in dims]
    in_t = "tensor<" + "".join(f"{s}x" for s in kept) + "i64>"
    out_t = "tensor<" + "".join(f"{s}x" for s in out_shape) + "i64>"
    source = f"""\
func.func @main(%a: {in_t}) -> {out_t} {{
  %e = tensor.empty() : {out_t}
  %b = linalg.broadcast ins(%a : {in_t}) outs(%e : {out_t}) dimensions = {dims}
  func.return %b : {out_t}
}}
"""
    a = torch.arange(math.prod(kept)).reshape(kept) + 1
    (b,) = run1(source, a)
    assert list(b.shape) == out_shape
    for index in torch.cartesian_prod(*[torch.arange(s) for s in out_shape]).tolist():
        index = index if isinstance(index, list) else [index]
        source_index = tuple(i for d, i in enumerate(index) if d not in dims)
        assert b[tuple(index)] == a[source_index]


# Control flow and calls ----------------------------------------------------------------


def test_scf_for_with_iter_args_and_the_induction_variable() -> None:
    source = """\
func.func @main(%a: tensor<3xi64>, %n: index) -> (tensor<3xi64>, i64) {
  %lb = arith.constant 1 : index
  %st = arith.constant 2 : index
  %zero = arith.constant 0 : i64
  %r:2 = scf.for %i = %lb to %n step %st iter_args(%acc = %a, %count = %zero) -> (tensor<3xi64>, i64) {
    %iv = arith.index_cast %i : index to i64
    %v = tensor.splat %iv : tensor<3xi64>
    %next = arith.addi %acc, %v : tensor<3xi64>
    %one = arith.constant 1 : i64
    %c = arith.addi %count, %one : i64
    scf.yield %next, %c : tensor<3xi64>, i64
  }
  func.return %r#0, %r#1 : tensor<3xi64>, i64
}
"""
    a = torch.tensor([10, 20, 30])
    for n in [0, 1, 2, 7]:
        acc, count = run1(source, a, torch.tensor(n))
        steps = list(range(1, n, 2))
        assert acc.tolist() == [v + sum(steps) for v in a.tolist()]
        assert int(count) == len(steps)


def test_scf_if_with_else() -> None:
    source = """\
func.func @main(%a: tensor<3xi64>, %c: i1) -> tensor<3xi64> {
  %r = scf.if %c -> (tensor<3xi64>) {
    %d = arith.addi %a, %a : tensor<3xi64>
    scf.yield %d : tensor<3xi64>
  } else {
    %n = arith.subi %a, %a : tensor<3xi64>
    %m = arith.subi %n, %a : tensor<3xi64>
    scf.yield %m : tensor<3xi64>
  }
  func.return %r : tensor<3xi64>
}
"""
    a = torch.tensor([1, -2, 3])
    (then,) = run1(source, a, torch.tensor(True))
    (other,) = run1(source, a, torch.tensor(False))
    assert then.tolist() == [2 * v for v in a.tolist()]
    assert other.tolist() == [-v for v in a.tolist()]


def test_func_call_with_several_results_and_nested_calls() -> None:
    source = """\
func.func @square(%x: tensor<3xi64>) -> tensor<3xi64> {
  %y = arith.muli %x, %x : tensor<3xi64>
  func.return %y : tensor<3xi64>
}
func.func @both(%x: tensor<3xi64>, %y: tensor<3xi64>) -> (tensor<3xi64>, tensor<3xi64>) {
  %s = func.call @square(%x) : (tensor<3xi64>) -> tensor<3xi64>
  %d = arith.subi %s, %y : tensor<3xi64>
  func.return %d, %s : tensor<3xi64>, tensor<3xi64>
}
func.func @main(%a: tensor<3xi64>, %b: tensor<3xi64>) -> (tensor<3xi64>, tensor<3xi64>) {
  %r:2 = func.call @both(%a, %b) : (tensor<3xi64>, tensor<3xi64>) -> (tensor<3xi64>, tensor<3xi64>)
  func.return %r#1, %r#0 : tensor<3xi64>, tensor<3xi64>
}
"""
    a, b = torch.tensor([1, -2, 5]), torch.tensor([4, 4, 4])
    squares, diff = run1(source, a, b)
    assert squares.tolist() == [v * v for v in a.tolist()]
    assert diff.tolist() == [v * v - w for v, w in zip(a.tolist(), b.tolist())]


def test_a_collective_inside_scf_for_runs_once_per_iteration() -> None:
    source = """\
func.func @main(%x: tensor<2xi64>) -> tensor<2xi64> {
  %lb = arith.constant 0 : index
  %n = arith.constant 4 : index
  %st = arith.constant 1 : index
  %r = scf.for %i = %lb to %n step %st iter_args(%acc = %x) -> (tensor<2xi64>) {
    %s = dist.all_reduce sum %acc : tensor<2xi64>
    scf.yield %s : tensor<2xi64>
  }
  func.return %r : tensor<2xi64>
}
"""
    world_size, n = 3, 4
    xs = [torch.tensor([r, 10 * r + 1]) for r in range(world_size)]
    results = distir.compile(source).simulate([[x] for x in xs], timeout=10)
    total = [sum(x[i].item() for x in xs) for i in range(2)]
    expected = [v * world_size ** (n - 1) for v in total]
    for r in results:
        assert r.tolist() == expected


# Unsupported ops: compile errors naming the op and its location ---------------------------


UNSUPPORTED_TOP_LEVEL = """\
func.func @main(%a: tensor<3xi64>) -> tensor<3xi64> {
  %r = arith.ceildivsi %a, %a : tensor<3xi64>
  func.return %r : tensor<3xi64>
}
"""

UNSUPPORTED_IN_LOOP = """\
func.func @main(%a: tensor<3xi64>) -> tensor<3xi64> {
  %lb = arith.constant 0 : index
  %ub = arith.constant 2 : index
  %st = arith.constant 1 : index
  %r = scf.for %i = %lb to %ub step %st iter_args(%acc = %a) -> (tensor<3xi64>) {
    %n = arith.floordivsi %acc, %a : tensor<3xi64>
    scf.yield %n : tensor<3xi64>
  }
  func.return %r : tensor<3xi64>
}
"""

UNSUPPORTED_IN_CALLEE = """\
func.func @helper(%a: tensor<3xi64>) -> tensor<3xi64> {
  %n = arith.ceildivui %a, %a : tensor<3xi64>
  func.return %n : tensor<3xi64>
}
func.func @main(%a: tensor<3xi64>) -> tensor<3xi64> {
  %r = func.call @helper(%a) : (tensor<3xi64>) -> tensor<3xi64>
  func.return %r : tensor<3xi64>
}
"""

UNSUPPORTED_MATH = """\
func.func @main(%a: tensor<4xi32>) -> tensor<4xi32> {
  %r = math.ctpop %a : tensor<4xi32>
  func.return %r : tensor<4xi32>
}
"""

UNSUPPORTED_MATH_IN_COMBINE = """\
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce %x : tensor<4xi64> combine(%a, %b) {
    %s = arith.addi %a, %b : tensor<4xi64>
    %z = math.ctlz %s : tensor<4xi64>
    dist.yield %z : tensor<4xi64>
  }
  func.return %y : tensor<4xi64>
}
"""

UNSUPPORTED_IN_COMBINE = """\
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce %x : tensor<4xi64> combine(%a, %b) {
    %s = arith.ceildivsi %a, %b : tensor<4xi64>
    dist.yield %s : tensor<4xi64>
  }
  func.return %y : tensor<4xi64>
}
"""


@pytest.mark.parametrize(
    ("source", "op_name"),
    [
        (UNSUPPORTED_TOP_LEVEL, "arith.ceildivsi"),
        (UNSUPPORTED_IN_LOOP, "arith.floordivsi"),
        (UNSUPPORTED_IN_CALLEE, "arith.ceildivui"),
        (UNSUPPORTED_MATH, "math.ctpop"),
        (UNSUPPORTED_MATH_IN_COMBINE, "math.ctlz"),
        pytest.param(
            UNSUPPORTED_IN_COMBINE,
            "arith.ceildivsi",
        ),
    ],
    ids=["top-level", "in-scf-for", "in-callee", "math", "math-in-combine", "in-combine-region"],
)
def test_an_unsupported_op_is_a_compile_error_naming_it(tmp_path, source, op_name) -> None:
    path = tmp_path / "unsupported.mlir"
    path.write_text(source)
    with pytest.raises(UnsupportedOpError) as info:
        distir.compile(path)
    assert isinstance(info.value, CompileError)
    assert f"'{op_name}' at {location(source, op_name, str(path))}" in str(info.value)
