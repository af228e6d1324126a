"""Programs built with `distir.ir.builder` verify and print as the text a
person would write."""

from __future__ import annotations

import pytest
from xdsl.dialects import arith

from distir.ir import builder as b
from distir.ir.parsing import parse_module


def _check(module, expected: str) -> None:
    module.verify()
    assert str(module) == expected
    # What the builder makes is what the parser makes of its text.
    assert parse_module(expected).is_structurally_equivalent(module)


def test_tensor_type() -> None:
    assert str(b.tensor_type("f32", [None, 4])) == "tensor<?x4xf32>"
    assert str(b.tensor_type("i64", [2, 3, 16])) == "tensor<2x3x16xi64>"


def test_rank_queries_and_broadcast() -> None:
    def body(x):
        r = b.rank()
        p = b.group_size("pairs")
        static = b.broadcast(x, 1, group="pairs")
        dynamic = b.broadcast(static, r)
        return dynamic, p

    module = b.build_program(body, [b.tensor_type("f32", [4])], groups={"pairs": [[0, 1], [2, 3]]})
    _check(
        module,
        """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>, index) {
    %0 = dist.rank : index
    %1 = dist.group_size group @pairs : index
    %2 = dist.broadcast %arg0 root 1 group @pairs : tensor<4xf32>
    %3 = dist.broadcast %2 root %0 : tensor<4xf32>
    func.return %3, %1 : tensor<4xf32>, index
  }
}""",
    )


@pytest.mark.parametrize("kind", ["sum", "prod", "min", "max", "band", "bor", "bxor"])
def test_native_all_reduce(kind: str) -> None:
    module = b.build_program(lambda x: b.all_reduce(x, kind), [b.tensor_type("i32", [8])])
    _check(
        module,
        f"""\
builtin.module {{
  func.func @main(%arg0: tensor<8xi32>) -> tensor<8xi32> {{
    %0 = dist.all_reduce {kind} %arg0 : tensor<8xi32>
    func.return %0 : tensor<8xi32>
  }}
}}""",
    )


def test_generic_all_reduce_with_extra_and_commutative() -> None:
    def body(x, m):
        def combine(lhs, rhs, mod):
            return arith.RemUIOp(arith.AddiOp(lhs, rhs), mod)

        return b.all_reduce(x, combine=combine, extras=[m], commutative=True, group="g")

    t = b.tensor_type("i64", [4])
    module = b.build_program(body, [t, t], groups={"g": [[0, 1]]})
    _check(
        module,
        """\
builtin.module {
  dist.group @g [[0, 1]]
  func.func @main(%arg0: tensor<4xi64>, %arg1: tensor<4xi64>) -> tensor<4xi64> {
    %0 = dist.all_reduce %arg0, %arg1 group @g commutative : tensor<4xi64>, tensor<4xi64> combine(%1, %2, %3) {
      %4 = arith.addi %1, %2 : tensor<4xi64>
      %5 = arith.remui %4, %3 : tensor<4xi64>
      dist.yield %5 : tensor<4xi64>
    }
    func.return %0 : tensor<4xi64>
  }
}""",
    )


def test_all_reduce_needs_exactly_one_of_kind_and_combine() -> None:
    t = b.tensor_type("f32", [4])
    with pytest.raises(ValueError, match="exactly one of"):
        b.build_program(lambda x: b.all_reduce(x), [t])
    with pytest.raises(ValueError, match="exactly one of"):
        b.build_program(lambda x: b.all_reduce(x, "sum", combine=lambda p, q: p), [t])


def test_ciphertext_add() -> None:
    def body(ct, q):
        return b.all_reduce_add_ciphertext(ct, q, modulus_basis="P", max_modulus_bits=60)

    module = b.build_program(body, [b.tensor_type("i64", [2, 3, 16]), b.tensor_type("i64", [3])])
    _check(
        module,
        """\
builtin.module {
  func.func @main(%arg0: tensor<2x3x16xi64>, %arg1: tensor<3xi64>) -> tensor<2x3x16xi64> {
    %0 = dist.all_reduce_add_ciphertext %arg0, %arg1 basis "P" max_modulus_bits 60 : tensor<2x3x16xi64>, tensor<3xi64>
    func.return %0 : tensor<2x3x16xi64>
  }
}""",
    )


def test_even_and_uneven_all_gather() -> None:
    def body(x, counts):
        even = b.all_gather(x, axis=1)
        sized = b.all_gather(x, result_type=b.tensor_type("f32", [8, 4]), group="pairs")
        uneven = b.all_gather(x, counts=counts)
        return even, sized, uneven

    module = b.build_program(
        body,
        [b.tensor_type("f32", [4, 4]), b.tensor_type("i64", [2])],
        groups={"pairs": [[0, 1], [2, 3]]},
    )
    _check(
        module,
        """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%arg0: tensor<4x4xf32>, %arg1: tensor<2xi64>) -> (tensor<4x?xf32>, tensor<8x4xf32>, tensor<?x4xf32>) {
    %0 = dist.all_gather %arg0 axis 1 : tensor<4x4xf32> -> tensor<4x?xf32>
    %1 = dist.all_gather %arg0 axis 0 group @pairs : tensor<4x4xf32> -> tensor<8x4xf32>
    %2 = dist.all_gather %arg0 counts(%arg1 : tensor<2xi64>) axis 0 : tensor<4x4xf32> -> tensor<?x4xf32>
    func.return %0, %1, %2 : tensor<4x?xf32>, tensor<8x4xf32>, tensor<?x4xf32>
  }
}""",
    )


def test_variable_all_to_all() -> None:
    def body(x, counts):
        y, recv = b.variable_all_to_all(x, counts, group="ep")
        return y, recv

    module = b.build_program(
        body,
        [b.tensor_type("f32", [None, 16]), b.tensor_type("i64", [4])],
        groups={"ep": [[0, 1, 2, 3]]},
    )
    _check(
        module,
        """\
builtin.module {
  dist.group @ep [[0, 1, 2, 3]]
  func.func @main(%arg0: tensor<?x16xf32>, %arg1: tensor<4xi64>) -> (tensor<?x16xf32>, tensor<4xi64>) {
    %0, %1 = dist.variable_all_to_all %arg0, %arg1 axis 0 group @ep : tensor<?x16xf32>, tensor<4xi64> -> tensor<?x16xf32>
    func.return %0, %1 : tensor<?x16xf32>, tensor<4xi64>
  }
}""",
    )


def test_build_program_verifies_what_it_builds() -> None:
    from xdsl.utils.exceptions import VerifyException

    with pytest.raises(VerifyException, match="needs an integer element type"):
        b.build_program(lambda x: b.all_reduce(x, "bor"), [b.tensor_type("f32", [4])])


def test_program_without_results_and_custom_name() -> None:
    module = b.build_program(lambda: None, [], name="noop")
    _check(
        module,
        """\
builtin.module {
  func.func @noop() {
    func.return
  }
}""",
    )
