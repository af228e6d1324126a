"""Inputs whose memory is not their value (`distir.runtime.ownership.plain_inputs`).

A negation view (memory holding -x under the negative bit) and an efficient
zero tensor (no memory) run on a copy of their value, donated or not; a
sparse tensor or a tensor on the meta device is refused naming the input:
by `run` on every rank within the agreement (never a wait for the
deadline), and by `simulate`, which rejects what a run rejects. The
property over every collective family on real ranks is
`tests/differential/test_ranks_vs_oracle.py::test_negation_views_donated_or_not_give_the_oracles_results`.
"""

from __future__ import annotations

import time

import pytest
import torch

import distir
from distir.errors import DistirError, ProgramInputError
from distir.runtime.launch import launch

T = "tensor<4xf32>"
ALL_REDUCE = (
    f"func.func @main(%x: {T}) -> {T} {{\n  %y = dist.all_reduce sum %x : {T}\n"
    f"  func.return %y : {T}\n}}"
)


@pytest.fixture
def world(one_rank_world):
    """The one-rank world, its execution domain cleared after each test (a
    refused input poisons it, as every failed run does)."""
    from distir.transport.domain import reset_domain

    yield
    reset_domain(None)


def _odd(kind: str) -> torch.Tensor:
    if kind == "sparse":
        return torch.tensor([1.0, 0.0, 2.0, 0.0]).to_sparse()
    return torch.empty(4, device="meta")


@pytest.mark.parametrize("agreement", [True, False])
@pytest.mark.parametrize("donate", [False, True])
def test_a_negation_view_and_a_zero_tensor_run_on_their_values(world, agreement, donate):
    program = distir.compile(ALL_REDUCE, agreement=agreement)
    memory = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    negated = torch._neg_view(memory)
    y = program.run(negated, donate=donate)
    assert torch.equal(y, torch.tensor([1.0, -2.0, 3.0, -4.0]))
    assert torch.equal(memory, torch.tensor([-1.0, 2.0, -3.0, 4.0]))  # not written
    zero = torch._efficientzerotensor(4)
    assert torch.equal(program.run(zero, donate=donate), torch.zeros(4))


def test_a_negation_views_gradient_reaches_the_tensor_it_views(world):
    program = distir.compile(ALL_REDUCE)
    leaf = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    y = program.run(torch._neg_view(leaf * 1))  # the value -leaf, lazily
    (y * torch.tensor([1.0, 10.0, 100.0, 1000.0])).sum().backward()
    assert torch.equal(leaf.grad, -torch.tensor([1.0, 10.0, 100.0, 1000.0]))


@pytest.mark.parametrize("kind,needle", [("sparse", "sparse_coo tensor"), ("meta", "meta device")])
@pytest.mark.parametrize("agreement", [True, False])
def test_a_tensor_without_dense_memory_is_refused_naming_it(world, kind, needle, agreement):
    program = distir.compile(ALL_REDUCE, agreement=agreement)
    with pytest.raises(ProgramInputError, match=f"@main input #0 is a? ?.*{needle}"):
        program.run(_odd(kind))
    with pytest.raises(ProgramInputError, match=needle):
        program.simulate([[_odd(kind)]])


def _one_rank_passes(context, kind: str) -> str:
    program = distir.compile(ALL_REDUCE, deadline=30)
    x = _odd(kind) if context.rank == 1 else torch.ones(4)
    start = time.monotonic()
    try:
        program.run(x)
    except DistirError as e:
        return f"{type(e).__name__} after {time.monotonic() - start:.1f} s: {e}"
    return "returned a result"


@pytest.mark.multirank
@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["sparse", "meta"])
def test_one_ranks_refused_input_is_every_ranks_named_error_at_once(kind):
    outcomes = launch(_one_rank_passes, 3, kind, pass_context=True, timeout=60)
    for rank, outcome in enumerate(outcomes):
        assert outcome.startswith(("ProgramInputError", "ProgramMismatch")), (rank, outcome)
        assert "rank 1 rejected its inputs" in outcome or rank == 1, (rank, outcome)
        seconds = float(outcome.split(" after ")[1].split(" s")[0])
        assert seconds < 10, (rank, outcome)  # within the agreement, not the 30 s deadline
