"""verify-spmd: collectives under rank-dependent control flow are rejected."""

from __future__ import annotations

import pytest
from xdsl.dialects.builtin import TensorType
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.rewriter import Rewriter

import distir
from distir.errors import CompileError
from distir.ir.attributes import CollectiveEffect
from distir.ir.facts import EveryRankEnters, UniformResults
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


#: a branch on the all-reduced rank: uniform because the all-reduce's results are
IF_ON_REDUCED_RANK = IF_ON.replace("{source}", "dist.rank : index").replace(
    "%c = arith.cmpi eq, %r, %z : index",
    "%rt = tensor.from_elements %r : tensor<1xindex>\n"
    "  %rs = dist.all_reduce max %rt : tensor<1xindex>\n"
    "  %zero = arith.constant 0 : index\n"
    "  %m = tensor.extract %rs[%zero] : tensor<1xindex>\n"
    "  %c = arith.cmpi eq, %m, %z : index",
)


def test_a_condition_derived_from_a_collective_result_is_uniform():
    check(IF_ON_REDUCED_RANK)


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


# The pass reads the facts ops declare, not a list of op types: an op it has
# never heard of is treated by its traits alone.


@irdl_op_definition
class _EntersOp(IRDLOperation):
    name = "test.enters"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(CollectiveEffect(), EveryRankEnters())


@irdl_op_definition
class _UniformOp(IRDLOperation):
    name = "test.uniform"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(CollectiveEffect(), EveryRankEnters(), UniformResults())


def _swapped(text: str, op_type: type[IRDLOperation]):
    """The module of `text` with its first `dist.all_reduce` replaced by `op_type`."""
    module = parse_module(text, "spmd.mlir")
    old = next(op for op in module.walk() if op.name == "dist.all_reduce")
    new = op_type.create(operands=[old.operands[0]], result_types=[old.results[0].type])
    Rewriter.replace_op(old, new)
    return module


def test_an_op_declaring_every_rank_enters_is_rejected_under_a_rank_condition():
    module = _swapped(IF_ON.replace("{source}", "dist.rank : index"), _EntersOp)
    with pytest.raises(
        SPMDViolation, match="'test.enters' at <unknown location> runs under control"
    ):
        verify_spmd(module)


def _condition_from(op_type: type[IRDLOperation]):
    return _swapped(IF_ON_REDUCED_RANK, op_type)


def test_results_of_an_op_declaring_uniform_results_are_uniform():
    verify_spmd(_condition_from(_UniformOp))


def test_results_of_a_communicating_op_without_uniform_results_vary():
    with pytest.raises(SPMDViolation, match="'test.enters' .* returns different data per rank"):
        verify_spmd(_condition_from(_EntersOp))
