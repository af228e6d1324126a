"""Gradients are correct or refused: a run on inputs that require grad,
through an op with no derivative, is `NotDifferentiable` on that rank before
any collective, and a named error on every other rank (never a result whose
backward ignores the collective, never a hang)."""

from __future__ import annotations

import time

import pytest
import torch

import distir
from distir.errors import DistirError
from distir.runtime.launch import launch

P = 3

SATURATING_MAX = """
func.func @main(%x: tensor<3xf32>, %cap: tensor<3xf32>) -> tensor<3xf32> {
  %y = dist.all_reduce %x, %cap commutative : tensor<3xf32>, tensor<3xf32> combine(%a, %b, %c) {
    %m = arith.maximumf %a, %b : tensor<3xf32>
    %s = arith.minimumf %m, %c : tensor<3xf32>
    dist.yield %s : tensor<3xf32>
  }
  func.return %y : tensor<3xf32>
}"""

NATIVE_PROD = """
func.func @main(%x: tensor<3xf32>, %cap: tensor<3xf32>) -> tensor<3xf32> {
  %y = dist.all_reduce prod %x : tensor<3xf32>
  func.return %y : tensor<3xf32>
}"""

CASES = {"generic saturating max": SATURATING_MAX, "native prod": NATIVE_PROD}


# Long enough that a local refusal on a loaded machine stays well below it.
DEADLINE_S = 4.0


def _outcome(fn) -> tuple[str, str, float]:
    start = time.monotonic()
    try:
        fn()
    except DistirError as e:
        return type(e).__name__, str(e), time.monotonic() - start
    return "ok", "", time.monotonic() - start


def refusal_worker(ctx, name: str, only_rank: int | None) -> tuple[str, str, float]:
    program = distir.compile(CASES[name], deadline=DEADLINE_S)
    x = torch.full((3,), float(ctx.rank + 1))
    wants = only_rank is None or ctx.rank == only_rank
    x.requires_grad_(wants)
    return _outcome(lambda: program.run(x, torch.full((3,), 2.0)))


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CASES))
def test_every_rank_refuses_before_any_collective(name):
    outcomes = launch(refusal_worker, P, name, None, pass_context=True, timeout=90)
    for kind, message, elapsed in outcomes:
        assert kind == "NotDifferentiable", message
        assert "require grad" in message and "@main" in message
        # Refused locally: a rank that waited for the deadline took at least it.
        assert elapsed < DEADLINE_S


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_one_rank_requiring_grad_is_named_on_every_rank():
    outcomes = launch(refusal_worker, P, "native prod", 1, pass_context=True, timeout=90)
    kinds = [kind for kind, _, _ in outcomes]
    assert kinds[1] == "NotDifferentiable"
    for rank in (0, 2):
        kind, message, elapsed = outcomes[rank]
        assert kind != "ok"
        assert "NotDifferentiable" in message and "rank 1" in message, message
        assert elapsed < DEADLINE_S + 2.0 + 1.0
