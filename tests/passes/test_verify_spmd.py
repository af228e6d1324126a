"""verify-spmd: collectives under rank-dependent control flow are rejected."""

from __future__ import annotations

import pytest

import distir
from distir.errors import CompileError
from distir.ir.parsing import parse_module
from distir.passes.verify_spmd import SPMDViolation, verify_spmd

IF_ON = """
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %r = {source}
  %z = arith.constant 0 : index
  %c = arith.cmpi eq, %r, %z : index
  %y = scf.if %c -> (tensor<4xi64>) {
    %b = dist.all_reduce sum %x : tensor<4xi64>
    scf.yield %b : tensor<4xi64>
  } else {
    scf.yield %x : tensor<4xi64>
  }
  func.return %y : tensor<4xi64>
}
"""

FOR_TO = """
func.func @main(%x: tensor<4xi64>, %n: index) -> tensor<4xi64> {
  %z = arith.constant 0 : index
  %one = arith.constant 1 : index
  %bound = {bound}
  %y = scf.for %i = %z to %bound step %one iter_args(%acc = %x) -> (tensor<4xi64>) {
    %b = dist.all_reduce sum %acc : tensor<4xi64>
    scf.yield %b : tensor<4xi64>
  }
  func.return %y : tensor<4xi64>
}
"""


def check(text: str) -> None:
    module = parse_module(text, "spmd.mlir")
    module.verify()
    verify_spmd(module)


def test_a_collective_under_a_rank_condition_is_rejected_with_both_locations():
    with pytest.raises(SPMDViolation) as info:
        check(IF_ON.replace("{source}", "dist.rank : index"))
    message = str(info.value)
    assert "'dist.all_reduce' at spmd.mlir:7:5" in message
    assert "the condition of 'scf.if' at spmd.mlir:6:3 depends on the rank" in message
    assert "'dist.rank' at spmd.mlir:3:3" in message


def test_a_uniform_condition_passes():
    check(IF_ON.replace("{source}", "dist.group_size : index"))


def test_a_condition_derived_from_a_collective_result_is_uniform():
    text = IF_ON.replace("{source}", "dist.rank : index").replace(
        "%c = arith.cmpi eq, %r, %z : index",
        "%rt = tensor.from_elements %r : tensor<1xindex>\n"
        "  %rs = dist.all_reduce max %rt : tensor<1xindex>\n"
        "  %zero = arith.constant 0 : index\n"
        "  %m = tensor.extract %rs[%zero] : tensor<1xindex>\n"
        "  %c = arith.cmpi eq, %m, %z : index",
    )
    check(text)


def test_a_rank_dependent_trip_count_is_rejected():
    with pytest.raises(SPMDViolation, match="the trip count of 'scf.for' at spmd.mlir:6:3"):
        check(FOR_TO.replace("{bound}", "dist.rank : index"))


def test_an_input_dependent_trip_count_is_rejected_because_inputs_vary():
    with pytest.raises(SPMDViolation, match=r"argument #1 of @main \(each rank passes its own"):
        check(FOR_TO.replace("{bound}", "arith.addi %n, %z : index"))


def test_a_uniform_trip_count_passes():
    check(FOR_TO.replace("{bound}", "dist.group_size : index"))


def test_compile_runs_the_check_and_can_skip_it():
    bad = IF_ON.replace("{source}", "dist.rank : index")
    with pytest.raises(CompileError, match="runs under control flow that differs between ranks"):
        distir.compile(bad)
    assert distir.compile(bad, verify_spmd=False) is not None


def test_the_pass_is_available_in_pipelines():
    bad = IF_ON.replace("{source}", "dist.rank : index")
    with pytest.raises(CompileError, match="differs between ranks"):
        distir.compile(bad, "verify-spmd", verify_spmd=False)
