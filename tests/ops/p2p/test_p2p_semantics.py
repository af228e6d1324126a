"""Waves, point-to-point and mesh transfers: the simulator against the
definitions, then real gloo ranks against the simulator."""

from __future__ import annotations

import oracle
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

import distir
from distir.runtime.launch import launch

# -- mesh transfers -------------------------------------------------------------


def transfer_program(case: dict) -> str:
    def layout(dims):
        return "[" + ", ".join("*" if d is None else str(d) for d in dims) + "]"

    rank = len(case["shape"])
    dyn = "x".join(["?"] * rank)
    partial = f" partial {list(case['partial'])}" if case["partial"] else ""
    return f"""
dist.mesh @src {list(case['src_shape'])} ranks {list(case['src_ranks'])}
dist.mesh @dst {list(case['dst_shape'])} ranks {list(case['dst_ranks'])}
func.func @main(%x: tensor<{dyn}xi64>) -> tensor<{dyn}xi64> {{
  %y = dist.transfer %x from @src {layout(case['src_dims'])}{partial} to @dst {layout(case['dst_dims'])} global {list(case['shape'])} : tensor<{dyn}xi64> -> tensor<{dyn}xi64>
  func.return %y : tensor<{dyn}xi64>
}}"""


def transfer_inputs(case: dict, world: int, seed: int) -> tuple[torch.Tensor, list]:
    """The global tensor and every rank's input: its source shard, where the
    partial axis splits each value into random addends."""
    gen = torch.Generator().manual_seed(seed)
    whole = torch.randint(-100, 100, case["shape"], generator=gen)
    src_ranks, src_shape = list(case["src_ranks"]), list(case["src_shape"])
    partial_axis = case["partial"][0] if case["partial"] else None
    inputs = []
    for rank in range(world):
        if rank not in src_ranks:
            inputs.append([torch.empty([0] * len(case["shape"]), dtype=torch.int64)])
            continue
        shard = oracle.mesh_shard(whole, src_shape, src_ranks, case["src_dims"], rank).clone()
        if partial_axis is not None:
            # Addends along the partial axis: random pieces, the last one fixes the sum.
            index = src_ranks.index(rank)
            coord = []
            rest = index
            for size in reversed(src_shape):
                coord.append(rest % size)
                rest //= size
            coord.reverse()
            parts = src_shape[partial_axis]
            # Replicas (ranks differing only along unsharded axes) hold equal addends.
            key = tuple(c for a, c in enumerate(coord) if a in case["src_dims"])
            g = torch.Generator().manual_seed(hash((seed, key)) & 0xFFFF)
            pieces = [torch.randint(-50, 50, shard.shape, generator=g) for _ in range(parts - 1)]
            pieces.append(shard - sum(pieces, torch.zeros_like(shard)))
            shard = pieces[coord[partial_axis]]
        inputs.append([shard])
    return whole, inputs


@st.composite
def transfer_cases(draw, max_world: int = 8) -> dict:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=rank, max_size=rank)))

    def mesh_and_layout(allow_partial: bool):
        mesh_shape = tuple(draw(st.sampled_from([(1,), (2,), (3,), (4,), (2, 2), (1, 3), (2, 1)])))
        size = 1
        for d in mesh_shape:
            size *= d
        ranks = tuple(draw(st.permutations(range(max_world)))[:size])
        axes = list(range(len(mesh_shape)))
        dims: list[int | None] = [None] * rank
        for axis in axes:
            if draw(st.booleans()):
                free = [d for d in range(rank) if dims[d] is None]
                if free:
                    dims[draw(st.sampled_from(free))] = axis
        partial: tuple[int, ...] = ()
        unused = [a for a in axes if a not in dims]
        if allow_partial and unused and draw(st.booleans()):
            partial = (draw(st.sampled_from(unused)),)
        return mesh_shape, ranks, tuple(dims), partial

    src_shape, src_ranks, src_dims, partial = mesh_and_layout(True)
    dst_shape, dst_ranks, dst_dims, _ = mesh_and_layout(False)
    return {
        "shape": shape,
        "src_shape": src_shape,
        "src_ranks": src_ranks,
        "src_dims": src_dims,
        "partial": partial,
        "dst_shape": dst_shape,
        "dst_ranks": dst_ranks,
        "dst_dims": dst_dims,
    }


def expected_outputs(case: dict, whole: torch.Tensor, world: int) -> list[torch.Tensor]:
    """Every rank's block of `whole` on the destination mesh (tests/oracle.py)."""
    out = []
    for rank in range(world):
        if rank in case["dst_ranks"]:
            out.append(oracle.mesh_shard(
                whole, case["dst_shape"], case["dst_ranks"], case["dst_dims"], rank))  # fmt: skip
        else:
            out.append(torch.empty([0] * len(case["shape"]), dtype=torch.int64))
    return out


