"""What a combine region computes, and how to run a generic all-reduce.

Torch-free facts about combine regions, in one place: passes decide with
them (`recognize-native-reductions`, `select-all-reduce-algorithm`) and the
Torch backend evaluates regions by them, so the pass and the backend can
never disagree about what a region is.

- `is_elementwise_region`: every output element depends only on the same
  element of the operands and extras, so the region may run chunk by chunk;
- `single_op`: the region is one binary op on (lhs, rhs), which a backend
  runs in place;
- `native_kind`: the region is one commutative op a native collective has;
- `non_commutative_witness`: operands on which the region's result depends
  on their order (the verifier refutes a `commutative` marker with it).

Which algorithm may run a combine, and which is cheapest, are facts of the
all-reduce itself (`all_reduce.py`).
"""

from __future__ import annotations

import math
from fractions import Fraction

from xdsl.dialects import arith, tensor
from xdsl.dialects.builtin import (
    AnyFloat,
    BFloat16Type,
    DenseIntOrFPElementsAttr,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    Signedness,
    TensorType,
)
from xdsl.dialects.linalg.ops import BroadcastOp as LinalgBroadcastOp
from xdsl.dialects.linalg.ops import ReduceOp as LinalgReduceOp
from xdsl.ir import Attribute, Block, Operation, SSAValue

from distir.ir.attributes import REDUCTION_KINDS, ReductionKind
from distir.ir.elementwise import ELEMENTWISE_OPS
from distir.ir.region_program import RegionProgram, broadcast_extra, region_program


def _shape(t: object) -> tuple[int, ...] | None:
    return tuple(t.get_shape()) if isinstance(t, TensorType) else None


def _is_splat(op: arith.ConstantOp) -> bool:
    return isinstance(op.value, DenseIntOrFPElementsAttr) and op.value.is_splat()


def _only_sizes(value: SSAValue) -> bool:
    """Used only as a size of a `tensor.splat` or `tensor.empty`, directly or
    through `tensor.dim`."""
    return all(
        (isinstance(use.operation, tensor.SplatOp) and use.index >= 1)
        or isinstance(use.operation, tensor.EmptyOp)
        or (isinstance(use.operation, tensor.DimOp) and use.index == 1)
        for use in value.uses
    )


def _only_broadcast_outs(value: SSAValue) -> bool:
    return all(
        isinstance(use.operation, LinalgBroadcastOp) and use.index == 1 for use in value.uses
    )


def is_elementwise_region(block: Block) -> bool:
    """Whether output element i depends only on element i of the operands
    and of the extras (broadcast extras count: element i of the broadcast).

    Allowed: arith ops on tensors of the operands' shape (the element type
    may change), splat constants and constants of that shape, `tensor.splat`
    (sizes from `tensor.dim`), and `linalg.broadcast` of an extra into a
    `tensor.empty` of that shape. Extras that are not broadcast must have the
    operands' shape."""
    shape = _shape(block.args[0].type) if block.args else None
    if shape is None:
        return False
    broadcast_sources = {
        op.operands[0] for op in block.ops if broadcast_extra(op, block) is not None
    }
    for arg in block.args[2:]:
        if _shape(arg.type) != shape and not (
            arg in broadcast_sources
            and all(isinstance(u.operation, LinalgBroadcastOp) for u in arg.uses)
        ):
            return False
    for op in block.ops:
        if op.name == "dist.yield":
            return len(op.operands) == 1
        if isinstance(op, tensor.DimOp) or (
            isinstance(op, arith.ConstantOp) and isinstance(op.result.type, IndexType)
        ):
            ok = _only_sizes(op.results[0])
        elif isinstance(op, arith.ConstantOp):
            t = op.result.type
            ok = (
                _shape(t) == shape or _is_splat(op)
                if isinstance(t, TensorType)
                else all(
                    isinstance(use.operation, tensor.SplatOp) and use.index == 0
                    for use in op.result.uses
                )
            )
        elif isinstance(op, tensor.SplatOp):
            ok = _shape(op.results[0].type) == shape
        elif isinstance(op, tensor.EmptyOp):
            ok = _shape(op.results[0].type) == shape and _only_broadcast_outs(op.results[0])
        elif isinstance(op, LinalgBroadcastOp):
            ok = broadcast_extra(op, block) is not None
        else:
            ok = isinstance(op, ELEMENTWISE_OPS) and all(
                _shape(v.type) == shape for v in (*op.operands, *op.results)
            )
        if not ok:
            return False
    return False


