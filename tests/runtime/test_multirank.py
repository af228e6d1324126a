"""Real gloo ranks agree with the reference simulator, bit for bit.

Spawning ranks costs seconds (about 2 s at P=2 and 4 s at P=4 on two
cores), so there is ONE launch per world size P in {1, 2, 3, 4}: every rank
runs the whole case list of its P (see `multirank_cases.run_cases`) and the
parent compares each case's per-rank results with `Program.simulate` on the
same inputs. The case lists are drawn from `random.Random(P)`: every op,
random shapes and dtypes, zero counts, subgroups, a non-commutative combine,
60- and 62-bit ciphertext moduli, and the passes that lower them.

Floats are integer-valued, so a native float sum is exact whatever order
gloo adds in; everything is compared with `torch.equal`.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from multirank_cases import Arg, Case, run_cases, run_then_fail_on_rank
from runtime_support import (
    ARITHMETIC_KINDS,
    BITWISE_KINDS,
    MATMUL_COMBINE_PROGRAM,
    location,
    matmul_in_rank_order,
    order_sensitive_matrices,
    tensor_type,
)

import distir
from distir.errors import DistirError
from distir.runtime.launch import LaunchError, launch

pytestmark = pytest.mark.multirank

WORLD_SIZES = (1, 2, 3, 4)
LAUNCH_TIMEOUT_S = 150.0
COLLECTIVE_TIMEOUT_S = 30.0


# Case families ---------------------------------------------------------------------


def _shape(rng: random.Random, dims: int | None = None) -> tuple[int, ...]:
    return tuple(rng.randint(1, 3) for _ in range(dims or rng.randint(1, 3)))


def rank_queries(rng, p):
    return Case("rank-queries", """\
func.func @main() -> (index, index) {
  %r = dist.rank : index
  %s = dist.group_size : index
  func.return %r, %s : index, index
}
""")


def broadcast_static(rng, p):
    dtype = rng.choice(["int64", "int32", "int8", "float32", "float64", "bool"])
    shape = _shape(rng)
    t = tensor_type(shape, dtype)
    root = rng.randrange(p)
    return Case(
        f"broadcast-root{root}-{dtype}",
        f"""\
func.func @main(%x: {t}) -> {t} {{
  %y = dist.broadcast %x root {root} : {t}
  func.return %y : {t}
}}
""",
        (Arg(dtype, shape, 0, 2 if dtype == "bool" else 100),),
        seed=rng.randrange(1 << 20),
    )


def broadcast_dynamic(rng, p):
    root = rng.randrange(p)
    return Case(
        f"broadcast-dynamic-root{root}",
        """\
func.func @main(%x: tensor<?x3xf32>, %root: index) -> (tensor<?x3xf32>, tensor<?x3xf32>) {
  %y = dist.broadcast %x root %root : tensor<?x3xf32>
  %size = dist.group_size : index
  %one = arith.constant 1 : index
  %last = arith.subi %size, %one : index
  %z = dist.broadcast %y root %last : tensor<?x3xf32>
  func.return %y, %z : tensor<?x3xf32>, tensor<?x3xf32>
}
""",
        (Arg("float32", (rng.randint(0, 4), 3), -50, 50), Arg("int64", values=root)),
        seed=rng.randrange(1 << 20),
    )


def native_all_reduce(kind):
    def make(rng, p):
        if kind in BITWISE_KINDS:
            dtype = rng.choice(["int64", "int32", "int8", "bool"])
            low, high = (0, 2) if dtype == "bool" else (-100, 100)
        else:
            dtype = rng.choice(["int64", "int32", "float32", "float64"])
            low, high = (-2, 3) if kind == "prod" else (-1000, 1000)
        shape = _shape(rng)
        t = tensor_type(shape, dtype)
        return Case(
            f"all-reduce-{kind}-{dtype}",
            f"""\
