"""A compiled step's writable operands for each donation pattern."""

from __future__ import annotations

import itertools

from distir.interpreters.block_compiler import _WRITABLE_PATTERNS_KEPT, Step


def test_writable_operands_follow_every_donation_pattern_beyond_those_remembered():
    # Operands 0..4 read block arguments 0..4; operand 5 is always writable.
    step = Step(
        kernel=lambda xs, writable: (),
        inputs=(0, 1, 2, 3, 4, 5),
        outputs=(),
        op=None,  # type: ignore[arg-type]
        dist=True,
        writable=frozenset({5}),
        donatable=tuple((p, p) for p in range(5)),
    )
    patterns = [frozenset(c) for k in range(6) for c in itertools.combinations(range(5), k)]
    assert len(patterns) > _WRITABLE_PATTERNS_KEPT
    for _ in range(2):  # the second time, some come from the cache
        for donated in patterns:
            assert step.writable_when(donated) == donated | {5}
    assert len(step._writable_when) == _WRITABLE_PATTERNS_KEPT