@settings(max_examples=examples(0.6), deadline=None)
@given(case=transfer_cases(), seed=st.integers(0, 1000))
def test_every_destination_receives_exactly_its_slice_in_the_simulator(case, seed):
    world = max(max(case["src_ranks"]), max(case["dst_ranks"])) + 1
    whole, inputs = transfer_inputs(case, world, seed)
    results = distir.simulate(transfer_program(case), inputs, timeout=20)
    for rank, (got, want) in enumerate(zip(results, expected_outputs(case, whole, world))):
        assert torch.equal(got, want), (rank, case)


def transfer_worker(ctx, cases: list[tuple[dict, int]]) -> list[torch.Tensor]:
    results = []
    for case, seed in cases:
        _, inputs = transfer_inputs(case, ctx.world_size, seed)
        results.append(distir.compile(transfer_program(case)).run(*inputs[ctx.rank]))
    return results


@pytest.mark.multirank
@pytest.mark.timeout(180)
@settings(max_examples=1, derandomize=True, deadline=None)
@given(drawn=st.lists(st.tuples(transfer_cases(max_world=6), st.integers(0, 999)),
                      min_size=12, max_size=12))  # fmt: skip
def test_transfers_on_six_real_gloo_ranks_match_the_simulator(drawn):
    # One launch for twelve drawn cases, the same on every run (derandomized).
    cases = list(drawn)
    # The worked example of the README: rows + partial on a 2x2 mesh to columns on 3 ranks.
    cases.append(({"shape": (4, 6), "src_shape": (2, 2), "src_ranks": (0, 1, 2, 3),
                   "src_dims": (0, None), "partial": (1,), "dst_shape": (3,),
                   "dst_ranks": (3, 4, 5), "dst_dims": (None, 0)}, 1))
    real = launch(transfer_worker, 6, cases, pass_context=True, timeout=170)
    for i, (case, seed) in enumerate(cases):
        whole, inputs = transfer_inputs(case, 6, seed)
        sim = distir.simulate(transfer_program(case), inputs, timeout=20)
        expected = expected_outputs(case, whole, 6)
        for rank in range(6):
            assert torch.equal(real[rank][i], sim[rank]), (i, rank, case)
            assert torch.equal(real[rank][i], expected[rank]), (i, rank, case)


# -- waves and point-to-point ------------------------------------------------------------

WAVE = """
func.func @main(%a: tensor<3xi64>, %b: tensor<5xi64>, %c: tensor<2xf64>, %rows: tensor<?x2xi64>,
                %counts: tensor<3xi64>) -> ({types}) {{
  {body}
}}
"""
ONE_BY_ONE = """
  %0 = dist.all_reduce sum %a : tensor<3xi64>
  %1 = dist.all_reduce max %b : tensor<5xi64>
  %2 = dist.all_reduce sum %c : tensor<2xf64>
  %3, %4 = dist.variable_all_to_all %rows, %counts axis 0 : tensor<?x2xi64>, tensor<3xi64> -> tensor<?x2xi64>
  func.return %0, %1, %2, %3, %4 : {types}
"""
IN_A_WAVE = """
  %0, %1, %2, %3, %4 = dist.wave {{
    %w0 = dist.all_reduce sum %a : tensor<3xi64>
    %w1 = dist.all_reduce max %b : tensor<5xi64>
    %w2 = dist.all_reduce sum %c : tensor<2xf64>
    %w3, %w4 = dist.variable_all_to_all %rows, %counts axis 0 : tensor<?x2xi64>, tensor<3xi64> -> tensor<?x2xi64>
    dist.yield %w0, %w1, %w2, %w3, %w4 : {types}
  }} : {types}
  func.return %0, %1, %2, %3, %4 : {types}
"""
TYPES = "tensor<3xi64>, tensor<5xi64>, tensor<2xf64>, tensor<?x2xi64>, tensor<3xi64>"


def wave_inputs(rank: int) -> list[torch.Tensor]:
    # Rank 1 has no rows to send at all: its payload is empty.
    counts = [0, 0, 0] if rank == 1 else [1, 0, 2]
    return [
        torch.arange(3) + rank,
        torch.tensor([5, 1, 4, 1, 5]) * (rank + 1),
        torch.tensor([0.5, 1.5], dtype=torch.float64) * rank,
        torch.arange(2 * sum(counts)).reshape(-1, 2) + 100 * rank,
        torch.tensor(counts),
    ]


