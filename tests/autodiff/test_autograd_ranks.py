"""Autograd through programs on real gloo ranks: gradients equal
`torch.distributed.nn.functional`'s where it has the op, and the simulator's
backward where it does not; ranks that disagree about recording gradients,
and a rank that fails during backward, are named errors on every rank."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn

import distir
from distir.errors import DistirError
from distir.runtime.autograd import simulate_vjp
from distir.runtime.launch import LaunchError, launch

P = 3

PROGRAMS = {
    "all_reduce": """
func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
  %y = dist.all_reduce sum %x : tensor<3xf32>
  func.return %y : tensor<3xf32>
}""",
    "broadcast": """
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %y = dist.broadcast %x root 1 : tensor<2x3xf32>
  func.return %y : tensor<2x3xf32>
}""",
    "all_gather": """
func.func @main(%x: tensor<2x3xf32>) -> tensor<?x3xf32> {
  %y = dist.all_gather %x axis 0 : tensor<2x3xf32> -> tensor<?x3xf32>
  func.return %y : tensor<?x3xf32>
}""",
    "all_to_all": """
func.func @main(%x: tensor<?x2xf32>, %s: tensor<3xi64>) -> (tensor<?x2xf32>, tensor<3xi64>) {
  %y, %r = dist.variable_all_to_all %x, %s axis 0 : tensor<?x2xf32>, tensor<3xi64> -> tensor<?x2xf32>
  func.return %y, %r : tensor<?x2xf32>, tensor<3xi64>
}""",
    "uneven all_gather": """
func.func @main(%x: tensor<?x2xf32>, %c: tensor<3xi64>) -> tensor<?x2xf32> {
  %y = dist.all_gather %x counts(%c : tensor<3xi64>) axis 0 : tensor<?x2xf32> -> tensor<?x2xf32>
  func.return %y : tensor<?x2xf32>
}""",
    "wave": """
