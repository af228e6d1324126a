"""Real gloo ranks against the independent oracle, on one long-lived P=3
launch fed seeded hypothesis draws.

The ranks are a `rank_server.RankServer`: this process draws a case
(program text, every rank's inputs and memory layouts), the ranks compile
and run it and send back every rank's results, which must equal
`tests/oracle.py`'s on every rank — or the program is rejected at compile
time with `CompileError` on every rank — and no rank may modify an input it
did not donate (a draw donates every input or none). Inputs come in every
memory layout a caller can pass, negation views included. Every draw runs
twice: as written, and under one drawn pipeline (a pass never changes a
result).

The draws are derandomized (reproducible: the same cases on every run and
machine) and not shrunk: a failing case is reported as drawn, since each
run-time failure costs a fresh launch. Explicit cases below pin the
defects these draws found.
"""

from __future__ import annotations

import dataclasses
import math

import oracle
import pytest
import strategies
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from rank_server import Case, Outcome, RankServer

pytestmark = pytest.mark.multirank

WORLD = 3


@pytest.fixture(scope="module")
def server():
    server = RankServer(WORLD)
    yield server
    server.close()


def judge(case: strategies.DrawnCase, outcomes: list[Outcome], pipeline: str) -> None:
    where = f"{case.name}, pipeline {pipeline!r}, P={WORLD}"
    if any(o.compile_error for o in outcomes):
        assert all(o.compile_error for o in outcomes), f"{where}: only some ranks rejected it"
        return
    for rank, o in enumerate(outcomes):
        assert o.error is None, f"{where}: rank {rank} raised {o.error}\n{case.source}"
        assert not o.modified_inputs, f"{where}: rank {rank} modified inputs {o.modified_inputs}"
    why = oracle.first_mismatch(case.expected, [o.results for o in outcomes])
    assert why is None, f"{where}: {why}\n{case.source}"


def run_and_judge(
    server: RankServer, case: strategies.DrawnCase, pipeline: str = "", donate: tuple = ()
) -> None:
    judge(case, server.run(case.case(pipeline, donate)), pipeline)


def every_family(fraction: float):
    """A test run for every case family, fed `fraction` of the hypothesis
    profile's examples, derandomized (the same draws on every run)."""

    def decorate(test):
        test = given(data=st.data())(test)
        test = settings(
            max_examples=strategies.examples(fraction),
            derandomize=True,
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
        )(test)
        return pytest.mark.parametrize("family", sorted(strategies.FAMILIES))(test)

    return decorate


@every_family(0.06)
def test_real_ranks_equal_the_oracle(server, family, data):
    case = data.draw(strategies.FAMILIES[family](WORLD), label="case")
    pipeline = data.draw(st.sampled_from(strategies.PIPELINES[1:]), label="pipeline")
    # Donating changes which memory a run may write, never its results.
    donate = data.draw(st.sampled_from([(), tuple(range(len(case.inputs[0])))]), label="donate")
    run_and_judge(server, case, "", donate)
    run_and_judge(server, case, pipeline, donate)


# -- inputs whose memory is not their value -----------------------------------------


def _negated_where_possible(case: strategies.DrawnCase) -> strategies.DrawnCase:
    """The case with every input a negation view can hold passed as one
    (memory holding -x under the negative bit) on every rank."""
    layouts = [
        ["negated" if strategies.negatable(x.dtype) else lay for x, lay in zip(xs, lays)]
        for xs, lays in zip(case.inputs, case.case().layouts)
    ]  # fmt: skip
    return dataclasses.replace(case, layouts=layouts)


@every_family(0.04)
def test_negation_views_donated_or_not_give_the_oracles_results(server, family, data):
    # A negation view's memory holds -x: a collective that read or wrote that
    # memory as the value returned each rank's own input (gloo wrote the sum
    # into a temporary), silently.
    case = _negated_where_possible(data.draw(strategies.FAMILIES[family](WORLD), label="case"))
    for donate in ((), tuple(range(len(case.inputs[0])))):
        run_and_judge(server, case, "", donate)


