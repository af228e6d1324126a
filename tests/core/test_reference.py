"""The reference simulator computes what the dialect reference (docs/reference/dialect.md) says.

Every expected value here is computed in the test from the definition
(Python integers, explicit slicing, rank-order folds), never copied from the
simulator's own code; mismatched ranks fail with an error naming the op and
its location, and never hang.
"""

from __future__ import annotations

import functools
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_support import (
    ARITHMETIC_KINDS,
    BITWISE_KINDS,
    MATMUL_COMBINE_PROGRAM,
    as_tuple,
    location,
    matmul_in_rank_order,
    order_sensitive_matrices,
    reference_all_to_all,
    reference_ciphertext_sum,
    reference_gather,
    reference_native,
    tensor_type,
    write_program,
)
from strategies import examples

import distir
from distir.core.simulator import SimulationError
from distir.errors import CollectiveMismatchError, CompileError, DistirError, OpError


@functools.cache
def compiled(source: str) -> distir.Program:
    return distir.compile(source)


def simulate(source: str, inputs_per_rank) -> list[tuple[torch.Tensor, ...]]:
    return [as_tuple(r) for r in compiled(source).simulate(inputs_per_rank, timeout=10)]


def randint(generator: torch.Generator, shape, low: int, high: int, dtype: str) -> torch.Tensor:
    return torch.randint(low, high, tuple(shape), generator=generator).to(getattr(torch, dtype))


# Broadcast -------------------------------------------------------------------


BROADCAST_STATIC = """\
func.func @main(%x: tensor<3x2xf32>) -> tensor<3x2xf32> {{
  %y = dist.broadcast %x root {root} : tensor<3x2xf32>
  func.return %y : tensor<3x2xf32>
}}
"""


@pytest.mark.parametrize(("world_size", "root"), [(1, 0), (2, 1), (3, 2), (5, 3)])
def test_broadcast_static_root_gives_every_rank_the_roots_input(world_size, root) -> None:
    g = torch.Generator().manual_seed(world_size)
    xs = [torch.rand(3, 2, generator=g) for _ in range(world_size)]
    results = simulate(BROADCAST_STATIC.format(root=root), [[x] for x in xs])
    for (y,) in results:
        assert torch.equal(y, xs[root])


BROADCAST_DYNAMIC = """\
func.func @main(%x: tensor<?xi64>, %root: index) -> (tensor<?xi64>, tensor<?xi64>) {
  %y = dist.broadcast %x root %root : tensor<?xi64>
  %size = dist.group_size : index
  %one = arith.constant 1 : index
  %last = arith.subi %size, %one : index
  %z = dist.broadcast %x root %last : tensor<?xi64>
  func.return %y, %z : tensor<?xi64>, tensor<?xi64>
}
"""


@pytest.mark.parametrize(("world_size", "root"), [(2, 0), (3, 1), (4, 3)])
def test_broadcast_dynamic_root_from_an_input_and_from_group_size(world_size, root) -> None:
    xs = [torch.arange(5) * (r + 1) + 100 * r for r in range(world_size)]
    results = simulate(BROADCAST_DYNAMIC, [[x, torch.tensor(root)] for x in xs])
    for y, z in results:
        assert torch.equal(y, xs[root])
        assert torch.equal(z, xs[world_size - 1])


def test_broadcast_does_not_alias_or_write_its_input() -> None:
    xs = [torch.arange(4), torch.arange(4) + 10]
    before = [x.clone() for x in xs]
    results = simulate(BROADCAST_DYNAMIC, [[x, torch.tensor(0)] for x in xs])
    results[1][0].add_(1000)  # a result must own its memory
    for x, b in zip(xs, before):
        assert torch.equal(x, b)
    assert torch.equal(results[0][0], before[0])


# Native all-reduce -------------------------------------------------------------


NATIVE = """\
func.func @main(%x: {t}) -> {t} {{
  %y = dist.all_reduce {kind} %x : {t}
  func.return %y : {t}
}}
"""

NATIVE_CASES = [
    (kind, dtype)
    for kind in ARITHMETIC_KINDS
    for dtype in ("int64", "int32", "float32", "float64")
] + [(kind, dtype) for kind in BITWISE_KINDS for dtype in ("int64", "int32", "int8", "bool")]


