"""Bad input to the rooted collectives and the shift, on real gloo ranks: a
named error on every rank, never a hang or a result.

What the types decide is refused at compile time (tests/ir/test_verifiers.py);
these are the cases only the values decide: counts that do not sum to the
rows, counts that differ between ranks, a payload whose shape differs
between ranks (dynamic types), rows that do not split over the group.
"""

from __future__ import annotations

import pytest
import torch
from rank_server import Case, RankServer

pytestmark = pytest.mark.multirank

WORLD = 3


@pytest.fixture(scope="module")
def server():
    server = RankServer(WORLD)
    yield server
    server.close()


def _case(name: str, source: str, inputs: list[list[torch.Tensor]]) -> Case:
    return Case(name, source, inputs, [["contiguous"] * len(x) for x in inputs])


def _uneven(op: str) -> str:
    return (
        "func.func @main(%x: tensor<?x2xf32>, %c: tensor<3xi64>) -> tensor<?x2xf32> {\n"
        f"  %y = dist.{op} %x counts(%c : tensor<3xi64>) axis 0 root 1 : "
        "tensor<?x2xf32> -> tensor<?x2xf32>\n"
        "  func.return %y : tensor<?x2xf32>\n}\n"
    )


def _even(op: str, t: str, to: str, extra: str = "axis 0 root 0") -> str:
    return (
        f"func.func @main(%x: {t}) -> {to} {{\n"
        f"  %y = dist.{op} %x {extra} : {t} -> {to}\n"
        f"  func.return %y : {to}\n}}\n"
    )


C = torch.tensor([1, 2, 0])

#: name -> (program, every rank's inputs, what each rank's error says)
BAD: dict[str, tuple[str, list[list[torch.Tensor]], str]] = {
    "scatter counts that do not sum to the rows": (
        _uneven("scatter"),
        [[torch.ones(4, 2), C] for _ in range(WORLD)],
        "input has 4 rows on axis 0 but the sum of counts says 3",
    ),
    "gather rows that disagree with the counts": (
        _uneven("gather"),
        [[torch.ones(n, 2), C] for n in (1, 3, 0)],
        "input has 3 rows on axis 0 but counts[1] says 2",
    ),
    "gather counts that differ between ranks": (
        _uneven("gather"),
        [[torch.ones(1, 2), C], [torch.ones(2, 2), C], [torch.ones(1, 2), torch.tensor([1, 2, 1])]],
        "ranks pass different counts (rank 0: [1, 2, 0]; rank 1: [1, 2, 0]; rank 2: [1, 2, 1])",
    ),
    "scatter counts with a negative entry": (
        _uneven("scatter"),
        [[torch.ones(3, 2), torch.tensor([2, 2, -1])] for _ in range(WORLD)],
        "counts[2] = -1 is negative",
    ),
    "even gather whose shapes differ between ranks": (
        _even("gather", "tensor<?x2xf32>", "tensor<?x2xf32>"),
        [[torch.ones(n, 2)] for n in (1, 1, 2)],
        "ranks pass different input layouts (rank 0: float32[1, 2]; rank 1: float32[1, 2]; "
        "rank 2: float32[2, 2])",
    ),
    "even scatter whose rows do not split over the group": (
        _even("scatter", "tensor<?xf32>", "tensor<?xf32>"),
        [[torch.ones(4)] for _ in range(WORLD)],
        "input has 4 rows on axis 0, which do not split evenly over a group of size 3",
    ),
    "even scatter whose shapes differ between ranks": (
        _even("scatter", "tensor<?xf32>", "tensor<?xf32>"),
        [[torch.ones(n)] for n in (3, 6, 3)],
        "ranks pass different input layouts (rank 0: float32[3]; rank 1: float32[6]; "
        "rank 2: float32[3])",
    ),
    "reduce whose shapes differ between ranks": (
        "func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> {\n"
        "  %y = dist.reduce sum %x root 2 : tensor<?xf32>\n"
        "  func.return %y : tensor<?xf32>\n}\n",
        [[torch.ones(n)] for n in (2, 2, 5)],
        "ranks pass different input layouts (rank 0: float32[2]; rank 1: float32[2]; "
        "rank 2: float32[5])",
    ),
    "shift whose shapes differ between ranks": (
        "func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> {\n"
        "  %y = dist.shift %x offset 1 rotate : tensor<?xf32>\n"
        "  func.return %y : tensor<?xf32>\n}\n",
        [[torch.ones(n)] for n in (2, 3, 2)],
        "ranks pass different input layouts (rank 0: float32[2]; rank 1: float32[3]; "
        "rank 2: float32[2])",
    ),
}


#: cases in which one rank's local check fails: the others learn it from the agreement
FAILS_ALONE = {"gather rows that disagree with the counts": (1,)}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_a_named_error_on_every_rank(server, name):
    source, inputs, says = BAD[name]
    outcomes = server.run(_case(name, source, inputs))
    for rank, o in enumerate(outcomes):
        assert o.results is None and o.error is not None, f"rank {rank} gave {o.results}"
        assert not o.error.startswith(("unnamed", "silently")), f"rank {rank}: {o.error}"
        assert "'dist." in o.error and "<program>:2:3" in o.error, f"rank {rank}: {o.error}"
        if rank in FAILS_ALONE.get(name, (rank,)):
            assert says in o.error, f"rank {rank}: {o.error}"
        else:  # its peer's local check failed: told so, before any payload moved
            (alone,) = FAILS_ALONE[name]
            assert f"rank(s) [{alone}] of group world rejected their inputs" in o.error, o.error
