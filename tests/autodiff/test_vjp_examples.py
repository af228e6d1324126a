"""The `vjp` pass on every example program: the backward program is printed,
parses back and verifies, and its gradients pass the SPMD gradient check in
the simulator; or the pass names the op that has no derivative."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from spmd_gradcheck import check_gradients

import distir
from distir.errors import NotDifferentiable
from distir.ir.parsing import parse_module
from distir.passes.vjp import add_vjp
from distir.runtime.autograd import simulate_vjp
from distir.runtime.inputs import synthesize_inputs
from distir.runtime.program import load_module

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: example -> (ranks it runs on, the op the pass refuses, if any)
EXPECTED = {
    "abs_max.mlir": (4, "'dist.all_reduce' at"),  # a generic combine, not a sum
    "all_gather.mlir": (4, None),
    "all_reduce.mlir": (4, None),  # integers only: an empty backward
    "broadcast.mlir": (4, None),
    "ciphertext_add.mlir": (4, None),  # integers: the ciphertext sum carries no gradient
    "custom_combine.mlir": (4, "'dist.all_reduce' at"),
    "megatron_f_g.mlir": (4, None),  # replicated values: its own oracle, below
    "mesh_transfer.mlir": (6, None),
    "point_to_point.mlir": (4, None),
    "secure_aggregation.mlir": (4, None),
    # shard ops have no derivative before convert-shard-to-dist (dist ops after)
    "shard_grid.mlir": (4, "'shard.all_gather' at"),
    "subgroups.mlir": (4, None),
    "variable_all_to_all.mlir": (4, None),
    "wave.mlir": (4, None),
}


#: examples with replicated values, whose objective counts those once (the
#: SPMD gradient check sums every rank's outputs): checked by their own tests
REPLICATING = {"megatron_f_g.mlir"}


def test_every_example_is_listed():
    assert sorted(p.name for p in EXAMPLES.glob("*.mlir")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_backward_of_each_example_verifies_and_is_the_gradient(name):
    P, refused = EXPECTED[name]
    module = load_module(EXAMPLES / name)
    if refused is not None:
        with pytest.raises(NotDifferentiable, match=refused):
            add_vjp(module)
        return
    functions = add_vjp(module)
    module.verify()
    printed = str(module)
    assert f"func.func @{functions.backward}(" in printed
    parse_module(printed, name).verify()  # what distir-opt prints reads back
    if not functions.float_inputs or name in REPLICATING:
        return
    program = distir.compile(EXAMPLES / name)
    inputs = [synthesize_inputs(program.function, r, P, seed=5) for r in range(P)]
    # exact steps: every example is linear in its float inputs
    check_gradients(EXAMPLES / name, inputs, seed=5, step=1.0, tolerance=1e-4)


@pytest.mark.slow  # starts distir-opt
def test_distir_opt_shows_the_backward_program():
    proc = subprocess.run(
        [sys.executable, "-m", "distir.cli.opt", "-p", "vjp", str(EXAMPLES / "wave.mlir")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    backward = proc.stdout[proc.stdout.index("func.func @main_bwd") :]
    assert backward.splitlines()[:7] == [
        "func.func @main_bwd(%ds1: tensor<1024xf32>, %ds2: tensor<256x64xf32>) -> "
        "(tensor<1024xf32>, tensor<256x64xf32>) {",
        "    %0, %1 = dist.wave {",
        "      %2 = dist.all_reduce sum %ds2 : tensor<256x64xf32>",
        "      %3 = dist.all_reduce sum %ds1 : tensor<1024xf32>",
        "      dist.yield %2, %3 : tensor<256x64xf32>, tensor<1024xf32>",
        "    } : tensor<256x64xf32>, tensor<1024xf32>",
        "    func.return %1, %0 : tensor<1024xf32>, tensor<256x64xf32>",
    ]


@pytest.mark.slow  # starts distir-opt
def test_distir_opt_names_an_op_without_derivative():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "distir.cli.opt",
            "-p",
            "vjp",
            str(EXAMPLES / "custom_combine.mlir"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "custom_combine.mlir:4:5" in proc.stderr and "has no derivative" in proc.stderr


def test_a_program_may_not_already_hold_the_derived_functions():
    module = load_module(EXAMPLES / "wave.mlir")
    add_vjp(module)
    with pytest.raises(NotDifferentiable, match="already has main_fwd"):
        add_vjp(module)


def test_the_megatron_example_has_the_gradient_of_its_one_replicated_output():
    """out = sum over ranks of x * w_r, plus b; x, b and out replicated (one
    value each), w_r rank r's: with J = <dout, out>, dx = dout * sum w_r,
    dw_r = dout * x, db = dout on every rank (plain torch, one process)."""
    P = 4
    program = distir.compile(EXAMPLES / "megatron_f_g.mlir")
    g = torch.Generator().manual_seed(3)
    x, b, dout = (torch.randn(4, generator=g) for _ in range(3))
    w = [torch.randn(4, generator=g) for _ in range(P)]
    leaves = [t.clone().requires_grad_(True) for t in (x, b, *w)]
    out = sum(leaves[0] * leaves[2 + r] for r in range(P)) + leaves[1]
    (out * dout).sum().backward()
    _, grads = simulate_vjp(program, [[x, w[r], b] for r in range(P)], [[dout]] * P)
    for r, (dx, dw, db) in enumerate(grads):
        torch.testing.assert_close(dx, leaves[0].grad)
        torch.testing.assert_close(dw, leaves[2 + r].grad)
        torch.testing.assert_close(db, leaves[1].grad)
