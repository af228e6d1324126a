"""verify-spmd covers the rooted collectives and the shift: each is entered
by every rank (refused under a rank-dependent condition) and its result
differs between ranks (a condition computed from it is rank-dependent)."""

from __future__ import annotations

import pytest

from distir.ir.parsing import parse_module
from distir.passes.verify_spmd import SPMDViolation, verify_spmd

#: op -> the op's line, reading %x : tensor<4xf32> and defining %b : tensor<4xf32>
OPS = {
    "dist.gather": "%b = dist.gather %x axis 0 root 0 : tensor<4xf32> -> tensor<4xf32>",
    "dist.scatter": "%b = dist.scatter %x axis 0 root 1 : tensor<4xf32> -> tensor<4xf32>",
    "dist.reduce": "%b = dist.reduce sum %x root 0 : tensor<4xf32>",
    "dist.shift": "%b = dist.shift %x offset 1 rotate : tensor<4xf32>",
}

UNDER_RANK = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = dist.rank : index
  %z = arith.constant 0 : index
  %c = arith.cmpi eq, %r, %z : index
  %y = scf.if %c -> (tensor<4xf32>) {
    {op}
    scf.yield %b : tensor<4xf32>
  } else {
    scf.yield %x : tensor<4xf32>
  }
  func.return %y : tensor<4xf32>
}
"""

CONDITION_FROM_RESULT = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  {op}
  %i = arith.constant 0 : index
  %e = tensor.extract %b[%i] : tensor<4xf32>
  %zero = arith.constant 0.0 : f32
  %c = arith.cmpf ogt, %e, %zero : f32
  %y = scf.if %c -> (tensor<4xf32>) {
    %s = dist.all_reduce sum %x : tensor<4xf32>
    scf.yield %s : tensor<4xf32>
  } else {
    scf.yield %x : tensor<4xf32>
  }
  func.return %y : tensor<4xf32>
}
"""


def _check(text: str) -> None:
    module = parse_module(text, "spmd.mlir")
    module.verify()
    verify_spmd(module)


@pytest.mark.parametrize("op", sorted(OPS))
def test_the_op_under_a_rank_condition_is_refused(op):
    with pytest.raises(SPMDViolation) as info:
        _check(UNDER_RANK.replace("{op}", OPS[op]))
    assert f"'{op}' at spmd.mlir:7:5" in str(info.value)
    assert "depends on the rank" in str(info.value)


@pytest.mark.parametrize("op", sorted(OPS))
def test_a_condition_computed_from_its_result_varies_between_ranks(op):
    with pytest.raises(SPMDViolation) as info:
        _check(CONDITION_FROM_RESULT.replace("{op}", OPS[op]))
    assert "'dist.all_reduce' at spmd.mlir:9:5" in str(info.value)
