"""The reference simulator against the independent oracle, every pass
re-checked on the same draws.

`distir.simulate` is the oracle the rest of the suite trusts; here it is
judged by `tests/oracle.py`, which shares no code with it. For every drawn
case and every pipeline of `strategies.PIPELINES`, the simulator's results
must equal the oracle's on every rank, or the program must be rejected at
compile time with `CompileError`. Process-free (the simulator runs ranks as
threads of this process).
"""

from __future__ import annotations

import math

import oracle
import pytest
import strategies
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_server import apply_layout

import distir
from distir.errors import CompileError


def simulate_against_oracle(case: strategies.DrawnCase, world: int) -> None:
    inputs = [
        [apply_layout(x, lay) for x, lay in zip(xs, lays)]
        for xs, lays in zip(case.inputs, case.case().layouts)
    ]
    for pipeline in case.pipelines:
        try:
            program = distir.compile(case.source, pipeline)
        except CompileError:
            continue  # rejected before running: allowed by the contract
        results = program.simulate(inputs)
        results = [r if isinstance(r, tuple) else (r,) for r in results]
        why = oracle.first_mismatch(case.expected, results)
        assert why is None, f"{case.name}, pipeline {pipeline!r}, P={world}: {why}\n{case.source}"


@pytest.mark.parametrize("family", sorted(strategies.FAMILIES))
@settings(max_examples=strategies.examples(0.25))
@given(data=st.data())
def test_the_simulator_equals_the_oracle_under_every_pipeline(family, data):
    world = data.draw(st.sampled_from([1, 2, 3, 4]), label="world size")
    case = data.draw(strategies.FAMILIES[family](world), label="case")
    simulate_against_oracle(case, world)


# -- what the draws found, pinned ------------------------------------------------


@pytest.mark.parametrize("pipeline", ["", "recognize-native-reductions"])
def test_maximumf_orders_signed_zeros_in_the_simulator(pipeline):
    """MLIR's arith.maximumf treats -0.0 as less than +0.0 and propagates NaN."""
    t = "tensor<3xf32>"
    source = (f"func.func @main(%x: {t}) -> {t} {{\n"
              f"  %y = dist.all_reduce %x commutative : {t} combine(%a, %b) {{\n"
              f"    %c = arith.maximumf %a, %b : {t}\n    dist.yield %c : {t}\n  }}\n"
              f"  func.return %y : {t}\n}}\n")  # fmt: skip
    xs = [torch.tensor([-0.0, math.nan, 1.0]), torch.tensor([0.0, 1.0, -0.0])]
    results = distir.compile(source, pipeline).simulate([[x] for x in xs])
    expected = oracle.generic_all_reduce("maximumf", xs, True)
    why = oracle.first_mismatch(expected, [(r,) for r in results])
    assert why is None, why


@pytest.mark.parametrize("pipeline", strategies.PIPELINES)
def test_a_ciphertext_with_no_coefficients_sums_under_every_pipeline(pipeline):
    """Zero coefficients per limb: an empty sum, or a CompileError, never a crash."""
    t, tq = "tensor<1x2x0xi64>", "tensor<2xi64>"
    source = (f"func.func @main(%c: {t}, %q: {tq}) -> {t} {{\n"
              f"  %y = dist.all_reduce_add_ciphertext %c, %q : {t}, {tq}\n"
              f"  func.return %y : {t}\n}}\n")  # fmt: skip
    cts = [torch.zeros(1, 2, 0, dtype=torch.int64)] * 2
    q = torch.tensor([7, 11])
    try:
        program = distir.compile(source, pipeline)
    except CompileError:
        return
    results = program.simulate([[ct, q] for ct in cts])
    why = oracle.first_mismatch(oracle.ciphertext_sum(cts, [7, 11]), [(r,) for r in results])
    assert why is None, why