@pytest.mark.parametrize(("kind", "dtype"), NATIVE_CASES)
def test_native_all_reduce_is_the_rank_order_fold_of_the_kind(kind, dtype) -> None:
    world_size = 4
    g = torch.Generator().manual_seed(7)
    low, high = (0, 2) if dtype == "bool" else (-3, 4) if kind in ARITHMETIC_KINDS else (-100, 100)
    xs = [randint(g, (2, 3), low, high, dtype) for _ in range(world_size)]
    source = NATIVE.format(kind=kind, t=tensor_type((2, 3), dtype))
    expected = reference_native(kind, xs)
    for (y,) in simulate(source, [[x] for x in xs]):
        assert y.dtype == xs[0].dtype
        assert torch.equal(y, expected)


def test_native_all_reduce_of_one_rank_is_the_identity() -> None:
    x = torch.tensor([1.5, -2.25, 3.0])
    source = NATIVE.format(kind="prod", t=tensor_type((3,), "float32"))
    ((y,),) = simulate(source, [[x]])
    assert torch.equal(y, x)


# Generic all-reduce ------------------------------------------------------------


MODULAR_SUM = """\
func.func @main(%x: tensor<6xi64>, %m: tensor<6xi64>) -> tensor<6xi64> {
  %y = dist.all_reduce %x, %m commutative : tensor<6xi64>, tensor<6xi64> combine(%a, %b, %mod) {
    %s = arith.addi %a, %b : tensor<6xi64>
    %r = arith.remui %s, %mod : tensor<6xi64>
    dist.yield %r : tensor<6xi64>
  }
  func.return %y : tensor<6xi64>
}
"""


@pytest.mark.parametrize("world_size", [1, 2, 5])
def test_generic_all_reduce_passes_extras_to_the_combine(world_size) -> None:
    moduli = [7, 11, 13, 97, 1000, 3]
    g = torch.Generator().manual_seed(world_size)
    xs = [torch.randint(0, 7, (6,), generator=g) for _ in range(world_size)]
    m = torch.tensor(moduli)
    results = simulate(MODULAR_SUM, [[x, m] for x in xs])
    if world_size == 1:
        # No combine runs for one rank: the input comes back unreduced.
        expected = xs[0]
    else:
        expected = torch.tensor(
            [sum(int(x[i]) for x in xs) % moduli[i] for i in range(6)]
        )
    for (y,) in results:
        assert torch.equal(y, expected)


@pytest.mark.parametrize("world_size", [2, 3, 4, 6])
def test_generic_all_reduce_folds_a_non_commutative_combine_in_rank_order(world_size) -> None:
    ms = order_sensitive_matrices(world_size, seed=world_size)
    expected = matmul_in_rank_order(ms)
    assert not torch.equal(expected, matmul_in_rank_order(ms[::-1]))
    for (y,) in simulate(MATMUL_COMBINE_PROGRAM, [[m] for m in ms]):
        assert torch.equal(y, expected)


# Ciphertext add ----------------------------------------------------------------


CIPHERTEXT = """\
func.func @main(%ct: tensor<2x{limbs}x5xi64>, %q: tensor<{limbs}xi64>) -> tensor<2x{limbs}x5xi64> {{
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x{limbs}x5xi64>, tensor<{limbs}xi64>
  func.return %y : tensor<2x{limbs}x5xi64>
}}
"""


@pytest.mark.parametrize(
    ("world_size", "moduli"),
    [
        (3, [(1 << 60) - 93, (1 << 60) - 173, (1 << 60) - 233]),
        (6, [(1 << 62) - 57, (1 << 61) - 1]),  # P·q overflows int64: exactness matters
        (2, [17, 2]),
    ],
)
def test_ciphertext_add_is_the_python_integer_sum_mod_q(world_size, moduli) -> None:
    g = torch.Generator().manual_seed(world_size)
    q = torch.tensor(moduli)
    cts = [
        torch.remainder(torch.randint(0, 1 << 62, (2, len(moduli), 5), generator=g), q.view(-1, 1))
        for _ in range(world_size)
    ]
    # Make the sum wrap: the largest residue on every rank.
    cts[0][0, :, 0] = q - 1
    if world_size > 1:
        cts[1][0, :, 0] = q - 1
    expected = reference_ciphertext_sum(cts, moduli)
    source = CIPHERTEXT.format(limbs=len(moduli))
    for (y,) in simulate(source, [[ct, q] for ct in cts]):
        assert torch.equal(y, expected)


