"""`dist.pvary`'s input must be replicated: the gradient it sends back is
the sum over ranks of its result's cotangent, right for one value every
rank holds and silently wrong for a per-rank value (whose gradient is its
own cotangent). A per-rank input ends as a named error on every rank (the
run's agreement compares a digest of it, as `dist.assert_uniform` does);
an input the types prove varying over pvary's group (the result of another
collective, or of a local op reading one) is refused when
the backward is derived, naming the pvary and where its input comes from.

The oracle shares no code with distir: whether every rank's input has the
same bytes (numpy), and the sum over ranks of the cotangents (plain torch).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.errors import DistirError, NotDifferentiable
from distir.ir.parsing import parse_module
from distir.passes.vjp import add_vjp
from distir.runtime.autograd import simulate_vjp
from distir.runtime.launch import launch

ONE_PVARY = """
func.func @main(%x: tensor<3xf64>) -> tensor<3xf64> {
  %h = arith.mulf %x, %x : tensor<3xf64>
  %y = dist.pvary %h : tensor<3xf64>
  func.return %y : tensor<3xf64>
}"""


def _same_bytes(values: list[torch.Tensor]) -> bool:
    raw = [v.numpy().tobytes() for v in values]
    return all(r == raw[0] for r in raw)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(2, 3), st.data())
def test_pvary_on_the_simulator_sums_a_replicated_input_and_names_a_varying_one(P, data):
    element = st.sampled_from([0.0, 1.5, -2.0, 3.25])
    shared = data.draw(st.booleans())
    first = torch.tensor(data.draw(st.lists(element, min_size=3, max_size=3)), dtype=torch.float64)
    xs = [
        first if shared or r == 0 else
        torch.tensor(data.draw(st.lists(element, min_size=3, max_size=3)), dtype=torch.float64)
        for r in range(P)
    ]  # fmt: skip
    cts = [torch.tensor([r + 1.0, -r, 0.5], dtype=torch.float64) for r in range(P)]
    program = distir.compile(ONE_PVARY)
    hs = [x * x for x in xs]
    if not _same_bytes(hs):
        with pytest.raises(DistirError, match="'dist.pvary' at .*must be replicated"):
            simulate_vjp(program, [[x] for x in xs], [[c] for c in cts])
        return
    results, grads = simulate_vjp(program, [[x] for x in xs], [[c] for c in cts])
    total = sum(cts)
    for r in range(P):
        torch.testing.assert_close(results[r][0], hs[r], rtol=0, atol=0)
        torch.testing.assert_close(grads[r][0], 2 * xs[r] * total)


def _eager_worker(ctx, shared: bool) -> str:
    x = torch.tensor([1.0, 2.0, 3.0]) * (1 if shared else ctx.rank + 1)
    x.requires_grad_(True)
    try:
        y = distir.pvary(x, deadline=20.0)
        (y * (ctx.rank + 1)).sum().backward()
    except DistirError as e:
        return f"{type(e).__name__}: {e}"
    return repr(x.grad.tolist())


@pytest.mark.timeout(120)
def test_eager_pvary_of_a_per_rank_value_is_a_named_error_on_every_rank():
    """Fails on old main: every rank got the sum over ranks (6, 6, 6) as the
    gradient of its own x."""
    P = 3
    for rank, message in enumerate(launch(_eager_worker, P, False, pass_context=True, timeout=100)):
        assert "'dist.pvary' at" in message and "must be replicated" in message, (
            f"rank {rank}: {message}"
        )
    # the same value on every rank: the gradient is the sum of every rank's
    # cotangent (1 + 2 + 3), on every rank
    for rank, message in enumerate(launch(_eager_worker, P, True, pass_context=True, timeout=100)):
        assert message == repr([6.0, 6.0, 6.0]), f"rank {rank}: {message}"


def _compiled_worker(ctx, text: str, shared: bool) -> str:
    program = distir.compile(text, deadline=20.0)
    x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + (0 if shared else ctx.rank)
    x.requires_grad_(True)
    try:
        program.run(x).sum().backward()
    except DistirError as e:
        return f"{type(e).__name__}: {e}"
    return repr(x.grad.tolist())


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "text",
    [
        ONE_PVARY,  # checked where the op runs
        ONE_PVARY.replace("%h = arith.mulf %x, %x : tensor<3xf64>\n  ", "").replace(
            "pvary %h", "pvary %x"
        ),  # an entry argument: checked with the run's agreement, at its start
    ],
    ids=["computed", "argument"],
)
def test_a_compiled_pvary_of_a_per_rank_value_is_a_named_error_on_every_rank(text):
    for rank, message in enumerate(
        launch(_compiled_worker, 2, text, False, pass_context=True, timeout=100)
    ):
        assert "'dist.pvary' at" in message and "must be replicated" in message, (
            f"rank {rank}: {message}"
        )


PROVEN_VARYING = {
    "pvary of a pvary": """
