"""Every place an op needs outside its family folder, op by op.

A new op is a folder `distir/ops/<family>/` (ir, build, semantics, torch),
one line in `distir/ops/table.py`, its helper re-exported by
`distir/ir/builder.py` (tests/ir/test_op_coverage.py), and these, which
this test lists for every op of the table and checks exist:

- `oracle`: its meaning in the independent oracle (`tests/oracle.py`,
  plain torch and Python integers, no distir code), the functions named;
- `strategies`: the hypothesis families that draw its programs and inputs
  against that oracle (`tests/strategies.py`'s `FAMILIES`), whose code
  calls those oracle functions;
- `bench`: its benchmark families (`distir/bench/families.py`), timed
  against raw torch.distributed;
- `group_size`: whether its static types fix the group size (the
  `ImpliesGroupSize` fact, which `runtime/requirements.py` reads: the op
  then needs nothing there but the fact).

An op the table gains without a line here fails
`test_every_op_of_the_table_says_where_it_is_checked`. An empty place is
debt, listed in `NOT_YET` (to shrink, never to grow); structural ops
(declarations, the wave's terminator) have no meaning of their own to check.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Places:
    oracle: tuple[str, ...] = ()
    strategies: tuple[str, ...] = ()
    bench: tuple[str, ...] = ()
    group_size: bool = False


PLACES: dict[str, Places] = {
    "dist.group": Places(),
    "dist.rank": Places(("rank",), ("queries",)),
    "dist.group_size": Places(("group_size",), ("queries",)),
    "dist.mesh": Places(),
    "dist.transfer": Places(
        (
            "transfer_sharded_to_replicated",
            "transfer_replicated_to_sharded",
            "transfer_partial_to_replicated",
        ),
        ("transfer",),
    ),  # fmt: skip
    "dist.broadcast": Places(("broadcast",), ("broadcast",), ("broadcast",)),
    "dist.all_reduce": Places(
        ("native_all_reduce", "generic_all_reduce"),
        ("native", "generic"),
        ("all_reduce", "combine", "wave"),
    ),  # fmt: skip
    "dist.all_reduce_add_ciphertext": Places(
        ("ciphertext_sum",), ("ciphertext",), ("ciphertext", "ciphertext62")
    ),
    "dist.all_gather": Places(
        ("all_gather",), ("all_gather",), ("all_gather", "fsdp_step"), group_size=True
    ),  # fmt: skip
    "dist.reduce_scatter": Places(
        ("reduce_scatter", "scattered"),
        ("reduce_scatter", "reduce_scatter_general"),
        ("reduce_scatter", "fsdp_step"),
    ),  # fmt: skip
    "dist.variable_all_to_all": Places(("variable_all_to_all",), ("all_to_all",), ("all_to_all",)),
    "dist.psum": Places(),
    "dist.pvary": Places(),
    "dist.gather": Places(("gather",), ("gather_scatter",)),
    "dist.scatter": Places(("scatter",), ("gather_scatter",)),
    "dist.reduce": Places(("reduce",), ("reduce",)),
    "dist.shift": Places(("shift",), ("shift",)),
    "dist.send": Places(("send_to_last",), ("p2p",)),
    "dist.recv": Places(("send_to_last",), ("p2p",)),
    "dist.sendrecv": Places(("ring_shift",), ("p2p",)),
    "dist.wave": Places((), ("wave",), ("wave",)),
    "dist.yield": Places(),
    "dist.assert_reduced": Places(),
    "dist.assert_uniform": Places(),
}

#: ops with no meaning of their own to check: declarations and terminators
STRUCTURAL = {"dist.group", "dist.mesh", "dist.yield", "dist.wave"}

#: (op, place) not there yet: the debt of issue 35, to shrink, never to grow
NOT_YET = {
    ("dist.psum", "oracle"), ("dist.psum", "strategies"),
    ("dist.pvary", "oracle"), ("dist.pvary", "strategies"),
    ("dist.assert_reduced", "oracle"), ("dist.assert_reduced", "strategies"),
    ("dist.assert_uniform", "oracle"), ("dist.assert_uniform", "strategies"),
}  # fmt: skip


def _table_ops() -> list[str]:
    from distir.ops.table import dist_ops

    return [op.name for op in dist_ops()]


def test_every_op_of_the_table_says_where_it_is_checked() -> None:
    missing = [name for name in _table_ops() if name not in PLACES]
    assert not missing, (
        f"{missing}: add each to PLACES with its oracle function (tests/oracle.py), the "
        "strategies that draw it (tests/strategies.py), its bench family "
        "(distir/bench/families.py) and whether it fixes the group size (ImpliesGroupSize)"
    )
    assert sorted(PLACES) == sorted(_table_ops())


def _empty_places() -> set[tuple[str, str]]:
    return {
        (name, place)
        for name, places in PLACES.items()
        if name not in STRUCTURAL
        for place in ("oracle", "strategies")
        if not getattr(places, place)
    }


def test_the_debt_is_exact() -> None:
    assert _empty_places() == NOT_YET


def _calls_to_oracle(function: ast.FunctionDef) -> set[str]:
    return {
        node.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "oracle"
    }


@pytest.mark.parametrize("name", sorted(PLACES))
def test_each_place_exists(name: str) -> None:
    import oracle
    import strategies

    from distir.bench.families import FAMILIES as BENCH
    from distir.ir.facts import ImpliesGroupSize
    from distir.ops.table import dist_ops

    places = PLACES[name]
    for function in places.oracle:
        assert callable(getattr(oracle, function, None)), f"tests/oracle.py has no {function}"
    tree = ast.parse((TESTS / "strategies.py").read_text())
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    called = set()
    for family in places.strategies:
        assert family in strategies.FAMILIES, f"tests/strategies.py has no family {family!r}"
        called |= _calls_to_oracle(functions[strategies.FAMILIES[family].__name__])
    # the strategies check the op against the oracle functions named
    assert set(places.oracle) <= called, (name, sorted(called))
    for family in places.bench:
        assert family in BENCH, f"distir/bench/families.py has no family {family!r}"
    (op,) = [op for op in dist_ops() if op.name == name]
    assert issubclass(op, ImpliesGroupSize) == places.group_size
