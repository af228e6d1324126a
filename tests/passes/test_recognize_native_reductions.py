"""`recognize-native-reductions` turns a generic all-reduce whose combine is one
commutative arith op on (lhs, rhs) into the native form, and leaves every
other generic all-reduce alone."""

from __future__ import annotations

import pytest
from pass_support import FILENAME, line_of, locations, op_names, ops_named, rerun, run

from distir.ir.dialect import AllReduceOp

PASS = "recognize-native-reductions"


def generic(
    body: str,
    *,
    element: str = "i64",
    extras: int = 0,
    props: str = "",
    decl: str = "",
) -> str:
    """A program with one generic all-reduce; `body` is the region's text using
    %lhs, %rhs (and %e0, ... for extras), yielding %r."""
    t = f"tensor<8x{element}>"
    extra_args = "".join(f", %x{i}: {t}" for i in range(extras))
    extra_ops = "".join(f", %x{i}" for i in range(extras))
    extra_types = "".join(f", {t}" for _ in range(extras))
    extra_block = "".join(f", %e{i}" for i in range(extras))
    return (
        f"{decl}func.func @main(%x: {t}{extra_args}) -> {t} {{\n"
        f"  %y = dist.all_reduce %x{extra_ops}{props} : {t}{extra_types} "
        f"combine(%lhs, %rhs{extra_block}) {{\n"
        f"{body}"
        f"    dist.yield %r : {t}\n"
        f"  }}\n"
        f"  func.return %y : {t}\n"
        f"}}\n"
    )


def one_op(op: str, element: str = "i64", operands: str = "%lhs, %rhs", **kw) -> str:
    return generic(f"    %r = {op} {operands} : tensor<8x{element}>\n", element=element, **kw)


def the_all_reduce(module) -> AllReduceOp:
    (op,) = ops_named(module, "dist.all_reduce")
    assert isinstance(op, AllReduceOp)
    return op


RECOGNISED = [
    ("arith.addi", "i64", "sum"),
    ("arith.addi", "i32", "sum"),
    ("arith.addf", "f32", "sum"),
    ("arith.muli", "i64", "prod"),
    ("arith.mulf", "f64", "prod"),
    ("arith.maxsi", "i64", "max"),
    ("arith.minsi", "i8", "min"),
    ("arith.maximumf", "f32", "max"),
    ("arith.minimumf", "f16", "min"),
    ("arith.andi", "i64", "band"),
    ("arith.ori", "i32", "bor"),
    ("arith.xori", "i64", "bxor"),
    ("arith.andi", "i1", "band"),
    ("arith.ori", "i1", "bor"),
    ("arith.xori", "i1", "bxor"),
]


@pytest.mark.parametrize("operands", ["%lhs, %rhs", "%rhs, %lhs"])
@pytest.mark.parametrize(("op", "element", "kind"), RECOGNISED)
def test_one_commutative_op_becomes_the_native_kind(op, element, kind, operands):
    module = run(one_op(op, element, operands), PASS)
    native = the_all_reduce(module)
    assert native.kind is not None and native.kind.data == kind
    assert not native.combine.blocks and not native.extras
    assert f"%y = dist.all_reduce {kind} %x : tensor<8x{element}>" in str(module)


NOT_NATIVE = {
    "unsigned max": one_op("arith.maxui"),
    "unsigned min": one_op("arith.minui"),
    "subtraction": one_op("arith.subi"),
    "i1 addition wraps": one_op("arith.addi", "i1"),
    "i1 multiplication": one_op("arith.muli", "i1"),
    "signed i1 max": one_op("arith.maxsi", "i1"),
    "signed i1 min": one_op("arith.minsi", "i1"),
    "maxnumf": one_op("arith.maxnumf", "f32"),
    "lhs twice": one_op("arith.addi", operands="%lhs, %lhs"),
    "rhs twice": one_op("arith.maxsi", operands="%rhs, %rhs"),
    "uses an extra": one_op("arith.addi", operands="%lhs, %e0", extras=1),
    "two ops": generic(
        "    %s = arith.addi %lhs, %rhs : tensor<8xi64>\n"
        "    %r = arith.addi %s, %s : tensor<8xi64>\n"
    ),
    "yields an argument": generic("    %r = arith.addi %lhs, %rhs : tensor<8xi64>\n").replace(
        "dist.yield %r", "dist.yield %lhs"
    ),
    "algorithm chosen for the generic form": one_op("arith.addi", props=' algorithm "gather_fold"'),
}