func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
  %a, %b = dist.wave {
    %s = dist.all_reduce sum %x : tensor<3xf32>
    %t = dist.broadcast %x root 2 : tensor<3xf32>
    dist.yield %s, %t : tensor<3xf32>, tensor<3xf32>
  } : tensor<3xf32>, tensor<3xf32>
  %y = arith.mulf %a, %b : tensor<3xf32>
  func.return %y : tensor<3xf32>
}""",
    **{
        kind: f"""
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {{
  %y = dist.all_reduce {kind} %x : tensor<4xf32>
  func.return %y : tensor<4xf32>
}}"""
        for kind in ("max", "min")
    },
}

#: max/min inputs with ties: rank r holds TIES[r]
TIES = [[1.0, 3.0, 2.0, 0.0], [1.0, 3.0, 5.0, 0.0], [0.0, 3.0, 5.0, 1.0]]
#: the rank each element's gradient goes to: the lowest holding the extremum
HOLDERS = {"max": [0, 0, 1, 2], "min": [2, 0, 0, 0]}

#: rank r sends SENDS[r][j] rows to rank j (zeros included)
SENDS = [[1, 0, 2], [0, 0, 3], [2, 1, 0]]
COUNTS = [2, 0, 3]


def _inputs(name: str, rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    if name in ("all_reduce", "wave"):
        return [torch.rand(3, generator=g)]
    if name in ("max", "min"):
        return [torch.tensor(TIES[rank])]
    if name in ("broadcast", "all_gather"):
        return [torch.rand(2, 3, generator=g)]
    if name == "all_to_all":
        return [torch.rand(sum(SENDS[rank]), 2, generator=g), torch.tensor(SENDS[rank])]
    return [torch.rand(COUNTS[rank], 2, generator=g), torch.tensor(COUNTS)]


def _weights(y: torch.Tensor, rank: int) -> torch.Tensor:
    return torch.rand(y.shape, generator=torch.Generator().manual_seed(100 + rank))


def _torch_reference(name: str, x: torch.Tensor, rank: int) -> torch.Tensor | None:
    if name == "all_reduce":
        return dnn.all_reduce(x)
    if name == "broadcast":
        return dnn.broadcast(x, src=1)
    if name == "all_gather":
        return torch.cat(dnn.all_gather(x), dim=0)
    if name == "all_to_all":
        recv = [SENDS[j][rank] for j in range(P)]
        out = torch.empty(sum(recv), 2)
        return dnn.all_to_all_single(out, x, recv, SENDS[rank])
    return None


def gradients_worker(ctx) -> dict:
    out = {}
    for name, text in PROGRAMS.items():
        program = distir.compile(text, deadline=20.0)
        inputs = _inputs(name, ctx.rank)
        x = inputs[0].clone().requires_grad_(True)
        y = program.run(x, *inputs[1:])
        y = y[0] if isinstance(y, tuple) else y
        (y * _weights(y, ctx.rank)).sum().backward()
        entry = {"y": y.detach(), "grad": x.grad.clone(), "torch": None}
        x_ref = inputs[0].clone().requires_grad_(True)
        y_ref = _torch_reference(name, x_ref, ctx.rank)
        if y_ref is not None:
            (y_ref * _weights(y_ref, ctx.rank)).sum().backward()
            entry["torch"] = (y_ref.detach(), x_ref.grad.clone())
        out[name] = entry
    # The example: rank r's loss is (r + 1) * sum(y).
    program = distir.compile(PROGRAMS["all_reduce"])
    x = torch.ones(3, requires_grad=True)
    ((ctx.rank + 1) * program.run(x).sum()).backward()
    out["issue"] = x.grad.clone()
    with torch.no_grad():  # not recorded: a plain run
        out["no_grad"] = program.run(x).requires_grad
    out["detached"] = program.run(x.detach()).requires_grad
    try:
        program.run(x, donate=True)
        out["donated"] = "ran"
    except DistirError as e:  # refused on every rank, before any collective
        out["donated"] = f"{type(e).__name__}: {e}"
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def outcomes():
    results = launch(gradients_worker, P, pass_context=True, timeout=100)
    assert multiprocessing.active_children() == []
    return results


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_the_gradient_of_an_all_reduce_counts_every_rank(outcomes):
    for rank in range(P):
        assert torch.equal(outcomes[rank]["issue"], torch.full((3,), 6.0))


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_runs_not_recorded_stay_plain_and_donating_a_tensor_requiring_grad_is_refused(outcomes):
    for rank in range(P):
        assert outcomes[rank]["no_grad"] is False and outcomes[rank]["detached"] is False
        assert outcomes[rank]["donated"] == (
            "ProgramInputError: @main: inputs [0] require grad and cannot be donated"
        )


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["all_reduce", "broadcast", "all_gather", "all_to_all"])
def test_gradients_equal_torch_distributed_nn(outcomes, name):
    for rank in range(P):
        got = outcomes[rank][name]
        y_ref, grad_ref = got["torch"]
        assert torch.allclose(got["y"], y_ref, atol=1e-6)
        assert torch.allclose(got["grad"], grad_ref, atol=1e-6), (rank, got["grad"], grad_ref)


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_gradients_equal_the_simulated_backward(outcomes, name):
    program = distir.compile(PROGRAMS[name])
    inputs = [_inputs(name, r) for r in range(P)]
    cotangents = [[_weights(outcomes[r][name]["y"], r)] for r in range(P)]
    results, gradients = simulate_vjp(program, inputs, cotangents)
    for rank in range(P):
        assert torch.allclose(results[rank][0], outcomes[rank][name]["y"], atol=1e-6)
        assert torch.allclose(gradients[rank][0], outcomes[rank][name]["grad"], atol=1e-6)


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["max", "min"])
def test_an_extremum_gradient_goes_to_the_lowest_rank_holding_it_on_gloo(outcomes, kind):
    values = torch.tensor(TIES)
    expected_y = values.amax(0) if kind == "max" else values.amin(0)
    total = sum(_weights(expected_y, r) for r in range(P))
    for rank in range(P):
        got = outcomes[rank][kind]
        assert torch.equal(got["y"], expected_y)
        expected = torch.where(torch.tensor(HOLDERS[kind]) == rank, total, torch.zeros(4))
        # the summation order of the cotangents may differ (rounding only)
        assert torch.allclose(got["grad"], expected, atol=1e-6), (rank, got["grad"], expected)
        assert torch.equal(got["grad"] == 0, expected == 0), (rank, got["grad"], expected)


# -- disagreement and failure ------------------------------------------------------

DEADLINE_S = 3.0


def _attempt(fn) -> dict:
    start = time.monotonic()
    try:
        fn()
        outcome = {"error": None, "message": ""}
    except Exception as e:  # recorded for the parent to assert on
        outcome = {
            "error": type(e).__name__,
            "message": str(e),
            "distir": isinstance(e, DistirError),
        }
    outcome["seconds"] = time.monotonic() - start
    return outcome


def fault_worker(ctx, scenario: str) -> dict:
    program = distir.compile(PROGRAMS["all_reduce"], deadline=DEADLINE_S)
    bad = ctx.rank == ctx.world_size - 1
    x = torch.ones(3, requires_grad=not (scenario == "one rank records" and bad))
    if scenario == "one rank records":
        return {"forward": _attempt(lambda: program.run(x))}
    y = program.run(x)
    if bad:

        def fail(grad):
            if scenario == "exit in backward":
                os._exit(3)
            raise RuntimeError("injected failure during backward")

        y.register_hook(fail)
    outcome = {"backward": _attempt(lambda: y.sum().backward())}
    outcome["next run"] = _attempt(lambda: program.run(x.detach()))
    return outcome


def _run(scenario: str) -> tuple[dict[int, dict], dict[int, str]]:
    try:
        return dict(enumerate(launch(fault_worker, 2, scenario, pass_context=True, timeout=60))), {}
    except LaunchError as e:
        return e.results, e.failures


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_ranks_that_disagree_about_recording_gradients_fail_together():
    reports, failures = _run("one rank records")
    assert not failures
    for rank in (0, 1):
        outcome = reports[rank]["forward"]
        assert outcome["error"] == "ProgramMismatch", outcome
        assert "run different programs" in outcome["message"]
        assert outcome["seconds"] < DEADLINE_S + 2


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["exit in backward", "raise in backward"])
def test_a_rank_failing_during_backward_is_named_on_its_peer(scenario):
    start = time.monotonic()
    reports, failures = _run(scenario)
    assert time.monotonic() - start < 60
    assert multiprocessing.active_children() == []
    survivor = reports[0]["backward"]
    # a rank that exited: rank 0 waits out its deadline in the backward; a rank
    # that raised and ran on: its next run's agreement meets rank 0's backward
    assert survivor["error"] in ("DeadlineExceeded", "CollectiveFailed", "ProgramMismatch")
    assert "@main_bwd" in survivor["message"], survivor
    assert survivor["seconds"] < DEADLINE_S + 2
    assert reports[0]["next run"]["error"] == "Poisoned"
    if scenario == "exit in backward":
        assert "exited with code 3" in failures[1]
    else:
        assert reports[1]["backward"]["error"] == "RuntimeError"
        late = reports[1]["next run"]
        assert late["distir"] and late["seconds"] < DEADLINE_S + 2, late


# -- five ranks: zero counts, partial transfers, point-to-point in branches, loops,
# linalg.broadcast/reduce, min --------------------------------------------------------


class _Drawn:
    """Feeds a program family (tests/autodiff/test_transpose_rules.py) the
    values it would draw, in order: fixed cases for real ranks."""

    def __init__(self, *values):
        self.values = list(values)

    def __call__(self, strategy):
        return self.values.pop(0)


def _five_rank_cases() -> dict[str, tuple[str, list[list[torch.Tensor]]]]:
    import test_transpose_rules as families

    P5 = 5
    sends = [[0, 2, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [2, 1, 1, 0, 3], [0, 0, 1, 0, 1]]
    return {
        "all_to_all": families.all_to_all(_Drawn(*sends, 2), P5, 11),
        "uneven all_gather": families.gather_uneven(_Drawn([2, 0, 1, 0, 3], 2), P5, 12),
        "transfer": families.transfer(_Drawn(5, 3, "[*, *] partial [0] to @m [0, *]"), P5, 13),
        "send_recv": families.send_recv_in_branches(_Drawn(), P5, 14),
        "static loop": families.static_loop(_Drawn(1, 3, 2, 2), P5, 15),
        "broadcast and reduce": families.broadcast_and_reduce(_Drawn(2, [2, 3], {1}), P5, 16),
        "min and max in a wave": families.extremum(_Drawn([2, 3], "min", True), P5, 17),
    }


def _cotangents(results, rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [
        torch.rand(y.shape, generator=g, dtype=y.dtype) for y in results if y.is_floating_point()
    ]


def five_rank_worker(ctx) -> dict:
    out = {}
    for name, (text, inputs_per_rank) in _five_rank_cases().items():
        program = distir.compile(text, deadline=20.0)
        inputs = [
            x.clone().requires_grad_(True) if x.is_floating_point() else x
            for x in inputs_per_rank[ctx.rank]
        ]
        results = program.run(*inputs)
        results = results if isinstance(results, tuple) else (results,)
        floats = [y for y in results if y.is_floating_point()]
        loss = sum((y * c).sum() for y, c in zip(floats, _cotangents(results, ctx.rank)))
        loss.backward()
        out[name] = [
            None if x.grad is None else x.grad.clone() for x in inputs if x.is_floating_point()
        ]
    dist.barrier()
    return out


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_five_ranks_gradients_equal_the_simulated_backward():
    outcomes = launch(five_rank_worker, 5, pass_context=True, timeout=100)
    for name, (text, inputs) in _five_rank_cases().items():
        program = distir.compile(text)
        results = [r if isinstance(r, tuple) else (r,) for r in program.simulate(inputs)]
        cotangents = [_cotangents(results[r], r) for r in range(5)]
        _, gradients = simulate_vjp(program, inputs, cotangents)
        for rank in range(5):
            expected = [g for g in gradients[rank] if g is not None]
            got = outcomes[rank][name]
            assert len(got) == len(expected)
            for a, b in zip(got, expected):
                assert torch.allclose(a, b, atol=1e-12), (name, rank, a, b)
