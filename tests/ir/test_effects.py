"""Collectives are communication: `cse` must not merge two of them and `dce`
must not delete an unused one, while ordinary pure ops stay optimisable."""

from __future__ import annotations

from distir.ir.parsing import make_context, parse_module
from distir.passes import parse_pipeline

PROGRAM = """\
func.func @main(%x: tensor<8xi64>, %i: i64) -> (tensor<8xi64>, tensor<8xi64>, i64, i64) {
  %a = dist.all_reduce sum %x : tensor<8xi64>
  %b = dist.all_reduce sum %x : tensor<8xi64>
  %unused = dist.broadcast %x root 0 : tensor<8xi64>
  %dead = arith.addi %i, %i : i64
  %m1 = arith.muli %i, %i : i64
  %m2 = arith.muli %i, %i : i64
  func.return %a, %b, %m1, %m2 : tensor<8xi64>, tensor<8xi64>, i64, i64
}
"""


def _op_names_after_cse_dce(text: str) -> list[str]:
    module = parse_module(text)
    parse_pipeline("cse,dce").apply(make_context(), module)
    return [op.name for op in module.walk()]


def test_identical_all_reduces_and_an_unused_broadcast_survive() -> None:
    names = _op_names_after_cse_dce(PROGRAM)
    assert names.count("dist.all_reduce") == 2
    assert names.count("dist.broadcast") == 1


def test_control_pure_ops_are_still_optimised() -> None:
    """Without this the test above would pass with passes that do nothing."""
    names = _op_names_after_cse_dce(PROGRAM)
    assert "arith.addi" not in names  # unused and pure: deleted by dce
    assert names.count("arith.muli") == 1  # identical and pure: merged by cse


def test_every_other_collective_survives_too() -> None:
    text = """\
func.func @main(%x: tensor<2x4xf32>, %c: tensor<4xi64>, %ct: tensor<3x4xi64>, %q: tensor<3xi64>) {
  %s = dist.all_reduce_add_ciphertext %ct, %q : tensor<3x4xi64>, tensor<3xi64>
  %t = dist.all_reduce_add_ciphertext %ct, %q : tensor<3x4xi64>, tensor<3xi64>
  %g = dist.all_gather %x axis 0 : tensor<2x4xf32> -> tensor<?x4xf32>
  %h = dist.all_gather %x axis 0 : tensor<2x4xf32> -> tensor<?x4xf32>
  %y, %rc = dist.variable_all_to_all %x, %c axis 0 : tensor<2x4xf32>, tensor<4xi64> -> tensor<?x4xf32>
  %m = dist.all_reduce %x commutative : tensor<2x4xf32> combine(%l, %r) {
    %z = arith.maximumf %l, %r : tensor<2x4xf32>
    dist.yield %z : tensor<2x4xf32>
  }
  func.return
}
"""
    names = _op_names_after_cse_dce(text)
    assert names.count("dist.all_reduce_add_ciphertext") == 2
    assert names.count("dist.all_gather") == 2
    assert names.count("dist.variable_all_to_all") == 1
    assert names.count("dist.all_reduce") == 1
    assert "arith.maximumf" in names  # a combine body is not dead code


def test_unused_rank_queries_are_pure_and_removed() -> None:
    text = """\
func.func @main() -> index {
  %r1 = dist.rank : index
  %r2 = dist.rank : index
  %p = dist.group_size : index
  func.return %r2 : index
}
"""
    names = _op_names_after_cse_dce(text)
    assert names.count("dist.rank") == 1
    assert "dist.group_size" not in names
