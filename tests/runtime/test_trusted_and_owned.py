"""One rank, in process: what a trusted program agrees on and when, what
the fingerprint distinguishes, and results that own their memory."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import distir
from distir.runtime.agreement import RunAgreement

GENERIC = """
func.func @main(%x: tensor<6xi64>) -> tensor<6xi64> {
  %y = dist.all_reduce %x commutative : tensor<6xi64> combine(%a, %b) {
    %s = arith.addi %a, %b : tensor<6xi64>
    dist.yield %s : tensor<6xi64>
  }
  func.return %y : tensor<6xi64>
}"""

TWO_SUMS = """
func.func @main(%x: tensor<4xi64>, %y: tensor<4xi64>) -> (tensor<4xi64>, tensor<4xi64>, tensor<4xi64>) {
  %a = dist.all_reduce sum %x : tensor<4xi64>
  %b = dist.all_reduce sum %y : tensor<4xi64>
  %c = arith.constant dense<7> : tensor<4xi64>
  func.return %a, %b, %c : tensor<4xi64>, tensor<4xi64>, tensor<4xi64>
}"""



@pytest.fixture
def agreements(monkeypatch):
    """Counts the run agreements (exchanges at the start of a run)."""
    count = [0]
    agree = RunAgreement.agree

    def counted(self, *args, **kwargs):
        count[0] += 1
        return agree(self, *args, **kwargs)

    monkeypatch.setattr(RunAgreement, "agree", counted)
    return count


def test_a_trusted_plan_agrees_once_per_group_even_when_compiled_again(one_rank_world, agreements):
    group = dist.new_group([0])
    x = torch.arange(6)
    for _ in range(3):
        assert torch.equal(distir.compile(GENERIC, agreement=False).run(x, group=group), x)
    program = distir.compile(GENERIC, agreement=False)
    for _ in range(3):
        program.run(x, group=group)
    assert agreements[0] == 1
    # Another plan (another algorithm than size 1's default, ring) agrees at its own first run.
    other = distir.compile(
        GENERIC, agreement=False, implementations={"dist.all_reduce": "gather-fold"}
    )
    other.run(x, group=group)
    other.run(x, group=group)
    assert agreements[0] == 2


def test_a_verified_program_agrees_at_every_run(one_rank_world, agreements):
    group = dist.new_group([0])
    program = distir.compile(GENERIC)
    for _ in range(3):
        program.run(torch.arange(6), group=group)
    assert agreements[0] == 3


def test_the_agreement_mode_cannot_change_per_run(one_rank_world):
    with pytest.raises(TypeError, match="agreement"):
        distir.compile(GENERIC).run(torch.arange(6), agreement=False)


@pytest.mark.parametrize("size", [2, 3, 4, 8])
def test_the_fingerprint_covers_what_runs_and_nothing_else(size):
    def fingerprint(**options) -> int:
        return distir.compile(GENERIC, **options).bound_fingerprint(size)

    names = ("gather-fold", "ring", "halving-doubling", "recursive-doubling")
    explicit = {name: fingerprint(implementations={"dist.all_reduce": name}) for name in names}
    assert len(set(explicit.values())) == len(names)
    # The default algorithm is the same plan as naming it.
    assert fingerprint() in explicit.values()
    assert fingerprint(agreement=False) != fingerprint()
    assert fingerprint(deadline=3.0) == fingerprint(deadline=40.0) == fingerprint()


def test_a_result_never_shares_memory_with_inputs_or_constants(one_rank_world):
    program = distir.compile(TWO_SUMS)
    t = torch.arange(4)
    a, b, c = program.run(t, t, donate=(0,))
    assert torch.equal(t, torch.arange(4))
    for r in (a, b, c):
        assert r.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    c.add_(1)  # the caller's to write
    assert torch.equal(program.run(t, t)[2], torch.full((4,), 7))
    base = torch.arange(6)
    x, y = base[:4], base[2:]
    a, b, _ = program.run(x, y, donate=(0,))  # overlapping: the donation is declined
    assert torch.equal(base, torch.arange(6)) and torch.equal(a, x) and torch.equal(b, y)
    a, _, _ = program.run(base[:4], torch.arange(4), donate=(0,))  # alone: written in place
    assert a.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
