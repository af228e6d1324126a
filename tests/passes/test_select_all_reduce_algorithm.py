"""`select-all-reduce-algorithm` records on every generic all-reduce the
point-to-point algorithm its combine allows: ring when commutative and
elementwise, halving-doubling when elementwise but ordered, recursive
doubling when not elementwise. Whatever it records, the runtime can run."""

from __future__ import annotations

import pytest
from pass_support import ops_named, rerun, run

import distir
from distir.ir.dialect import AllReduceOp

PASS = "select-all-reduce-algorithm"
T = "tensor<8xi64>"


def generic(body: str, *, props: str = " commutative", extras: int = 0, t: str = T) -> str:
    """One generic all-reduce whose region `body` uses %lhs, %rhs (%e0, ...
    for extras) and yields %r."""
    extra_args = "".join(f", %x{i}: {t}" for i in range(extras))
    extra_ops = "".join(f", %x{i}" for i in range(extras))
    extra_types = "".join(f", {t}" for _ in range(extras))
    extra_block = "".join(f", %e{i}" for i in range(extras))
    return (
        f"func.func @main(%x: {t}{extra_args}) -> {t} {{\n"
        f"  %y = dist.all_reduce %x{extra_ops}{props} : {t}{extra_types} "
        f"combine(%lhs, %rhs{extra_block}) {{\n{body}"
        f"    dist.yield %r : {t}\n  }}\n  func.return %y : {t}\n}}\n"
    )


WRAP_ADD = generic(
    f"    %s = arith.addi %lhs, %rhs : {T}\n"
    f"    %m = arith.constant dense<4294967295> : {T}\n"
    f"    %r = arith.andi %s, %m : {T}\n"
)
SATURATING = generic(
    f"    %m = arith.maxsi %lhs, %rhs : {T}\n    %r = arith.minsi %m, %e0 : {T}\n", extras=1
)
KEEP_LEFT_NONZERO = generic(
    f"    %z = arith.constant dense<0> : {T}\n"
    f"    %n = arith.subi %z, %lhs : {T}\n"
    f"    %o = arith.ori %lhs, %n : {T}\n"
    f"    %c = arith.constant dense<63> : {T}\n"
    f"    %k = arith.shrsi %o, %c : {T}\n"
    f"    %one = arith.constant dense<-1> : {T}\n"
    f"    %f = arith.xori %k, %one : {T}\n"
    f"    %b = arith.andi %rhs, %f : {T}\n"
    f"    %r = arith.ori %lhs, %b : {T}\n",
    props="",
)
# Reads element 0 of every operand: not elementwise.
BROADCAST_FIRST = generic(
    "    %i = arith.constant 0 : index\n"
    f"    %a = tensor.extract %lhs[%i] : {T}\n"
    f"    %b = tensor.extract %rhs[%i] : {T}\n"
    "    %s = arith.addi %a, %b : i64\n"
    f"    %r = tensor.splat %s : {T}\n"
)


def algorithm_of(text: str, pipeline: str = PASS) -> str | None:
    (op,) = ops_named(run(text, pipeline), "dist.all_reduce")
    assert isinstance(op, AllReduceOp)
    return None if op.algorithm is None else op.algorithm.data


def test_a_commutative_elementwise_combine_gets_the_ring():
    text = str(run(WRAP_ADD, PASS))
    assert f'%y = dist.all_reduce %x commutative algorithm "ring" : {T} combine(' in text


def test_extras_of_the_operands_shape_stay_elementwise():
    assert algorithm_of(SATURATING) == "ring"


def test_an_ordered_combine_gets_an_order_preserving_algorithm():
    assert algorithm_of(KEEP_LEFT_NONZERO) == "halving-doubling"


def test_a_combine_that_reads_other_elements_gets_recursive_doubling():
    assert algorithm_of(BROADCAST_FIRST) == "recursive-doubling"
    assert algorithm_of(BROADCAST_FIRST.replace(" commutative", "")) == "recursive-doubling"


def test_an_extra_of_another_shape_is_not_elementwise():
    text = (
        f"func.func @main(%x: {T}, %s: tensor<1xi64>) -> {T} {{\n"
        f"  %y = dist.all_reduce %x, %s commutative : {T}, tensor<1xi64> "
        f"combine(%lhs, %rhs, %e) {{\n"
        f"    %r = arith.addi %lhs, %rhs : {T}\n"
        f"    dist.yield %r : {T}\n  }}\n  func.return %y : {T}\n}}\n"
    )
    assert algorithm_of(text) == "recursive-doubling"


@pytest.mark.parametrize("shape", ["2x3x16", "?x3x?"])
def test_the_lowered_ciphertext_combine_is_elementwise(shape):
    t = f"tensor<{shape}xi64>"
    text = (
        f"func.func @main(%ct: {t}, %q: tensor<3xi64>) -> {t} {{\n"
        f"  %y = dist.all_reduce_add_ciphertext %ct, %q : {t}, tensor<3xi64>\n"
        f"  func.return %y : {t}\n}}\n"
    )
    assert algorithm_of(text, f"lower-ciphertext-add,{PASS}") == "ring"


def test_native_all_reduces_and_ciphertext_sums_are_left_alone():
    text = (
        f"func.func @main(%x: {T}, %ct: tensor<2x4xi64>, %q: tensor<2xi64>) -> {T} {{\n"
        f"  %y = dist.all_reduce sum %x : {T}\n"
        f"  %z = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x4xi64>, tensor<2xi64>\n"
        f"  func.return %y : {T}\n}}\n"
    )
    module = run(text, PASS)
    assert str(module) == str(run(text, ""))


def test_a_recorded_algorithm_is_kept():
    text = WRAP_ADD.replace(" commutative :", ' commutative algorithm "gather-fold" :')
    assert algorithm_of(text) == "gather-fold"


@pytest.mark.parametrize(
    ("options", "text", "expected"),
    [
        ("{commutative=gather-fold}", WRAP_ADD, "gather-fold"),
        ("{commutative=halving-doubling}", WRAP_ADD, "halving-doubling"),
        ("{ordered=recursive-doubling}", KEEP_LEFT_NONZERO, "recursive-doubling"),
        ("{whole=gather-fold}", BROADCAST_FIRST, "gather-fold"),
    ],
)
def test_options_name_the_algorithm_for_each_case(options, text, expected):
    assert algorithm_of(text, PASS + options) == expected


def test_the_result_prints_parses_and_is_a_fixed_point():
    once = run(WRAP_ADD, PASS)
    assert str(rerun(once, PASS)) == str(once)


@pytest.mark.parametrize(
    ("text", "pipeline"),
    [
        (WRAP_ADD, PASS),
        (SATURATING, PASS),
        (KEEP_LEFT_NONZERO, PASS),
        (BROADCAST_FIRST, PASS),
        (
            "func.func @main(%ct: tensor<?x3x?xi64>, %q: tensor<3xi64>) -> tensor<?x3x?xi64> {\n"
            "  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<?x3x?xi64>, tensor<3xi64>\n"
            "  func.return %y : tensor<?x3x?xi64>\n}\n",
            f"lower-ciphertext-add,{PASS}",
        ),
    ],
)
def test_every_recorded_algorithm_has_an_implementation(text, pipeline):
    program = distir.compile(text, pipeline)
    (op,) = ops_named(program.module, "dist.all_reduce")
    assert [name for _, name in program.plan_summary()] == [op.algorithm.data]
