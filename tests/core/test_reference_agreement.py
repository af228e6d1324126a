"""The reference rejects what the runtime rejects: operands that must be
equal on every rank (ciphertext moduli, a combine's extra operands, a
dynamic root, uneven counts) raise `CollectiveMismatchError` naming the op,
under every lowering, instead of a result that depends on the rank."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

import distir
from distir.errors import CollectiveMismatchError

CIPHERTEXT = """
func.func @main(%ct: tensor<2x3x8xi64>, %q: tensor<3xi64>) -> tensor<2x3x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x8xi64>, tensor<3xi64>
  func.return %y : tensor<2x3x8xi64>
}
"""
PIPELINES = [
    "",
    "lower-ciphertext-add",
    "lower-ciphertext-add,select-all-reduce-algorithm",
    "defer-modular-reduction{max-group-size=8}",
    "defer-modular-reduction{max-group-size=8},cse,canonicalize",
]
MODULI = [(1 << 60) - 93, (1 << 60) - 173, (1 << 59) - 55]

WITH_EXTRA = """
func.func @main(%x: tensor<4xi64>, %m: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce %x, %m : tensor<4xi64>, tensor<4xi64> combine(%a, %b, %mod) {
    %s = arith.addi %a, %b : tensor<4xi64>
    %r = arith.remsi %s, %mod : tensor<4xi64>
    dist.yield %r : tensor<4xi64>
  }
  func.return %y : tensor<4xi64>
}
"""


def _ciphertext_inputs(p: int, odd_rank: int, limb: int) -> list[list[torch.Tensor]]:
    per_rank = []
    for rank in range(p):
        q = list(MODULI)
        if rank == odd_rank:
            q[limb] -= 2 * (limb + 1) * 61
        moduli = torch.tensor(q)
        ct = torch.remainder(torch.arange(48).reshape(2, 3, 8) * (rank + 7) * 1_000_003,
                             moduli.view(-1, 1))
        per_rank.append([ct, moduli])
    return per_rank


@settings(max_examples=examples(0.25), deadline=None)
@given(
    p=st.integers(2, 6),
    data=st.data(),
    pipeline=st.sampled_from(PIPELINES),
    limb=st.integers(0, 2),
)
def test_moduli_that_differ_are_rejected_under_every_lowering(p, data, pipeline, limb):
    odd_rank = data.draw(st.integers(0, p - 1))
    program = distir.compile(CIPHERTEXT, pipeline)
    with pytest.raises(CollectiveMismatchError) as info:
        program.simulate(_ciphertext_inputs(p, odd_rank, limb), timeout=20)
    assert "at <program>:3:3" in str(info.value)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_equal_moduli_give_the_modular_sum_under_every_lowering(pipeline):
    inputs = _ciphertext_inputs(3, odd_rank=-1, limb=0)
    results = distir.compile(CIPHERTEXT, pipeline).simulate(inputs)
    q = inputs[0][1].view(-1, 1)
    expected = torch.remainder(sum(ct for ct, _ in inputs), q)
    for result in results:
        assert torch.equal(result, expected)


@settings(max_examples=examples(0.2), deadline=None)
@given(p=st.integers(2, 5), data=st.data(),
       pipeline=st.sampled_from(["", "select-all-reduce-algorithm"]))
def test_combine_extras_that_differ_are_rejected(p, data, pipeline):
    odd_rank = data.draw(st.integers(0, p - 1))
    inputs = [[torch.arange(4) + r, torch.full((4,), 11 + int(r == odd_rank))] for r in range(p)]
    with pytest.raises(CollectiveMismatchError) as info:
        distir.compile(WITH_EXTRA, pipeline).simulate(inputs, timeout=20)
    assert "'dist.all_reduce' at <program>:3:3" in str(info.value)
    assert "extra operand #0" in str(info.value)