func.func @main(%x: {t}) -> {t} {{
  %y = dist.all_reduce {kind} %x : {t}
  func.return %y : {t}
}}
""",
            (Arg(dtype, shape, low, high),),
            seed=rng.randrange(1 << 20),
        )

    return make


def generic_modular_sum(rng, p):
    return Case(
        "all-reduce-generic-modular-sum",
        """\
func.func @main(%x: tensor<2x5xi64>, %m: tensor<2x5xi64>) -> tensor<2x5xi64> {
  %y = dist.all_reduce %x, %m commutative : tensor<2x5xi64>, tensor<2x5xi64> combine(%a, %b, %mod) {
    %s = arith.addi %a, %b : tensor<2x5xi64>
    %r = arith.remui %s, %mod : tensor<2x5xi64>
    dist.yield %r : tensor<2x5xi64>
  }
  func.return %y : tensor<2x5xi64>
}
""",
        (Arg("int64", (2, 5), 0, 50), Arg("int64", (2, 5), 2, 60, shared=True)),
        seed=rng.randrange(1 << 20),
    )


def generic_matmul(rng, p):
    ms = order_sensitive_matrices(p, seed=rng.randrange(1 << 20))
    return Case(
        "all-reduce-generic-matmul",
        MATMUL_COMBINE_PROGRAM,
        (Arg("int64", values=[m.tolist() for m in ms], per_rank=True),),
    )


def ciphertext(bits: int, pipeline: str = ""):
    def make(rng, p):
        limbs = rng.randint(1, 3)
        moduli = [(1 << bits) - 1 - 2 * rng.randrange(1, 1000) for _ in range(limbs)]
        batch = rng.randint(1, 2)
        ct_t = f"tensor<{batch}x{limbs}x8xi64>"
        q_t = f"tensor<{limbs}xi64>"
        seed = rng.randrange(1 << 20)
        gen = torch.Generator().manual_seed(seed)
        q = torch.tensor(moduli)
        cts = [
            torch.remainder(torch.randint(0, 1 << 62, (batch, limbs, 8), generator=gen), q.view(-1, 1))
            for _ in range(p)
        ]
        for ct in cts:  # every sum wraps at least once per limb
            ct[0, :, 0] = q - 1
        return Case(
            f"ciphertext-{bits}bit" + (f"-{pipeline.split('{')[0]}" if pipeline else ""),
            f"""\
func.func @main(%ct: {ct_t}, %q: {q_t}) -> {ct_t} {{
  %y = dist.all_reduce_add_ciphertext %ct, %q max_modulus_bits {bits} : {ct_t}, {q_t}
  func.return %y : {ct_t}
}}
""",
            (Arg("int64", values=[c.tolist() for c in cts], per_rank=True), Arg("int64", values=moduli)),
            pipeline=pipeline,
        )

    return make


def even_gather(axis: int):
    def make(rng, p):
        dtype = rng.choice(["int64", "int32", "float32", "float64", "int8"])
        shape = _shape(rng, dims=rng.randint(axis + 1, 3))
        out = list(shape)
        out[axis] = None
        t, out_t = tensor_type(shape, dtype), tensor_type(out, dtype)
        return Case(
            f"all-gather-even-axis{axis}-{dtype}",
            f"""\
func.func @main(%x: {t}) -> {out_t} {{
  %y = dist.all_gather %x axis {axis} : {t} -> {out_t}
  func.return %y : {out_t}
}}
""",
            (Arg(dtype, shape, -100, 100),),
            seed=rng.randrange(1 << 20),
        )

    return make


def uneven_gather(axis: int):
    def make(rng, p):
        counts = [rng.randint(0, 3) for _ in range(p)]
        if p > 1:
            counts[rng.randrange(p)] = 0  # always a rank with nothing to send
        other = rng.randint(1, 3)
        shapes = [(c, other) if axis == 0 else (other, c) for c in counts]
        return Case(
            f"all-gather-uneven-axis{axis}",
            f"""\
