"""A gallery of textbook custom reductions, each a generic `dist.all_reduce`
whose combine region is written in arith/math/tensor ops, run on 4 local
gloo ranks under every algorithm that may run it, and compared with a plain
torch computation over all ranks' inputs.

    python examples/custom_reductions.py

- abs-max: the value of largest magnitude (a tie between x and -x gives +x;
  NaN wins), elementwise and commutative: every algorithm may run it;
- argmax with its value: per element, the largest value and the rank that
  holds it; ties go to the lowest rank and NaN counts as the largest, as
  `torch.max(dim=0)` defines it;
- log-sum-exp merge of (max, sum) pairs, as softmax and attention shards
  combine their statistics;
- Welford merge of (count, mean, M2) triples: a mean and variance across
  ranks in one pass (what a synchronised batch norm needs).

Pairs and triples are packed along the leading axis: each rank concatenates
its parts (`tensor.concat`), the combine takes them apart with
`tensor.extract_slice` and concatenates its result. Such a region reads
elements far apart, so it is not elementwise: the chunked algorithms (ring,
halving-doubling) do not apply and it runs on whole tensors (recursive
doubling, gather-fold).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import distir
from distir.ops.all_reduce.ir import candidate_algorithms, elementwise_combine

N = 6  # elements per rank (abs_max.mlir is written for 6 too)


#: the walk-through of README.md's "Writing a custom reduction"
ABS_MAX = (Path(__file__).resolve().parent / "abs_max.mlir").read_text()

ARGMAX = f"""\
func.func @main(%x: tensor<{N}xf32>) -> (tensor<{N}xf32>, tensor<{N}xi64>) {{
  // Pack (value, rank) along the leading axis, both as f64 (exact for both).
  %rank = dist.rank : index
  %r64 = arith.index_cast %rank : index to i64
  %rf = arith.sitofp %r64 : i64 to f64
  %ranks = tensor.splat %rf : tensor<{N}xf64>
  %values = arith.extf %x : tensor<{N}xf32> to tensor<{N}xf64>
  %pairs = tensor.concat dim(0) %values, %ranks : (tensor<{N}xf64>, tensor<{N}xf64>) -> tensor<{2 * N}xf64>
  %best = dist.all_reduce %pairs commutative : tensor<{2 * N}xf64> combine(%a, %b) {{
    %va = tensor.extract_slice %a[0] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
    %ia = tensor.extract_slice %a[{N}] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
    %vb = tensor.extract_slice %b[0] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
    %ib = tensor.extract_slice %b[{N}] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
    // NaN is the largest value: a wins if a > b, or a is NaN and b is not.
    %nan_a = arith.cmpf uno, %va, %va : tensor<{N}xf64>
    %num_b = arith.cmpf ord, %vb, %vb : tensor<{N}xf64>
    %nan_over_num = arith.andi %nan_a, %num_b : tensor<{N}xi1>
    %greater = arith.cmpf ogt, %va, %vb : tensor<{N}xf64>
    %a_wins = arith.ori %greater, %nan_over_num : tensor<{N}xi1>
    // Equal values (or both NaN): the lower rank.
    %equal = arith.cmpf oeq, %va, %vb : tensor<{N}xf64>
    %nan_b = arith.cmpf uno, %vb, %vb : tensor<{N}xf64>
    %both_nan = arith.andi %nan_a, %nan_b : tensor<{N}xi1>
    %tie = arith.ori %equal, %both_nan : tensor<{N}xi1>
    %lower = arith.minimumf %ia, %ib : tensor<{N}xf64>
    %i_tie = arith.select %tie, %lower, %ib : tensor<{N}xi1>, tensor<{N}xf64>
    %i = arith.select %a_wins, %ia, %i_tie : tensor<{N}xi1>, tensor<{N}xf64>
    %v = arith.select %a_wins, %va, %vb : tensor<{N}xi1>, tensor<{N}xf64>
    %r = tensor.concat dim(0) %v, %i : (tensor<{N}xf64>, tensor<{N}xf64>) -> tensor<{2 * N}xf64>
    dist.yield %r : tensor<{2 * N}xf64>
  }}
  %v64 = tensor.extract_slice %best[0] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
  %if = tensor.extract_slice %best[{N}] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
  %value = arith.truncf %v64 : tensor<{N}xf64> to tensor<{N}xf32>
  %index = arith.fptosi %if : tensor<{N}xf64> to tensor<{N}xi64>
  func.return %value, %index : tensor<{N}xf32>, tensor<{N}xi64>
}}
"""

LOG_SUM_EXP = f"""\
func.func @main(%max: tensor<{N}xf64>, %sum: tensor<{N}xf64>) -> tensor<{N}xf64> {{
  // Each rank's (max, sum of exp(x - max)) over its shard of every row.
  %pairs = tensor.concat dim(0) %max, %sum : (tensor<{N}xf64>, tensor<{N}xf64>) -> tensor<{2 * N}xf64>
  %merged = dist.all_reduce %pairs commutative : tensor<{2 * N}xf64> combine(%a, %b) {{
    %ma = tensor.extract_slice %a[0] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
    %sa = tensor.extract_slice %a[{N}] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
    %mb = tensor.extract_slice %b[0] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
    %sb = tensor.extract_slice %b[{N}] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
    %m = arith.maximumf %ma, %mb : tensor<{N}xf64>
    // exp(ma - m) rescales a's sum; where ma is m it is 1 (so that an empty
    // shard, max -inf, never computes -inf - -inf).
    %zero = arith.constant dense<0.0> : tensor<{N}xf64>
    %a_top = arith.cmpf oeq, %ma, %m : tensor<{N}xf64>
    %b_top = arith.cmpf oeq, %mb, %m : tensor<{N}xf64>
    %da_raw = arith.subf %ma, %m : tensor<{N}xf64>
    %db_raw = arith.subf %mb, %m : tensor<{N}xf64>
    %da = arith.select %a_top, %zero, %da_raw : tensor<{N}xi1>, tensor<{N}xf64>
    %db = arith.select %b_top, %zero, %db_raw : tensor<{N}xi1>, tensor<{N}xf64>
    %ea = math.exp %da : tensor<{N}xf64>
    %eb = math.exp %db : tensor<{N}xf64>
    %ta = arith.mulf %sa, %ea : tensor<{N}xf64>
    %tb = arith.mulf %sb, %eb : tensor<{N}xf64>
    %s = arith.addf %ta, %tb : tensor<{N}xf64>
    %r = tensor.concat dim(0) %m, %s : (tensor<{N}xf64>, tensor<{N}xf64>) -> tensor<{2 * N}xf64>
    dist.yield %r : tensor<{2 * N}xf64>
  }}
  %gm = tensor.extract_slice %merged[0] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
  %gs = tensor.extract_slice %merged[{N}] [{N}] [1] : tensor<{2 * N}xf64> to tensor<{N}xf64>
  %log_s = math.log %gs : tensor<{N}xf64>
  %lse = arith.addf %gm, %log_s : tensor<{N}xf64>
  func.return %lse : tensor<{N}xf64>
}}
"""

WELFORD = f"""\
func.func @main(%stats: tensor<{3 * N}xf64>) -> tensor<{3 * N}xf64> {{
  // (count, mean, M2) of each feature over this rank's samples, packed.
  %merged = dist.all_reduce %stats commutative : tensor<{3 * N}xf64> combine(%a, %b) {{
    %na = tensor.extract_slice %a[0] [{N}] [1] : tensor<{3 * N}xf64> to tensor<{N}xf64>
    %ma = tensor.extract_slice %a[{N}] [{N}] [1] : tensor<{3 * N}xf64> to tensor<{N}xf64>
    %qa = tensor.extract_slice %a[{2 * N}] [{N}] [1] : tensor<{3 * N}xf64> to tensor<{N}xf64>
    %nb = tensor.extract_slice %b[0] [{N}] [1] : tensor<{3 * N}xf64> to tensor<{N}xf64>
    %mb = tensor.extract_slice %b[{N}] [{N}] [1] : tensor<{3 * N}xf64> to tensor<{N}xf64>
    %qb = tensor.extract_slice %b[{2 * N}] [{N}] [1] : tensor<{3 * N}xf64> to tensor<{N}xf64>
    %n = arith.addf %na, %nb : tensor<{N}xf64>
    // Two empty sides stay empty (count 0, mean 0) instead of 0 / 0.
    %one = arith.constant dense<1.0> : tensor<{N}xf64>
    %zero = arith.constant dense<0.0> : tensor<{N}xf64>
    %empty = arith.cmpf oeq, %n, %zero : tensor<{N}xf64>
    %n_safe = arith.select %empty, %one, %n : tensor<{N}xi1>, tensor<{N}xf64>
    %delta = arith.subf %mb, %ma : tensor<{N}xf64>
    %wb = arith.divf %nb, %n_safe : tensor<{N}xf64>
    %shift = arith.mulf %delta, %wb : tensor<{N}xf64>
    %mean = arith.addf %ma, %shift : tensor<{N}xf64>
    %nab = arith.mulf %na, %wb : tensor<{N}xf64>
    %d2 = arith.mulf %delta, %delta : tensor<{N}xf64>
    %cross = arith.mulf %d2, %nab : tensor<{N}xf64>
    %q = arith.addf %qa, %qb : tensor<{N}xf64>
    %m2 = arith.addf %q, %cross : tensor<{N}xf64>
    %r = tensor.concat dim(0) %n, %mean, %m2 : (tensor<{N}xf64>, tensor<{N}xf64>, tensor<{N}xf64>) -> tensor<{3 * N}xf64>
    dist.yield %r : tensor<{3 * N}xf64>
  }}
  func.return %merged : tensor<{3 * N}xf64>
}}
"""


# Each rank's inputs, and the expected result from all ranks' data --------------------


def abs_max_inputs(rank: int, size: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(N, generator=g)
    x[0] = 1.5 if rank % 2 else -1.5  # a tie of magnitudes: +1.5 wins
    x[1] = -(rank + 1.0)  # the last rank's negative value wins
    return [x]


def abs_max_expected(all_inputs: list[list[torch.Tensor]]) -> torch.Tensor:
    x = torch.stack([inputs[0] for inputs in all_inputs])
    largest = x.abs().amax(dim=0)
    return torch.where(x.abs() == largest, x, -torch.inf).amax(dim=0)


def argmax_inputs(rank: int, size: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rank)
    x = torch.randint(0, 4, (N,), generator=g).to(torch.float32)  # many ties
    x[0] = 7.0 if rank >= 1 else 0.0  # a tie between ranks 1.. : rank 1 wins
    if rank == size - 1:
        x[1] = torch.nan  # NaN is the largest
    return [x]


def argmax_expected(all_inputs: list[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    values, ranks = torch.stack([inputs[0] for inputs in all_inputs]).max(dim=0)
    return values, ranks


#: each rank's shard of every row's logits (rank 0's shard of row 0 is empty)
SHARD = 5


def _logits(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(20 + rank)
    x = torch.randn(N, SHARD, generator=g, dtype=torch.float64) * 30
    if rank == 0:
        x[0] = -torch.inf
    return x


def log_sum_exp_inputs(rank: int, size: int) -> list[torch.Tensor]:
    x = _logits(rank)
    m = x.amax(dim=1)
    s = torch.where(m == -torch.inf, 0.0, (x - m[:, None]).exp().sum(dim=1))
    return [m, s]


def log_sum_exp_expected(all_inputs: list[list[torch.Tensor]]) -> torch.Tensor:
    return torch.logsumexp(torch.cat([_logits(r) for r in range(len(all_inputs))], dim=1), dim=1)


def _samples(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(30 + rank)
    return torch.randn(rank + 2, N, generator=g, dtype=torch.float64) * 3 + rank


def welford_inputs(rank: int, size: int) -> list[torch.Tensor]:
    x = _samples(rank)
    count = torch.full((N,), float(x.shape[0]), dtype=torch.float64)
    mean = x.mean(dim=0)
    return [torch.cat([count, mean, ((x - mean) ** 2).sum(dim=0)])]


def welford_expected(all_inputs: list[list[torch.Tensor]]) -> torch.Tensor:
    x = torch.cat([_samples(r) for r in range(len(all_inputs))])
    count = torch.full((N,), float(x.shape[0]), dtype=torch.float64)
    return torch.cat([count, x.mean(dim=0), x.var(dim=0, correction=0) * x.shape[0]])


@dataclass(frozen=True)
class Reduction:
    name: str
    program: str
    inputs: Callable[[int, int], list[torch.Tensor]]
    expected: Callable[[list[list[torch.Tensor]]], object]
    #: results equal the definition bit for bit (no rounding in the combine)
    exact: bool


GALLERY = (
    Reduction("abs-max", ABS_MAX, abs_max_inputs, abs_max_expected, exact=True),
    Reduction("argmax", ARGMAX, argmax_inputs, argmax_expected, exact=True),
    Reduction("log-sum-exp", LOG_SUM_EXP, log_sum_exp_inputs, log_sum_exp_expected, exact=False),
    Reduction("welford", WELFORD, welford_inputs, welford_expected, exact=False),
)


def algorithms(reduction: Reduction) -> tuple[str, ...]:
    """The all-reduce algorithms that may run this reduction's combine."""
    from distir.ir.dialect import AllReduceOp

    program = distir.compile(reduction.program)
    (op,) = [o for o in program.module.walk() if isinstance(o, AllReduceOp)]
    return candidate_algorithms(
        elementwise_combine(op), op.properties.get("commutative") is not None
    )


