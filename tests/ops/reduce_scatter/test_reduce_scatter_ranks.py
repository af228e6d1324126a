"""`dist.reduce_scatter` on real gloo ranks, P = 2, 3 and 4, against the
independent oracle (`tests/oracle.py`): native kinds and combine regions
(every combine of the generic all-reduce's tests and the ciphertext modular
add), even and uneven counts, any axis, each schedule that computes the op
exactly (`ring`, `direct`, and the per-run choice), over every element
type the families draw. Plus one message large enough that the ring cuts
every part into several segments (P=2), its result checked against plain torch.
"""

from __future__ import annotations

import oracle
import pytest
import strategies
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from rank_server import Case, RankServer

from distir.transport.groups import COLLECTIVE_DTYPES

pytestmark = pytest.mark.multirank


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda p: f"P{p}")
def server(request):
    server = RankServer(request.param)
    yield server
    server.close()


def _refused_by_design(case: strategies.DrawnCase) -> bool:
    """A native kind on an element type the transport does not reduce (i16,
    ui32, ...): refused when the program is compiled, as the native
    all-reduce is, whatever the schedule."""
    kind = case.name.split()[1:2]
    return (
        bool(kind)
        and kind[0] in strategies.NATIVE_KINDS
        and case.inputs[0][0].dtype not in COLLECTIVE_DTYPES
    )


def _judge(case: strategies.DrawnCase, server: RankServer) -> None:
    outcomes = server.run(case.case())
    where = f"{case.name}, P={server.world_size}"
    if _refused_by_design(case):
        for rank, o in enumerate(outcomes):
            assert o.compile_error and "cannot run" in str(o.error), (
                f"{where}: rank {rank}: {o.error}"
            )
        return
    assert not any(o.compile_error for o in outcomes), f"{where}: {outcomes[0].error}"
    for rank, o in enumerate(outcomes):
        assert o.error is None, f"{where}: rank {rank} raised {o.error}\n{case.source}"
        assert not o.modified_inputs, f"{where}: rank {rank} modified inputs"
    why = oracle.first_mismatch(case.expected, [o.results for o in outcomes])
    assert why is None, f"{where}: {why}\n{case.source}"


@settings(max_examples=strategies.examples(0.3), derandomize=True,
          phases=[Phase.explicit, Phase.reuse, Phase.generate], deadline=None)  # fmt: skip
@given(data=st.data())
def test_real_ranks_equal_the_oracle(server, data):
    _judge(data.draw(strategies.general_reduce_scatter_cases(server.world_size)), server)