func.func @main(%x: tensor<?x?xf64>, %c: tensor<{p}xi64>) -> tensor<?x?xf64> {{
  %y = dist.all_gather %x counts(%c : tensor<{p}xi64>) axis {axis} : tensor<?x?xf64> -> tensor<?x?xf64>
  func.return %y : tensor<?x?xf64>
}}
""",
            (Arg("float64", shapes, -9, 9, per_rank=True), Arg("int64", values=counts)),
            seed=rng.randrange(1 << 20),
        )

    return make


def variable_all_to_all(axis: int, count_dtype: str):
    def make(rng, p):
        sends = [[rng.choice([0, 0, 1, 2, 3]) for _ in range(p)] for _ in range(p)]
        other = rng.randint(1, 3)
        shapes = [(sum(s), other) if axis == 0 else (other, sum(s)) for s in sends]
        ct = tensor_type((p,), count_dtype)
        return Case(
            f"all-to-all-axis{axis}-{count_dtype}",
            f"""\
func.func @main(%x: tensor<?x?xi32>, %c: {ct}) -> (tensor<?x?xi32>, {ct}) {{
  %y, %r = dist.variable_all_to_all %x, %c axis {axis} : tensor<?x?xi32>, {ct} -> tensor<?x?xi32>
  func.return %y, %r : tensor<?x?xi32>, {ct}
}}
""",
            (Arg("int32", shapes, -1000, 1000, per_rank=True),
             Arg(count_dtype, values=sends, per_rank=True)),
            seed=rng.randrange(1 << 20),
        )

    return make


def chained(rng, p):
    """Several collectives feeding each other, with local ops between them."""
    return Case(
        "chained-collectives",
        """\
