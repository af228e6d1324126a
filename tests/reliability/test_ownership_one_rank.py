"""The ownership property of `test_ownership`, on a one-rank group in this
process: cheap enough for hypothesis to draw (and shrink) many cases. One
rank's collectives leave values as they are, so this checks what a run
writes and what its results share; the 2-rank launch checks values."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples
from test_ownership import FAMILIES, PATTERNS, OwnershipCase, _as_tuple, _shares

import distir

#: the families whose programs run on one rank
ONE_RANK = sorted(
    f for f in FAMILIES if f not in ("broadcast", "sendrecv", "variable all-to-all", "transfer")
)
_programs: dict[str, distir.Program] = {}



@settings(max_examples=examples(0.8), derandomize=True, deadline=None, database=None)
@given(
    family=st.sampled_from(ONE_RANK),
    pattern=st.sampled_from(PATTERNS),
    donate=st.sets(st.sampled_from([0, 1])),
    seed=st.integers(0, 1000),
)
def test_a_run_writes_only_what_it_may_and_results_own_their_memory(
    one_rank_world, family, pattern, donate, seed
) -> None:
    case = OwnershipCase(family, pattern, tuple(sorted(donate)), seed)
    program = _programs.get(family) or _programs.setdefault(family, case.compile())
    inputs = case.inputs(0)
    before = [x.clone() for x in inputs]
    (want,) = program.simulate([case.reference_inputs(0)])
    got = _as_tuple(program.run(*inputs, donate=case.donate))
    kept = [i for i in range(len(inputs)) if i not in case.donate]
    for i in kept:
        assert torch.equal(inputs[i], before[i]), f"input #{i} was not donated but was written"
    for p, r in enumerate(got):
        assert not any(_shares(r, inputs[i]) for i in kept), f"result #{p} aliases an input"
    for g, w in zip(got, _as_tuple(want), strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)
    for r in got:
        r.add_(1)
    again = _as_tuple(program.run(*case.reference_inputs(0)))
    for g, w in zip(again, _as_tuple(want), strict=True):
        assert torch.equal(g, w), "a result was the program's own state"