def single_op(block: Block) -> tuple[type[Operation], bool] | None:
    """(op type, swapped) when the region is one binary op on (lhs, rhs),
    yielded; `swapped` when its operands are (rhs, lhs)."""
    ops = list(block.ops)
    if len(ops) != 2 or len(block.args) < 2 or ops[1].name != "dist.yield":
        return None
    op, terminator = ops
    if len(op.results) != 1 or list(terminator.operands) != [op.results[0]]:
        return None
    lhs, rhs = block.args[0], block.args[1]
    if tuple(op.operands) == (lhs, rhs):
        return type(op), False
    if tuple(op.operands) == (rhs, lhs):
        return type(op), True
    return None


#: the native kind of each commutative arith op, from the kinds' fact table
NATIVE_KIND_OF: dict[type[Operation], ReductionKind] = {
    combine: kind
    for kind, facts in REDUCTION_KINDS.items()
    for combine in (facts.integer_combine, facts.float_combine)
    if combine is not None
}

# i1 arithmetic wraps (addi is xor) and maxsi/minsi read 1 as -1.
_NOT_NATIVE_ON_I1 = frozenset({arith.AddiOp, arith.MuliOp, arith.MaxSIOp, arith.MinSIOp})


def native_kind(block: Block) -> ReductionKind | None:
    """The native kind a combine region computes, if it is one recognised
    commutative op on (lhs, rhs)."""
    found = single_op(block)
    if found is None:
        return None
    op_type, _ = found
    kind = NATIVE_KIND_OF.get(op_type)
    element = (
        block.args[0].type.element_type if isinstance(block.args[0].type, TensorType) else None
    )
    if kind is None or (op_type in _NOT_NATIVE_ON_I1 and element == IntegerType(1)):
        return None
    return kind


# Commutativity --------------------------------------------------------------------
#
# A user's `commutative` marker lets the ring reorder the fold; on a region
# whose result depends on the order that is a wrong result, not a slower
# one. The verifier refutes the marker where the region is elementwise and
# evaluating it exactly, on a few small witnesses, gives
# combine(a, b) != combine(b, a) with every intermediate value exactly
# representable in its type: a proof, so a region is never rejected
# wrongly. Regions the evaluator does not know stay trusted.

#: (lhs, rhs) witnesses: small, non-negative (valid for unsigned and i8 and
#: every float type), and results of the ops below on them stay small
_WITNESSES = ((2, 5), (0, 3), (1, 2), (6, 3), (1, 0))

#: significand bits of each float type's element (its width -> bits)
_SIGNIFICAND_BITS = {16: 11, 32: 24, 64: 53}


class _Unknown(Exception):
    """The evaluator cannot decide this region on this witness exactly."""


def _element_type(value: SSAValue) -> Attribute:
    t = value.type
    return t.element_type if isinstance(t, TensorType) else t


def _exact(value: Fraction, element: Attribute) -> Fraction:
    """`value` when it is exactly representable in `element`, else _Unknown."""
    if isinstance(element, IntegerType | IndexType):
        if value.denominator != 1:
            raise _Unknown
        width = element.width.data if isinstance(element, IntegerType) else 64
        unsigned = (
            isinstance(element, IntegerType) and element.signedness.data == Signedness.UNSIGNED
        )
        if width == 1:  # i1 is a torch bool: no wrap-around to model
            if value not in (0, 1):
                raise _Unknown
            return value
        # Two's complement wrap-around, as arith defines it and torch runs it.
        wrapped = int(value) % (1 << width)
        if not unsigned and wrapped >> (width - 1):
            wrapped -= 1 << width
        return Fraction(wrapped)
    bits = _SIGNIFICAND_BITS.get(getattr(element, "bitwidth", 0))
    if isinstance(element, BFloat16Type):
        bits = 8
    if bits is None or not isinstance(element, AnyFloat):
        raise _Unknown
    if value == 0:
        return value
    numerator, denominator = abs(value.numerator), value.denominator
    if denominator & (denominator - 1) or numerator.bit_length() > bits or abs(value) > 2**15:
        raise _Unknown  # rounded, or near f16's range: not exact in every float type
    return value


