"""A combine region is compiled once per program (`ir.region_program`):
the verifier's exact evaluation, the plan's kernels and the algorithms'
tile-by-tile combine all read that one form."""

from __future__ import annotations

import pytest
import torch

import distir
from distir.ir import region_program as regions
from distir.runtime.launch import launch

T = "tensor<6xi64>"
#: two generic all-reduces: an elementwise region with a constant of the
#: op's shape (the ring runs it tile by tile) and one the verifier checks
#: for commutativity (its witnesses evaluate the compiled form)
TEXT = f"""func.func @main(%x: {T}) -> ({T}, {T}) {{
  %y = dist.all_reduce %x commutative algorithm "ring" : {T} combine(%a, %b) {{
    %s = arith.addi %a, %b : {T}
    %w = arith.constant dense<[1, 2, 3, 4, 5, 6]> : {T}
    %r = arith.muli %s, %w : {T}
    dist.yield %r : {T}
  }}
  %z = dist.all_reduce %y commutative : {T} combine(%a, %b) {{
    %m = arith.maxsi %a, %b : {T}
    %n = arith.minsi %a, %b : {T}
    %r = arith.subi %m, %n : {T}
    dist.yield %r : {T}
  }}
  func.return %y, %z : {T}, {T}
}}"""


def _compile_and_run(ctx) -> tuple[int, list[int], list[int]]:
    before = regions.Compilations.count
    program = distir.compile(TEXT)
    x = torch.arange(6, dtype=torch.int64) + 10 * ctx.rank
    for _ in range(2):
        y, z = program.run(x)
    return regions.Compilations.count - before, y.tolist(), z.tolist()


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_each_region_is_compiled_once_through_compile_bind_and_runs() -> None:
    results = launch(_compile_and_run, 2, pass_context=True, timeout=90)
    x0, x1 = list(range(6)), [v + 10 for v in range(6)]
    y = [(a + b) * w for a, b, w in zip(x0, x1, [1, 2, 3, 4, 5, 6])]
    for compiled, got_y, got_z in results:
        assert compiled == 2  # one per region, whatever reads it
        assert got_y == y
        assert got_z == [0] * 6  # max - min of two equal values


def test_the_plan_and_the_analysis_share_the_form_and_a_rewrite_compiles_again() -> None:
    program = distir.compile(TEXT)
    for op, invocation in program.plan.invocations.items():
        block = op.regions[0].block
        (compiled,) = invocation.regions
        assert compiled.program is regions.region_program(block)
    op = next(iter(program.plan.invocations))
    block = op.regions[0].block
    first = regions.region_program(block)
    block.last_op.operands = (block.args[1],)  # yield rhs: a rewritten region
    again = regions.region_program(block)
    assert again is not first and again.returned == (1,)
