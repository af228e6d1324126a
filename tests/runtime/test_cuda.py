"""CUDA: the NCCL backend, and gloo ranks holding CUDA tensors.

Every test here is marked `cuda`; tests/conftest.py skips them, saying why,
where torch sees no GPU. On a GPU machine each test is one launch running
several cases; results are compared with the simulator on CPU copies of the
same inputs, exactly (floats are integer-valued).
"""

from __future__ import annotations

import pytest
import torch
from multirank_cases import Arg, Case, run_cases_on_device
from runtime_support import MATMUL_COMBINE_PROGRAM, order_sensitive_matrices

import distir
from distir.runtime.launch import launch

pytestmark = [pytest.mark.cuda, pytest.mark.multirank]


def _cases(p: int) -> list[Case]:
    counts = [r % 3 for r in range(p)]
    rs_counts = [r + 1 for r in range(p)]
    sends = [[(r + j) % 3 for j in range(p)] for r in range(p)]
    ms = order_sensitive_matrices(p, seed=p)
    moduli = [(1 << 60) - 93, (1 << 60) - 173]
    gen = torch.Generator().manual_seed(p)
    cts = [
        torch.remainder(torch.randint(0, 1 << 62, (2, 2, 8), generator=gen),
                        torch.tensor(moduli).view(-1, 1))
        for _ in range(p)
    ]
    return [
        Case("broadcast", """\
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %y = dist.broadcast %x root 0 : tensor<4x8xf32>
  func.return %y : tensor<4x8xf32>
}
""", (Arg("float32", (4, 8), -100, 100),), seed=1),
        Case("all-reduce-native", """\
func.func @main(%x: tensor<16xi64>, %f: tensor<3x5xf32>) -> (tensor<16xi64>, tensor<16xi64>, tensor<3x5xf32>) {
  %s = dist.all_reduce sum %x : tensor<16xi64>
  %m = dist.all_reduce max %x : tensor<16xi64>
  %fs = dist.all_reduce sum %f : tensor<3x5xf32>
  func.return %s, %m, %fs : tensor<16xi64>, tensor<16xi64>, tensor<3x5xf32>
}
""", (Arg("int64", (16,), -1000, 1000), Arg("float32", (3, 5), -100, 100)), seed=2),
        Case("all-reduce-generic-matmul", MATMUL_COMBINE_PROGRAM,
             (Arg("int64", values=[m.tolist() for m in ms], per_rank=True),)),
        Case("ciphertext-add", """\
func.func @main(%ct: tensor<2x2x8xi64>, %q: tensor<2xi64>) -> tensor<2x2x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x2x8xi64>, tensor<2xi64>
  func.return %y : tensor<2x2x8xi64>
}
""", (Arg("int64", values=[c.tolist() for c in cts], per_rank=True),
              Arg("int64", values=moduli))),
        Case("all-gather", f"""\
func.func @main(%x: tensor<2x3xf64>, %r: tensor<?x3xf64>, %c: tensor<{p}xi64>) -> (tensor<?x3xf64>, tensor<?x3xf64>) {{
  %even = dist.all_gather %x axis 0 : tensor<2x3xf64> -> tensor<?x3xf64>
  %uneven = dist.all_gather %r counts(%c : tensor<{p}xi64>) axis 0 : tensor<?x3xf64> -> tensor<?x3xf64>
  func.return %even, %uneven : tensor<?x3xf64>, tensor<?x3xf64>
}}
""", (Arg("float64", (2, 3), -9, 9), Arg("float64", [(c, 3) for c in counts], -9, 9, per_rank=True),
              Arg("int64", values=counts)), seed=3),
        Case("reduce-scatter", f"""\
func.func @main(%x: tensor<{2 * p}x3xf32>, %i: tensor<{sum(rs_counts)}x2xi64>) -> (tensor<2x3xf32>, tensor<?x2xi64>) {{
  %s = dist.reduce_scatter sum %x axis 0 : tensor<{2 * p}x3xf32> -> tensor<2x3xf32>
  %m = dist.reduce_scatter %i counts [{", ".join(map(str, rs_counts))}] axis 0 : tensor<{sum(rs_counts)}x2xi64> -> tensor<?x2xi64> combine(%a, %b) {{
    %c = arith.maxsi %a, %b : tensor<{sum(rs_counts)}x2xi64>
    dist.yield %c : tensor<{sum(rs_counts)}x2xi64>
  }}
  func.return %s, %m : tensor<2x3xf32>, tensor<?x2xi64>
}}
""", (Arg("float32", (2 * p, 3), -100, 100), Arg("int64", (sum(rs_counts), 2), -99, 99)), seed=5),
        Case("variable-all-to-all", f"""\
func.func @main(%x: tensor<?x4xi32>, %c: tensor<{p}xi64>) -> (tensor<?x4xi32>, tensor<{p}xi64>) {{
  %y, %rc = dist.variable_all_to_all %x, %c axis 0 : tensor<?x4xi32>, tensor<{p}xi64> -> tensor<?x4xi32>
  func.return %y, %rc : tensor<?x4xi32>, tensor<{p}xi64>
}}
""", (Arg("int32", [(sum(s), 4) for s in sends], -99, 99, per_rank=True),
              Arg("int64", values=sends, per_rank=True)), seed=4),
        Case("rooted-and-shift", f"""\
func.func @main(%x: tensor<2x3xf32>, %r: tensor<?x3xf64>, %c: tensor<{p}xi64>) -> (tensor<?x3xf32>, tensor<?x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<?x3xf64>, tensor<?x3xf64>) {{
  %g = dist.gather %x axis 0 root 0 : tensor<2x3xf32> -> tensor<?x3xf32>
  %s = dist.scatter %g axis 0 root 0 : tensor<?x3xf32> -> tensor<?x3xf32>
  %rs = dist.reduce sum %x root 0 : tensor<2x3xf32>
  %rm = dist.reduce max %x root 0 : tensor<2x3xf32>
  %sh = dist.shift %x offset 1 rotate : tensor<2x3xf32>
  %ug = dist.gather %r counts(%c : tensor<{p}xi64>) axis 0 root 0 : tensor<?x3xf64> -> tensor<?x3xf64>
  %us = dist.scatter %ug counts(%c : tensor<{p}xi64>) axis 0 root 0 : tensor<?x3xf64> -> tensor<?x3xf64>
  func.return %g, %s, %rs, %rm, %sh, %ug, %us : tensor<?x3xf32>, tensor<?x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<?x3xf64>, tensor<?x3xf64>
}}
""", (Arg("float32", (2, 3), -100, 100),
              Arg("float64", [(c, 3) for c in counts], -9, 9, per_rank=True),
              Arg("int64", values=counts)), seed=5),
        Case("rank-queries", """\
func.func @main() -> (index, index) {
  %r = dist.rank : index
  %s = dist.group_size : index
  func.return %r, %s : index, index
}
"""),
    ]


