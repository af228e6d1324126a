"""Synthesised inputs and world-size requirements for the rooted
collectives: an uneven scatter's payload has the sum of its counts in rows
on every rank (a gather's has this rank's count), and counts of static
length pin the world size."""

from __future__ import annotations

import pytest
import torch
from xdsl.dialects import func

import distir
from distir.ir.parsing import parse_module
from distir.runtime.inputs import synthesize_inputs
from distir.runtime.requirements import WorldSizeError, check_world_size

UNEVEN = """\
func.func @main(%x: tensor<?x2xf32>, %c: tensor<3xi64>, %r: tensor<?x2xf32>, %d: tensor<3xi64>) -> (tensor<?x2xf32>, tensor<?x2xf32>) {
  %s = dist.scatter %x counts(%c : tensor<3xi64>) axis 0 root 1 : tensor<?x2xf32> -> tensor<?x2xf32>
  %g = dist.gather %r counts(%d : tensor<3xi64>) axis 0 root 2 : tensor<?x2xf32> -> tensor<?x2xf32>
  func.return %s, %g : tensor<?x2xf32>, tensor<?x2xf32>
}
"""


def test_uneven_scatter_and_gather_inputs_keep_their_contracts_and_run() -> None:
    module = parse_module(UNEVEN, "rooted.mlir")
    fn = next(op for op in module.walk() if isinstance(op, func.FuncOp))
    inputs = [synthesize_inputs(fn, rank, 3) for rank in range(3)]
    for rank, (x, c, r, d) in enumerate(inputs):
        assert c.tolist() == d.tolist() == [1, 2, 3]
        assert x.shape == (6, 2)
        assert r.shape == (rank + 1, 2)
    results = distir.compile(UNEVEN).simulate(inputs)
    for rank, (scattered, gathered) in enumerate(results):
        assert torch.equal(scattered, torch.split(inputs[1][0], [1, 2, 3])[rank])
        assert gathered.shape == (6, 2)


@pytest.mark.parametrize("op", ["scatter", "gather"])
def test_counts_of_static_length_pin_the_world_size(op) -> None:
    t = "tensor<?x2xf32>"
    module = parse_module(
        f"func.func @main(%x: {t}, %c: tensor<3xi64>) -> {t} {{\n"
        f"  %y = dist.{op} %x counts(%c : tensor<3xi64>) axis 0 root 0 : {t} -> {t}\n"
        f"  func.return %y : {t}\n}}\n",
        "rooted.mlir",
    )
    with pytest.raises(
        WorldSizeError,
        match=rf"'dist.{op}' at rooted.mlir:2:3 takes {op} counts tensor<3xi64> \(one per rank\)",
    ):
        check_world_size(module, 2)
    check_world_size(module, 3)