func.func @main(%x: tensor<3xi64>) -> (tensor<?xi64>, tensor<?xi64>, tensor<?xi64>) {
  %g = dist.all_gather %x axis 0 : tensor<3xi64> -> tensor<?xi64>
  %sq = arith.muli %g, %g : tensor<?xi64>
  %m = dist.all_reduce max %sq : tensor<?xi64>
  %r = dist.rank : index
  %r64 = arith.index_cast %r : index to i64
  %c0 = arith.constant 0 : index
  %n = tensor.dim %m, %c0 : tensor<?xi64>
  %rs = tensor.splat %r64[%n] : tensor<?xi64>
  %mixed = arith.addi %m, %rs : tensor<?xi64>
  %size = dist.group_size : index
  %one = arith.constant 1 : index
  %last = arith.subi %size, %one : index
  %b = dist.broadcast %mixed root %last : tensor<?xi64>
  func.return %g, %m, %b : tensor<?xi64>, tensor<?xi64>, tensor<?xi64>
}
""",
        (Arg("int64", (3,), -20, 20),),
        seed=rng.randrange(1 << 20),
    )


SUBGROUPS_P4 = """\
dist.group @pairs [[0, 1], [2, 3]]
dist.group @strided [[0, 2], [1, 3]]
func.func @main(%x: tensor<4xi64>, %f: tensor<2x2xf32>) -> (index, index, tensor<4xi64>, tensor<2x2xf32>, tensor<8xi64>, tensor<4xi64>, tensor<4xi64>) {
  %r = dist.rank group @pairs : index
  %n = dist.group_size group @strided : index
  %sum = dist.all_reduce sum %x group @pairs : tensor<4xi64>
  %from_second = dist.broadcast %f root 1 group @pairs : tensor<2x2xf32>
  %both = dist.all_gather %sum axis 0 group @strided : tensor<4xi64> -> tensor<8xi64>
  %max = dist.all_reduce max %x group @strided : tensor<4xi64>
  %world = dist.all_reduce sum %max : tensor<4xi64>
  func.return %r, %n, %sum, %from_second, %both, %max, %world : index, index, tensor<4xi64>, tensor<2x2xf32>, tensor<8xi64>, tensor<4xi64>, tensor<4xi64>
}
"""

#: pair {0, 1} all-reduces while pair {2, 3} broadcasts, at the same time
DIFFERENT_OPS_PER_PAIR = """\
dist.group @pairs [[0, 1], [2, 3]]
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %r = dist.rank : index
  %two = arith.constant 2 : index
  %first_pair = arith.cmpi slt, %r, %two : index
  %y = scf.if %first_pair -> (tensor<4xi64>) {
    %s = dist.all_reduce sum %x group @pairs : tensor<4xi64>
    scf.yield %s : tensor<4xi64>
  } else {
    %b = dist.broadcast %x root 1 group @pairs : tensor<4xi64>
    scf.yield %b : tensor<4xi64>
  }
  func.return %y : tensor<4xi64>
}
"""

#: ranks 2 and up are in no subgroup of @low and never run its ops (bound,
#: but not run, on those ranks)
SOME_RANKS_OUTSIDE = """\
dist.group @low [[0, 1]]
func.func @main(%x: tensor<4xi64>, %f: tensor<3xf32>) -> (tensor<4xi64>, tensor<3xf32>) {
  %r = dist.rank : index
  %two = arith.constant 2 : index
  %in_low = arith.cmpi ult, %r, %two : index
  %y, %g = scf.if %in_low -> (tensor<4xi64>, tensor<3xf32>) {
    %s = dist.all_reduce sum %x group @low : tensor<4xi64>
    %b = dist.broadcast %f root 1 group @low : tensor<3xf32>
    scf.yield %s, %b : tensor<4xi64>, tensor<3xf32>
  } else {
    scf.yield %x, %f : tensor<4xi64>, tensor<3xf32>
  }
  func.return %y, %g : tensor<4xi64>, tensor<3xf32>
}
"""

SUBGROUPS_P3 = """\
dist.group @g {parts}
func.func @main(%x: tensor<2xi64>) -> (index, index, tensor<2xi64>, tensor<?xi64>, tensor<2xi64>) {{
  %r = dist.rank group @g : index
  %n = dist.group_size group @g : index
  %s = dist.all_reduce sum %x group @g : tensor<2xi64>
  %y = dist.all_gather %x axis 0 group @g : tensor<2xi64> -> tensor<?xi64>
  %b = dist.broadcast %x root 0 group @g : tensor<2xi64>
  func.return %r, %n, %s, %y, %b : index, index, tensor<2xi64>, tensor<?xi64>, tensor<2xi64>
}}
"""



def subgroups(p: int, seed: int) -> list[tuple[Case, list]]:
    if p == 4:
        return [
            (Case("subgroups-pairs-and-strided", SUBGROUPS_P4,
                  (Arg("int64", (4,), -50, 50), Arg("float32", (2, 2), -50, 50)), seed=seed), []),
            (Case("subgroups-different-op-per-pair", DIFFERENT_OPS_PER_PAIR,
                  (Arg("int64", (4,), -50, 50),), seed=seed + 1, verify_spmd=False), []),
            (Case("subgroups-some-ranks-outside", SOME_RANKS_OUTSIDE,
                  (Arg("int64", (4,), -50, 50), Arg("float32", (3,), -50, 50)), seed=seed + 2,
                  verify_spmd=False), []),
        ]
    if p == 3:
        args = (Arg("int64", (2,), -50, 50),)
        return [
            (Case("subgroups-sizes-2-and-1", SUBGROUPS_P3.format(parts="[[0, 2], [1]]"), args,
                  seed=seed), []),
        ]
    return []


def mismatch_cases(p: int) -> list[tuple[Case, str, Callable[[int], str]]]:
    """Cases where ranks disagree: (case, what every rank's error must name,
    the exact error each rank must raise, as a function of its rank)."""
    last = p - 1
    gather = f"""\
