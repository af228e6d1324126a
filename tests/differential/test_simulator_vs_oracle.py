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

import oracle
import pytest
import strategies
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