# All-gather ----------------------------------------------------------------------


EVEN_GATHER = """\
func.func @main(%x: tensor<2x3xi32>) -> tensor<?x?xi32> {{
  %y = dist.all_gather %x axis {axis} : tensor<2x3xi32> -> tensor<?x?xi32>
  func.return %y : tensor<?x?xi32>
}}
"""

UNEVEN_GATHER = """\
func.func @main(%x: tensor<?x?xf64>, %c: tensor<?xi64>) -> tensor<?x?xf64> {{
  %y = dist.all_gather %x counts(%c : tensor<?xi64>) axis {axis} : tensor<?x?xf64> -> tensor<?x?xf64>
  func.return %y : tensor<?x?xf64>
}}
"""


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("world_size", [1, 3])
def test_even_all_gather_concatenates_in_rank_order(axis, world_size) -> None:
    xs = [torch.arange(6, dtype=torch.int32).reshape(2, 3) + 10 * r for r in range(world_size)]
    expected = reference_gather(xs, axis)
    for (y,) in simulate(EVEN_GATHER.format(axis=axis), [[x] for x in xs]):
        assert torch.equal(y, expected)


@pytest.mark.parametrize("axis", [0, 1])
def test_uneven_all_gather_takes_counts_rows_from_each_rank_including_zero(axis) -> None:
    counts = [2, 0, 3, 1]
    xs = []
    for r, c in enumerate(counts):
        shape = [c, 4] if axis == 0 else [4, c]
        xs.append(torch.arange(c * 4, dtype=torch.float64).reshape(shape) + 100 * r)
    c = torch.tensor(counts)
    expected = reference_gather(xs, axis)
    assert expected.shape[axis] == sum(counts)
    for (y,) in simulate(UNEVEN_GATHER.format(axis=axis), [[x, c] for x in xs]):
        assert torch.equal(y, expected)


# Variable all-to-all ------------------------------------------------------------


ALL_TO_ALL = """\
func.func @main(%x: tensor<?x?xi64>, %c: tensor<?x{ct}>) -> (tensor<?x?xi64>, tensor<?x{ct}>) {{
  %y, %r = dist.variable_all_to_all %x, %c axis {axis} : tensor<?x?xi64>, tensor<?x{ct}> -> tensor<?x?xi64>
  func.return %y, %r : tensor<?x?xi64>, tensor<?x{ct}>
}}
"""


@pytest.mark.parametrize(("axis", "count_type"), [(0, "i64"), (1, "i32")])
def test_variable_all_to_all_with_zero_counts(axis, count_type) -> None:
    # Rank 1 sends nothing at all; rank 2 receives nothing from anybody.
    sends = [[1, 2, 0], [0, 0, 0], [3, 1, 0]]
    count_dtype = torch.int64 if count_type == "i64" else torch.int32
    xs = []
    for r, send in enumerate(sends):
        rows = sum(send)
        shape = [rows, 2] if axis == 0 else [2, rows]
        xs.append(torch.arange(rows * 2).reshape(shape) + 100 * r)
    source = ALL_TO_ALL.format(axis=axis, ct=count_type)
    results = simulate(source, [[x, torch.tensor(s, dtype=count_dtype)] for x, s in zip(xs, sends)])
    for me, (y, recv) in enumerate(results):
        expected, expected_counts = reference_all_to_all(xs, sends, me, axis)
        assert torch.equal(y, expected)
        assert recv.dtype == count_dtype
        assert recv.tolist() == expected_counts
    assert results[2][0].shape[axis] == 0


# Rank queries ------------------------------------------------------------------


RANK_QUERIES = """\
dist.group @g [[0, 1], [2, 3]]
func.func @main() -> (index, index, index, index) {
  %r = dist.rank : index
  %s = dist.group_size : index
  %gr = dist.rank group @g : index
  %gs = dist.group_size group @g : index
  func.return %r, %s, %gr, %gs : index, index, index, index
}
"""


