"""The reduce-scatter's point-to-point schedules equal the definition for
any group size, even and uneven parts.

`ring` and `direct` only talk through an `Exchange`, so each runs here on P
threads over `InProcessExchange` mailboxes, segments cut tiny so that every
part is several messages. The oracle is plain Python: integer lists folded
left to right in rank order, then sliced by the counts; "first nonzero"
(associative, not commutative) tells rank order apart, so `direct` must
keep it; the ring is checked with a sum and a max (commutative).
"""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.ops.all_reduce.torch import base
from distir.ops.reduce_scatter.torch import direct_reduce_scatter, ring_reduce_scatter
from distir.transport.exchange import InProcessWorld


def _run(size: int, body) -> list:
    """Runs `body(exchange)` on `size` threads; returns their results."""
    return InProcessWorld(size, timeout=30).run(body)


@pytest.fixture(autouse=True)
def small_segments():
    saved = base.SEGMENT_BYTES
    base.SEGMENT_BYTES = 16
    yield
    base.SEGMENT_BYTES = saved


COMBINES = {
    # name: (combine on tensors, the same on Python ints, commutative)
    "sum": (lambda d, a, b, s: torch.add(a, b, out=d), lambda a, b: a + b, True),
    "max": (lambda d, a, b, s: torch.maximum(a, b, out=d), max, True),
    "first": (lambda d, a, b, s: torch.where(a != 0, a, b, out=d), lambda a, b: a or b, False),
}


def _expected(values: list[list[int]], counts: list[int], fold) -> list[list[int]]:
    total = values[0]
    for v in values[1:]:
        total = [fold(a, b) for a, b in zip(total, v)]
    parts, start = [], 0
    for c in counts:
        parts.append(total[start : start + c])
        start += c
    return parts


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    size=st.integers(1, 7),
    combine=st.sampled_from(sorted(COMBINES)),
    schedule=st.sampled_from(["ring", "direct"]),
    uneven=st.booleans(),
)
def test_schedules_equal_the_rank_order_fold(data, size, combine, schedule, uneven):
    fn, fold, commutative = COMBINES[combine]
    if schedule == "ring" and not commutative:
        schedule = "direct"
    if uneven:
        counts = data.draw(st.lists(st.integers(0, 9), min_size=size, max_size=size))
    else:
        counts = [data.draw(st.integers(0, 9))] * size
    n = sum(counts)
    values = [data.draw(st.lists(st.integers(-3, 3) | st.just(0), min_size=n, max_size=n))
              for _ in range(size)]  # fmt: skip
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    algorithm = ring_reduce_scatter if schedule == "ring" else direct_reduce_scatter

    def body(ex):
        x = torch.tensor(values[ex.rank], dtype=torch.int64)
        before = x.clone()
        out = torch.full((counts[ex.rank],), 99, dtype=torch.int64)
        if size == 1:
            out.copy_(x)
        else:
            algorithm(x, out, offsets, fn, ex)
        assert torch.equal(x, before), "the input was written"
        return out.tolist()

    assert _run(size, body) == _expected(values, counts, fold)


def test_the_ring_passes_start_offsets_of_the_part():
    """The combine is told where its elements are (extras are sliced by it):
    every call's `start` is the flat position of `dst`'s first element."""
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def combine(dst, lhs, rhs, start):
        with lock:
            seen.append((start, dst.numel()))
        torch.add(lhs, rhs, out=dst)

    offsets = [0, 5, 7, 13]
    _run(3, lambda ex: ring_reduce_scatter(torch.arange(13), torch.empty(
        offsets[ex.rank + 1] - offsets[ex.rank], dtype=torch.int64), offsets, combine, ex))
    covered = sorted(seen)
    # every part is combined P - 1 = 2 times, once on each of two ranks
    per_element = [0] * 13
    for start, n in covered:
        for i in range(start, start + n):
            per_element[i] += 1
    assert per_element == [2] * 13


def test_the_transports_own_reduce_scatter_runs_only_where_it_is_native():
    """NCCL's reduce_scatter_tensor sends N·(P-1)/P bytes per rank, gloo's
    all-reduces the whole input: a native kind split evenly runs the
    transport's on NCCL only; uneven counts, combine regions and gloo run
    point to point; a combine that is not elementwise folds whole inputs."""
    from distir.ir.parsing import parse_module
    from distir.ops.reduce_scatter.torch import DIRECT, GATHER_FOLD, NATIVE, choose_schedule

    t = "tensor<4x2xf32>"
    text = f"""func.func @main(%x: {t}, %w: tensor<2x2xf32>) {{
  %a = dist.reduce_scatter sum %x axis 0 : {t} -> tensor<?x2xf32>
  %b = dist.reduce_scatter sum %x counts [3, 1] axis 0 : {t} -> tensor<?x2xf32>
  %c = dist.reduce_scatter %x axis 0 commutative : {t} -> tensor<?x2xf32> combine(%l, %r) {{
    %s = arith.addf %l, %r : {t}
    dist.yield %s : {t}
  }}
  %d = dist.reduce_scatter %x axis 0 : {t} -> tensor<?x2xf32> combine(%l, %r) {{
    %e = tensor.extract_slice %l[0, 0] [2, 2] [1, 1] : {t} to tensor<2x2xf32>
    %k = tensor.extract_slice %r[0, 0] [2, 2] [1, 1] : {t} to tensor<2x2xf32>
    %f = tensor.concat dim(0) %k, %e : (tensor<2x2xf32>, tensor<2x2xf32>) -> {t}
    dist.yield %f : {t}
  }}
  func.return
}}"""
    ops = [op for op in parse_module(text).walk() if op.name == "dist.reduce_scatter"]
    assert [choose_schedule(op, "nccl") for op in ops] == [NATIVE, DIRECT, DIRECT, GATHER_FOLD]
    assert [choose_schedule(op, "gloo") for op in ops] == [DIRECT, DIRECT, DIRECT, GATHER_FOLD]