def wave_worker(ctx) -> tuple:
    one = distir.compile(WAVE.format(types=TYPES, body=ONE_BY_ONE.format(types=TYPES)))
    wave = distir.compile(WAVE.format(types=TYPES, body=IN_A_WAVE.format(types=TYPES)))
    x = wave_inputs(ctx.rank)
    return one.run(*x), wave.run(*x)


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_wave_equals_its_ops_one_by_one_even_with_zero_work_ranks():
    wave_text = WAVE.format(types=TYPES, body=IN_A_WAVE.format(types=TYPES))
    sim = distir.simulate(wave_text, [wave_inputs(r) for r in range(3)])
    real = launch(wave_worker, 3, pass_context=True, timeout=110)
    for rank in range(3):
        one_by_one, in_wave = real[rank]
        for a, b, c in zip(one_by_one, in_wave, sim[rank]):
            assert torch.equal(a, b) and torch.equal(b, c), rank
    # Rank 1 sent nothing, and received its peers' rows all the same.
    assert sim[1][4].tolist() == [0, 0, 0]
    assert sim[0][3].shape == (2, 2)  # one row from rank 0, none from 1, one from 2


RING_SHIFT = """
func.func @main(%x: tensor<?xi64>) -> (tensor<?xi64>, tensor<?xi64>) {
  %n = dist.group_size : index
  %r = dist.rank : index
  %one = arith.constant 1 : index
  %zero = arith.constant 0 : index
  %r1 = arith.addi %r, %one : index
  %next = arith.remui %r1, %n : index
  %rn = arith.addi %r, %n : index
  %rm = arith.subi %rn, %one : index
  %prev = arith.remui %rm, %n : index
  %shifted = dist.sendrecv %x to %next from %prev : tensor<?xi64> -> tensor<?xi64>
  %is0 = arith.cmpi eq, %r, %zero : index
  %echo = scf.if %is0 -> (tensor<?xi64>) {
    dist.send %x to 1 : tensor<?xi64>
    %back = dist.recv from 1 : tensor<?xi64>
    scf.yield %back : tensor<?xi64>
  } else {
    %is1 = arith.cmpi eq, %r, %one : index
    %got = scf.if %is1 -> (tensor<?xi64>) {
      %m = dist.recv from 0 : tensor<?xi64>
      %twice = arith.addi %m, %m : tensor<?xi64>
      dist.send %twice to 0 : tensor<?xi64>
      scf.yield %m : tensor<?xi64>
    } else {
      scf.yield %x : tensor<?xi64>
    }
    scf.yield %got : tensor<?xi64>
  }
  func.return %shifted, %echo : tensor<?xi64>, tensor<?xi64>
}
"""


def ring_worker(ctx) -> tuple:
    return distir.compile(RING_SHIFT).run(torch.arange(ctx.rank + 2) * 10)


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_ring_shift_and_ping_pong_with_dynamic_shapes():
    inputs = [[torch.arange(r + 2) * 10] for r in range(3)]
    sim = distir.simulate(RING_SHIFT, inputs)
    real = launch(ring_worker, 3, pass_context=True, timeout=110)
    for rank in range(3):
        assert all(torch.equal(a, b) for a, b in zip(real[rank], sim[rank])), rank
        # Each rank receives its predecessor's tensor, whatever its length.
        assert torch.equal(sim[rank][0], inputs[(rank - 1) % 3][0])
    assert torch.equal(sim[0][1], inputs[0][0] * 2)


def test_a_receive_of_the_wrong_shape_is_an_error_naming_the_op():
    text = """
func.func @main(%x: tensor<4xi64>) -> tensor<?xi64> {
  %r = dist.rank : index
  %zero = arith.constant 0 : index
  %is0 = arith.cmpi eq, %r, %zero : index
  %y = scf.if %is0 -> (tensor<?xi64>) {
    dist.send %x to 1 : tensor<4xi64>
    %same = tensor.cast %x : tensor<4xi64> to tensor<?xi64>
    scf.yield %same : tensor<?xi64>
  } else {
    %m = dist.recv from 0 : tensor<3xi64>
    %any = tensor.cast %m : tensor<3xi64> to tensor<?xi64>
    scf.yield %any : tensor<?xi64>
  }
  func.return %y : tensor<?xi64>
}
"""
    with pytest.raises(Exception, match=r"'dist.recv' at <program>:11:5: group rank 0 sent"):
        distir.simulate(text, [[torch.arange(4)], [torch.arange(4)]], timeout=10)


@pytest.mark.parametrize("which, message", [("to", "destination 5"), ("from", "source 5")])
def test_a_dynamic_peer_outside_the_group_is_an_error_naming_the_op(which, message):
    # One rule (core.checks.check_group_rank) for roots and both peers.
    peers = "to %far from %r" if which == "to" else "to %r from %far"
    text = f"""
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {{
  %r = dist.rank : index
  %far = arith.constant 5 : index
  %y = dist.sendrecv %x {peers} : tensor<4xi64> -> tensor<4xi64>
  func.return %y : tensor<4xi64>
}}
"""
    pattern = rf"'dist.sendrecv' at <program>:5:3: {message} is outside the group \(size 2\)"
    with pytest.raises(Exception, match=pattern):
        distir.simulate(text, [[torch.arange(4)], [torch.arange(4)]], timeout=10)
