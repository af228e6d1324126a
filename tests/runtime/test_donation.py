"""Ownership: a result never aliases a caller's tensor unless the caller
donated it, a non-donated input is never modified, and donated inputs let
collectives run in place (results aliasing the inputs), with the same
values as the reference.

Every case runs on 2 real gloo ranks in one launch, three times: inputs
not donated, all inputs donated, and again not donated (the donated run
must leave nothing behind that changes a later run).
"""

from __future__ import annotations

import multiprocessing

import pytest
import torch

import distir
from distir.core.block_compiler import BlockCompiler
from distir.runtime.inputs import synthesize_inputs
from distir.runtime.launch import launch

P = 2

CASES: dict[str, tuple[str, str]] = {
    "native all-reduce": ("", """
func.func @main(%x: tensor<4096xf32>) -> tensor<4096xf32> {
  %y = dist.all_reduce sum %x : tensor<4096xf32>
  func.return %y : tensor<4096xf32>
}"""),
    "broadcast": ("", """
func.func @main(%x: tensor<4096xi64>) -> tensor<4096xi64> {
  %y = dist.broadcast %x root 1 : tensor<4096xi64>
  func.return %y : tensor<4096xi64>
}"""),
    "broadcast, dynamic root": ("", """
func.func @main(%x: tensor<64xi64>, %r: index) -> tensor<64xi64> {
  %y = dist.broadcast %x root %r : tensor<64xi64>
  func.return %y : tensor<64xi64>
}"""),
    "ring": ("select-all-reduce-algorithm{commutative=ring}", """
func.func @main(%x: tensor<5000xi64>) -> tensor<5000xi64> {
  %y = dist.all_reduce %x commutative : tensor<5000xi64> combine(%a, %b) {
    %s = arith.addi %a, %b : tensor<5000xi64>
    %c = arith.constant dense<4294967295> : tensor<5000xi64>
    %r = arith.andi %s, %c : tensor<5000xi64>
    dist.yield %r : tensor<5000xi64>
  }
  func.return %y : tensor<5000xi64>
}"""),
    "halving-doubling": ("select-all-reduce-algorithm{commutative=halving-doubling}", """
func.func @main(%x: tensor<999xi64>) -> tensor<999xi64> {
  %y = dist.all_reduce %x commutative : tensor<999xi64> combine(%a, %b) {
    %r = arith.maxsi %a, %b : tensor<999xi64>
    dist.yield %r : tensor<999xi64>
  }
  func.return %y : tensor<999xi64>
}"""),
    "ciphertext, automatic": ("", """
func.func @main(%ct: tensor<2x3x512xi64>, %q: tensor<3xi64>) -> tensor<2x3x512xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x512xi64>, tensor<3xi64>
  func.return %y : tensor<2x3x512xi64>
}"""),
    "ciphertext, lowered + ring": ("lower-ciphertext-add,select-all-reduce-algorithm", """
func.func @main(%ct: tensor<2x3x512xi64>, %q: tensor<3xi64>) -> tensor<2x3x512xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x512xi64>, tensor<3xi64>
  func.return %y : tensor<2x3x512xi64>
}"""),
    "ciphertext, deferred": ("defer-modular-reduction{max-group-size=4}", """
func.func @main(%ct: tensor<2x3x512xi64>, %q: tensor<3xi64>) -> tensor<2x3x512xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x512xi64>, tensor<3xi64>
  func.return %y : tensor<2x3x512xi64>
}"""),
    "all-gather, even and uneven": ("", """
func.func @main(%x: tensor<2x4xf32>, %rows: tensor<?x4xf32>, %c: tensor<2xi64>) -> (tensor<?x4xf32>, tensor<?x4xf32>) {
  %e = dist.all_gather %x axis 0 : tensor<2x4xf32> -> tensor<?x4xf32>
  %u = dist.all_gather %rows counts(%c : tensor<2xi64>) axis 0 : tensor<?x4xf32> -> tensor<?x4xf32>
  func.return %e, %u : tensor<?x4xf32>, tensor<?x4xf32>
}"""),
    "variable all-to-all": ("", """
func.func @main(%x: tensor<?x3xf32>, %s: tensor<2xi64>) -> (tensor<?x3xf32>, tensor<2xi64>) {
  %y, %r = dist.variable_all_to_all %x, %s axis 0 : tensor<?x3xf32>, tensor<2xi64> -> tensor<?x3xf32>
  func.return %y, %r : tensor<?x3xf32>, tensor<2xi64>
}"""),
    "sendrecv": ("", """
func.func @main(%x: tensor<8xi64>) -> tensor<8xi64> {
  %r = dist.rank : index
  %one = arith.constant 1 : index
  %peer = arith.subi %one, %r : index
  %y = dist.sendrecv %x to %peer from %peer : tensor<8xi64> -> tensor<8xi64>
  func.return %y : tensor<8xi64>
}"""),
    "send and recv": ("", """
func.func @main(%x: tensor<8xi64>) -> tensor<8xi64> {
  %r = dist.rank : index
  %zero = arith.constant 0 : index
  %is_first = arith.cmpi eq, %r, %zero : index
  %y = scf.if %is_first -> (tensor<8xi64>) {
    dist.send %x to 1 : tensor<8xi64>
    scf.yield %x : tensor<8xi64>
  } else {
    %got = dist.recv from 0 : tensor<8xi64>
    scf.yield %got : tensor<8xi64>
  }
  func.return %y : tensor<8xi64>
}"""),
    "transfer": ("", """
dist.mesh @rows [2] ranks [0, 1]
dist.mesh @one [1] ranks [1]
func.func @main(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  %y = dist.transfer %x from @rows [0, *] to @one [*, *] global [6, 4] : tensor<?x4xf32> -> tensor<?x4xf32>
  func.return %y : tensor<?x4xf32>
}"""),
    "assert_uniform and group queries": ("", """
func.func @main(%q: tensor<3xi64>) -> (tensor<3xi64>, index, index) {
  dist.assert_uniform %q : tensor<3xi64>
  %r = dist.rank : index
  %n = dist.group_size : index
  func.return %q, %r, %n : tensor<3xi64>, index, index
}"""),
    "wave": ("", """
func.func @main(%x: tensor<16xf32>, %z: tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>) {
  %a, %b = dist.wave {
    %s = dist.all_reduce sum %x : tensor<16xf32>
    %t = dist.broadcast %z root 0 : tensor<16xf32>
    dist.yield %s, %t : tensor<16xf32>, tensor<16xf32>
  } : tensor<16xf32>, tensor<16xf32>
  func.return %a, %b : tensor<16xf32>, tensor<16xf32>
}"""),
    "chain of collectives": ("", """
func.func @main(%x: tensor<20000xf32>) -> tensor<20000xf32> {
  %a = dist.all_reduce sum %x : tensor<20000xf32>
  %b = dist.all_reduce max %a : tensor<20000xf32>
  %c = dist.broadcast %b root 0 : tensor<20000xf32>
  func.return %c : tensor<20000xf32>
}"""),
    "argument returned as is": ("", """
func.func @main(%x: tensor<8xi64>) -> (tensor<8xi64>, tensor<8xi64>) {
  %c = tensor.cast %x : tensor<8xi64> to tensor<8xi64>
  %s = dist.all_reduce sum %x : tensor<8xi64>
  func.return %c, %s : tensor<8xi64>, tensor<8xi64>
}"""),
}