def test_rank_and_group_size_on_the_world_and_on_a_declared_group() -> None:
    results = simulate(RANK_QUERIES, [[] for _ in range(4)])
    declared = [[0, 1], [2, 3]]
    for rank, values in enumerate(results):
        assert all(v.dtype == torch.int64 and v.dim() == 0 for v in values)
        mine = next(part for part in declared if rank in part)
        assert [int(v) for v in values] == [rank, 4, mine.index(rank), len(mine)]


SUBGROUP_COLLECTIVES = """\
dist.group @pairs [[0, 1], [2, 3]]
func.func @main(%x: tensor<3xi64>) -> (tensor<3xi64>, tensor<3xi64>, tensor<6xi64>) {
  %s = dist.all_reduce sum %x group @pairs : tensor<3xi64>
  %b = dist.broadcast %x root 1 group @pairs : tensor<3xi64>
  %g = dist.all_gather %x axis 0 group @pairs : tensor<3xi64> -> tensor<6xi64>
  func.return %s, %b, %g : tensor<3xi64>, tensor<3xi64>, tensor<6xi64>
}
"""


def test_collectives_on_a_declared_group_stay_within_each_subgroup() -> None:
    xs = [torch.arange(3) + 10 * r for r in range(4)]
    results = simulate(SUBGROUP_COLLECTIVES, [[x] for x in xs])
    for rank, (s, b, g) in enumerate(results):
        pair = [0, 1] if rank < 2 else [2, 3]
        mine = [xs[p] for p in pair]
        assert torch.equal(s, reference_native("sum", mine))
        assert torch.equal(b, xs[pair[1]])
        assert torch.equal(g, reference_gather(mine, 0))


def test_a_declared_group_naming_more_ranks_than_run_is_a_located_error() -> None:
    with pytest.raises(OpError, match=r"'dist.rank' at <program>:\d+:\d+.*names rank 3"):
        compiled(RANK_QUERIES).simulate([[] for _ in range(3)], timeout=5)


# Properties over random world sizes, shapes and dtypes -----------------------------


@st.composite
def native_cases(draw):
    kind = draw(st.sampled_from(ARITHMETIC_KINDS + BITWISE_KINDS))
    dtypes = ("int64", "int32", "int8", "bool") if kind in BITWISE_KINDS else (
        "int64", "int32", "float32", "float64")
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    world_size = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**16))
    return kind, dtype, tuple(shape), world_size, seed


@settings(max_examples=examples(0.4), deadline=None)
@given(native_cases())
def test_property_native_all_reduce_matches_the_python_fold(case) -> None:
    kind, dtype, shape, world_size, seed = case
    g = torch.Generator().manual_seed(seed)
    low, high = (0, 2) if dtype == "bool" else (-3, 4) if kind in ARITHMETIC_KINDS else (-100, 100)
    xs = [randint(g, shape, low, high, dtype) for _ in range(world_size)]
    # A dynamic leading dimension: one program serves every shape.
    source = NATIVE.format(kind=kind, t=tensor_type((None, *shape[1:]), dtype))
    expected = reference_native(kind, xs)
    for (y,) in simulate(source, [[x] for x in xs]):
        assert torch.equal(y, expected)


@settings(max_examples=examples(0.4), deadline=None)
@given(
    world_size=st.integers(1, 6),
    axis=st.sampled_from([0, 1]),
    uneven=st.booleans(),
    data=st.data(),
)
def test_property_all_gather_matches_rank_order_concatenation(world_size, axis, uneven, data):
    other = data.draw(st.integers(1, 3), label="non-gathered extent")
    if uneven:
        counts = data.draw(st.lists(st.integers(0, 3), min_size=world_size, max_size=world_size))
    else:
        counts = [data.draw(st.integers(1, 3), label="rows")] * world_size
    xs = []
    for r, c in enumerate(counts):
        shape = [c, other] if axis == 0 else [other, c]
        xs.append(torch.arange(c * other, dtype=torch.float64).reshape(shape) + 1000 * r)
    expected = reference_gather(xs, axis)
    if uneven:
        c = torch.tensor(counts)
        results = simulate(UNEVEN_GATHER.format(axis=axis), [[x, c] for x in xs])
    else:
        source = f"""\
func.func @main(%x: tensor<?x?xf64>) -> tensor<?x?xf64> {{
  %y = dist.all_gather %x axis {axis} : tensor<?x?xf64> -> tensor<?x?xf64>
  func.return %y : tensor<?x?xf64>
}}
"""
        results = simulate(source, [[x] for x in xs])
    for (y,) in results:
        assert torch.equal(y, expected)