def _int_op(op: Operation, a: Fraction, b: Fraction) -> Fraction:
    if isinstance(op, arith.AddiOp | arith.AddfOp):
        return a + b
    if isinstance(op, arith.SubiOp | arith.SubfOp):
        return a - b
    if isinstance(op, arith.MuliOp | arith.MulfOp):
        return a * b
    if isinstance(op, arith.DivfOp):
        if b == 0:
            raise _Unknown
        return a / b
    if isinstance(op, arith.DivSIOp | arith.DivUIOp | arith.RemSIOp | arith.RemUIOp):
        if b == 0:
            raise _Unknown
        quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # truncated
        return Fraction(quotient if isinstance(op, arith.DivSIOp | arith.DivUIOp)
                        else a - b * quotient)  # fmt: skip
    if isinstance(op, arith.MaxSIOp | arith.MaxUIOp | arith.MaximumfOp | arith.MaxnumfOp):
        return max(a, b)
    if isinstance(op, arith.MinSIOp | arith.MinUIOp | arith.MinimumfOp | arith.MinnumfOp):
        return min(a, b)
    if isinstance(op, arith.AndIOp | arith.OrIOp | arith.XOrIOp):
        if a < 0 or b < 0:
            raise _Unknown
        x, y = int(a), int(b)
        return Fraction(x & y if isinstance(op, arith.AndIOp) else
                        x | y if isinstance(op, arith.OrIOp) else x ^ y)  # fmt: skip
    raise _Unknown


_CMP = {0: lambda a, b: a == b, 1: lambda a, b: a != b, 2: lambda a, b: a < b,
        3: lambda a, b: a <= b, 4: lambda a, b: a > b, 5: lambda a, b: a >= b}  # fmt: skip
#: cmpf's ordered predicates (no NaN among the witnesses) -> cmpi's
_CMPF_AS_CMPI = {1: 0, 2: 4, 3: 5, 4: 2, 5: 3, 6: 1, 8: 0, 9: 4, 10: 5, 11: 2, 12: 3, 13: 1}


def _splat_constant(op: arith.ConstantOp) -> int | float:
    """The one value of a scalar or splat constant (every element the same
    bits: -0.0 is not 0.0, and a NaN splat is one), or _Unknown."""
    attr = op.value
    if isinstance(attr, IntegerAttr | FloatAttr):
        return attr.value.data
    values = attr.get_values() if isinstance(attr, DenseIntOrFPElementsAttr) else ()
    if values and len({repr(v) for v in values}) == 1:
        return values[0]
    raise _Unknown


#: an empty slot: an extra, or a value the evaluator does not hold
_MISSING = object()


def _evaluate(program: RegionProgram, block: Block, lhs: int, rhs: int) -> Fraction:
    """The region's yielded element on witnesses (lhs, rhs), exactly: its
    compiled steps (`region_program`) evaluated over Fractions."""
    env: list[object] = [_MISSING] * program.n_slots
    env[0] = _exact(Fraction(lhs), _element_type(block.args[0]))
    env[1] = _exact(Fraction(rhs), _element_type(block.args[1]))
    for step in program.steps:
        op = step.op
        if isinstance(op, arith.ConstantOp):
            env[step.results[0]] = Fraction(_splat_constant(op))
            continue
        if any(env[i] is _MISSING for i in step.operands) or len(step.results) != 1:
            raise _Unknown  # an extra, a size, an op the evaluator does not know
        args: list = [env[i] for i in step.operands]
        result = op.results[0]
        if isinstance(op, tensor.SplatOp):
            value = args[0]
        elif isinstance(op, arith.NegfOp):
            value = -args[0]
        elif op.name == "arith.select":  # xDSL's scalar one or tensor_arith's
            value = args[1] if args[0] else args[2]
        elif op.name == "arith.cmpi" and op.predicate.value.data in _CMP:
            value = Fraction(_CMP[op.predicate.value.data](*args))
        elif op.name == "arith.cmpf" and op.predicate.value.data in _CMPF_AS_CMPI:
            value = Fraction(_CMP[_CMPF_AS_CMPI[op.predicate.value.data]](*args))
        elif len(args) == 2:
            if isinstance(op, arith.MaxUIOp | arith.MinUIOp | arith.DivUIOp | arith.RemUIOp) and (
                args[0] < 0 or args[1] < 0
            ):
                raise _Unknown
            value = _int_op(op, *args)
        else:
            raise _Unknown
        env[step.results[0]] = _exact(value, _element_type(result))
    return _yielded(program, env)


def _yielded(program: RegionProgram, env: list[object]) -> object:
    """The one value the region yields, or _Unknown."""
    if program.result is None or env[program.result] is _MISSING:
        raise _Unknown
    return env[program.result]