#: cases whose (first) result must share memory with the donated input #0
IN_PLACE = {
    "native all-reduce", "broadcast", "ring", "halving-doubling", "ciphertext, automatic",
    "ciphertext, lowered + ring", "ciphertext, deferred", "chain of collectives",
}


def _inputs(text: str, rank: int) -> list[torch.Tensor]:
    program = distir.compile(text)
    inputs = synthesize_inputs(program.function, rank, P, seed=3)
    return [x.float() * 1.0 if x.is_floating_point() else x for x in inputs]


def donation_worker(ctx) -> dict:
    out = {}
    for name, (pipeline, text) in CASES.items():
        program = distir.compile(text, pipeline)
        given = _inputs(text, ctx.rank)
        kept = [x.clone() for x in given]
        plain = program.run(*given)
        plain = plain if isinstance(plain, tuple) else (plain,)
        unchanged = all(torch.equal(a, b) for a, b in zip(given, kept))
        aliases = any(
            r.numel() and r.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            for r in plain for x in given if x.numel()
        )
        donated_inputs = [x.clone() for x in kept]
        donated = program.run(*donated_inputs, donate=True)
        donated = donated if isinstance(donated, tuple) else (donated,)
        again = program.run(*[x.clone() for x in kept])
        again = again if isinstance(again, tuple) else (again,)
        out[name] = {
            "unchanged": unchanged,
            "aliases": aliases,
            "plain": [r.clone() for r in plain],
            "donated": [r.clone() for r in donated],
            "again": [r.clone() for r in again],
            "in_place": donated[0].untyped_storage().data_ptr()
            == donated_inputs[0].untyped_storage().data_ptr(),
        }
    return out


