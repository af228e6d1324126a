"""A donated input that autograd saved is never used stale in backward.

Collectives write memory torch does not track: `dist.all_reduce(x)` leaves
x's version counter alone, so a backward through a value autograd saved
from x (w * x saves x) used the reduced sum instead of x, silently. A run
now advances the version counter of every input it may write
(`ownership.mark_written`), as torch's in-place ops do: such a backward is
refused ("modified by an inplace operation"), never wrong. An input that
is not donated is never written, so its backward runs and is right.
"""

from __future__ import annotations

import pytest
import torch

import distir
from distir.runtime.launch import launch

P = 2

#: program body over %x : tensor<4xf32> (and %c, the counts, for the all-to-all)
PROGRAMS = {
    "all_reduce sum": "%y = dist.all_reduce sum %x : tensor<4xf32>",
    "all_reduce max": "%y = dist.all_reduce max %x : tensor<4xf32>",
    "all_reduce prod": "%y = dist.all_reduce prod %x : tensor<4xf32>",
    "broadcast root 0": "%y = dist.broadcast %x root 0 : tensor<4xf32>",
    "broadcast root 1": "%y = dist.broadcast %x root 1 : tensor<4xf32>",
    "generic all_reduce": (
        "%y = dist.all_reduce %x commutative : tensor<4xf32> combine(%a, %b) {\n"
        "    %s = arith.addf %a, %b : tensor<4xf32>\n"
        "    dist.yield %s : tensor<4xf32>\n  }"
    ),
    "wave of two": (
        "%y, %z = dist.wave {\n"
        "    %s = dist.all_reduce sum %x : tensor<4xf32>\n"
        "    %m = dist.all_reduce max %x : tensor<4xf32>\n"
        "    dist.yield %s, %m : tensor<4xf32>, tensor<4xf32>\n  } : tensor<4xf32>, tensor<4xf32>"
    ),
}


def _source(body: str) -> str:
    returned = "%y, %z : tensor<4xf32>, tensor<4xf32>" if "%z" in body else "%y : tensor<4xf32>"
    results = "(tensor<4xf32>, tensor<4xf32>)" if "%z" in body else "tensor<4xf32>"
    return (
        f"func.func @main(%x: tensor<4xf32>) -> {results} {{\n  {body}\n"
        f"  func.return {returned}\n}}"
    )


def _backward_through_saved_inputs(context) -> list[str]:
    problems = []
    for name, body in PROGRAMS.items():
        for agreement in (True, False):
            program = distir.compile(_source(body), agreement=agreement)
            for donate in (False, True):
                x = torch.tensor([1.0, -2.0, 3.0, 0.5]) * (context.rank + 2)
                original = x.clone()
                w = torch.ones(4, requires_grad=True)
                saved = (w * x).sum()  # autograd saves x itself
                program.run(x, donate=donate)
                where = f"rank {context.rank}, {name}, agreement={agreement}, donate={donate}"
                try:
                    saved.backward()
                except RuntimeError as e:
                    if not donate or "modified by an inplace operation" not in str(e):
                        problems.append(f"{where}: backward raised {e}")
                    continue
                if not torch.equal(w.grad, original):
                    problems.append(f"{where}: gradient {w.grad.tolist()}, not {original.tolist()}")
    return problems


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_saved_donated_input_is_refused_in_backward_never_used_stale():
    results = launch(_backward_through_saved_inputs, P, pass_context=True, timeout=100)
    assert results == [[]] * P, "\n".join(p for r in results for p in r)
