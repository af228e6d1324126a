"""The oracle itself, on cases small enough to check by hand."""

from __future__ import annotations

import math

import oracle
import torch

NAN = math.nan


def one(expected: list[list[oracle.Expected]], rank: int = 0, i: int = 0) -> oracle.Expected:
    return expected[rank][i]


def test_native_integer_kinds_wrap_in_the_element_type():
    xs = [
        torch.tensor([127, -128, 6], dtype=torch.int8),
        torch.tensor([1, -1, 7], dtype=torch.int8),
    ]
    assert torch.equal(one(oracle.native_all_reduce("sum", xs)).alternatives[0],
                       torch.tensor([-128, 127, 13], dtype=torch.int8))  # fmt: skip
    assert torch.equal(one(oracle.native_all_reduce("prod", xs)).alternatives[0],
                       torch.tensor([127, -128, 42], dtype=torch.int8))  # fmt: skip
    big = [torch.tensor([2**64 - 1], dtype=torch.uint64), torch.tensor([2], dtype=torch.uint64)]
    assert one(oracle.native_all_reduce("sum", big)).alternatives[0].tolist() == [1]


def test_bool_sum_is_or_and_prod_is_and():
    xs = [torch.tensor([True, True, False]), torch.tensor([True, False, False])]
    assert one(oracle.native_all_reduce("sum", xs)).alternatives[0].tolist() == [1, 1, 0]
    assert one(oracle.native_all_reduce("prod", xs)).alternatives[0].tolist() == [1, 0, 0]


def test_a_float_sum_allows_every_bracketing_and_nothing_else():
    xs = [torch.tensor([1e16]), torch.tensor([1.0]), torch.tensor([-1e16])]
    xs = [x.double() for x in xs]
    expected = one(oracle.native_all_reduce("sum", xs))
    assert len(expected.alternatives) == 3
    assert sorted(a.item() for a in expected.alternatives) == [0.0, 0.0, 1.0]
    assert expected.mismatch(torch.tensor([1.0], dtype=torch.float64)) is None
    assert expected.mismatch(torch.tensor([2.0], dtype=torch.float64)) is not None


def test_native_max_propagates_nan_and_leaves_the_sign_of_zero_open():
    xs = [torch.tensor([NAN, -0.0, 1.0]), torch.tensor([2.0, 0.0, NAN])]
    expected = one(oracle.native_all_reduce("max", xs))
    assert expected.mismatch(torch.tensor([NAN, 0.0, NAN])) is None
    assert expected.mismatch(torch.tensor([NAN, -0.0, NAN])) is None
    assert "element [0]" in expected.mismatch(torch.tensor([2.0, 0.0, NAN]))


def test_maximumf_orders_signed_zeros_and_propagates_nan():
    xs = [torch.tensor([-0.0, 0.0, NAN]), torch.tensor([0.0, -0.0, 1.0])]
    expected = one(oracle.generic_all_reduce("maximumf", xs, commutative=True))
    assert expected.mismatch(torch.tensor([0.0, 0.0, NAN])) is None
    assert expected.mismatch(torch.tensor([-0.0, 0.0, NAN])) is not None
    minimum = one(oracle.generic_all_reduce("minimumf", xs, commutative=True))
    assert minimum.mismatch(torch.tensor([-0.0, -0.0, NAN])) is None


def test_a_non_commutative_combine_folds_in_rank_order():
    xs = [torch.tensor([1]), torch.tensor([2]), torch.tensor([3])]
    assert one(oracle.generic_all_reduce("first", xs, False)).alternatives[0].tolist() == [1]
    assert one(oracle.generic_all_reduce("last", xs, False)).alternatives[0].tolist() == [3]


def test_unsigned_integer_combines_compare_unsigned():
    xs = [torch.tensor([-1], dtype=torch.int8), torch.tensor([1], dtype=torch.int8)]
    assert one(oracle.generic_all_reduce("maxui", xs, True)).alternatives[0].tolist() == [-1]
    assert one(oracle.generic_all_reduce("maxsi", xs, True)).alternatives[0].tolist() == [1]


def test_the_ciphertext_sum_is_modular_per_limb():
    q = [7, 11]
    cts = [torch.tensor([[[6, 1], [10, 0]]]), torch.tensor([[[6, 6], [10, 10]]])]
    got = one(oracle.ciphertext_sum(cts, q)).alternatives[0]
    assert got.tolist() == [[[5, 0], [9, 10]]]


def test_gathers_and_all_to_all():
    xs = [torch.tensor([[1, 2]]), torch.zeros(0, 2, dtype=torch.int64), torch.tensor([[5, 6]])]
    assert one(oracle.all_gather(xs, 0)).alternatives[0].tolist() == [[1, 2], [5, 6]]
    rows = [torch.arange(3).view(3, 1), torch.arange(10, 12).view(2, 1)]
    sends = [[1, 2], [0, 2]]
    out = oracle.variable_all_to_all(rows, sends, 0)
    assert out[0][0].alternatives[0].view(-1).tolist() == [0]
    assert out[1][0].alternatives[0].view(-1).tolist() == [1, 2, 10, 11]
    assert out[1][1].alternatives[0].tolist() == [2, 2]


def test_mesh_shards_split_like_numpy_array_split_in_row_major_order():
    whole = torch.arange(20).view(5, 4)
    # mesh [2, 2] of ranks 3, 4, 5, 6: rank 5 is at coordinate (1, 0)
    shard = oracle.mesh_shard(whole, [2, 2], [3, 4, 5, 6], [0, 1], 5)
    assert shard.tolist() == [[12, 13], [16, 17]]  # rows 3-4 (5 = 3 + 2), columns 0-1
    assert oracle.mesh_shard(whole, [3], [0, 1, 2], [None, 0], 2).tolist() == [[3], [7], [11],
                                                                               [15], [19]]  # fmt: skip