@pytest.mark.parametrize("schedule", ["ring", "direct", ""])
@pytest.mark.parametrize("uneven", [False, True], ids=["even", "uneven"])
def test_large_parts(server, schedule, uneven):
    """7/P MiB of int64 per rank (the rank server's store takes 8 MiB a
    case): at P=2 the ring cuts each part into two segments (of at least
    1 MiB), so sends and combines overlap step by step."""
    p = server.world_size
    rows = 7 * (1 << 20) // 8 // 2 // p
    counts = [rows // p + (7 * r if uneven else 0) for r in range(p)]
    n = sum(counts)
    xs = [torch.randint(-1000, 1000, (n, 2), generator=torch.Generator().manual_seed(r))
          for r in range(p)]  # fmt: skip
    total = torch.stack(xs).sum(0)
    t = f"tensor<{n}x2xi64>"
    counts_text = f" counts [{', '.join(map(str, counts))}]" if uneven else ""
    to = "tensor<?x2xi64>"
    source = (f"func.func @main(%x: {t}) -> {to} {{\n"
              f"  %y = dist.reduce_scatter sum %x{counts_text} axis 0 : {t} -> {to}\n"
              f"  func.return %y : {to}\n}}\n")  # fmt: skip
    impls = (("dist.reduce_scatter", schedule),) if schedule else ()
    expected = oracle.scattered(oracle.exact(total), p, 0, counts)
    case = strategies.DrawnCase(f"sum {schedule}", source, [[x] for x in xs], expected,
                                implementations=impls)  # fmt: skip
    _judge(case, server)


def test_a_schedule_that_would_reorder_a_non_commutative_combine_is_refused(server):
    """`ring` folds in a rotated order: asked for a combine not marked
    commutative, compilation fails on every rank, naming the op."""
    p = server.world_size
    t, to = f"tensor<{p}xi64>", "tensor<1xi64>"
    source = (f"func.func @main(%x: {t}) -> {to} {{\n"
              f"  %y = dist.reduce_scatter %x axis 0 : {t} -> {to} combine(%a, %b) {{\n"
              f"    dist.yield %a : {t}\n  }}\n  func.return %y : {to}\n}}\n")  # fmt: skip
    case = Case("ring first", source, [[torch.zeros(p, dtype=torch.int64)]] * p,
                [["contiguous"]] * p, implementations=(("dist.reduce_scatter", "ring"),))  # fmt: skip
    outcomes = server.run(case)
    assert all(o.compile_error for o in outcomes)
    assert "no implementation named 'ring'" in outcomes[0].error


def test_a_combine_that_is_not_elementwise_folds_whole_inputs(server):
    """combine(l, r) = r with its last two rows replaced by l's first two:
    not elementwise (a part of the fold needs other rows) and not
    commutative. Every rank must get its part of the rank-order fold,
    computed here with plain torch."""
    p = server.world_size
    counts = {2: [2, 2], 3: [2, 1, 1], 4: [1, 1, 1, 1]}[p]
    t = "tensor<4x2xi64>"
    source = (f"func.func @main(%x: {t}) -> tensor<?x2xi64> {{\n"
              f"  %y = dist.reduce_scatter %x counts [{', '.join(map(str, counts))}] axis 0 : "
              f"{t} -> tensor<?x2xi64> combine(%l, %r) {{\n"
              f"    %e = tensor.extract_slice %l[0, 0] [2, 2] [1, 1] : {t} to tensor<2x2xi64>\n"
              f"    %k = tensor.extract_slice %r[0, 0] [2, 2] [1, 1] : {t} to tensor<2x2xi64>\n"
              f"    %f = tensor.concat dim(0) %k, %e : (tensor<2x2xi64>, tensor<2x2xi64>) -> {t}\n"
              f"    dist.yield %f : {t}\n  }}\n  func.return %y : tensor<?x2xi64>\n}}\n")  # fmt: skip
    xs = [torch.arange(8, dtype=torch.int64).view(4, 2) + 100 * r for r in range(p)]

    def combine(lhs, rhs):
        out = rhs.clone()
        out[2:] = lhs[:2]
        return out

    total = xs[0]
    for x in xs[1:]:
        total = combine(total, x)
    case = strategies.DrawnCase("not elementwise", source, [[x] for x in xs],
                                oracle.scattered(oracle.exact(total), p, 0, counts))  # fmt: skip
    _judge(case, server)


def test_counts_for_another_group_size_are_a_named_error_on_every_rank(server):
    """The world's size is known only at run time: counts for one rank
    more are refused by the precondition, before any exchange, with the
    same named error on every rank."""
    p = server.world_size
    counts = [1] * (p + 1)
    t = f"tensor<{p + 1}xi64>"
    source = (f"func.func @main(%x: {t}) -> tensor<?xi64> {{\n"
              f"  %y = dist.reduce_scatter sum %x counts [{', '.join(map(str, counts))}] axis 0 : "
              f"{t} -> tensor<?xi64>\n  func.return %y : tensor<?xi64>\n}}\n")  # fmt: skip
    case = Case("counts", source, [[torch.ones(p + 1, dtype=torch.int64)]] * p,
                [["contiguous"]] * p)  # fmt: skip
    outcomes = server.run(case)
    errors = {o.error for o in outcomes}
    assert len(errors) == 1, errors
    (error,) = errors
    assert error is not None and not error.startswith("unnamed"), error
    assert f"has {p + 1} entries for a group of size {p}" in error and "dist.reduce_scatter" in error