def non_commutative_witness(block: Block) -> tuple[str, str, str, str] | None:
    """(a, b, combine(a, b), combine(b, a)) proving that an elementwise
    combine region depends on the order of its operands, or None when no
    witness proves it (it may still be non-commutative).

    Every ordered pair of witnesses covering the element type's whole
    domain is tried: for floats ±0, small values of both signs, the largest
    finite values, ±inf and NaN (a combine that keeps `a` when |a| >= |b|
    differs on (2, -2)); for integers negatives and the extremes too."""
    if len(block.args) < 2 or not is_elementwise_region(block):
        return None
    element = _element_type(block.args[0])
    floats = isinstance(element, AnyFloat)
    witnesses = _float_witnesses(element) if floats else _integer_witnesses(element)
    evaluate = _evaluate_floats if floats else _evaluate
    program = region_program(block)
    for i, a in enumerate(witnesses):
        for b in witnesses[i + 1 :]:
            try:
                forward = evaluate(program, block, a, b)
                backward = evaluate(program, block, b, a)
            except (_Unknown, ArithmeticError, ValueError):  # huge shifts, ...
                continue
            if not _same(forward, backward):
                return _show(a), _show(b), _show(forward), _show(backward)
    return None


def _show(x: object) -> str:
    """A witness as a message shows it: 2 for 2.0, but -0.0, inf, nan."""
    if isinstance(x, Fraction):
        return str(x)
    if isinstance(x, float) and math.isfinite(x) and x.is_integer() and x != 0:
        return str(int(x))
    return str(x)


def _same(x: object, y: object) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        if math.isnan(x) or math.isnan(y):  # any NaN is the same NaN (no payloads)
            return math.isnan(x) and math.isnan(y)
        return x == y and math.copysign(1, x) == math.copysign(1, y)
    return x == y


def _integer_witnesses(element: Attribute) -> list[int]:
    if not isinstance(element, IntegerType | IndexType):
        return list(dict.fromkeys(v for pair in _WITNESSES for v in pair))
    width = element.width.data if isinstance(element, IntegerType) else 64
    if width == 1:
        return [0, 1]
    unsigned = isinstance(element, IntegerType) and element.signedness.data == Signedness.UNSIGNED
    small = [2, 5, 0, 1, 3, 6]
    if unsigned:
        return [*small, (1 << width) - 1]
    return [*small, -1, -2, -5, -(1 << (width - 1)), (1 << (width - 1)) - 1]


#: (significand bits, largest exponent, smallest normal exponent) per float width
_FLOAT_FORMATS = {16: (11, 15, -14), 32: (24, 127, -126), 64: (53, 1023, -1022)}


def _float_format(element: Attribute) -> tuple[int, int, int]:
    if isinstance(element, BFloat16Type):
        return 8, 127, -126
    found = _FLOAT_FORMATS.get(getattr(element, "bitwidth", 0))
    if found is None:
        raise _Unknown
    return found


def _float_witnesses(element: Attribute) -> list[float]:
    try:
        bits, top, _ = _float_format(element)
    except _Unknown:
        return []
    largest = float((2 - Fraction(1, 2 ** (bits - 1))) * Fraction(2) ** top)
    small = [2.0, 5.0, 1.0, 3.0, -2.0, 0.5, -1.0, 6.0, 0.0, -0.0]
    return [*small, largest, -largest, math.inf, -math.inf, math.nan]


def _representable(q: Fraction, element: Attribute) -> bool:
    """Whether `q` is a normal (or zero) value of the float type `element`."""
    if q == 0:
        return True
    bits, top, bottom = _float_format(element)
    numerator, denominator = abs(q.numerator), q.denominator
    if denominator & (denominator - 1):
        return False
    exponent = numerator.bit_length() - denominator.bit_length()
    if not bottom <= exponent <= top:
        return False
    while numerator % 2 == 0:
        numerator //= 2
    return numerator.bit_length() <= bits