func.func @main(%x: tensor<?xi64>, %c: tensor<{p}xi64>) -> tensor<?xi64> {{
  %y = dist.all_gather %x counts(%c : tensor<{p}xi64>) axis 0 : tensor<?xi64> -> tensor<?xi64>
  func.return %y : tensor<?xi64>
}}
"""
    # Each rank's rows agree with its own counts; the counts disagree.
    counts = [[1] * p for _ in range(p)]
    counts[last][last] = 2
    root = """\
func.func @main(%x: tensor<4xi64>, %root: index) -> tensor<4xi64> {
  %y = dist.broadcast %x root %root : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
"""
    reduce = """\
func.func @main(%x: tensor<?xi64>) -> tensor<?xi64> {
  %y = dist.all_reduce sum %x : tensor<?xi64>
  func.return %y : tensor<?xi64>
}
"""
    return [
        (Case("mismatch-gather-counts", gather, (
            Arg("int64", [(c[r],) for r, c in enumerate(counts)], per_rank=True),
            Arg("int64", values=counts, per_rank=True)), expect_error=True),
         "dist.all_gather", lambda r: "CollectiveMismatchError: 'dist.all_gather' at "
         f"<program>:2:3: ranks pass different counts ({per_rank(counts)})"),
        (Case("mismatch-root-out-of-range-on-one-rank", root, (
            Arg("int64", (4,)), Arg("int64", values=[0] * last + [p], per_rank=True)),
            expect_error=True),
         "dist.broadcast", lambda r: (
             f"OpError: 'dist.broadcast' at <program>:2:3: root {p} is outside the group "
             f"(size {p})" if r == last else
             "CollectiveMismatchError: 'dist.broadcast' at <program>:2:3: rank(s) "
             f"[{last}] of group world rejected their inputs for this collective (their "
             "own error says why), so no rank sends its payload")),
        (Case("mismatch-different-valid-roots", root, (
            Arg("int64", (4,)), Arg("int64", values=[0] + [1] * last, per_rank=True)),
            expect_error=True),
         "dist.broadcast", lambda r: "CollectiveMismatchError: 'dist.broadcast' at "
         f"<program>:2:3: ranks pass different roots ({per_rank([0] + [1] * last)})"),
        (Case("mismatch-all-reduce-shapes", reduce, (
            Arg("int64", [(3,)] * last + [(4,)], per_rank=True),), expect_error=True),
         "dist.all_reduce", lambda r: "CollectiveMismatchError: 'dist.all_reduce' at "
         "<program>:2:3: ranks pass different input layouts "
         f"({per_rank(['int64[3]'] * last + ['int64[4]'], str)})"),
        (Case("mismatch-input-dtype-on-one-rank", reduce, (
            Arg(["int64"] * last + ["float64"], values=[[1, 2]] * p, per_rank=True),),
            expect_error=True),
         "@main", lambda r: (
             "ProgramInputError: " if r == last else
             f"ProgramMismatch: @main: rank {last} rejected its inputs: ") + "@main input #0 "
         "must be tensor<?xi64> (torch.int64), got tensor of shape [2] and dtype torch.float64"),
    ]



def per_rank(values: list, show: Callable[[Any], str] = repr) -> str:
    """`rank 0: v0; rank 1: v1; ...`, as mismatch errors list every rank's value."""
    return "; ".join(f"rank {r}: {show(v)}" for r, v in enumerate(values))


FAMILIES = [
    rank_queries,
    broadcast_static,
    broadcast_static,
    broadcast_dynamic,
    *(native_all_reduce(kind) for kind in ARITHMETIC_KINDS + BITWISE_KINDS),
    native_all_reduce("sum"),
    native_all_reduce("bxor"),
    generic_modular_sum,
    generic_matmul,
    ciphertext(60),
    ciphertext(62),
    ciphertext(60, "lower-ciphertext-add"),
    ciphertext(62, "lower-ciphertext-add"),
    ciphertext(60, "defer-modular-reduction{max-group-size=4}"),
    even_gather(0),
    even_gather(1),
    uneven_gather(0),
    uneven_gather(1),
    variable_all_to_all(0, "int64"),
    variable_all_to_all(1, "int32"),
    chained,
]


def build_cases(p: int) -> list[tuple[Case, list]]:
    rng = random.Random(p)
    cases = [(family(rng, p), []) for family in FAMILIES]
    cases += subgroups(p, rng.randrange(1 << 20))
    if p > 1:
        # In the middle: the cases after them show the group recovered.
        middle = len(cases) // 2
        cases[middle:middle] = [(case, []) for case, _, _ in mismatch_cases(p)]
    # Unique names: a family may be drawn twice.
    seen: dict[str, int] = {}
    unique = []
    for case, marks in cases:
        k = seen[case.name] = seen.get(case.name, 0) + 1
        if k > 1:
            case = dataclasses.replace(case, name=f"{case.name}-{k}")
        unique.append((case, marks))
    return unique


CASES = {p: build_cases(p) for p in WORLD_SIZES}

_launched: dict[int, list | LaunchError] = {}


def results_on_gloo(p: int) -> list[list[tuple[torch.Tensor, ...]]]:
    """Every rank's results for every case of world size p (one launch per p)."""
    if p not in _launched:
        cases = [case for case, _ in CASES[p]]
        try:
            _launched[p] = launch(
                run_cases, p, cases, pass_context=True,
                timeout=LAUNCH_TIMEOUT_S, collective_timeout=COLLECTIVE_TIMEOUT_S,
            )
        except LaunchError as e:
            _launched[p] = e
    outcome = _launched[p]
    if isinstance(outcome, LaunchError):
        pytest.fail(f"the P={p} launch failed:\n{outcome}", pytrace=False)
    return outcome


def case_results(p: int, name: str) -> list[tuple[torch.Tensor, ...]]:
    index = next(i for i, (case, _) in enumerate(CASES[p]) if case.name == name)
    return [per_rank[index] for per_rank in results_on_gloo(p)]


# Tests ---------------------------------------------------------------------------------


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
@pytest.mark.parametrize(
    ("world_size", "case"),
    [
        pytest.param(p, case, marks=marks, id=f"P{p}-{case.name}")
        for p in WORLD_SIZES
        for case, marks in CASES[p]
        if not case.expect_error
    ],
)
def test_gloo_matches_the_simulator(world_size: int, case: Case) -> None:
    got = case_results(world_size, case.name)
    assert not any(isinstance(g, str) for g in got), got
    inputs = case.inputs_per_rank(world_size)
    # The oracle runs the program as written: passes must keep its meaning.
    oracle = distir.compile(case.source, verify_spmd=case.verify_spmd)
    expected = oracle.simulate(inputs, timeout=30)
    for rank in range(world_size):
        want = expected[rank] if isinstance(expected[rank], tuple) else (expected[rank],)
        assert len(got[rank]) == len(want)
        for i, (g, w) in enumerate(zip(got[rank], want)):
            assert g.dtype == w.dtype, f"rank {rank} result #{i}"
            assert torch.equal(g, w), f"rank {rank} result #{i}: gloo {g} vs simulator {w}"


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
@pytest.mark.parametrize(
    ("world_size", "case", "needle", "message"),
    [
        pytest.param(p, case, needle, message, id=f"P{p}-{case.name}")
        for p in (2, 3)
        for case, needle, message in mismatch_cases(p)
    ],
)
def test_disagreeing_ranks_all_fail_naming_the_op(world_size, case, needle, message) -> None:
    """Every rank raises (none hangs, none gets a result), each naming the op
    where the ranks disagreed, as the simulator does on the same inputs."""
    outcomes = case_results(world_size, case.name)
    where = needle if needle.startswith("@") else (
        f"'{needle}' at {location(case.source, needle, '<program>')}"
    )
    for rank, outcome in enumerate(outcomes):
        assert isinstance(outcome, str), f"rank {rank} got a result: {outcome}"
        assert where in outcome, (rank, outcome)
        assert outcome == message(rank), (rank, outcome)
    with pytest.raises(DistirError) as info:
        distir.compile(case.source).simulate(case.inputs_per_rank(world_size), timeout=10)
    assert where in str(info.value)


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_non_commutative_combine_keeps_rank_order_on_gloo(world_size: int) -> None:
    case = next(c for c, _ in CASES[world_size] if c.name == "all-reduce-generic-matmul")
    matrices = [inputs[0] for inputs in case.inputs_per_rank(world_size)]
    forward = matmul_in_rank_order(matrices)
    assert not torch.equal(forward, matmul_in_rank_order(matrices[::-1])), "order must matter"
    for (y,) in case_results(world_size, case.name):
        assert torch.equal(y, forward)


def test_every_op_and_world_size_is_covered() -> None:
    ops = {"dist.rank", "dist.group_size", "dist.broadcast", "dist.all_reduce",
           "dist.all_reduce_add_ciphertext", "dist.all_gather", "dist.variable_all_to_all"}
    for p in WORLD_SIZES:
        text = "\n".join(case.source for case, _ in CASES[p])
        assert all(op + " " in text for op in ops), p
    assert any("group @" in case.source for case, _ in CASES[4])
    assert any(case.name == "ciphertext-60bit" for case, _ in CASES[3])


# Failures: bounded, located, and no process left behind -----------------------------------


def spawned_children() -> list[int]:
    """Live spawned rank processes of this process (the resource tracker aside)."""
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = stat.rsplit(")", 1)[1].split()[1]
        state = stat.rsplit(")", 1)[1].split()[0]
        if ppid == me and state != "Z" and "spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def assert_no_child_survives() -> None:
    assert multiprocessing.active_children() == []
    assert spawned_children() == []


BROADCAST_DYNAMIC_ROOT = """\
func.func @main(%x: tensor<4xi64>, %root: index) -> tensor<4xi64> {
  %y = dist.broadcast %x root %root : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
"""


@pytest.mark.timeout(60)
def test_a_root_outside_the_group_on_every_rank_fails_each_rank_naming_the_op() -> None:
    case = Case("bad-root", BROADCAST_DYNAMIC_ROOT,
                (Arg("int64", (4,)), Arg("int64", values=5)))
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(run_cases, 2, [case], pass_context=True, timeout=60, collective_timeout=10)
    assert time.monotonic() - start < 30
    where = f"'dist.broadcast' at {location(case.source, 'dist.broadcast', '<program>')}"
    assert set(info.value.failures) == {0, 1}
    for rank, why in info.value.failures.items():
        assert where in why and "root 5" in why, (rank, why)
        assert f"rank {rank}" in str(info.value)
    assert_no_child_survives()


@pytest.mark.timeout(60)
def test_a_python_exception_on_one_rank_is_reported_in_bounded_time() -> None:
    source = """\
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce sum %x : tensor<4xi64>
  func.return %y : tensor<4xi64>
}
"""
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(run_then_fail_on_rank, 2, source, 1, pass_context=True, timeout=60,
               collective_timeout=10)
    assert time.monotonic() - start < 30
    failures = info.value.failures
    assert "ValueError: deliberate failure on rank 1" in failures[1]
    assert "rank 1:" in str(info.value)
    # Rank 0 was waiting for rank 1 in the program agreement: it fails too,
    # naming where it waited (the peer's exit closed the connection), or is
    # killed when it outlives the launch's grace; it never reports success.
    assert 0 in failures
    assert failures[0].startswith(
        "CollectiveFailed: @main (program agreement): the gloo backend failed on group world"
    ) or failures[0].startswith("did not finish in time"), failures[0]
    assert_no_child_survives()
