"""Every all-reduce algorithm equals the definition for any group size.

The algorithms only talk through an `Exchange`, so here each runs with P
threads of this process over `InProcessExchange` mailboxes, for P up to 64
(powers of two and not), message sizes around the chunk boundaries, and
combines that tell rank order apart: the ring for a commutative sum, the
order-keeping algorithms for "first nonzero" (associative, not
commutative), and the lazily reduced ciphertext ring against Python
integers with moduli near 2^62 (no headroom) and below 2^60 (deferred).
"""

from __future__ import annotations

import pytest
import torch

from distir.ir.modular import lazy_reduction_schedule
from distir.ops.all_reduce.torch import base
from distir.ops.all_reduce.torch.combines import LazyModularAdd, ModuliPieces
from distir.ops.all_reduce.torch.halving_doubling import halving_doubling_all_reduce
from distir.ops.all_reduce.torch.recursive_doubling import recursive_doubling_all_reduce
from distir.ops.all_reduce.torch.ring import ring_all_reduce
from distir.transport.exchange import InProcessWorld

#: sizes past 16 take seconds each in one process: CI runs them, --fast does not
GROUP_SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16] + [
    pytest.param(size, marks=pytest.mark.large) for size in (31, 33, 64)
]


def _run(size: int, body) -> list:
    """Runs `body(exchange)` on `size` threads; returns their results."""
    return InProcessWorld(size, timeout=30).run(body)


def _values(size: int, n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(size * 1000 + n)
    # Sparse, so "first nonzero" depends on the order.
    return [torch.randint(0, 4, (n,), generator=g) * torch.randint(0, 2, (n,), generator=g)
            for _ in range(size)]  # fmt: skip


def _first_nonzero(dst, lhs, rhs, start):
    torch.where(lhs != 0, lhs, rhs, out=dst)


def _sizes(p: int) -> list[int]:
    return sorted({0, 1, p - 1, p, 3 * p + 1, 100})


@pytest.fixture(autouse=True)
def small_segments():
    # Tiny segments make every chunk several messages, as large ones are.
    saved = base.SEGMENT_BYTES
    base.SEGMENT_BYTES = 24
    yield
    base.SEGMENT_BYTES = saved


@pytest.mark.parametrize("size", GROUP_SIZES)
def test_the_ring_sums_for_any_group_size(size):
    for n in _sizes(size):
        xs = _values(size, n)
        out = _run(size, lambda ex, xs=xs: _ring(xs[ex.rank], ex, in_place=ex.rank % 2 == 1))
        want = sum(xs) if xs else None
        for got in out:
            assert torch.equal(got, want)


def _ring(x, ex, in_place):
    x = x.clone()
    out = x if in_place else torch.empty_like(x)
    if ex.size == 1 or not x.numel():
        return x.clone()
    ring_all_reduce(x, out, lambda step: lambda d, a, b, s: torch.add(a, b, out=d), ex)
    return out


@pytest.mark.parametrize("size", GROUP_SIZES)
def test_halving_doubling_keeps_rank_order_for_any_group_size(size):
    for n in _sizes(size):
        xs = _values(size, n)

        def body(ex, xs=xs):
            x = xs[ex.rank].clone()
            out = x if ex.rank % 3 == 0 else torch.empty_like(x)
            if ex.size == 1 or not x.numel():
                return x
            halving_doubling_all_reduce(x, out, _first_nonzero, ex)
            return out

        want = xs[0].clone()
        for x in xs[1:]:
            want = torch.where(want != 0, want, x)
        for got in _run(size, body):
            assert torch.equal(got, want), (size, n)


@pytest.mark.parametrize("size", GROUP_SIZES)
def test_recursive_doubling_keeps_rank_order_for_any_group_size(size):
    xs = [torch.randint(-2, 3, (2, 2), generator=torch.Generator().manual_seed(size * 7 + r))
          for r in range(size)]  # fmt: skip
    want = xs[0]
    for x in xs[1:]:
        want = want @ x  # a 2x2 matrix product: associative, order matters
    results = _run(size, lambda ex: recursive_doubling_all_reduce(xs[ex.rank], torch.matmul, ex))
    for got in results:
        assert torch.equal(got, want)


@pytest.mark.parametrize("size", [2, 3, 5, 8, 13, pytest.param(64, marks=pytest.mark.large)])
@pytest.mark.parametrize("bits", [59, 62])
def test_the_lazily_reduced_ciphertext_ring_is_exact(size, bits):
    moduli = [(1 << bits) - 57, (1 << bits) - 87, (1 << (bits - 1)) - 1]
    q = torch.tensor(moduli)
    g = torch.Generator().manual_seed(size + bits)
    cts = [torch.remainder(torch.randint(0, 1 << 62, (2, 3, 7), generator=g), q.view(-1, 1))
           for _ in range(size)]  # fmt: skip

    def body(ex):
        ct = cts[ex.rank].clone()
        out = torch.empty_like(ct).reshape(-1)
        lazy = LazyModularAdd(ModuliPieces.per_row(q, ct.shape))
        steps = [lazy.step_combine(b) for b in lazy_reduction_schedule(ex.size, max(moduli))]
        ring_all_reduce(ct.reshape(-1), out, steps.__getitem__, ex)
        return out.view(ct.shape)

    flat = [c.reshape(-1, 3, 7).tolist() for c in cts]
    want = torch.tensor(
        [[[sum(f[b][limb][k] for f in flat) % moduli[limb] for k in range(7)]
          for limb in range(3)] for b in range(2)]
    )  # fmt: skip
    for got in _run(size, body):
        assert torch.equal(got, want)


ALL_REDUCES = {
    "native sum": "%y = dist.all_reduce sum %x : tensor<8xi64>",
    "commutative elementwise": (
        "%y = dist.all_reduce %x commutative : tensor<8xi64> combine(%a, %b) {\n"
        " %m = arith.maxsi %a, %b : tensor<8xi64>\n"
        " dist.yield %m : tensor<8xi64>\n }"
    ),
    "ordered elementwise": (
        "%y = dist.all_reduce %x : tensor<8xi64> combine(%a, %b) {\n"
        " %m = arith.addi %a, %b : tensor<8xi64>\n"
        " dist.yield %m : tensor<8xi64>\n }"
    ),
}


@pytest.mark.parametrize("case", sorted(ALL_REDUCES))
def test_each_algorithm_matches_exactly_the_ops_the_table_allows(case) -> None:
    from distir.ir.parsing import parse_module
    from distir.ops.all_reduce.ir import ALGORITHM_NEEDS, candidate_algorithms, elementwise_combine
    from distir.transport.implementations import distributed_operation_contributions

    text = f"func.func @main(%x: tensor<8xi64>) -> tensor<8xi64> {{\n  {ALL_REDUCES[case]}\n"
    module = parse_module(text + "  func.return %y : tensor<8xi64>\n}\n")
    (op,) = [o for o in module.walk() if o.name == "dist.all_reduce"]
    matching = {
        impl.name
        for impl in distributed_operation_contributions()
        if impl.name in ALGORITHM_NEEDS and impl.matches(op)
    }
    native = not op.is_generic
    allowed = set(candidate_algorithms(elementwise_combine(op), native or bool(op.commutative)))
    # gather-fold folds a region: a native kind has none
    assert matching == allowed - ({"gather-fold"} if native else set())
    assert (
        matching
        == {
            "native sum": {"ring", "halving-doubling", "recursive-doubling"},
            "commutative elementwise": {
                "ring",
                "halving-doubling",
                "recursive-doubling",
                "gather-fold",
            },
            "ordered elementwise": {"halving-doubling", "recursive-doubling", "gather-fold"},
        }[case]
    )


def _counting_all_to_alls(monkeypatch) -> list[int]:
    """Counts `InProcessExchange.all_to_all` calls (the ring's one-segment path)."""
    from distir.transport.exchange import InProcessExchange

    calls: list[int] = []
    original = InProcessExchange.all_to_all

    def counted(self, out, x):
        calls.append(self.rank)
        return original(self, out, x)

    monkeypatch.setattr(InProcessExchange, "all_to_all", counted)
    return calls


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8, 13])
def test_one_segment_chunks_fold_between_two_all_to_alls(size, monkeypatch):
    # Default segments (1 MiB and up): every chunk of these inputs is one segment.
    monkeypatch.setattr(base, "SEGMENT_BYTES", None)
    calls = _counting_all_to_alls(monkeypatch)
    for n in (size, 3 * size, 100 * size):
        xs = _values(size, n)
        out = _run(size, lambda ex, xs=xs: _ring(xs[ex.rank], ex, in_place=ex.rank % 2 == 1))
        for got in out:
            assert torch.equal(got, sum(xs))
    assert len(calls) == 6 * size  # two all-to-alls per rank and input, no ring steps
    uneven = _values(size, 3 * size + 1)  # chunks of unequal length: the ring
    out = _run(size, lambda ex: _ring(uneven[ex.rank], ex, in_place=False))
    assert all(torch.equal(got, sum(uneven)) for got in out) and len(calls) == 6 * size


