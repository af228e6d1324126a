"""Torch kernels for the local (non-communicating) ops a program may use.

`LOCAL_KERNELS`, one declared table at the end of this module, maps each
op class to a *kernel factory*: called once per op at compile time, it reads
the op's attributes and returns a callable over tensors that returns a tuple
of results. Nothing here walks IR at run time.
Values are tensors throughout; scalars (index, i64, f32, i1) are 0-d tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from xdsl.dialects import arith, math, tensor
from xdsl.dialects.builtin import (
    DenseIntOrFPElementsAttr,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    TensorType,
)
from xdsl.dialects.linalg.ops import BroadcastOp as LinalgBroadcastOp
from xdsl.dialects.linalg.ops import ReduceOp as LinalgReduceOp
from xdsl.ir import Attribute, Operation

from distir.core.dtypes import element_dtype, static_shape
from distir.ir import tensor_arith
from distir.ir.analysis import is_sum_reduction
from distir.ir.attributes import REDUCTION_KINDS

Kernel = Callable[..., tuple[torch.Tensor, ...]]
KernelFactory = Callable[[Operation], Kernel]

_SIGN_BIT = -(1 << 63)


def _binary(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> KernelFactory:
    def factory(op: Operation) -> Kernel:
        return lambda a, b: (fn(a, b),)

    return factory


def _int_width(t: Attribute) -> int:
    elem = t.element_type if isinstance(t, TensorType) else t
    return elem.width.data if isinstance(elem, IntegerType) else 64


def _unsigned(x: torch.Tensor, width: int) -> torch.Tensor:
    """Reinterpret signed storage as unsigned, widened so it stays exact."""
    if width >= 64:
        return x  # callers of 64-bit unsigned ops document the non-negative domain
    return x.to(torch.int64) & ((1 << width) - 1)


# Integer and float arithmetic ------------------------------------------------
#
# The float contract (README, "Float contract"): `maximumf`/`minimumf` and the
# native `max`/`min` are IEEE 754-2019 maximum/minimum: NaN if either operand
# is NaN, and -0.0 orders below +0.0. `maxnumf`/`minnumf` return the other
# operand when one is NaN, and order zeros the same way. torch.maximum and
# torch.fmax return their first operand on a tie of zeros, which would make
# the result depend on the fold order (and so on the algorithm); these
# functions decide ties by the sign bit, so every order gives the same bits.


def _zero_tie(fn: Callable[..., torch.Tensor], larger: bool) -> Callable[..., torch.Tensor]:
    def combine(
        a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if not (a.is_floating_point() or b.is_floating_point()):
            return fn(a, b, out=out) if out is not None else fn(a, b)
        # On a == b only zeros can differ (in sign): max keeps the one
        # without the sign bit, min the one with it.
        a_negative = torch.signbit(a)
        tie = torch.where(a_negative, b, a) if larger else torch.where(a_negative, a, b)
        picked = fn(a, b)
        if out is None:
            return torch.where(a == b, tie, picked)
        return torch.where(a == b, tie, picked, out=out)

    combine.__name__ = f"ieee_{'max' if larger else 'min'}_{fn.__name__}"
    return combine


#: IEEE 754-2019 maximum / minimum (arith.maximumf / minimumf, native max / min)
maximum = _zero_tie(torch.maximum, larger=True)
minimum = _zero_tie(torch.minimum, larger=False)
#: IEEE 754-2019 maximumNumber / minimumNumber (arith.maxnumf / minnumf)
maximum_number = _zero_tie(torch.fmax, larger=True)
minimum_number = _zero_tie(torch.fmin, larger=False)

#: Binary arith ops that are one torch function of (lhs, rhs) accepting
#: `out=`: also what the all-reduce algorithms run in place.
BINARY_TORCH_OPS: dict[type[Operation], Callable[..., torch.Tensor]] = {
    arith.AddiOp: torch.add,
    arith.SubiOp: torch.sub,
    arith.MuliOp: torch.mul,
    arith.AndIOp: torch.bitwise_and,
    arith.OrIOp: torch.bitwise_or,
    arith.XOrIOp: torch.bitwise_xor,
    arith.MaxSIOp: torch.maximum,
    arith.MinSIOp: torch.minimum,
    arith.ShLIOp: torch.bitwise_left_shift,
    arith.ShRSIOp: torch.bitwise_right_shift,
    arith.AddfOp: torch.add,
    arith.SubfOp: torch.sub,
    arith.MulfOp: torch.mul,
    arith.DivfOp: torch.div,
    arith.MaximumfOp: maximum,
    arith.MinimumfOp: minimum,
    arith.MaxnumfOp: maximum_number,
    arith.MinnumfOp: minimum_number,
}

#: The fold of each native reduction kind, element by element, derived from
#: the kind's arith combine (`distir.ir.attributes.REDUCTION_KINDS`): its float
#: combine where it has one (IEEE maximum/minimum, whose zero ties and NaN
#: the float contract fixes; on integers they are the signed max/min), else
#: its integer one. The one table the reference interpreter and the
#: point-to-point algorithms share.
NATIVE_FOLDS: Mapping[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    kind: BINARY_TORCH_OPS[facts.float_combine or facts.integer_combine]
    for kind, facts in REDUCTION_KINDS.items()
}


def fold_in_rank_order(
    combine: Callable[..., tuple[torch.Tensor, ...]],
    values: Sequence[torch.Tensor],
    extras: Sequence[torch.Tensor] = (),
) -> torch.Tensor:
    """`x_0 ⊕ x_1 ⊕ … ⊕ x_{P-1}`, left to right: the order in which the dialect
    defines every reduction (docs/reference/dialect.md). `combine(acc, x, *extras)` returns a 1-tuple,
    as a compiled combine region does; returns `values[0]` itself for one value."""
    acc = values[0]
    for value in values[1:]:
        (acc,) = combine(acc, value, *extras)
    return acc


def _divsi(op: Operation) -> Kernel:
    return lambda a, b: (torch.div(a, b, rounding_mode="trunc"),)


def _remsi(op: Operation) -> Kernel:
    return lambda a, b: (torch.fmod(a, b),)


def _as_uint64(x: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().cpu().numpy()).view(np.uint64)


def _from_uint64(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values).view(np.int64)).to(like.device)


def _unsigned64(fast, exact):
    """i64 unsigned op: torch's signed op where both operands are below 2^63
    (the common case: limbs, counts), an exact uint64 path otherwise."""

    def run(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
        if bool((a < 0).any()) or bool((b < 0).any()):
            a, b = torch.broadcast_tensors(a, b)
            return (_from_uint64(exact(_as_uint64(a), _as_uint64(b)), a),)
        return (fast(a, b),)

    return run


def _min_max_u64(pick_min: bool):
    def run(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
        # Flipping the sign bit maps unsigned order onto signed order.
        a_lt_b = (a ^ _SIGN_BIT) < (b ^ _SIGN_BIT)
        return (torch.where(a_lt_b if pick_min else ~a_lt_b, a, b),)

    return run


def _shrui64(a: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor]:
    shifted = torch.bitwise_right_shift(a, n)
    keep = torch.bitwise_left_shift(torch.ones_like(a), 64 - n) - 1  # 2^(64-n) - 1
    return (torch.where(n > 0, shifted & keep, a),)


def _unsigned_binary(op: Operation) -> Kernel:
    width = _int_width(op.operands[0].type)
    dtype = element_dtype(op.operands[0].type)
    if width >= 64:
        if isinstance(op, arith.DivUIOp):
            return _unsigned64(lambda a, b: torch.div(a, b, rounding_mode="floor"), np.floor_divide)
        if isinstance(op, arith.RemUIOp):
            return _unsigned64(torch.remainder, np.remainder)
        if isinstance(op, arith.ShRUIOp):
            return _shrui64
        return _min_max_u64(isinstance(op, arith.MinUIOp))
    fn = {
        arith.DivUIOp: lambda a, b: torch.div(a, b, rounding_mode="floor"),
        arith.RemUIOp: torch.remainder,
        arith.MaxUIOp: torch.maximum,
        arith.MinUIOp: torch.minimum,
        arith.ShRUIOp: torch.bitwise_right_shift,
    }[type(op)]
    return lambda a, b: (fn(_unsigned(a, width), _unsigned(b, width)).to(dtype),)


def _negf(op: Operation) -> Kernel:
    return lambda a: (torch.neg(a),)


_CMPI = {
    0: torch.eq,
    1: torch.ne,
    2: torch.lt,
    3: torch.le,
    4: torch.gt,
    5: torch.ge,
    6: torch.lt,  # ult
    7: torch.le,  # ule
    8: torch.gt,  # ugt
    9: torch.ge,  # uge
}


def _cmpi(op: Operation) -> Kernel:
    predicate = op.predicate.value.data  # type: ignore[attr-defined]
    fn = _CMPI[predicate]
    width = _int_width(op.operands[0].type)
    if predicate >= 6 and width < 64:
        return lambda a, b: (fn(_unsigned(a, width), _unsigned(b, width)),)
    if predicate >= 6:
        # Flipping the sign bit maps unsigned 64-bit order onto signed order.
        return lambda a, b: (fn(a ^ _SIGN_BIT, b ^ _SIGN_BIT),)
    return lambda a, b: (fn(a, b),)


def _unordered(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.isnan() | b.isnan()


#: arith.cmpf, by predicate number (false, oeq, ogt, oge, olt, ole, one, ord,
#: ueq, ugt, uge, ult, ule, une, uno, true): torch's comparisons are the
#: ordered ones (false on NaN); an unordered predicate is the negation of the
#: opposite ordered one.
_CMPF: dict[int, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    0: lambda a, b: torch.zeros(torch.broadcast_shapes(a.shape, b.shape), dtype=torch.bool),
    1: torch.eq,
    2: torch.gt,
    3: torch.ge,
    4: torch.lt,
    5: torch.le,
    6: lambda a, b: torch.ne(a, b) & ~_unordered(a, b),
    7: lambda a, b: ~_unordered(a, b),
    8: lambda a, b: torch.eq(a, b) | _unordered(a, b),
    9: lambda a, b: ~torch.le(a, b),
    10: lambda a, b: ~torch.lt(a, b),
    11: lambda a, b: ~torch.ge(a, b),
    12: lambda a, b: ~torch.gt(a, b),
    13: torch.ne,
    14: _unordered,
    15: lambda a, b: torch.ones(torch.broadcast_shapes(a.shape, b.shape), dtype=torch.bool),
}


def _cmpf(op: Operation) -> Kernel:
    fn = _CMPF[op.predicate.value.data]  # type: ignore[attr-defined]
    return lambda a, b: (fn(a, b),)


def _select(op: Operation) -> Kernel:
    if isinstance(op.operands[0].type, TensorType):
        return lambda c, a, b: (torch.where(c, a, b),)
    return lambda c, a, b: ((a if bool(c) else b),)


# Casts -----------------------------------------------------------------------
# Signless integers are torch's signed ones; `i1` is torch.bool, whose true
# is 1 read as unsigned and -1 read as signed (MLIR's `extsi`/`sitofp` of
# true give -1).


def _is_i1(t: Attribute) -> bool:
    return element_dtype(t) == torch.bool


def _to_result_dtype(op: Operation) -> Kernel:
    dtype = element_dtype(op.results[0].type)
    return lambda a: (a.to(dtype),)


def _signed_cast(op: Operation) -> Kernel:
    """extsi, sitofp: an i1 operand reads as 0 or -1."""
    dtype = element_dtype(op.results[0].type)
    if _is_i1(op.operands[0].type):
        return lambda a: (-(a.to(dtype)),)
    return lambda a: (a.to(dtype),)


def _trunci(op: Operation) -> Kernel:
    dtype = element_dtype(op.results[0].type)
    if dtype == torch.bool:  # the low bit, not "nonzero"
        return lambda a: ((a & 1).to(torch.bool),)
    return lambda a: (a.to(dtype),)


def _unsigned_to_float(op: Operation) -> Kernel:
    width = _int_width(op.operands[0].type)
    dtype = element_dtype(op.results[0].type)
    if width >= 64:
        # Negative storage is 2^64 more read as unsigned.
        return lambda a: ((a.to(torch.float64) + (a < 0).to(torch.float64) * 2.0**64).to(dtype),)
    return lambda a: (_unsigned(a, width).to(dtype),)


def _float_to_unsigned(op: Operation) -> Kernel:
    dtype = element_dtype(op.results[0].type)
    if dtype == torch.bool:
        return lambda a: ((a.trunc().to(torch.int64) & 1).to(torch.bool),)
    # Through int64 so that values above the signed range of the width wrap
    # to the same bits an unsigned conversion gives; values in [2^63, 2^64)
    # (in range for a 64-bit unsigned result) are out of int64's range, so
    # they convert less 2^63 and get the top bit back by wrapping.
    def run(a: torch.Tensor) -> tuple[torch.Tensor]:
        whole = a.trunc()
        if a.dtype in (torch.float16, torch.bfloat16):  # below 2^63 anyway
            return (whole.to(torch.int64).to(dtype),)
        high = whole >= _TWO_TO_63
        low = torch.where(high, whole - _TWO_TO_63, whole).to(torch.int64)
        bits = torch.where(high, low + _INT64_MIN, low)
        return (bits.to(dtype),)

    return run


_TWO_TO_63 = float(2**63)
_INT64_MIN = torch.tensor(-(2**63), dtype=torch.int64)


def _float_to_signed(op: Operation) -> Kernel:
    dtype = element_dtype(op.results[0].type)
    if dtype == torch.bool:  # -1.0 is true, 0.0 false
        return lambda a: (a.trunc() != 0,)
    return lambda a: (a.to(dtype),)


def _bitcast(op: Operation) -> Kernel:
    dtype = element_dtype(op.results[0].type)
    if dtype == element_dtype(op.operands[0].type) or dtype == torch.bool:
        return lambda a: (a.to(dtype),)
    # A 0-d tensor cannot be viewed as another dtype: through one element.
    return lambda a: (a.reshape(-1).view(dtype).reshape(a.shape),)


def _extui(op: Operation) -> Kernel:
    width = _int_width(op.operands[0].type)
    dtype = element_dtype(op.results[0].type)
    if width == 1:
        return lambda a: (a.to(dtype),)
    return lambda a: (_unsigned(a, width).to(dtype),)


# Math ------------------------------------------------------------------------


def _round_half_away(a: torch.Tensor) -> torch.Tensor:
    """math.round: to the nearest integer, halves away from zero, the sign
    of zero kept. Not floor(|a| + 0.5): that sum rounds (0.49999997 + 0.5
    is 1.0 in f32, 2^23 + 1.5 rounds to even); a - trunc(a) is exact."""
    whole = a.trunc()
    up = (a - whole).abs() >= 0.5
    return torch.copysign(torch.where(up, whole + torch.sign(a), whole), a)


def _round_to_odd_f32(s: torch.Tensor) -> torch.Tensor:
    """An f64 tensor rounded to f32 by rounding to odd: exact values stay,
    an inexact one becomes the one of its two f32 neighbours whose last bit
    is odd. Rounding that once more to nearest (to a type of 22 or fewer
    significant bits) is the correct rounding of the original."""
    f = s.to(torch.float32)
    error = s - f.double()  # exact: f is within an ulp of s
    even = (f.view(torch.int32) & 1) == 0
    toward = torch.where(error > 0, torch.inf, -torch.inf).to(torch.float32)
    return torch.where((error != 0) & even & torch.isfinite(f), torch.nextafter(f, toward), f)


def _fma(op: Operation) -> Kernel:
    """math.fma: a * b + c with one rounding. For f32, f16 and bf16 the
    product is exact in f64 (at most 48 significant bits); the sum is
    rounded to odd in f64 (TwoSum gives its exact error), which 53 >= 24 + 2
    bits make a correct single rounding to the result type. f64 has no such
    wider type in torch: refused at compile time rather than rounded twice."""
    dtype = element_dtype(op.results[0].type)
    if dtype == torch.float64:
        raise NotImplementedError(
            "math.fma on f64 (torch has no fused multiply-add that rounds once)"
        )

    def run(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor]:
        p = a.double() * b.double()
        c = c.double()
        s = p + c
        back = s - p
        error = (p - (s - back)) + (c - back)  # TwoSum: s + error == p + c
        even = (s.view(torch.int64) & 1) == 0
        toward = torch.where(error > 0, torch.inf, -torch.inf).to(torch.float64)
        s = torch.where((error != 0) & even & torch.isfinite(s), torch.nextafter(s, toward), s)
        if dtype == torch.float32:
            return (s.to(dtype),)
        return (_round_to_odd_f32(s).to(dtype),)

    return run


def _cbrt_f64(x: torch.Tensor) -> torch.Tensor:
    """The real cube root in f64, within an ulp and exact on exact cubes:
    x = m * 2^(3q) with m in [0.5, 4), cbrt(m) by pow and one Newton step,
    times 2^q (exact). pow(x, 1/3) alone is off by up to ~60 ulp far from 1
    (1/3 is inexact) and gives 3.9999999999999996 for 64."""
    mantissa, exponent = torch.frexp(x.abs())
    q = torch.div(exponent, 3, rounding_mode="floor")
    m = torch.ldexp(mantissa, exponent - 3 * q)
    y = m.pow(1.0 / 3.0)
    y = y - (y * y * y - m) / (3.0 * y * y)
    y = torch.ldexp(y, q)
    special = (x == 0) | ~torch.isfinite(x)
    return torch.copysign(torch.where(special, x.abs(), y), x)


def _cbrt(a: torch.Tensor) -> torch.Tensor:
    return _cbrt_f64(a.double()).to(a.dtype)


#: the `math` ops with a kernel: one torch function each, element by element
MATH_TORCH_OPS: dict[type[Operation], Callable[..., torch.Tensor]] = {
    math.AbsFOp: torch.abs,
    math.AbsIOp: torch.abs,  # wraps at the minimum, as MLIR's
    math.AcosOp: torch.acos,
    math.AcoshOp: torch.acosh,
    math.AsinOp: torch.asin,
    math.AsinhOp: torch.asinh,
    math.AtanOp: torch.atan,
    math.AtanhOp: torch.atanh,
    math.Atan2Op: torch.atan2,
    math.CbrtOp: _cbrt,
    math.CeilOp: torch.ceil,
    math.CopySignOp: torch.copysign,
    math.CosOp: torch.cos,
    math.CoshOp: torch.cosh,
    math.ErfOp: torch.erf,
    math.ExpOp: torch.exp,
    math.Exp2Op: torch.exp2,
    math.ExpM1Op: torch.expm1,
    math.FloorOp: torch.floor,
    math.FPowIOp: lambda a, n: torch.pow(a, n.to(a.dtype)),
    math.LogOp: torch.log,
    math.Log10Op: torch.log10,
    math.Log1pOp: torch.log1p,
    math.Log2Op: torch.log2,
    math.PowFOp: torch.pow,
    math.RoundOp: _round_half_away,
    math.RoundEvenOp: torch.round,  # torch rounds half to even
    math.RsqrtOp: torch.rsqrt,
    math.SinOp: torch.sin,
    math.SinhOp: torch.sinh,
    math.SqrtOp: torch.sqrt,
    math.TanOp: torch.tan,
    math.TanhOp: torch.tanh,
    math.TruncOp: torch.trunc,
}


def _math(fn: Callable[..., torch.Tensor]) -> KernelFactory:
    def factory(op: Operation) -> Kernel:
        return lambda *xs: (fn(*xs),)

    return factory




# Constants -------------------------------------------------------------------


def constant_tensor(value: Attribute, result_type: Attribute) -> torch.Tensor:
    dtype = element_dtype(result_type)
    if isinstance(value, IntegerAttr | FloatAttr):
        return torch.tensor(value.value.data, dtype=dtype)
    if isinstance(value, DenseIntOrFPElementsAttr):
        shape = [d for d in static_shape(result_type)]
        values = value.get_values()
        if len(values) == 1 and (not shape or int(torch.tensor(shape).prod()) != 1):
            return torch.full(shape, values[0], dtype=dtype)
        return torch.tensor(list(values), dtype=dtype).reshape(shape)
    raise NotImplementedError(f"constant of attribute {value}")


def _constant(op: arith.ConstantOp) -> Kernel:
    value = constant_tensor(op.value, op.result.type)
    # Results are never written in place, so every run may share the tensor.
    return lambda: (value,)


# Tensor ops ------------------------------------------------------------------


def _sizes(result_type: Attribute, dynamic: Sequence[torch.Tensor]) -> list[int]:
    it = iter(dynamic)
    return [d if d is not None else int(next(it)) for d in static_shape(result_type)]


def _empty(op: tensor.EmptyOp) -> Kernel:
    t = op.tensor.type
    dtype = element_dtype(t)
    return lambda *dyn: (torch.empty(_sizes(t, dyn), dtype=dtype),)


def _dim(op: tensor.DimOp) -> Kernel:
    return lambda x, i: (torch.tensor(x.shape[int(i)], dtype=torch.int64),)


def _extract(op: Operation) -> Kernel:
    return lambda x, *idx: (x[tuple(int(i) for i in idx)].clone(),)


def _insert(op: Operation) -> Kernel:
    def run(v: torch.Tensor, x: torch.Tensor, *idx: torch.Tensor):
        y = x.clone()
        y[tuple(int(i) for i in idx)] = v
        return (y,)

    return run


def _from_elements(op: Operation) -> Kernel:
    shape = [d for d in static_shape(op.results[0].type)]
    return lambda *xs: (torch.stack(list(xs)).reshape(shape),)


def _splat(op: Operation) -> Kernel:
    t = op.results[0].type
    return lambda v, *dyn: (v.expand(_sizes(t, dyn)).clone(),)


def _cast(op: Operation) -> Kernel:
    return lambda x: (x,)


def _extract_slice(op: tensor.ExtractSliceOp) -> Kernel:
    static_offsets = op.static_offsets.get_values()
    static_sizes = op.static_sizes.get_values()
    static_strides = op.static_strides.get_values()
    n_off, n_size = len(op.offsets), len(op.sizes)
    result_shape = static_shape(op.result.type)

    def fill(static: Sequence[int], values: Sequence[torch.Tensor]) -> list[int]:
        it = iter(values)
        return [int(next(it)) if s < -(2**62) else s for s in static]

    def run(x: torch.Tensor, *dyn: torch.Tensor):
        offsets = fill(static_offsets, dyn[:n_off])
        sizes = fill(static_sizes, dyn[n_off : n_off + n_size])
        strides = fill(static_strides, dyn[n_off + n_size :])
        index = tuple(slice(o, o + s * st, st) for o, s, st in zip(offsets, sizes, strides))
        y = x[index]
        if len(result_shape) != y.dim():  # rank-reducing slice
            y = y.reshape([d if d is not None else -1 for d in result_shape])
        return (y.clone(),)

    return run


def _concat(op: Operation) -> Kernel:
    dim = op.dim.value.data  # type: ignore[attr-defined]
    return lambda *xs: (torch.cat(xs, dim=dim),)


def _reshape(op: Operation) -> Kernel:
    return lambda x, shape: (x.reshape([int(s) for s in shape]).clone(),)


def broadcast_view(x: torch.Tensor, shape: Sequence[int], added: Sequence[int]) -> torch.Tensor:
    """`linalg.broadcast` of x to `shape`, adding the dimensions `added`: a
    view, no copy."""
    view = [1 if d in added else s for d, s in enumerate(shape)]
    return x.reshape(view).expand(list(shape))


def _broadcast(op: LinalgBroadcastOp) -> Kernel:
    added = tuple(op.dimensions.get_values())
    # Kernels never write into their inputs, so a view is safe.
    return lambda x, init: (broadcast_view(x, init.shape, added),)


def _reduce(op: LinalgReduceOp) -> Kernel:
    # Only the sum: a general body would need an element-by-element
    # interpreter; the sum is what gradients of broadcasts need.
    if not is_sum_reduction(op):
        raise NotImplementedError("'linalg.reduce' with a body other than one arith.addf/addi")
    dims = tuple(op.dimensions.get_values())
    return lambda x, init: (init + x.sum(dim=dims, dtype=x.dtype) if dims else init + x,)


#: Ops whose kernels always return new tensors that nothing else holds:
#: the block compiler lets a collective overwrite such a value at its last
#: use. (Constants are shared by every run; casts may return their input;
#: broadcasts are views; select returns an operand.)
FRESH_RESULTS: frozenset[type[Operation]] = frozenset(
    {
        *BINARY_TORCH_OPS,
        arith.DivSIOp, arith.RemSIOp, arith.DivUIOp, arith.RemUIOp, arith.MaxUIOp,
        arith.MinUIOp, arith.ShRUIOp, arith.NegfOp, arith.CmpiOp, arith.CmpfOp,
        tensor_arith.CmpiOp, tensor_arith.CmpfOp, *MATH_TORCH_OPS, math.FmaOp,
        tensor.EmptyOp, tensor.DimOp, tensor.ExtractOp, tensor.InsertOp,
        tensor.FromElementsOp, tensor.SplatOp, tensor.ExtractSliceOp, tensor.ConcatOp,
        tensor.ReshapeOp,
    }
)  # fmt: skip


#: The kernel factory of every local op, declared here in one table (the
#: block compiler and the combine compiler read it; nothing registers itself).
LOCAL_KERNELS: Mapping[type[Operation], KernelFactory] = {
    **{op: _binary(fn) for op, fn in BINARY_TORCH_OPS.items()},
    **{op: _math(fn) for op, fn in MATH_TORCH_OPS.items()},
    math.FmaOp: _fma,
    arith.DivSIOp: _divsi,
    arith.RemSIOp: _remsi,
    **dict.fromkeys(
        (arith.DivUIOp, arith.RemUIOp, arith.MaxUIOp, arith.MinUIOp, arith.ShRUIOp),
        _unsigned_binary,
    ),
    arith.NegfOp: _negf,
    **dict.fromkeys((arith.CmpiOp, tensor_arith.CmpiOp), _cmpi),
    **dict.fromkeys((arith.CmpfOp, tensor_arith.CmpfOp), _cmpf),
    **dict.fromkeys((arith.SelectOp, tensor_arith.SelectOp), _select),
    **dict.fromkeys(
        (arith.ExtSIOp, tensor_arith.ExtSIOp, arith.SIToFPOp, tensor_arith.SIToFPOp),
        _signed_cast,
    ),
    **dict.fromkeys((arith.TruncIOp, tensor_arith.TruncIOp), _trunci),
    **dict.fromkeys((arith.FPToSIOp, tensor_arith.FPToSIOp), _float_to_signed),
    **dict.fromkeys((arith.UIToFPOp, tensor_arith.UIToFPOp), _unsigned_to_float),
    **dict.fromkeys((arith.FPToUIOp, tensor_arith.FPToUIOp), _float_to_unsigned),
    **dict.fromkeys(
        (arith.ExtFOp, tensor_arith.ExtFOp, arith.TruncFOp, tensor_arith.TruncFOp,
         arith.IndexCastOp),
        _to_result_dtype,
    ),
    arith.BitcastOp: _bitcast,
    **dict.fromkeys((arith.ExtUIOp, tensor_arith.ExtUIOp), _extui),
    arith.ConstantOp: _constant,
    tensor.EmptyOp: _empty,
    tensor.DimOp: _dim,
    tensor.ExtractOp: _extract,
    tensor.InsertOp: _insert,
    tensor.FromElementsOp: _from_elements,
    tensor.SplatOp: _splat,
    tensor.CastOp: _cast,
    tensor.ExtractSliceOp: _extract_slice,
    tensor.ConcatOp: _concat,
    tensor.ReshapeOp: _reshape,
    LinalgBroadcastOp: _broadcast,
    LinalgReduceOp: _reduce,
}  # fmt: skip
