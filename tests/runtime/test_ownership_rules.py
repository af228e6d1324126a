"""The ownership rule's storage arithmetic (`distir.runtime.ownership`),
against a brute-force account of the bytes each tensor can touch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from distir.errors import ProgramInputError
from distir.runtime.ownership import overlap, storage_span, writable_inputs

BASE = 48


def _bytes(t: torch.Tensor) -> set[int]:
    """Every byte of its storage `t` reads, element by element."""
    if t.numel() == 0:
        return set()
    offsets = torch.as_strided(
        torch.arange(t.untyped_storage().nbytes() // t.element_size()),
        t.shape, t.stride(), t.storage_offset(),
    )  # fmt: skip
    size = t.element_size()
    return {o * size + b for o in offsets.reshape(-1).tolist() for b in range(size)}


@st.composite
def views(draw, base: torch.Tensor) -> torch.Tensor:
    """A strided view inside `base`: sizes, strides (0 included) and offset."""
    dims = draw(st.integers(1, 2))
    sizes = [draw(st.integers(0, 4)) for _ in range(dims)]
    strides = [draw(st.integers(0, 5)) for _ in range(dims)]
    extent = sum((n - 1) * s for n, s in zip(sizes, strides) if n) + 1
    offset = draw(st.integers(0, max(0, BASE - extent)))
    if extent > BASE:
        sizes = [0] * dims
    return base.as_strided(sizes, strides, offset)


@settings(max_examples=examples(1.5), derandomize=True, deadline=None)
@given(st.data())
def test_overlap_never_misses_a_shared_byte(data) -> None:
    base = torch.zeros(BASE, dtype=torch.int32)
    other = torch.zeros(BASE, dtype=torch.int32)
    a = data.draw(views(base))
    b = data.draw(views(data.draw(st.sampled_from([base, other]))))
    shared = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and bool(
        _bytes(a) & _bytes(b)
    )
    if shared:
        assert overlap(storage_span(a), storage_span(b))
    if a.is_contiguous() and b.is_contiguous():  # exact for dense tensors
        assert overlap(storage_span(a), storage_span(b)) == shared


@settings(max_examples=examples(1), derandomize=True, deadline=None)
@given(st.data())
def test_only_dense_donated_inputs_that_overlap_no_other_input_are_written(data) -> None:
    base = torch.zeros(BASE, dtype=torch.int64)
    inputs = [data.draw(views(base)) for _ in range(data.draw(st.integers(1, 3)))]
    donated = data.draw(st.sets(st.integers(0, len(inputs) - 1)))
    writable = writable_inputs(inputs, tuple(donated))
    for i, x in enumerate(inputs):
        alone = all(
            not (_bytes(x) & _bytes(y)) for j, y in enumerate(inputs) if j != i
        )
        if i in writable:
            assert i in donated and x.is_contiguous() and alone
        elif i in donated and x.is_contiguous() and x.numel() and alone:
            # Declined only when the byte ranges (not the bytes) meet.
            spans = [storage_span(y) for j, y in enumerate(inputs) if j != i]
            assert any(overlap(storage_span(x), s) for s in spans)


def test_the_same_tensor_twice_is_written_under_neither_name() -> None:
    t = torch.arange(8)
    assert writable_inputs([t, t], (0,)) == frozenset()
    assert writable_inputs([t, t], True) == frozenset()
    assert writable_inputs([t[:4], t[4:]], True) == frozenset({0, 1})
    assert writable_inputs([t[:5], t[4:]], (1,)) == frozenset()
    assert writable_inputs([torch.zeros(1).expand(4)], True) == frozenset()
    assert writable_inputs([torch.zeros(2, 3).t()], True) == frozenset()


def test_donating_an_input_that_does_not_exist_is_a_named_error() -> None:
    with pytest.raises(ProgramInputError, match=r"donate names inputs \[2\] of 2"):
        writable_inputs([torch.zeros(1), torch.zeros(1)], (0, 2))
