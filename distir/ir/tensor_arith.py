"""arith's comparisons, selection and casts on tensors, as MLIR types them.

xDSL 0.74 types `arith.cmpi` / `arith.cmpf` as returning a scalar `i1` even
on tensors, `arith.select` as taking a scalar `i1` condition only, and the
integer/float casts on scalars only. MLIR (and a combine region, which works
on whole tensors) needs them element by element:

    %c = arith.cmpf oge, %a, %b : tensor<6xf32>          // -> tensor<6xi1>
    %r = arith.select %c, %a, %b : tensor<6xi1>, tensor<6xf32>
    %i = arith.fptosi %r : tensor<6xf32> to tensor<6xi32>

The classes here replace xDSL's in the `arith` dialect distir parses with
(`TENSOR_ARITH_OPS`, read by `parsing.make_context` and the builder); they
keep xDSL's names, syntax and scalar behaviour. (xDSL's classes cannot be
subclassed: their fields become properties.) `arith.index_cast` stays
xDSL's: an index is a scalar. A comparison's
result has its operands' shape with `i1` elements; a select's condition is
a scalar `i1` (picks a whole operand) or an `i1` tensor of the result's
shape (picks element by element); a cast keeps the shape and changes the
element type under MLIR's width rules.
"""

from __future__ import annotations

from types import UnionType
from typing import ClassVar