def _ieee(op: Operation, a: float, b: float, element: Attribute) -> float:
    """An arith float op on `element` values held exactly as Python floats,
    as IEEE 754 defines it, or _Unknown where it would round."""
    if isinstance(op, arith.MaximumfOp | arith.MinimumfOp | arith.MaxnumfOp | arith.MinnumfOp):
        if math.isnan(a) or math.isnan(b):
            if isinstance(op, arith.MaxnumfOp | arith.MinnumfOp):
                return b if math.isnan(a) else a
            return math.nan
        biggest = isinstance(op, arith.MaximumfOp | arith.MaxnumfOp)
        if a == b == 0:  # -0.0 below +0.0
            plus = math.copysign(1, a) > 0 or math.copysign(1, b) > 0
            minus = math.copysign(1, a) < 0 or math.copysign(1, b) < 0
            return 0.0 if (plus if biggest else not minus) else -0.0
        return max(a, b) if biggest else min(a, b)
    if isinstance(op, arith.DivfOp) and b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, math.copysign(1, a) * math.copysign(1, b))
    python = {arith.AddfOp: float.__add__, arith.SubfOp: float.__sub__,
              arith.MulfOp: float.__mul__, arith.DivfOp: float.__truediv__}  # fmt: skip
    fn = python.get(type(op))
    if fn is None:
        raise _Unknown
    result = fn(a, b)
    if math.isfinite(a) and math.isfinite(b):
        exact = _int_op(op, Fraction(a), Fraction(b))
        if not _representable(exact, element) or Fraction(result) != exact:
            raise _Unknown  # rounds or overflows in `element`: not a proof
    return result


#: MLIR's cmpf predicates: (ordered comparison, true when unordered)
_CMPF = {
    1: (lambda a, b: a == b, False), 2: (lambda a, b: a > b, False),
    3: (lambda a, b: a >= b, False), 4: (lambda a, b: a < b, False),
    5: (lambda a, b: a <= b, False), 6: (lambda a, b: a != b, False),
    7: (lambda a, b: True, False), 8: (lambda a, b: a == b, True),
    9: (lambda a, b: a > b, True), 10: (lambda a, b: a >= b, True),
    11: (lambda a, b: a < b, True), 12: (lambda a, b: a <= b, True),
    13: (lambda a, b: a != b, True), 14: (lambda a, b: False, True),
    0: (lambda a, b: False, False), 15: (lambda a, b: True, True),
}  # fmt: skip


def _evaluate_floats(program: RegionProgram, block: Block, lhs: float, rhs: float) -> object:
    """The region's yielded element on float witnesses (lhs, rhs), exactly
    as IEEE 754 defines each op on the block's element type: its compiled
    steps (`region_program`) evaluated over Python floats."""
    env: list[object] = [_MISSING] * program.n_slots
    env[0], env[1] = lhs, rhs
    for step in program.steps:
        op = step.op
        if isinstance(op, arith.ConstantOp):
            env[step.results[0]] = _splat_constant(op)
            continue
        if any(env[i] is _MISSING for i in step.operands) or len(step.results) != 1:
            raise _Unknown
        args: list = [env[i] for i in step.operands]
        result = op.results[0]
        element = _element_type(result)
        if isinstance(op, tensor.SplatOp):
            value = args[0]
        elif isinstance(op, arith.NegfOp):
            value = -args[0]
        elif op.name == "math.absf":
            value = abs(args[0])
        elif op.name == "arith.select":  # xDSL's scalar one or tensor_arith's
            value = args[1] if args[0] else args[2]
        elif op.name == "arith.cmpf" and op.predicate.value.data in _CMPF:
            compare, unordered = _CMPF[op.predicate.value.data]
            a, b = args
            value = unordered if (math.isnan(a) or math.isnan(b)) else compare(a, b)
        elif len(args) == 2 and all(isinstance(x, float) for x in args):
            value = _ieee(op, args[0], args[1], element)
        else:
            raise _Unknown
        env[step.results[0]] = value
    return _yielded(program, env)


def static_bytes(t: object) -> int | None:
    """Bytes of a statically shaped tensor type, or None."""
    shape = _shape(t)
    if shape is None or any(d < 0 for d in shape):
        return None
    element = t.element_type  # type: ignore[attr-defined]
    width = getattr(element, "bitwidth", None) or getattr(
        getattr(element, "width", None), "data", None
    )
    if width is None:
        return None
    return math.prod(shape) * max(1, width // 8)


def is_sum_reduction(op: LinalgReduceOp) -> bool:
    """Whether `linalg.reduce`'s body is one `arith.addf`/`addi` of its two
    arguments (the reduction the transpose of `linalg.broadcast` writes)."""
    body = op.region.block
    ops = list(body.ops)
    if len(ops) != 2 or not isinstance(ops[0], arith.AddfOp | arith.AddiOp):
        return False
    add, yielded = ops
    return set(add.operands) == set(body.args) and tuple(yielded.operands) == (add.results[0],)
