"""Reads of the rendezvous store never wait for a key (the class behind a
member that stalled in `grow`): a joiner withdrew its request between the
member's `check` and `get`, the `get` waited for the store's whole timeout
holding the client's lock, and every later store call of the member (its
`recover`) failed with "the rendezvous store does not answer".

`read_key` reads in one request. The store below loses every race: a key
that `check` reports is deleted before the next request. The source scan
keeps the class closed: no store `get` anywhere in distir.
"""

from __future__ import annotations

import ast
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.transport.epochs import decision_key, format_decision, read_decision, read_key

STORE_TIMEOUT_S = 1.0


class LosingEveryRace:
    """A store whose keys vanish right after `check` sees them (a concurrent
    deleter that always wins)."""

    def __init__(self, store: dist.Store):
        self.store = store

    def check(self, keys: list[str]) -> bool:
        found = self.store.check(keys)
        for key in keys:
            self.store.delete_key(key)
        return found

    def __getattr__(self, name: str):
        return getattr(self.store, name)


@pytest.fixture(scope="module")
def store() -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1", 0, 1, True, timeout=timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=False
    )


@settings(max_examples=30, deadline=None)
@given(
    key=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20),
    value=st.one_of(st.none(), st.binary(max_size=40).filter(lambda b: not b.startswith(b"\0"))),
)
def test_read_key_answers_at_once_what_a_dict_would(store, key: str, value: bytes | None):
    key = f"reads/{key}"
    store.delete_key(key)
    if value is not None:
        store.set(key, value)
    racing = LosingEveryRace(store)
    start = time.monotonic()
    assert read_key(racing, key) == value
    assert time.monotonic() - start < STORE_TIMEOUT_S / 2


def test_a_decision_read_while_a_deleter_races_is_read_in_one_request(store):
    store.set(decision_key(7), format_decision((0, 2), {"steps"}, 3, ()))
    racing = LosingEveryRace(store)
    start = time.monotonic()
    # check-then-get lost the race here: the get waited for the timeout
    assert read_decision(racing, 7) == (0, 2)
    assert time.monotonic() - start < STORE_TIMEOUT_S / 2


def _store_gets(tree: ast.AST) -> list[int]:
    """Lines that call `.get(...)` / `.multi_get(...)` on something named
    like a store."""
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "multi_get")
            and "store" in ast.unparse(node.func.value).lower()
        ):
            lines.append(node.lineno)
    return lines


def test_no_module_reads_the_store_with_a_waiting_get():
    package = Path(__file__).resolve().parents[2] / "distir"
    found = {
        str(path.relative_to(package)): lines
        for path in sorted(package.rglob("*.py"))
        if (lines := _store_gets(ast.parse(path.read_text())))
    }
    assert found == {}, f"store reads that wait for a missing key (use read_key): {found}"


def test_the_scan_finds_the_pattern_it_forbids():
    tree = ast.parse("v = store.get(k) if store.check([k]) else None\nw = d.get(k)\n")
    assert _store_gets(tree) == [1]