from xdsl.dialects import arith
from xdsl.dialects.arith import (
    CMPF_COMPARISON_OPERATIONS,
    CMPI_COMPARISON_OPERATIONS,
    FastMathFlagsAttr,
    floatingPointLike,
    signlessIntegerLike,
)
from xdsl.dialects.builtin import (
    AnyFloat,
    AnyFloatConstr,
    FixedBitwidthType,
    IntegerAttr,
    IntegerType,
    TensorType,
    container_of,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    AnyAttr,
    IRDLOperation,
    VarConstraint,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

I1 = IntegerType(1)


def shape_of(t: Attribute) -> tuple[int, ...] | None:
    """The shape of a tensor type; None for a scalar."""
    return tuple(t.get_shape()) if isinstance(t, TensorType) else None


def element_of(t: Attribute) -> Attribute:
    return t.element_type if isinstance(t, TensorType) else t


def like(t: Attribute, element: Attribute) -> Attribute:
    """`t`'s shape (scalar or tensor) with element type `element`."""
    return TensorType(element, t.get_shape()) if isinstance(t, TensorType) else element


def _same_shape(op: Operation, a: Attribute, b: Attribute, what: str) -> None:
    if shape_of(a) != shape_of(b) or isinstance(a, TensorType) != isinstance(b, TensorType):
        raise VerifyException(f"'{op.name}' {what} must have the same shape, got {a} and {b}")


def _width(t: Attribute) -> int | None:
    element = element_of(t)
    return element.bitwidth if isinstance(element, FixedBitwidthType) else None


class _Comparison(arith.ComparisonOperation):
    """A comparison whose result has its operands' shape with `i1`
    elements (xDSL's types it as a scalar `i1`)."""

    result = result_def(container_of(I1))
    traits = traits_def(Pure())

    def _build(
        self,
        lhs: Operation | SSAValue,
        rhs: Operation | SSAValue,
        predicate: int,
        properties: dict[str, Attribute],
    ) -> None:
        lhs, rhs = SSAValue.get(lhs), SSAValue.get(rhs)
        if lhs.type != rhs.type:
            raise VerifyException(
                f"'{self.name}' operands must have the same type, got {lhs.type} and {rhs.type}"
            )
        IRDLOperation.__init__(
            self,
            operands=[lhs, rhs],
            result_types=[like(lhs.type, I1)],
            properties={"predicate": IntegerAttr(predicate, 64), **properties},
        )

    def verify_(self) -> None:
        _same_shape(self, self.operands[0].type, self.results[0].type, "operands and result")


def _predicate(op_name: str, names: list[str], arg: int | str) -> int:
    if isinstance(arg, int):
        return arg
    if arg not in names:
        raise VerifyException(
            f"'{op_name}' has no predicate {arg!r}; the predicates are {', '.join(names)}"
        )
    return names.index(arg)


@irdl_op_definition
class CmpiOp(_Comparison):
    """`arith.cmpi`: element-wise integer comparison (`eq`, `ne`, signed
    `slt`..`sge`, unsigned `ult`..`uge`); an `i1` of the operands' shape."""

    name = "arith.cmpi"
    predicate = prop_def(IntegerAttr)
    lhs = operand_def(signlessIntegerLike)
    rhs = operand_def(signlessIntegerLike)

    def __init__(self, lhs: Operation | SSAValue, rhs: Operation | SSAValue, arg: int | str):
        self._build(lhs, rhs, _predicate(self.name, CMPI_COMPARISON_OPERATIONS, arg), {})

    parse = arith.CmpiOp.__dict__["parse"]
    print = arith.CmpiOp.__dict__["print"]


@irdl_op_definition
class CmpfOp(_Comparison):
    """`arith.cmpf`: element-wise float comparison; ordered predicates
    (`oeq`, `ogt`, ...) are false where either operand is NaN, unordered
    ones (`ueq`, `ugt`, ...) true; an `i1` of the operands' shape."""

    name = "arith.cmpf"
    predicate = prop_def(IntegerAttr)
    lhs = operand_def(floatingPointLike)
    rhs = operand_def(floatingPointLike)
    fastmath = prop_def(FastMathFlagsAttr, default_value=FastMathFlagsAttr("none"))

    def __init__(
        self,
        lhs: Operation | SSAValue,
        rhs: Operation | SSAValue,
        arg: int | str,
        fastmath: FastMathFlagsAttr | None = None,
    ):
        predicate = _predicate(self.name, CMPF_COMPARISON_OPERATIONS, arg)
        self._build(lhs, rhs, predicate, {"fastmath": fastmath or FastMathFlagsAttr("none")})

    parse = arith.CmpfOp.__dict__["parse"]
    print = arith.CmpfOp.__dict__["print"]


@irdl_op_definition
class SelectOp(IRDLOperation):
    """`arith.select %c, %a, %b`: `a` where `c` is true, else `b`; a scalar
    `c` picks a whole operand, an `i1` tensor of the result's shape picks
    element by element. Syntax as MLIR's: `: type` for a scalar condition,
    `: cond_type, type` for a tensor one."""

    name = "arith.select"
    _T: ClassVar = VarConstraint("_T", AnyAttr())
    cond = operand_def(container_of(I1))
    lhs = operand_def(_T)
    rhs = operand_def(_T)
    result = result_def(_T)
    traits = traits_def(Pure())

    def __init__(
        self, cond: Operation | SSAValue, lhs: Operation | SSAValue, rhs: Operation | SSAValue
    ):
        lhs = SSAValue.get(lhs)
        super().__init__(operands=[cond, lhs, rhs], result_types=[lhs.type])

    def verify_(self) -> None:
        if isinstance(self.cond.type, TensorType) and shape_of(self.cond.type) != shape_of(
            self.result.type
        ):
            raise VerifyException(
                f"'arith.select' condition {self.cond.type} must be i1 or have the "
                f"shape of the result {self.result.type}"
            )

    @classmethod
    def parse(cls, parser: Parser) -> SelectOp:
        cond = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        lhs = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        rhs = parser.parse_unresolved_operand()
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        first = parser.parse_type()
        if parser.parse_optional_punctuation(","):
            cond_type, value_type = first, parser.parse_type()
        else:
            cond_type, value_type = I1, first
        operands = parser.resolve_operands(
            [cond, lhs, rhs], [cond_type, value_type, value_type], parser.pos
        )
        op = cls(*operands)
        op.attributes.update(attributes)
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_list((self.cond, self.lhs, self.rhs), printer.print_operand)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        if isinstance(self.cond.type, TensorType):
            printer.print_attribute(self.cond.type)
            printer.print_string(", ")
        printer.print_attribute(self.result.type)


_INT = container_of(IntegerType)
_FLOAT = container_of(AnyFloatConstr)


class _CastOp(IRDLOperation):
    """A cast on a scalar or element-wise on a tensor: same shape, element
    kinds and width order as MLIR's."""

    INPUT_KIND: ClassVar[type | UnionType] = IntegerType
    RESULT_KIND: ClassVar[type | UnionType] = IntegerType
    #: -1: the result is narrower, 1: wider, 0: any width
    WIDTH_ORDER: ClassVar[int] = 0

    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `to` type($result)"

    def __init__(self, value: Operation | SSAValue, target_type: Attribute):
        super().__init__(operands=[value], result_types=[target_type])

    def verify_(self) -> None:
        source, target = self.operands[0].type, self.results[0].type
        _same_shape(self, source, target, "operand and result")
        for t, kind in ((source, self.INPUT_KIND), (target, self.RESULT_KIND)):
            if not isinstance(element_of(t), kind):
                raise VerifyException(f"'{self.name}' cannot take {source} to {target}")
        a, b = _width(source), _width(target)
        if self.WIDTH_ORDER and a is not None and b is not None and (b - a) * self.WIDTH_ORDER <= 0:
            bigger = "larger" if self.WIDTH_ORDER > 0 else "smaller"
            raise VerifyException(
                f"'{self.name}': the result's bit width must be {bigger} than the "
                f"operand's ({source} to {target})"
            )


@irdl_op_definition
class ExtSIOp(_CastOp):
    """`arith.extsi`: sign-extends integers to a wider type."""

    name = "arith.extsi"
    input = operand_def(_INT)
    result = result_def(_INT)
    WIDTH_ORDER: ClassVar[int] = 1


@irdl_op_definition
class ExtUIOp(_CastOp):
    """`arith.extui`: zero-extends integers (read as unsigned) to a wider type."""

    name = "arith.extui"
    input = operand_def(_INT)
    result = result_def(_INT)
    WIDTH_ORDER: ClassVar[int] = 1


@irdl_op_definition
class TruncIOp(_CastOp):
    """`arith.trunci`: keeps the low bits of integers (two's complement wrap)."""

    name = "arith.trunci"
    input = operand_def(_INT)
    result = result_def(_INT)
    WIDTH_ORDER: ClassVar[int] = -1


@irdl_op_definition
class SIToFPOp(_CastOp):
    """`arith.sitofp`: signed integers to the nearest float."""

    name = "arith.sitofp"
    input = operand_def(_INT)
    result = result_def(_FLOAT)
    RESULT_KIND: ClassVar[UnionType] = AnyFloat


@irdl_op_definition
class UIToFPOp(_CastOp):
    """`arith.uitofp`: integers read as unsigned to the nearest float."""

    name = "arith.uitofp"
    input = operand_def(_INT)
    result = result_def(_FLOAT)
    RESULT_KIND: ClassVar[UnionType] = AnyFloat


@irdl_op_definition
class FPToSIOp(_CastOp):
    """`arith.fptosi`: floats truncated toward zero to signed integers (out
    of range and NaN: undefined in MLIR; distir gives torch's conversion)."""

    name = "arith.fptosi"
    input = operand_def(_FLOAT)
    result = result_def(_INT)
    INPUT_KIND: ClassVar[UnionType] = AnyFloat


@irdl_op_definition
class FPToUIOp(_CastOp):
    """`arith.fptoui`: non-negative floats truncated toward zero to integers
    read as unsigned (negative, out of range and NaN: undefined in MLIR)."""

    name = "arith.fptoui"
    input = operand_def(_FLOAT)
    result = result_def(_INT)
    INPUT_KIND: ClassVar[UnionType] = AnyFloat


@irdl_op_definition
class ExtFOp(_CastOp):
    """`arith.extf`: floats to a wider float type (exact)."""

    name = "arith.extf"
    input = operand_def(_FLOAT)
    result = result_def(_FLOAT)
    INPUT_KIND: ClassVar[UnionType] = AnyFloat
    RESULT_KIND: ClassVar[UnionType] = AnyFloat
    WIDTH_ORDER: ClassVar[int] = 1


@irdl_op_definition
class TruncFOp(_CastOp):
    """`arith.truncf`: floats rounded to the nearest of a narrower type."""

    name = "arith.truncf"
    input = operand_def(_FLOAT)
    result = result_def(_FLOAT)
    INPUT_KIND: ClassVar[UnionType] = AnyFloat
    RESULT_KIND: ClassVar[UnionType] = AnyFloat
    WIDTH_ORDER: ClassVar[int] = -1


#: distir's classes for the arith ops xDSL types on scalars only
TENSOR_ARITH_OPS: dict[type[Operation], type[Operation]] = {
    arith.CmpiOp: CmpiOp,
    arith.CmpfOp: CmpfOp,
    arith.SelectOp: SelectOp,
    arith.ExtSIOp: ExtSIOp,
    arith.ExtUIOp: ExtUIOp,
    arith.TruncIOp: TruncIOp,
    arith.SIToFPOp: SIToFPOp,
    arith.UIToFPOp: UIToFPOp,
    arith.FPToSIOp: FPToSIOp,
    arith.FPToUIOp: FPToUIOp,
    arith.ExtFOp: ExtFOp,
    arith.TruncFOp: TruncFOp,
}