@every_family(0.05)
def test_a_value_autograd_saved_from_an_input_is_never_used_after_the_run_wrote_it(
    server, family, data
):
    # Collectives write memory torch does not track: backward through a
    # value saved from a donated input (w * x) used the run's result.
    # Contiguous inputs, so that every donated one may be written.
    case = data.draw(strategies.FAMILIES[family](WORLD), label="case")
    case = dataclasses.replace(case, layouts=[["contiguous"] * len(xs) for xs in case.inputs])
    for donate in ((), tuple(range(len(case.inputs[0])))):
        judge(case, server.run(case.case("", donate, saved_by_autograd=True)), "")


# -- the defects the draws found, pinned -----------------------------------------


def _native(kind: str, element: str, values: list[list]) -> strategies.DrawnCase:
    dtype = strategies.ELEMENT_TYPES[element]
    xs = [torch.tensor(v, dtype=dtype) for v in values]
    t = strategies.tensor_type(tuple(xs[0].shape), element)
    source = (f"func.func @main(%x: {t}) -> {t} {{\n  %y = dist.all_reduce {kind} %x : {t}\n"
              f"  func.return %y : {t}\n}}\n")  # fmt: skip
    return strategies.DrawnCase(f"all_reduce {kind} {t}", source, [[x] for x in xs],
                                oracle.native_all_reduce(kind, xs))  # fmt: skip


NAN = math.nan


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("nan_rank", [0, 1, 2])
def test_a_nan_on_any_rank_makes_native_max_and_min_nan(server, kind, nan_rank):
    values = [[1.0, -2.0], [3.0, 4.0], [-5.0, 6.0]]
    values[nan_rank][0] = NAN
    run_and_judge(server, _native(kind, "f32", values))


@pytest.mark.parametrize(
    "kind,element",
    [("prod", "i16"), ("sum", "ui16"), ("sum", "ui32"), ("sum", "ui64"), ("max", "ui16"),
     ("max", "ui32"), ("max", "ui64"), ("min", "ui64"), ("prod", "ui32")],
)  # fmt: skip
def test_every_listed_integer_type_reduces_or_is_rejected_at_compile_time(server, kind, element):
    info = torch.iinfo(strategies.ELEMENT_TYPES[element])
    values = [[info.max, 3, 0], [2, info.min, 7], [info.max, 1, 5]]
    run_and_judge(server, _native(kind, element, values))


@pytest.mark.parametrize("pipeline", ["", "recognize-native-reductions"])
def test_maximumf_propagates_nan_and_orders_signed_zeros_under_every_pipeline(server, pipeline):
    t = "tensor<3xf32>"
    source = (f"func.func @main(%x: {t}) -> {t} {{\n"
              f"  %y = dist.all_reduce %x commutative : {t} combine(%a, %b) {{\n"
              f"    %c = arith.maximumf %a, %b : {t}\n    dist.yield %c : {t}\n  }}\n"
              f"  func.return %y : {t}\n}}\n")  # fmt: skip
    xs = [torch.tensor(v) for v in ([NAN, -0.0, 1.0], [2.0, 0.0, 2.0], [3.0, -0.0, NAN])]
    case = strategies.DrawnCase("generic maximumf", source, [[x] for x in xs],
                                oracle.generic_all_reduce("maximumf", xs, True))  # fmt: skip
    run_and_judge(server, case, pipeline)


def test_all_gather_of_a_zero_width_tensor(server):
    t, to = "tensor<2x0xi32>", "tensor<6x0xi32>"
    source = (f"func.func @main(%x: {t}) -> {to} {{\n  %y = dist.all_gather %x axis 0 : {t} -> {to}\n"
              f"  func.return %y : {to}\n}}\n")  # fmt: skip
    xs = [torch.zeros(2, 0, dtype=torch.int32) for _ in range(WORLD)]
    case = strategies.DrawnCase(
        "all_gather 2x0", source, [[x] for x in xs], oracle.all_gather(xs, 0)
    )
    run_and_judge(server, case)


# -- inputs that require grad --------------------------------------------------