@settings(max_examples=examples(0.4), deadline=None)
@given(world_size=st.integers(1, 6), axis=st.sampled_from([0, 1]), data=st.data())
def test_property_variable_all_to_all_delivers_every_row_once(world_size, axis, data):
    sends = [
        data.draw(st.lists(st.integers(0, 3), min_size=world_size, max_size=world_size))
        for _ in range(world_size)
    ]
    xs = []
    for r, send in enumerate(sends):
        rows = sum(send)
        shape = [rows, 2] if axis == 0 else [2, rows]
        xs.append(torch.arange(rows * 2).reshape(shape) + 1000 * r)
    source = ALL_TO_ALL.format(axis=axis, ct="i64")
    results = simulate(source, [[x, torch.tensor(s)] for x, s in zip(xs, sends)])
    total_rows = 0
    for me, (y, recv) in enumerate(results):
        expected, expected_counts = reference_all_to_all(xs, sends, me, axis)
        assert torch.equal(y, expected)
        assert recv.tolist() == expected_counts
        total_rows += y.shape[axis]
    assert total_rows == sum(map(sum, sends))


@settings(max_examples=examples(0.3), deadline=None)
@given(world_size=st.integers(1, 6), data=st.data())
def test_property_broadcast_from_any_root(world_size, data):
    root = data.draw(st.integers(0, world_size - 1), label="root")
    xs = [torch.full((3,), 7 * r + 1) for r in range(world_size)]
    for y, _z in simulate(BROADCAST_DYNAMIC, [[x, torch.tensor(root)] for x in xs]):
        assert torch.equal(y, xs[root])


@settings(max_examples=examples(0.25), deadline=None)
@given(world_size=st.integers(1, 6), bits=st.sampled_from([30, 60, 62]), seed=st.integers(0, 999))
def test_property_ciphertext_add_is_exact(world_size, bits, seed):
    g = torch.Generator().manual_seed(seed)
    moduli = [(1 << bits) - 1 - 2 * i for i in range(3)]
    q = torch.tensor(moduli)
    cts = [
        torch.remainder(torch.randint(0, 1 << 62, (2, 3, 5), generator=g), q.view(-1, 1))
        for _ in range(world_size)
    ]
    expected = reference_ciphertext_sum(cts, moduli)
    for (y,) in simulate(CIPHERTEXT.format(limbs=3), [[ct, q] for ct in cts]):
        assert torch.equal(y, expected)


# Mismatches: a clear, located error, never a hang ----------------------------------


def _expect_located_error(path, needle, inputs_per_rank, error_type, pattern):
    text = path.read_text()
    where = location(text, needle, str(path))
    program = distir.compile(path)
    start = time.monotonic()
    with pytest.raises(error_type) as info:
        program.simulate(inputs_per_rank, timeout=10)
    assert time.monotonic() - start < 10, "a mismatch must fail fast, not wait for the timeout"
    message = str(info.value)
    assert f"'{needle}' at {where}" in message
    assert pattern in message
    return info.value


@pytest.mark.timeout(30)
def test_uneven_all_gather_with_different_counts_on_different_ranks(tmp_path) -> None:
    path = write_program(tmp_path, UNEVEN_GATHER.format(axis=0))
    # Each rank's rows agree with its own counts, but the counts disagree.
    inputs = [
        [torch.zeros(1, 2, dtype=torch.float64), torch.tensor([1, 2])],
        [torch.zeros(3, 2, dtype=torch.float64), torch.tensor([1, 3])],
    ]
    error = _expect_located_error(
        path, "dist.all_gather", inputs, CollectiveMismatchError, "different counts"
    )
    assert "[1, 2]" in str(error) and "[1, 3]" in str(error)


