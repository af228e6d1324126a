"""Every native reduction kind has one home (`ir.attributes.REDUCTION_KINDS`);
the interpreters' folds and the backend's c10d reductions are derived from it
and cover every kind. A new kind without a c10d name or a combine fails here."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.core.kernels import LOCAL_KERNELS, NATIVE_FOLDS, fold_in_rank_order
from distir.ir.attributes import REDUCTION_KINDS, ReductionKind
from distir.ops.all_reduce.torch.native import C10D_REDUCTIONS


def test_every_kind_has_one_fold_and_one_c10d_reduction() -> None:
    assert set(REDUCTION_KINDS) == set(ReductionKind)
    assert set(NATIVE_FOLDS) == set(ReductionKind)
    assert set(C10D_REDUCTIONS) == set(ReductionKind)
    # Distinct kinds reduce differently on the wire.
    assert len({str(op) for op in C10D_REDUCTIONS.values()}) == len(ReductionKind)


@pytest.mark.parametrize("kind", list(ReductionKind), ids=str)
def test_tables_are_read_with_the_kind_as_ir_prints_it(kind: ReductionKind) -> None:
    # Invocations carry the kind as the plain string of the IR (`"sum"`).
    name = str(kind.value)
    assert NATIVE_FOLDS[name] is NATIVE_FOLDS[kind]
    assert C10D_REDUCTIONS[name] == C10D_REDUCTIONS[kind]


def test_prod_is_c10d_product() -> None:
    assert C10D_REDUCTIONS["prod"] == dist.ReduceOp.PRODUCT
    assert C10D_REDUCTIONS["sum"] == dist.ReduceOp.SUM


def _kernel(op_type: type, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    (result,) = LOCAL_KERNELS[op_type](None)(a, b)  # binary kernels read nothing of the op
    return result


@settings(max_examples=30, deadline=None)
@given(
    a=st.lists(st.integers(-(2**62), 2**62), min_size=4, max_size=4),
    b=st.lists(st.integers(-(2**62), 2**62), min_size=4, max_size=4),
)
def test_each_fold_on_integers_is_its_kinds_integer_combine(a: list[int], b: list[int]) -> None:
    x, y = torch.tensor(a), torch.tensor(b)
    for kind, facts in REDUCTION_KINDS.items():
        assert torch.equal(NATIVE_FOLDS[kind](x, y), _kernel(facts.integer_combine, x, y)), kind


FLOATS = [0.0, -0.0, 1.5, -2.0, float("nan"), float("inf"), -float("inf")]


@pytest.mark.parametrize(
    "kind", [k for k, f in REDUCTION_KINDS.items() if not f.integer_only], ids=str
)
def test_each_fold_on_floats_is_its_kinds_float_combine(kind: ReductionKind) -> None:
    facts = REDUCTION_KINDS[kind]
    x = torch.tensor([a for a in FLOATS for _ in FLOATS], dtype=torch.float64)
    y = torch.tensor([b for _ in FLOATS for b in FLOATS], dtype=torch.float64)
    got, want = NATIVE_FOLDS[kind](x, y), _kernel(facts.float_combine, x, y)
    # Bit for bit: NaN where NaN, and the sign of zero.
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))


def test_min_and_max_folds_keep_the_float_contracts_zero_order() -> None:
    zero, negative_zero = torch.tensor([0.0]), torch.tensor([-0.0])
    assert torch.signbit(NATIVE_FOLDS["max"](negative_zero, zero)).item() is False
    assert torch.signbit(NATIVE_FOLDS["min"](zero, negative_zero)).item() is True


def test_fold_in_rank_order_folds_left_to_right() -> None:
    values = [torch.tensor([v]) for v in (1, 2, 3, 4)]
    trace = fold_in_rank_order(lambda acc, x: (acc * 10 + x,), values)
    assert trace.tolist() == [1234]
    with_extra = fold_in_rank_order(lambda acc, x, m: ((acc + x) % m,), values, [torch.tensor(7)])
    assert with_extra.tolist() == [(1 + 2 + 3 + 4) % 7]