@pytest.fixture(scope="module")
def outcomes():
    results = launch(donation_worker, P, pass_context=True, timeout=120)
    assert multiprocessing.active_children() == []
    return results


@pytest.mark.multirank
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(CASES))
def test_inputs_not_donated_are_never_modified_nor_aliased(outcomes, name):
    for rank in range(P):
        assert outcomes[rank][name]["unchanged"], f"rank {rank} saw its input modified"
        assert not outcomes[rank][name]["aliases"], f"rank {rank} got a result aliasing an input"


@pytest.mark.multirank
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(CASES))
def test_donated_and_plain_runs_equal_the_reference(outcomes, name):
    _, text = CASES[name]
    # The program as written, not lowered by the pipeline the ranks ran: a
    # pass that changed the result would otherwise change the expectation too.
    expected = distir.compile(text).simulate([_inputs(text, r) for r in range(P)])
    for rank in range(P):
        want = expected[rank] if isinstance(expected[rank], tuple) else (expected[rank],)
        for run in ("plain", "donated", "again"):
            got = outcomes[rank][name][run]
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and torch.equal(g, w), (rank, run)


@pytest.mark.multirank
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_donated_inputs_are_updated_in_place(outcomes, name):
    for rank in range(P):
        assert outcomes[rank][name]["in_place"], f"rank {rank} copied a donated input"


def _writable_steps(text: str) -> list[tuple[str, frozenset[int], tuple]]:
    program = distir.compile(text)
    block = BlockCompiler(program.module, lambda op: (lambda xs, w: ())).compile_function("main")
    return [(s.op.name, s.writable, s.donatable) for s in block.steps if s.dist]


def test_an_intermediate_whose_last_use_is_a_collective_is_overwritten():
    steps = _writable_steps(CASES["chain of collectives"][1])
    assert steps == [
        ("dist.all_reduce", frozenset(), ((0, 0),)),  # the argument: only when donated
        ("dist.all_reduce", frozenset({0}), ()),
        ("dist.broadcast", frozenset({0}), ()),
    ]


def test_values_read_twice_or_views_are_never_overwritten():
    text = """
func.func @main(%x: tensor<8xi64>) -> (tensor<8xi64>, tensor<8xi64>) {
  %a = dist.all_reduce sum %x : tensor<8xi64>
  %b = dist.all_reduce sum %a : tensor<8xi64>
  %c = tensor.cast %b : tensor<8xi64> to tensor<8xi64>
  %d = dist.all_reduce sum %c : tensor<8xi64>
  %k = arith.constant dense<1> : tensor<8xi64>
  %e = dist.all_reduce sum %k : tensor<8xi64>
  func.return %a, %d : tensor<8xi64>, tensor<8xi64>
}"""
    steps = _writable_steps(text)
    # %a is returned too, %c is a cast (a view of %b), %k a constant every run shares.
    assert [w for _, w, _ in steps] == [frozenset()] * 4