def _check_against_simulator(cases: list[Case], p: int, results) -> None:
    for index, case in enumerate(cases):
        expected = distir.compile(case.source).simulate(case.inputs_per_rank(p), timeout=30)
        for rank in range(p):
            want = expected[rank] if isinstance(expected[rank], tuple) else (expected[rank],)
            got = results[rank][index]
            assert len(got) == len(want), case.name
            for i, (g, w) in enumerate(zip(got, want)):
                assert g.dtype == w.dtype, (case.name, rank, i)
                assert torch.equal(g, w), (case.name, rank, i, g, w)


def _require_nccl(world_size: int) -> None:
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL backend")
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"NCCL with {world_size} ranks needs {world_size} GPUs, "
                    f"found {torch.cuda.device_count()}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", [1, 2])
def test_nccl_matches_the_simulator(world_size: int) -> None:
    _require_nccl(world_size)
    cases = _cases(world_size)
    results = launch(run_cases_on_device, world_size, cases, "cuda", backend="nccl",
                     pass_context=True, timeout=240)
    _check_against_simulator(cases, world_size, results)


@pytest.mark.timeout(300)
def test_gloo_ranks_holding_cuda_tensors() -> None:
    # gloo moves CUDA tensors through the host for broadcast and all-reduce;
    # both ranks may share one GPU.
    cases = [c for c in _cases(2) if c.name in ("broadcast", "all-reduce-native", "rank-queries")]
    results = launch(run_cases_on_device, 2, cases, "cuda", backend="gloo",
                     pass_context=True, timeout=240)
    _check_against_simulator(cases, 2, results)
