"""A compiled step's writable operands for each donation pattern, and a
block of one collective run without its slots."""

from __future__ import annotations

import itertools

import pytest
import torch

from distir.core.block_compiler import _WRITABLE_PATTERNS_KEPT, Step
from distir.errors import DistirError, OpError


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


#: blocks of one collective: only the first is run without slots (its
#: operands are the block's arguments in order, its results the block's)
_ONE_COLLECTIVE = {
    "direct": ("(%x: {t}) -> {t}", "%y = dist.all_reduce sum %x : {t}", "%y : {t}"),
    "returned twice": (
        "(%x: {t}) -> ({t}, {t})", "%y = dist.all_reduce sum %x : {t}", "%y, %y : {t}, {t}"
    ),
    "argument returned": (
        "(%x: {t}) -> ({t}, {t})", "%y = dist.all_reduce sum %x : {t}", "%x, %y : {t}, {t}"
    ),
    "second argument": (
        "(%x: {t}, %z: {t}) -> {t}", "%y = dist.all_reduce sum %z : {t}", "%y : {t}"
    ),
    "first of two": ("(%x: {t}, %z: {t}) -> {t}", "%y = dist.all_reduce sum %x : {t}", "%y : {t}"),
}


@pytest.mark.parametrize("name", list(_ONE_COLLECTIVE))
@pytest.mark.parametrize("raises", [None, ValueError, DistirError])
def test_a_block_of_one_collective_runs_as_its_stepped_form(name, raises):
    import distir
    from distir.core.block_compiler import BlockCompiler

    signature, body, returned = (s.format(t="tensor<3xf32>") for s in _ONE_COLLECTIVE[name])
    program = distir.compile(f"func.func @main{signature} {{\n  {body}\n  func.return {returned}\n}}")
    calls: list[tuple] = []

    def bind(op):
        def kernel(xs, writable):
            calls.append((tuple(id(x) for x in xs), writable))
            if raises is not None:
                raise raises("the backend broke")
            return (xs[0] * 2,)

        return kernel

    direct = BlockCompiler(program.module, bind).compile_function("main")
    stepped = BlockCompiler(program.module, bind).compile_function("main")
    stepped._direct = None  # the general form, over slots
    assert (direct._direct is not None) == (name == "direct")
    args = [torch.arange(3.0), torch.arange(3.0) + 10][: len(direct.steps[0].op.parent_block().args)]
    outcomes = []
    for block in (direct, stepped):
        for donated in (frozenset(), frozenset(range(len(args)))):
            try:
                results = block(*args, donated=donated)
            except DistirError as e:
                outcomes.append((type(e), str(e)))
            else:
                outcomes.append(tuple(r.tolist() for r in results))
    half = len(outcomes) // 2
    assert outcomes[:half] == outcomes[half:]
    assert calls[: len(calls) // 2] == calls[len(calls) // 2 :]
    if raises is ValueError:  # a torch error names the op that raised it
        assert all(o[0] is OpError and "dist.all_reduce" in o[1] for o in outcomes)
