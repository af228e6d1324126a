"""A queued run never computes with an input changed after it was queued.

`Program.run_async` returns at once and the run executes later. An input
modified in between used to be computed with silently: first through any
in-place op, then (once version counters were checked) through every
channel torch's version counter does not see — `.data`, `.numpy()`,
another tensor on the same storage, `torch.inference_mode()`. Now a queued
run reads copies made when it was queued (`ownership.queued_inputs`), so it
computes with the values it was given whatever the caller does next; a
donated input is not copied, and a change to it that the version counter
sees is a `ProgramInputError` on every rank.
"""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import distir
from distir.errors import ProgramInputError
from distir.runtime import autograd

T = "tensor<4xf32>"
SUM = f"func.func @main(%x: {T}) -> {T} {{\n  %y = dist.all_reduce sum %x : {T}\n  func.return %y : {T}\n}}"


@pytest.fixture
def world(one_rank_world):
    from distir.transport.domain import reset_domain

    yield
    reset_domain(None)


def _hold_first_run(patch) -> threading.Event:
    """Makes the first run to start wait until the returned event is set,
    so that the runs queued behind it have not started yet (`patch(module,
    name, value)` installs the wait: `setattr`, or pytest's monkeypatch)."""
    release, started = threading.Event(), []
    original = autograd.records_gradient

    def first_waits(inputs):
        if not started:
            started.append(True)
            assert release.wait(20)
        return original(inputs)

    patch(autograd, "records_gradient", first_waits)
    return release


@pytest.fixture
def held_worker(monkeypatch):
    return _hold_first_run(monkeypatch.setattr)


CHANGES = {
    "add_": lambda x: x.add_(1),
    "copy_": lambda x: x.copy_(torch.zeros(4)),
    "item assignment": lambda x: x.__setitem__(0, 5.0),
    "through a view": lambda x: x[1:].mul_(2),
}


@pytest.mark.parametrize("agreement", [True, False])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_donated_input_changed_before_its_queued_run_starts_is_a_named_error(
    world, held_worker, agreement, change
):
    program = distir.compile(SUM, agreement=agreement)
    first = program.run_async(torch.ones(4))
    x = torch.arange(4.0)
    queued = program.run_async(x, donate=True)
    CHANGES[change](x)
    held_worker.set()
    assert torch.equal(first.wait(), torch.ones(4))
    with pytest.raises(ProgramInputError, match="input #0 was modified in place after run_async"):
        queued.wait()


def _same_storage(x: torch.Tensor) -> None:
    other = torch.from_numpy(x.detach().numpy())  # its own version counter
    other.add_(100)


def _inference(x: torch.Tensor) -> None:
    with torch.inference_mode():
        x.add_(100)


def _no_grad(x: torch.Tensor) -> None:
    with torch.no_grad():
        x.add_(100)


#: every channel that changes an input's memory, including those torch's
#: version counter does not see (all but the in-place ops)
CHANNELS = {
    "add_": lambda x: x.detach().add_(100) if x.requires_grad else x.add_(100),
    "setitem": lambda x: x.detach().__setitem__(0, 100.0),
    ".data": lambda x: x.data.add_(100),
    ".numpy()": lambda x: x.detach().numpy().__iadd__(100),
    "another tensor on the storage": _same_storage,
    "inference_mode": _inference,
    "no_grad": _no_grad,
}