func.func @main(%x: tensor<3xf64>) -> tensor<3xf64> {
  %y = dist.pvary %x : tensor<3xf64>
  %z = dist.pvary %y : tensor<3xf64>
  func.return %z : tensor<3xf64>
}""",
    "pvary of a local op of an all_reduce": """
func.func @main(%x: tensor<3xf64> {dist.replicated}) -> tensor<3xf64> {
  %s = dist.all_reduce sum %x : tensor<3xf64>
  %t = arith.mulf %s, %x : tensor<3xf64>
  %z = dist.pvary %t : tensor<3xf64>
  func.return %z : tensor<3xf64>
}""",
    "pvary of an all_gather on its group": """
dist.group @pairs [[0, 1], [2, 3]]
func.func @main(%x: tensor<3xf64>) -> tensor<6xf64> {
  %g = dist.all_gather %x axis 0 group @pairs : tensor<3xf64> -> tensor<6xf64>
  %z = dist.pvary %g group @pairs : tensor<6xf64>
  func.return %z : tensor<6xf64>
}""",
    "pvary over the world of an all_reduce over a group": """
dist.group @pairs [[0, 1]]
func.func @main(%x: tensor<2xf64>) -> tensor<2xf64> {
  %s = dist.all_reduce sum %x group @pairs : tensor<2xf64>
  %z = dist.pvary %s : tensor<2xf64>
  func.return %z : tensor<2xf64>
}""",
}


@pytest.mark.parametrize("name", sorted(PROVEN_VARYING))
def test_an_input_the_types_prove_varying_is_refused_when_the_backward_is_derived(name):
    """Fails on old main, which derived a backward summing the cotangent
    twice over ranks (P times the gradient)."""
    with pytest.raises(
        NotDifferentiable, match=r"'dist.pvary' at .*:\d+:\d+: its input is varying"
    ):
        add_vjp(parse_module(PROVEN_VARYING[name]))


# -- a pvary over a group narrower than its input's replication ----------------------

NESTED = """
dist.group @tp [[0, 1], [2, 3]]
dist.group @solo [[0], [1], [2], [3]]
func.func @main(%x: tensor<2xf64> {REPLICATED}, %w: tensor<2xf64>) -> tensor<2xf64> {
  %z = dist.pvary %x group @GROUP : tensor<2xf64>
  %u = arith.mulf %z, %w : tensor<2xf64>
  %v = arith.mulf %x, %w : tensor<2xf64>
  %o = arith.addf %u, %v : tensor<2xf64>
  func.return %o : tensor<2xf64>
}"""

#: (x replicated over, pvary's group) -> the subgroups x is one value of
HELD = {
    ("dist.replicated", "tp"): [[0, 1, 2, 3]],
    ("dist.replicated", "solo"): [[0, 1, 2, 3]],
    ("dist.replicated = @tp", "solo"): [[0, 1], [2, 3]],
}


@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(HELD)), st.data())
def test_a_pvary_inside_its_inputs_replication_sends_back_the_sum_over_that_group_once(case, data):
    """Fails on old main: the pvary summed over its group and the input's
    varying use summed that again over the wider group (|tp| times the
    gradient). Oracle: one plain-torch leaf per subgroup x is one value of."""
    replicated, group = case
    number = st.floats(-2, 2, allow_nan=False, width=64)

    def draw() -> torch.Tensor:
        return torch.tensor(
            data.draw(st.lists(number, min_size=2, max_size=2)), dtype=torch.float64
        )

    held = HELD[case]
    leaves = [draw().requires_grad_(True) for _ in held]
    owner = {r: k for k, part in enumerate(held) for r in part}
    w = [draw() for _ in range(4)]
    cts = [draw() for _ in range(4)]
    sum(((leaves[owner[r]] * w[r] * 2) * cts[r]).sum() for r in range(4)).backward()
    text = NESTED.replace("REPLICATED", replicated).replace("GROUP", group)
    inputs = [[leaves[owner[r]].detach(), w[r]] for r in range(4)]
    _, grads = simulate_vjp(distir.compile(text), inputs, [[c] for c in cts])
    for r in range(4):
        torch.testing.assert_close(grads[r][0], leaves[owner[r]].grad)
        torch.testing.assert_close(grads[r][1], leaves[owner[r]].detach() * 2 * cts[r])


@pytest.mark.parametrize(
    ("replicated", "group"),
    [("dist.replicated = @tp", "tp2"), ("dist.replicated = @tp", "world")],
)
def test_a_pvary_wider_than_its_inputs_replication_is_refused(replicated, group):
    """x is one value per subgroup of @tp, several over @tp2's subgroups or
    the world's: pvary's input would not be one value."""
    text = NESTED.replace("REPLICATED", replicated).replace(
        "dist.group @solo", "dist.group @tp2 [[0, 2], [1, 3]]\ndist.group @solo"
    )
    text = text.replace(" group @GROUP", "" if group == "world" else f" group @{group}")
    with pytest.raises(NotDifferentiable, match=r"'dist.pvary' at .* replicated over @tp, whose"):
        add_vjp(parse_module(text))
