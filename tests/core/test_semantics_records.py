"""The semantics records: what each op decodes to, the facts records declare
and who reads them (the planner, the block compiler), and a transfer's plan
read from its op."""

from __future__ import annotations

import pytest
import torch

import distir
from distir.core.semantics import make_invocation, precondition_rule, semantics_of
from distir.errors import DistirError
from distir.ir.dialect import (
    AllGatherOp,
    AllReduceOp,
    BroadcastOp,
    RankOp,
    SendRecvOp,
    TransferOp,
    VariableAllToAllOp,
)
from distir.ir.facts import AgreementRidesWithPayload
from distir.ir.parsing import parse_module

GATHER_AND_ALL_TO_ALL = """
func.func @main(%x: tensor<4xi64>, %c: tensor<2xi64>) -> (tensor<?xi64>, tensor<?xi64>) {
  %g = dist.all_gather %x counts(%c : tensor<2xi64>) axis 0 : tensor<4xi64> -> tensor<?xi64>
  %a, %rc = dist.variable_all_to_all %x, %c axis 0 : tensor<4xi64>, tensor<2xi64> -> tensor<?xi64>
  func.return %g, %a : tensor<?xi64>, tensor<?xi64>
}
"""

TRANSFER = """
dist.mesh @src [2] ranks [0, 1]
dist.mesh @dst [1] ranks [2]
func.func @main(%x: tensor<?x6xf32>) -> tensor<?x6xf32> {
  %y = dist.transfer %x from @src [0, *] to @dst [*, *] global [4, 6] : tensor<?x6xf32> -> tensor<?x6xf32>
  func.return %y : tensor<?x6xf32>
}
"""


def _op(text: str, op_type: type):
    return next(op for op in parse_module(text).walk() if isinstance(op, op_type))


def test_the_all_to_all_agreement_rides_with_its_counts() -> None:
    # the fact is declared on the op (a trait), read by planning and the backend
    assert VariableAllToAllOp.has_trait(AgreementRidesWithPayload)
    assert not AllGatherOp.has_trait(AgreementRidesWithPayload)
    plan = distir.compile(GATHER_AND_ALL_TO_ALL).plan
    # Both read only entry arguments: both checks move to the run's start, the
    # all-to-all's send counts travelling in the run's agreement row.
    assert [op.name for op in plan.hoisted] == ["dist.all_gather", "dist.variable_all_to_all"]
    assert plan.counts_in_agreement is plan.hoisted[1]


def test_records_decode_static_properties() -> None:
    text = GATHER_AND_ALL_TO_ALL
    assert make_invocation(_op(text, VariableAllToAllOp)).properties == {"axis": 0}
    broadcast = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = dist.broadcast %x root 2 : tensor<4xf32>
  func.return %y : tensor<4xf32>
}"""
    assert make_invocation(_op(broadcast, BroadcastOp)).properties == {"root": 2}
    sendrecv = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = dist.sendrecv %x to 1 from 0 : tensor<4xf32> -> tensor<4xf32>
  func.return %y : tensor<4xf32>
}"""
    assert make_invocation(_op(sendrecv, SendRecvOp)).properties == {
        "dest": 1,
        "source": 0,
        "result_dtype": torch.float32,
    }


def test_only_ops_with_something_to_agree_on_have_a_precondition() -> None:
    assert precondition_rule(RankOp) is None
    assert precondition_rule(SendRecvOp) is None
    assert precondition_rule(AllReduceOp) is not None
    assert precondition_rule(TransferOp) is not None


def test_a_generic_all_reduces_results_are_not_fresh() -> None:
    native = """
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce sum %x : tensor<4xi64>
  func.return %y : tensor<4xi64>
}"""
    generic = """
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce %x : tensor<4xi64> combine(%a, %b) {
    dist.yield %a : tensor<4xi64>
  }
  func.return %y : tensor<4xi64>
}"""
    record = semantics_of(AllReduceOp)
    assert record.fresh_results(_op(native, AllReduceOp))
    assert not record.fresh_results(_op(generic, AllReduceOp))


def test_a_transfer_plan_is_read_from_its_op() -> None:
    plan = _op(TRANSFER, TransferOp).transfer_plan()
    assert plan.members == (0, 1, 2)
    assert plan.outside_shape == (0, 6)  # size 0 along the dynamic dim
    assert plan.dest_box(2).sizes == (4, 6)
    assert [(t.src_rank, t.dst_rank, t.box.sizes) for t in plan.transfers] == [
        (0, 2, (2, 6)),
        (1, 2, (2, 6)),
    ]
    assert make_invocation(_op(TRANSFER, TransferOp)).properties["plan"] == plan


def test_a_transfer_runs_in_the_simulator_from_its_plan() -> None:
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    results = distir.simulate(TRANSFER, [[x[:2]], [x[2:]], [torch.empty(0, 6)]], timeout=20)
    assert torch.equal(results[2], x)
    assert results[0].shape == (0, 6) and results[1].shape == (0, 6)


def test_the_simulator_runs_the_records_it_is_handed() -> None:
    from distir.core.block_compiler import BlockCompiler
    from distir.core.semantics import SEMANTICS
    from distir.core.simulator import run_simulation
    from distir.ops.groups.semantics import GroupSizeSemantics

    program = """
func.func @main() -> index {
  %p = dist.group_size : index
  func.return %p : index
}"""
    module = parse_module(program)

    class Doubled(GroupSizeSemantics):
        def reference(self, call, inputs):
            return (torch.tensor(2 * call.size),)

    def run(semantics):
        def run_rank(rank):
            def bind(op):
                kernel = rank.bind(op, ())
                return lambda xs, writable: kernel(*xs)

            return BlockCompiler(module, bind).compile_function("main")()[0]

        return [int(r) for r in run_simulation(run_rank, 3, [], 10, semantics)]

    assert run(SEMANTICS) == [3, 3, 3]
    others = tuple(r for r in SEMANTICS if not isinstance(r, GroupSizeSemantics))
    assert run((*others, Doubled())) == [6, 6, 6]
    with pytest.raises(DistirError, match="has no reference semantics"):
        run(others)