def run_gallery(ctx) -> dict[tuple[str, str], object]:
    """On every rank: each reduction under each algorithm that may run it."""
    results = {}
    for reduction in GALLERY:
        inputs = reduction.inputs(ctx.rank, ctx.world_size)
        for algorithm in algorithms(reduction):
            program = distir.compile(
                reduction.program, implementations={"dist.all_reduce": algorithm}
            )
            results[reduction.name, algorithm] = program.run(*inputs)
    return results


def matches(reduction: Reduction, got: object, expected: object) -> bool:
    got_t = got if isinstance(got, tuple) else (got,)
    want_t = expected if isinstance(expected, tuple) else (expected,)
    if reduction.exact:
        return all(torch.equal(g.nan_to_num(), w.nan_to_num()) and torch.equal(g.isnan(), w.isnan())
                   for g, w in zip(got_t, want_t, strict=True))  # fmt: skip
    return all(
        torch.allclose(g, w, rtol=1e-12, atol=1e-12) for g, w in zip(got_t, want_t, strict=True)
    )


# Ranks are fresh processes that import this file: launching goes under the guard.
if __name__ == "__main__":
    size = 4
    per_rank = distir.launch(run_gallery, size, pass_context=True)
    for reduction in GALLERY:
        expected = reduction.expected([reduction.inputs(r, size) for r in range(size)])
        for algorithm in algorithms(reduction):
            same = all(matches(reduction, results[reduction.name, algorithm], expected)
                       for results in per_rank)  # fmt: skip
            print(f"{reduction.name:12} {algorithm:19} equals torch on all {size} ranks: {same}")
        shown = per_rank[0][reduction.name, algorithms(reduction)[0]]
        shown = shown if isinstance(shown, tuple) else (shown,)
        rounded = [[round(v, 4) for v in t.tolist()] for t in shown]
        print(f"{'':12} rank 0 result: {'; '.join(str(v) for v in rounded)}")