@pytest.mark.parametrize("agreement", [True, False])
@pytest.mark.parametrize("grad", [False, True], ids=["plain", "requires grad"])
@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_a_queued_run_computes_with_the_values_it_was_given(
    world, held_worker, agreement, grad, channel
):
    program = distir.compile(SUM, agreement=agreement)
    first = program.run_async(torch.ones(4))
    x = torch.arange(4.0).requires_grad_(grad)
    queued = program.run_async(x)
    if not (grad and channel == "no_grad"):  # (a leaf requiring grad refuses that one)
        CHANNELS[channel](x)
        assert not torch.equal(x.detach(), torch.arange(4.0))  # the change happened
    held_worker.set()
    assert torch.equal(first.wait(), torch.ones(4))
    y = queued.wait()
    assert torch.equal(y.detach(), torch.arange(4.0))  # one rank: the sum is x as queued
    if grad:
        (y * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
        assert torch.equal(x.grad, torch.tensor([1.0, 2.0, 3.0, 4.0]))


#: in-place writes, each applied to the input or a view of it
IN_PLACE = {
    "add_": lambda v: v.add_(1), "sub_": lambda v: v.sub_(2), "mul_": lambda v: v.mul_(3),
    "div_": lambda v: v.div_(2), "neg_": lambda v: v.neg_(), "zero_": lambda v: v.zero_(),
    "fill_": lambda v: v.fill_(7), "clamp_": lambda v: v.clamp_(max=-1),
    "copy_": lambda v: v.copy_(torch.full_like(v, 9)),
    "masked_fill_": lambda v: v.masked_fill_(torch.ones_like(v, dtype=torch.bool), 4),
    "setitem": lambda v: v.__setitem__(slice(None), 5.0),
}  # fmt: skip


@given(
    write=st.sampled_from(sorted(IN_PLACE)),
    start=st.integers(0, 3),
    donate=st.booleans(),
    agreement=st.booleans(),
)
def test_any_in_place_write_through_any_view_before_the_run_starts(
    one_rank_world, write, start, donate, agreement
):
    """Donated: a named error; not donated: the values as queued."""
    from distir.transport.domain import reset_domain

    program = distir.compile(SUM, agreement=agreement)
    original = autograd.records_gradient
    try:
        release = _hold_first_run(setattr)
        first = program.run_async(torch.ones(4))
        x = torch.arange(4.0) + 1
        queued = program.run_async(x, donate=donate)
        IN_PLACE[write](x[start:])
        release.set()
        assert torch.equal(first.wait(), torch.ones(4))
        if donate:
            with pytest.raises(ProgramInputError, match="input #0 was modified in place"):
                queued.wait()
        else:
            assert torch.equal(queued.wait(), torch.arange(4.0) + 1)
    finally:
        autograd.records_gradient = original
        reset_domain(None)


def test_unchanged_inputs_queued_behind_a_run_give_their_results(world, held_worker):
    program = distir.compile(SUM)
    first = program.run_async(torch.ones(4))
    xs = [torch.arange(4.0) * k for k in range(3)]
    queued = [program.run_async(x) for x in xs]
    held_worker.set()
    first.wait()
    for x, future in zip(xs, queued):
        assert torch.equal(future.wait(), x)


def _one_rank_changes_its_queued_input(context) -> str:
    import time

    from distir.errors import DistirError

    program = distir.compile(SUM, deadline=30)
    release = _hold_first_run(setattr)
    first = program.run_async(torch.ones(4))
    x = torch.arange(4.0)
    queued = program.run_async(x, donate=True)
    if context.rank == 1:
        x.add_(1)
    release.set()
    first.wait()
    start = time.monotonic()
    try:
        queued.wait()
    except DistirError as e:
        return f"{type(e).__name__} after {time.monotonic() - start:.1f} s: {e}"
    return "returned a result"


@pytest.mark.multirank
@pytest.mark.timeout(90)
def test_one_ranks_changed_queued_input_is_every_ranks_named_error_at_once():
    from distir.runtime.launch import launch

    outcomes = launch(_one_rank_changes_its_queued_input, 3, pass_context=True, timeout=60)
    for rank, outcome in enumerate(outcomes):
        assert outcome.startswith(("ProgramInputError", "ProgramMismatch")), (rank, outcome)
        assert "input #0 was modified in place after run_async" in outcome, (rank, outcome)
        seconds = float(outcome.split(" after ")[1].split(" s")[0])
        assert seconds < 10, (rank, outcome)  # in the run agreement, not at the 30 s deadline


def _one_rank_changes_its_queued_input_unseen(context) -> list[float]:
    program = distir.compile(SUM, deadline=30)
    release = _hold_first_run(setattr)
    first = program.run_async(torch.ones(4))
    x = torch.arange(4.0) * (context.rank + 1)
    queued = program.run_async(x)
    if context.rank == 1:
        x.data.add_(100)  # no version counter sees it
    release.set()
    first.wait()
    return queued.wait().tolist()


@pytest.mark.multirank
@pytest.mark.timeout(90)
def test_one_ranks_unseen_change_to_a_queued_input_changes_no_ranks_result():
    from distir.runtime.launch import launch

    outcomes = launch(_one_rank_changes_its_queued_input_unseen, 3, pass_context=True, timeout=60)
    expected = (torch.arange(4.0) * (1 + 2 + 3)).tolist()
    assert outcomes == [expected] * 3