@pytest.mark.parametrize("size", [2, 3, 5, 8])
@pytest.mark.parametrize("bits", [59, 62])
def test_the_lazily_reduced_ciphertext_fold_is_exact(size, bits, monkeypatch):
    monkeypatch.setattr(base, "SEGMENT_BYTES", None)
    calls = _counting_all_to_alls(monkeypatch)
    moduli = [(1 << bits) - 57, (1 << bits) - 87, (1 << (bits - 1)) - 1]
    q = torch.tensor(moduli)
    g = torch.Generator().manual_seed(size + bits)
    shape = (size, 3, 8)  # 24 * size elements: P even chunks of whole rows
    cts = [torch.remainder(torch.randint(0, 1 << 62, shape, generator=g), q.view(-1, 1))
           for _ in range(size)]  # fmt: skip

    def body(ex):
        ct = cts[ex.rank].clone()
        out = ct.reshape(-1) if ex.rank % 2 else torch.empty_like(ct).reshape(-1)
        lazy = LazyModularAdd(ModuliPieces.per_row(q, ct.shape))
        steps = [lazy.step_combine(b) for b in lazy_reduction_schedule(ex.size, max(moduli))]
        ring_all_reduce(ct.reshape(-1), out, steps.__getitem__, ex)
        return out.view(ct.shape)

    flat = [c.tolist() for c in cts]
    want = torch.tensor(
        [[[sum(f[b][limb][k] for f in flat) % moduli[limb] for k in range(8)]
          for limb in range(3)] for b in range(size)]
    )  # fmt: skip
    for got in _run(size, body):
        assert torch.equal(got, want)
    assert len(calls) == 2 * size  # the one-segment path: two all-to-alls per rank