GRAD_PROGRAMS = {
    # program, d(Σ_r <y_r, w_r>)/dx_s for every rank s
    "all_reduce sum": (
        "%y = dist.all_reduce sum %x : tensor<3xf32>",
        lambda ws, s: sum(ws[1:], ws[0]),
    ),
    "broadcast root 1": (
        "%y = dist.broadcast %x root 1 : tensor<3xf32>",
        lambda ws, s: sum(ws[1:], ws[0]) if s == 1 else torch.zeros(3),
    ),
}


@pytest.mark.parametrize("name", sorted(GRAD_PROGRAMS))
def test_inputs_that_require_grad_get_the_true_gradient_or_a_named_error(server, name):
    """Until programs are differentiable, a named error that says so; after,
    the gradient of the global loss (the collective's transpose), never the
    gradient of a collective treated as the identity."""
    line, gradient = GRAD_PROGRAMS[name]
    source = (f"func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {{\n  {line}\n"
              "  func.return %y : tensor<3xf32>\n}\n")  # fmt: skip
    xs = [torch.tensor([1.0, 2.0, 3.0]) * (r + 1) for r in range(WORLD)]
    ws = [torch.tensor([1.0, 10.0, 100.0]) * (r + 1) for r in range(WORLD)]
    case = Case(name, source, [[x] for x in xs], [["contiguous"]] * WORLD, grad_weights=ws)
    outcomes = server.run(case)
    for rank, o in enumerate(outcomes):
        if o.error is not None:
            named = not o.error.startswith(("unnamed", "silently"))
            assert named and "grad" in o.error, f"rank {rank}: {o.error}"
            continue
        (grad,) = o.grads
        want = gradient(ws, rank)
        assert grad is not None and torch.equal(grad, want), (rank, grad, want)


# -- aliased inputs --------------------------------------------------------------

ALIASED = {
    # program over (x, y) and every rank's expected results when y is x
    "all_reduce sum and max of one tensor": (
        "%a = dist.all_reduce sum %x : tensor<3xi64>\n"
        "  %b = dist.all_reduce max %y : tensor<3xi64>",
        lambda xs: [oracle.native_all_reduce("sum", xs)[r] + oracle.native_all_reduce("max", xs)[r]
                    for r in range(WORLD)],
    ),
    "broadcast and all_reduce of one tensor": (
        "%a = dist.broadcast %x root 2 : tensor<3xi64>\n"
        "  %b = dist.all_reduce sum %y : tensor<3xi64>",
        lambda xs: [oracle.broadcast(xs, 2)[r] + oracle.native_all_reduce("sum", xs)[r]
                    for r in range(WORLD)],
    ),
}  # fmt: skip


@pytest.mark.parametrize("donate", [(), (0,)], ids=["none-donated", "first-donated"])
@pytest.mark.parametrize("name", sorted(ALIASED))
def test_the_same_tensor_passed_twice_gives_the_reference_and_stays_unmodified(
    server, name, donate
):
    """`run(t, t)` or `run(t, t, donate=(0,))`: results as if two copies were
    passed, and `t`, which is also the non-donated input #1, untouched (or a
    named error refusing the aliasing on every rank)."""
    body, expected = ALIASED[name]
    t = "tensor<3xi64>"
    source = (f"func.func @main(%x: {t}, %y: {t}) -> ({t}, {t}) {{\n  {body}\n"
              f"  func.return %a, %b : {t}, {t}\n}}\n")  # fmt: skip
    xs = [torch.tensor([5, -1, 7]) * (r + 1) for r in range(WORLD)]
    case = Case(
        name, source, [[x, x] for x in xs], [["contiguous", "alias:0"]] * WORLD, donate=donate
    )
    outcomes = server.run(case)
    if all(o.error is not None and not o.error.startswith("unnamed") for o in outcomes):
        return  # refused, with a named error on every rank
    for rank, o in enumerate(outcomes):
        assert o.error is None, f"rank {rank}: {o.error}"
        assert not o.modified_inputs, f"rank {rank} modified inputs {o.modified_inputs}"
    why = oracle.first_mismatch(expected(xs), [o.results for o in outcomes])
    assert why is None, why
