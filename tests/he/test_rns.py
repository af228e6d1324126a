"""Exactness and contract tests for distir.he.rns."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

from distir.he.rns import (
    IMPLEMENTATIONS,
    MAX_MODULUS_EXCLUSIVE,
    CiphertextAddCombine,
    TorchRNSBackend,
    prepare_ciphertext_add_combine,
)

PRIME_NEAR_2_62 = 4611686018427387847  # 2**62 - 57, the largest prime below 2**62
SPECIAL_MODULI = [
    2,
    3,
    5,
    65537,
    1099511480321,
    1152921504606748673,
    PRIME_NEAR_2_62,
    MAX_MODULUS_EXCLUSIVE - 1,
]

moduli_strategy = st.lists(
    st.one_of(st.sampled_from(SPECIAL_MODULI), st.integers(2, MAX_MODULUS_EXCLUSIVE - 1)),
    min_size=1,
    max_size=5,
)
batch_strategy = st.lists(st.integers(1, 3), min_size=0, max_size=2)


def _random_reduced(rng: random.Random, batch: list[int], moduli: list[int], n: int):
    """Python nested lists of shape batch + [L, n], biased towards 0, 1, q-2, q-1."""

    def limb(q: int) -> list[int]:
        out = []
        for _ in range(n):
            kind = rng.randrange(6)
            if kind == 0:
                out.append(0)
            elif kind == 1:
                out.append(q - 1)
            elif kind == 2:
                out.append(min(1, q - 1))
            elif kind == 3:
                out.append(max(q - 2, 0))
            else:
                out.append(rng.randrange(q))
        return out

    def build(dims: list[int]):
        if not dims:
            return [limb(q) for q in moduli]
        return [build(dims[1:]) for _ in range(dims[0])]

    return build(batch)


def _reference_add(a, b, moduli: list[int]):
    """(a + b) mod q_l with Python integers, same nesting as the inputs."""
    if isinstance(a[0][0], int):  # [L, N]
        return [
            [(x + y) % q for x, y in zip(ra, rb, strict=True)]
            for ra, rb, q in zip(a, b, moduli, strict=True)
        ]
    return [_reference_add(x, y, moduli) for x, y in zip(a, b, strict=True)]


@settings(max_examples=examples(1.2), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    moduli=moduli_strategy,
    batch=batch_strategy,
    n=st.integers(1, 17),
    seed=st.integers(0, 2**32 - 1),
)
def test_add_mod_matches_python_reference(moduli, batch, n, seed):
    rng = random.Random(seed)
    a_py = _random_reduced(rng, batch, moduli, n)
    b_py = _random_reduced(rng, batch, moduli, n)
    expected = torch.tensor(_reference_add(a_py, b_py, moduli), dtype=torch.int64)
    a = torch.tensor(a_py, dtype=torch.int64)
    b = torch.tensor(b_py, dtype=torch.int64)
    q = torch.tensor(moduli, dtype=torch.int64)
    backend = TorchRNSBackend()

    backend.check_reduced(a, q)
    backend.check_reduced(b, q)
    assert torch.equal(backend.add_mod(a, b, q), expected)
    assert torch.equal(a, torch.tensor(a_py)), "add_mod must not modify its inputs"

    acc = a.clone()
    assert backend.add_mod_(acc, b, q) is acc
    assert torch.equal(acc, expected)

    deferred = a + b  # non-negative, < 2q
    assert torch.equal(backend.reduce_(deferred, q), expected)

    for implementation in IMPLEMENTATIONS:
        combine = prepare_ciphertext_add_combine(backend, implementation=implementation)
        assert torch.equal(combine(a, b, q), expected), implementation
        acc = a.clone()
        assert combine.in_place(acc, b, q) is acc
        assert torch.equal(acc, expected), implementation


@pytest.mark.parametrize("q", [2, 3, PRIME_NEAR_2_62, MAX_MODULUS_EXCLUSIVE - 1])
def test_add_mod_worst_case_no_overflow(q):
    backend = TorchRNSBackend()
    moduli = torch.tensor([q, q], dtype=torch.int64)
    a = torch.full((2, 2, 8), q - 1, dtype=torch.int64)
    expected = torch.full_like(a, (2 * q - 2) % q)
    assert torch.equal(backend.add_mod(a, a.clone(), moduli), expected)
    assert torch.equal(backend.add_mod_(a.clone(), a, moduli), expected)
    zero = torch.zeros_like(a)
    assert torch.equal(backend.add_mod(a, zero, moduli), a)


def test_fold_of_many_operands_matches_reference():
    rng = random.Random(7)
    moduli = [PRIME_NEAR_2_62, 1152921504606748673, 1099510890497, 3]
    ops_py = [_random_reduced(rng, [2], moduli, 64) for _ in range(9)]
    q = torch.tensor(moduli)
    backend = TorchRNSBackend()
    acc = torch.tensor(ops_py[0])
    for other in ops_py[1:]:
        backend.add_mod_(acc, torch.tensor(other), q)
    expected = ops_py[0]
    for other in ops_py[1:]:
        expected = _reference_add(expected, other, moduli)
    assert torch.equal(acc, torch.tensor(expected))


def test_non_contiguous_accumulator():
    backend = TorchRNSBackend()
    q = torch.tensor([7, PRIME_NEAR_2_62])
    base = torch.tensor([[6, 5, 4, 3], [PRIME_NEAR_2_62 - 1, 1, 2, 0]])
    big = torch.stack([base, base], dim=-1)  # [2, 4, 2]
    acc = big[..., 0]  # non-contiguous [2, 4] view
    other = base.clone()
    backend.add_mod_(acc, other, q)
    expected = torch.tensor([[5, 3, 1, 6], [PRIME_NEAR_2_62 - 2, 2, 4, 0]])
    assert torch.equal(big[..., 0], expected)
    assert torch.equal(big[..., 1], base)


def test_in_place_is_in_place_and_scratch_is_reused(monkeypatch):
    backend = TorchRNSBackend()
    q = torch.tensor([PRIME_NEAR_2_62, 97])
    acc = torch.randint(0, 97, (3, 2, 32))
    other = torch.randint(0, 97, (3, 2, 32))
    ptr = acc.data_ptr()
    backend.add_mod_(acc, other, q)
    assert backend.scratch_cache_size() == 1
    scratch_ptr = backend._scratch(acc).data_ptr()

    calls = []
    real_empty = torch.empty

    def counting_empty(*args, **kwargs):
        calls.append(args)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", counting_empty)
    result = backend.add_mod_(acc, other, q)
    monkeypatch.undo()
    assert result is acc and acc.data_ptr() == ptr
    assert calls == [], "second add_mod_ with the same shape must not allocate scratch"
    assert backend.scratch_cache_size() == 1
    assert backend._scratch(acc).data_ptr() == scratch_ptr

    # a new shape gets its own scratch entry; the cache stays bounded
    for n in range(1, 20):
        backend.add_mod_(
            torch.zeros(2, n, dtype=torch.int64), torch.ones(2, n, dtype=torch.int64), q
        )
    assert backend.scratch_cache_size() <= 8


def test_reduce_is_in_place():
    backend = TorchRNSBackend()
    q = torch.tensor([5, 11])
    x = torch.tensor([[0, 5, 14, 100], [10, 11, 21, 22]])
    ptr = x.data_ptr()
    assert backend.reduce_(x, q) is x and x.data_ptr() == ptr
    assert x.tolist() == [[0, 0, 4, 0], [10, 0, 10, 0]]


@settings(max_examples=examples(0.6), deadline=None)
@given(
    moduli=moduli_strategy,
    n=st.integers(1, 9),
    negative=st.booleans(),
    data=st.data(),
)
def test_check_reduced_names_the_bad_limb(moduli, n, negative, data):
    backend = TorchRNSBackend()
    L = len(moduli)
    x = torch.zeros(2, L, n, dtype=torch.int64)
    limb = data.draw(st.integers(0, L - 1), label="limb")
    k = data.draw(st.integers(0, n - 1), label="coefficient")
    q = moduli[limb]
    if negative:
        bad = data.draw(st.integers(-(2**63), -1), label="bad")
    else:
        bad = data.draw(st.integers(q, 2**63 - 1), label="bad")
    x[1, limb, k] = bad
    with pytest.raises(ValueError) as info:
        backend.check_reduced(x, torch.tensor(moduli))
    message = str(info.value)
    assert f"limb {limb}" in message
    assert str(bad) in message
    assert str(q) in message
    assert str((1, limb, k)) in message


def test_check_reduced_accepts_boundaries():
    backend = TorchRNSBackend()
    q = torch.tensor([2, PRIME_NEAR_2_62])
    backend.check_reduced(torch.tensor([[0, 1], [0, PRIME_NEAR_2_62 - 1]]), q)


@pytest.mark.parametrize(
    "bad", [1, 0, -1, -(2**63), MAX_MODULUS_EXCLUSIVE, MAX_MODULUS_EXCLUSIVE + 1, 2**63 - 1]
)
def test_check_moduli_rejects_out_of_range(bad):
    moduli = torch.tensor([3, bad, 5], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"q_1 = " + str(bad)):
        TorchRNSBackend.check_moduli(moduli)
    backend = TorchRNSBackend()
    x = torch.zeros(3, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="2 <= q < 2\\*\\*62"):
        backend.add_mod_(x, x.clone(), moduli)


def test_check_moduli_accepts_boundaries():
    TorchRNSBackend.check_moduli(torch.tensor([2, MAX_MODULUS_EXCLUSIVE - 1]))


@pytest.mark.parametrize(
    ("moduli", "exc", "pattern"),
    [
        (torch.tensor([[3, 5]]), ValueError, "rank 1"),
        (torch.tensor([3, 5], dtype=torch.int32), ValueError, "int64"),
        (torch.tensor([], dtype=torch.int64), ValueError, "at least one"),
        ([3, 5], TypeError, "torch.Tensor"),
    ],
)
def test_check_moduli_rejects_bad_tensors(moduli, exc, pattern):
    with pytest.raises(exc, match=pattern):
        TorchRNSBackend.check_moduli(moduli)


def test_mutated_moduli_are_revalidated():
    backend = TorchRNSBackend()
    q = torch.tensor([7, 11])
    x = torch.zeros(2, 3, dtype=torch.int64)
    backend.add_mod_(x, x.clone(), q)
    q[1] = 1
    with pytest.raises(ValueError, match="q_1 = 1"):
        backend.add_mod_(x, x.clone(), q)


@pytest.mark.parametrize(
    ("lhs", "rhs", "pattern"),
    [
        (torch.zeros(2, 4, dtype=torch.int64), torch.zeros(2, 5, dtype=torch.int64), "differ"),
        (torch.zeros(3, 4, dtype=torch.int64), torch.zeros(3, 4, dtype=torch.int64), "L = 2"),
        (torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64), r"\[\.\.\., L, N\]"),
        (torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int32), "int64"),
        (torch.zeros(2, 4, dtype=torch.int64), torch.zeros(2, 4), "int64"),
    ],
)
def test_shape_and_dtype_errors(lhs, rhs, pattern):
    backend = TorchRNSBackend()
    q = torch.tensor([5, 7])
    with pytest.raises(ValueError, match=pattern):
        backend.add_mod(lhs, rhs, q)
    with pytest.raises(ValueError, match=pattern):
        backend.add_mod_(lhs, rhs, q)


def test_prepare_combine_records_and_validates():
    backend = TorchRNSBackend()
    combine = prepare_ciphertext_add_combine(backend)
    assert isinstance(combine, CiphertextAddCombine)
    assert combine.backend_name == "torch" == backend.name
    assert combine.modulus_basis == "Q"
    assert combine.implementation is None
    assert combine.effective_implementation == "subtract-and-mask"
    with pytest.raises(dataclasses.FrozenInstanceError):
        combine.implementation = "remainder"  # type: ignore[misc]

    by_name = prepare_ciphertext_add_combine(
        "torch", modulus_basis="QP", implementation="remainder"
    )
    assert (by_name.backend_name, by_name.modulus_basis, by_name.implementation) == (
        "torch",
        "QP",
        "remainder",
    )
    assert isinstance(by_name.backend, TorchRNSBackend)

    with pytest.raises(ValueError, match="subtract-and-mask.*remainder"):
        prepare_ciphertext_add_combine(backend, implementation="barrett")
    with pytest.raises(TypeError, match="TorchRNSBackend.*'torch'"):
        prepare_ciphertext_add_combine("nccl")
    with pytest.raises(TypeError, match="TorchRNSBackend.*'torch'"):
        prepare_ciphertext_add_combine(object())  # type: ignore[arg-type]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    rng = random.Random(3)
    moduli = [PRIME_NEAR_2_62, 1152921504606748673, 2, 1099510890497]
    a = torch.tensor(_random_reduced(rng, [3], moduli, 257))
    b = torch.tensor(_random_reduced(rng, [3], moduli, 257))
    q = torch.tensor(moduli)  # stays on the CPU: moved and cached by the backend
    backend = TorchRNSBackend()
    expected = backend.add_mod(a, b, q)
    acc = a.cuda()
    ptr = acc.data_ptr()
    backend.add_mod_(acc, b.cuda(), q)
    assert acc.data_ptr() == ptr
    assert torch.equal(acc.cpu(), expected)
    assert torch.equal(backend.add_mod(a.cuda(), b.cuda(), q.cuda()).cpu(), expected)
    combine = prepare_ciphertext_add_combine(backend, implementation="remainder")
    assert torch.equal(combine(a.cuda(), b.cuda(), q).cpu(), expected)
    with pytest.raises(ValueError, match="limb 0"):
        bad = a.cuda()
        bad[0, 0, 0] = PRIME_NEAR_2_62
        backend.check_reduced(bad, q)