@pytest.mark.timeout(30)
def test_a_root_out_of_range_on_one_rank(tmp_path) -> None:
    path = write_program(tmp_path, BROADCAST_DYNAMIC)
    # In a world of two, rank 1 alone names root 2.
    inputs = [[torch.arange(3), torch.tensor(0)], [torch.arange(3), torch.tensor(2)]]
    error = _expect_located_error(path, "dist.broadcast", inputs, OpError, "root 2")
    assert "outside the group" in str(error)


@pytest.mark.timeout(30)
def test_ranks_naming_different_valid_roots(tmp_path) -> None:
    path = write_program(tmp_path, BROADCAST_DYNAMIC)
    inputs = [[torch.arange(3), torch.tensor(0)], [torch.arange(3), torch.tensor(1)]]
    _expect_located_error(path, "dist.broadcast", inputs, CollectiveMismatchError, "root")


@pytest.mark.timeout(30)
def test_all_reduce_with_different_shapes_on_different_ranks(tmp_path) -> None:
    path = write_program(tmp_path, NATIVE.format(kind="sum", t="tensor<?xi64>"))
    inputs = [[torch.arange(3)], [torch.arange(4)], [torch.arange(3)]]
    error = _expect_located_error(path, "dist.all_reduce", inputs, CollectiveMismatchError, "[4]")
    assert "rank 1" in str(error)


@pytest.mark.timeout(30)
def test_a_local_failure_on_one_rank_releases_the_others(tmp_path) -> None:
    # Rank 1's all-to-all input disagrees with its own counts: it fails before
    # the exchange, and the ranks waiting there must be released at once.
    path = write_program(tmp_path, ALL_TO_ALL.format(axis=0, ct="i64"))
    inputs = [
        [torch.zeros(2, 2, dtype=torch.int64), torch.tensor([1, 1])],
        [torch.zeros(5, 2, dtype=torch.int64), torch.tensor([1, 1])],
    ]
    error = _expect_located_error(
        path, "dist.variable_all_to_all", inputs, OpError, "sum of send counts"
    )
    assert isinstance(error, DistirError)


DIVERGING = """\
func.func @main(%x: tensor<2xi64>, %c: i1) -> tensor<2xi64> {
  %r = scf.if %c -> (tensor<2xi64>) {
    %n = dist.all_reduce sum %x : tensor<2xi64>
    scf.yield %n : tensor<2xi64>
  } else {
    %m = dist.broadcast %x root 0 : tensor<2xi64>
    scf.yield %m : tensor<2xi64>
  }
  func.return %r : tensor<2xi64>
}
"""


@pytest.mark.timeout(30)
def test_ranks_reaching_different_collectives(tmp_path) -> None:
    path = write_program(tmp_path, DIVERGING)
    # The SPMD check rejects the program up front...
    with pytest.raises(CompileError, match="scf.if"):
        distir.compile(path)
    # ...and without it the simulator names both collectives.
    program = distir.compile(path, verify_spmd=False)
    x = torch.arange(2)
    start = time.monotonic()
    with pytest.raises(CollectiveMismatchError) as info:
        program.simulate([[x, torch.tensor(True)], [x, torch.tensor(False)]], timeout=10)
    assert time.monotonic() - start < 10
    for op in ("dist.all_reduce", "dist.broadcast"):
        assert f"'{op}' at {location(DIVERGING, op, str(path))}" in str(info.value)


@pytest.mark.timeout(30)
def test_a_rank_that_never_arrives_is_reported_after_the_timeout(tmp_path) -> None:
    text = DIVERGING.replace(
        "%m = dist.broadcast %x root 0 : tensor<2xi64>", "%m = arith.addi %x, %x : tensor<2xi64>"
    )
    path = write_program(tmp_path, text)
    program = distir.compile(path, verify_spmd=False)
    x = torch.arange(2)
    start = time.monotonic()
    with pytest.raises(SimulationError) as info:
        program.simulate([[x, torch.tensor(True)], [x, torch.tensor(False)]], timeout=1)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert f"'dist.all_reduce' at {location(text, 'dist.all_reduce', str(path))}" in message
    assert "[1]" in message