@pytest.mark.parametrize("text", NOT_NATIVE.values(), ids=NOT_NATIVE.keys())
def test_anything_else_stays_generic(text):
    before = run(text, "")
    after = run(text, PASS)
    assert str(after) == str(before)
    assert the_all_reduce(after).combine.blocks


def test_unused_extras_are_dropped_and_their_producers_kept():
    text = """
func.func @main(%x: tensor<8xi64>, %m: tensor<8xi64>) -> tensor<8xi64> {
  %two = arith.addi %m, %m : tensor<8xi64>
  %y = dist.all_reduce %x, %two, %m commutative : tensor<8xi64>, tensor<8xi64>, tensor<8xi64> combine(%a, %b, %e, %f) {
    %r = arith.maxsi %b, %a : tensor<8xi64>
    dist.yield %r : tensor<8xi64>
  }
  func.return %y : tensor<8xi64>
}
"""
    module = run(text, PASS)
    assert "%y = dist.all_reduce max %x : tensor<8xi64>" in str(module)
    assert "%two = arith.addi %m, %m : tensor<8xi64>" in str(module)


def test_the_group_location_and_attributes_are_kept():
    text = one_op(
        "arith.addi",
        decl="dist.group @dp [[0, 2], [1, 3]]\n",
        props=' group @dp commutative {note = "keep"}',
    )
    module = run(text, PASS)
    native = the_all_reduce(module)
    assert str(native.group) == "@dp"
    assert str(native.attributes["note"]) == '"keep"'
    assert locations([native]) == {f"{FILENAME}:{line_of(text, 'dist.all_reduce')}:3"}
    assert '%y = dist.all_reduce sum %x group @dp {note = "keep"} : tensor<8xi64>' in str(module)


def test_running_twice_changes_nothing():
    once = run(one_op("arith.xori"), PASS)
    assert str(rerun(once, PASS)) == str(once)


def test_native_all_reduces_and_other_collectives_are_untouched():
    text = """
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %a = dist.all_reduce max %x : tensor<8xf32>
  %b = dist.broadcast %a root 0 : tensor<8xf32>
  func.return %b : tensor<8xf32>
}
"""
    assert str(run(text, PASS)) == str(run(text, ""))


def test_generic_all_reduces_in_nested_regions_are_recognised():
    text = """
func.func @main(%x: tensor<8xi64>, %lo: index, %hi: index, %step: index) -> tensor<8xi64> {
  %out = scf.for %i = %lo to %hi step %step iter_args(%acc = %x) -> (tensor<8xi64>) {
    %y = dist.all_reduce %acc : tensor<8xi64> combine(%a, %b) {
      %r = arith.addi %a, %b : tensor<8xi64>
      dist.yield %r : tensor<8xi64>
    }
    scf.yield %y : tensor<8xi64>
  }
  func.return %out : tensor<8xi64>
}
"""
    assert "%y = dist.all_reduce sum %acc : tensor<8xi64>" in str(run(text, PASS))


def test_the_lowered_ciphertext_combine_is_not_a_native_reduction():
    text = """
func.func @main(%ct: tensor<4x8xi64>, %q: tensor<4xi64>) -> tensor<4x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<4x8xi64>, tensor<4xi64>
  func.return %y : tensor<4x8xi64>
}
"""
    lowered = run(text, "lower-ciphertext-add")
    assert str(rerun(lowered, PASS)) == str(lowered)
    assert "arith.shrsi" in op_names(lowered)
