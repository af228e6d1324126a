"""The all-gather's backward moves half the bytes it used to: a sum
reduce-scatter of the cotangent (each rank sends N·(P-1)/P bytes of an
N-byte cotangent) instead of an all-reduce and a slice (2·N·(P-1)/P on a
ring, the cheapest all-reduce). Counted from the backward program with
the textbook per-rank volumes, written here and not read from distir, and
from what runs. The uneven all-gather, whose counts are known at run time
only, too: its reduce-scatter is a variable all-to-all of the cotangent's
parts (rank r sends N less its own part; N·(P-1) over the ranks)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from distir.ir.parsing import parse_module
from distir.passes.vjp import add_vjp

ELEMENT_BYTES = {"f32": 4, "f64": 8}


def _bytes(t) -> int:
    count = 1
    for d in t.get_shape():
        assert d >= 0, f"a static shape is needed to count bytes: {t}"
        count *= d
    return count * ELEMENT_BYTES[str(t.element_type)]


def _sent_per_rank(op, P: int) -> Fraction:
    """Bytes one rank sends in `op`, by the lower bounds of the ring
    algorithms (reduce-scatter and all-gather N·(P-1)/P, all-reduce twice)."""
    if op.name not in ("dist.all_reduce", "dist.reduce_scatter", "dist.all_gather"):
        return Fraction(0)
    n = Fraction(_bytes(op.operands[0].type))
    if op.name == "dist.all_reduce":
        return 2 * n * (P - 1) / P
    if op.name == "dist.reduce_scatter":
        return n * (P - 1) / P
    return n * (P - 1)  # an all-gather sends its part to every other rank


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("axis", [0, 1])
def test_the_all_gather_backward_sends_at_most_half_the_bytes_of_an_all_reduce(P, axis):
    rows = [4, 4]
    out = list(rows)
    out[axis] *= P
    t_in = f"tensor<{rows[0]}x{rows[1]}xf32>"
    t_out = f"tensor<{out[0]}x{out[1]}xf32>"
    group = f"dist.group @g [[{', '.join(str(r) for r in range(P))}]]\n"
    text = (
        f"{group}func.func @main(%x: {t_in}) -> {t_out} {{\n"
        f"  %y = dist.all_gather %x axis {axis} group @g : {t_in} -> {t_out}\n"
        f"  func.return %y : {t_out}\n}}\n"
    )
    module = parse_module(text)
    functions = add_vjp(module)
    module.verify()
    backward = next(
        op for op in module.walk()
        if op.name == "func.func" and op.sym_name.data == functions.backward
    )  # fmt: skip
    sent = sum(_sent_per_rank(op, P) for op in backward.walk())
    cotangent_bytes = Fraction(4 * out[0] * out[1])
    all_reduce_and_slice = 2 * cotangent_bytes * (P - 1) / P
    assert 0 < sent <= all_reduce_and_slice / 2, (sent, all_reduce_and_slice)


class _Counting:
    """An in-process exchange that counts the bytes this rank sends (an
    all-to-all sends every piece but its own)."""

    def __init__(self, inner):
        self.inner, self.size, self.rank, self.sent = inner, inner.size, inner.rank, 0

    def send(self, t, peer):
        self.sent += t.numel() * t.element_size()
        self.inner.send(t, peer)

    def recv(self, t, peer):
        return self.inner.recv(t, peer)

    def wait(self, handle):
        self.inner.wait(handle)

    def finish(self):
        self.inner.finish()

    def all_to_all(self, out, x):
        self.sent += x.numel() * x.element_size() * (self.size - 1) // self.size
        self.inner.all_to_all(out, x)


@pytest.mark.parametrize("schedule", ["default", "ring"])
@pytest.mark.parametrize("P", [2, 3, 4])
def test_what_the_backward_runs_on_gloo_sends_half_an_all_reduce(P, schedule):
    """Counted from what runs: the backward's reduce-scatter, its schedule
    as the Torch backend chooses it on gloo (or the ring, by name), run
    over an in-process exchange that counts every byte sent: N·(P-1)/P per
    rank, half the all-reduce and slice's 2·N·(P-1)/P."""
    rows = 4
    import threading

    import torch

    from distir.ops.reduce_scatter.torch import (
        DIRECT,
        choose_schedule,
        direct_reduce_scatter,
        ring_reduce_scatter,
    )
    from distir.transport.exchange import InProcessWorld

    t_in, t_out = f"tensor<{rows}x2xf32>", f"tensor<{rows * P}x2xf32>"
    text = (
        f"dist.group @g [[{', '.join(str(r) for r in range(P))}]]\n"
        f"func.func @main(%x: {t_in}) -> {t_out} {{\n"
        f"  %y = dist.all_gather %x axis 0 group @g : {t_in} -> {t_out}\n"
        f"  func.return %y : {t_out}\n}}\n"
    )
    module = parse_module(text)
    add_vjp(module)
    (op,) = [o for o in module.walk() if o.name == "dist.reduce_scatter"]
    n = rows * P * 2
    assert choose_schedule(op, "gloo") == DIRECT
    algorithm = ring_reduce_scatter if schedule == "ring" else direct_reduce_scatter
    world = InProcessWorld(P, timeout=30)
    sent = [0] * P
    offsets = [n // P * r for r in range(P + 1)]

    def rank(r):
        ex = _Counting(world.exchange(r))
        out = torch.empty(n // P)
        algorithm(torch.ones(n), out, offsets, lambda d, a, b, s: torch.add(a, b, out=d), ex)
        assert bool((out == P).all())
        sent[r] = ex.sent

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(P)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    cotangent = 4 * n
    assert sent == [cotangent * (P - 1) // P] * P
    assert max(sent) <= (2 * cotangent * (P - 1) // P) // 2


# -- the uneven all-gather, its counts known at run time only ---------------------


def _uneven_text(P: int) -> str:
    t = "tensor<?x2xf32>"
    return (
        f"func.func @main(%x: {t}, %c: tensor<{P}xi64>) -> {t} {{\n"
        f"  %y = dist.all_gather %x counts(%c : tensor<{P}xi64>) axis 0 : {t} -> {t}\n"
        f"  func.return %y : {t}\n}}\n"
    )


@pytest.mark.parametrize("P", [2, 3, 4])
def test_the_uneven_backward_is_one_exchange_of_the_cotangent_by_the_gather_counts(P):
    """Counted from the plan: the backward's one collective sends part j of
    the cotangent (counts[j] rows) to rank j, by the forward's counts; no
    all-reduce. Rank r sends every part but its own: N - counts[r] rows."""
    module = parse_module(_uneven_text(P))
    functions = add_vjp(module)
    module.verify()
    backward = next(
        op for op in module.walk()
        if op.name == "func.func" and op.sym_name.data == functions.backward
    )  # fmt: skip
    collectives = [op for op in backward.walk() if op.name.startswith("dist.")]
    assert [op.name for op in collectives] == ["dist.variable_all_to_all"]
    (exchange,) = collectives
    dy, counts = backward.body.block.args
    assert exchange.operands[0] is dy and exchange.operands[1] is counts


def _count_worker(ctx, cases: list[list[int]]) -> list[tuple[int, list[float]]]:
    """Per case, the bytes this rank sends in the backward of an uneven
    all-gather (every all-to-all counted as run: the bytes of the parts
    for other ranks; an all-reduce, as on main, at the ring's 2·N·(P-1)/P)
    and the gradient of sum(y * 2)."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import ProcessGroup

    import distir

    me, sent = dist.get_rank(), [0]
    all_to_all, all_reduce = ProcessGroup.all_to_all_single, ProcessGroup.allreduce

    def counting_all_to_all(self, out, tensor, out_splits, in_splits, *args):
        rows = sum(in_splits)
        if rows:
            sent[0] += tensor.numel() * tensor.element_size() * (rows - in_splits[me]) // rows
        return all_to_all(self, out, tensor, out_splits, in_splits, *args)

    def counting_all_reduce(self, tensors, *args):
        P = dist.get_world_size()
        sent[0] += sum(2 * t.numel() * t.element_size() * (P - 1) // P for t in tensors)
        return all_reduce(self, tensors, *args)

    out = []
    for counts in cases:
        x = torch.ones(counts[ctx.rank], 2, requires_grad=True)
        y = distir.all_gather(x, counts=counts)
        ProcessGroup.all_to_all_single = counting_all_to_all
        ProcessGroup.allreduce = counting_all_reduce
        sent[0] = 0
        try:
            (y * 2).sum().backward()
        finally:
            ProcessGroup.all_to_all_single, ProcessGroup.allreduce = all_to_all, all_reduce
        out.append((sent[0], x.grad.reshape(-1).tolist()))
    return out


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_what_the_uneven_backward_runs_on_gloo_sends_half_an_all_reduce():
    """Fails on main (an all-reduce of the whole cotangent, then a slice).
    Counted as it runs on 3 gloo ranks: rank r sends N - counts[r] rows of
    the N-row cotangent, N·(P-1) over the ranks, half the all-reduce's
    2·N·(P-1); counts that happen to be even give N·(P-1)/P per rank."""
    import distir

    P, row = 3, 2 * 4
    cases = [[1, 0, 3], [2, 2, 2]]
    per_rank = distir.launch(_count_worker, P, cases, pass_context=True, timeout=100)
    for k, counts in enumerate(cases):
        n = sum(counts) * row
        sent = [per_rank[r][k][0] for r in range(P)]
        assert sent == [n - counts[r] * row for r in range(P)], (counts, sent)
        assert sum(sent) == n * (P - 1) == (P * 2 * n * (P - 1) // P) // 2
        for r in range(P):  # d sum(2y) / dx: 2 from each of the P ranks
            assert per_rank[r][k][1] == [2.0 * P] * (counts[r] * 2)
    assert [per_rank[r][1][0] for r in range(P)] == [6 * row * (P - 1) // P] * P
