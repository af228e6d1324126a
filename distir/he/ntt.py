"""Exact polynomial arithmetic in SEAL's NTT form.

SEAL stores CKKS keys and ciphertexts as RNS limbs in *NTT form*: limb ``l``
of a polynomial ``p`` in ``Z[X]/(X^N + 1)`` is the vector of its values at
the primitive ``2N``-th roots of unity modulo the prime ``q_l``.  In that
form a product of polynomials is the pointwise product of the limbs, so every
step of threshold key generation and decryption is per limb and per
coefficient.

The transform below is SEAL's own (``util/ntt.cpp``): for each prime, ``psi``
is the *smallest* primitive ``2N``-th root of unity modulo ``q``
(``try_minimal_primitive_root``), the table holds ``psi^i`` at index
``bit_reverse(i)``, and the forward transform is the Cooley-Tukey butterfly
``(x, y) -> (x + w*y, x - w*y)`` over those powers, so that output ``i``
holds ``p(psi^(2*bit_reverse(i) + 1))``.  A small-coefficient polynomial
transformed here is, bit for bit, what SEAL would store (tests check it
against secret keys SEAL generated: their inverse transform is ternary in
every limb).

Residues are below ``2**62`` and their products need 124 bits.  Where
numpy's ``longdouble`` has a 64-bit mantissa (x86-64 Linux), a product is
reduced on int64 words the way NTL's ``MulMod`` does it: the quotient
``floor(x*w/q)`` estimated in extended precision is off by at most one, the
remainder ``x*w - qhat*q`` computed modulo ``2**64`` is then exact up to one
correction by ``q`` (about 1 ms per limb at ``N = 8192``).  Elsewhere the
arithmetic runs on Python integers (numpy ``object`` arrays): exact, about
40 ms per limb.  Tests check both against each other and a reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "WORD_ARITHMETIC",
    "NegacyclicNTT",
    "centered",
    "from_ntt",
    "mul_mod",
    "mul_mod_words",
    "negacyclic_ntt",
    "sub_mod",
    "to_ntt",
]


#: Whether word arithmetic is exact here: a 64-bit-mantissa long double.
WORD_ARITHMETIC = np.finfo(np.longdouble).nmant >= 63
_WORD_LIMIT = 1 << 61


def _words_ok(modulus: int) -> bool:
    return WORD_ARITHMETIC and modulus < _WORD_LIMIT


def mul_mod_words(x: np.ndarray, w: np.ndarray, modulus: int) -> np.ndarray:
    """``x * w mod modulus`` for int64 arrays of residues (broadcasting),
    ``modulus < 2**61``, on a platform with :data:`WORD_ARITHMETIC`: the
    quotient estimated in 64-bit-mantissa floating point is within one of
    ``floor(x*w/q)`` (its error is below ``q * 2**-62 < 1``), so the wrapped
    remainder needs at most one correction."""
    q = np.int64(modulus)
    # Non-negative: truncation is the floor (and np.floor on long doubles is slow).
    qhat = (x.astype(np.longdouble) * w.astype(np.longdouble) / np.longdouble(modulus)).astype(
        np.int64
    )
    with np.errstate(over="ignore"):
        r = x.astype(np.uint64) * w.astype(np.uint64) - qhat.astype(np.uint64) * np.uint64(q)
    r = r.view(np.int64)
    r = np.where(r < 0, r + q, r)
    return np.where(r >= q, r - q, r)


def _bit_reverse(values: np.ndarray, bits: int) -> np.ndarray:
    out = np.zeros_like(values)
    for b in range(bits):
        out |= ((values >> b) & 1) << (bits - 1 - b)
    return out


def _minimal_primitive_root(modulus: int, order: int) -> int:
    """The smallest primitive ``order``-th root of unity modulo the prime
    ``modulus`` (``order`` a power of two), as SEAL chooses it."""
    if (modulus - 1) % order:
        raise ValueError(f"{modulus} is not 1 modulo {order}: no primitive {order}-th root")
    for x in range(2, modulus):
        root = pow(x, (modulus - 1) // order, modulus)
        if pow(root, order // 2, modulus) == modulus - 1:
            break
    else:  # pragma: no cover - a prime always has one
        raise ValueError(f"no primitive {order}-th root of unity modulo {modulus}")
    # Every primitive root is an odd power of this one.
    square = root * root % modulus
    best = current = root
    for _ in range(order // 2):
        best = min(best, current)
        current = current * square % modulus
    return best


class NegacyclicNTT:
    """SEAL's negacyclic number-theoretic transform modulo one prime.

    ``forward(p)`` maps the ``N`` coefficients of ``p`` (integers, any sign)
    to SEAL's NTT form modulo ``modulus``; ``inverse`` maps back to
    coefficients in ``[0, modulus)``.  Both return numpy ``object`` arrays of
    Python integers."""

    def __init__(self, modulus: int, degree: int):
        if degree < 2 or degree & (degree - 1):
            raise ValueError(f"degree must be a power of two >= 2, got {degree}")
        self.modulus = int(modulus)
        self.degree = int(degree)
        self.log_degree = degree.bit_length() - 1
        #: the minimal primitive 2N-th root of unity (SEAL's ``get_root()``)
        self.root = _minimal_primitive_root(self.modulus, 2 * degree)
        powers = [1] * degree
        for i in range(1, degree):
            powers[i] = powers[i - 1] * self.root % self.modulus
        order = _bit_reverse(np.arange(degree, dtype=np.int64), self.log_degree)
        self._roots = np.empty(degree, dtype=object)
        self._roots[order] = np.array(powers, dtype=object)
        self._inverse_roots = np.array(
            [pow(int(w), -1, self.modulus) for w in self._roots], dtype=object
        )
        self._half = pow(2, -1, self.modulus)

    def __repr__(self) -> str:
        return f"NegacyclicNTT(modulus={self.modulus}, degree={self.degree}, root={self.root})"

    def _check(self, values: np.ndarray | Sequence[int]) -> np.ndarray:
        array = np.asarray(values, dtype=object)
        if array.shape != (self.degree,):
            raise ValueError(f"expected {self.degree} coefficients, got shape {array.shape}")
        return array % self.modulus

    def _word_tables(self) -> tuple[np.ndarray, np.ndarray]:
        if not hasattr(self, "_words"):
            self._words = (self._roots.astype(np.int64), self._inverse_roots.astype(np.int64))
        return self._words

    def forward_words(self, coefficients: np.ndarray | Sequence[int]) -> np.ndarray:
        """:meth:`forward` as int64 residues (word arithmetic where exact)."""
        if not _words_ok(self.modulus):
            return self.forward(coefficients).astype(np.int64)
        a, q, n = self._check(coefficients).astype(np.int64), self.modulus, self.degree
        roots, _ = self._word_tables()
        m, gap = 1, n // 2
        while m < n:
            pairs = a.reshape(m, 2, gap)
            x, y = pairs[:, 0, :], mul_mod_words(pairs[:, 1, :], roots[m : 2 * m].reshape(m, 1), q)
            total, diff = x + y, x - y
            total = np.where(total >= q, total - q, total)
            diff = np.where(diff < 0, diff + q, diff)
            a = np.stack([total, diff], axis=1).reshape(n)
            m, gap = m * 2, gap // 2
        return a

    def forward(self, coefficients: np.ndarray | Sequence[int]) -> np.ndarray:
        """Coefficients -> NTT form (values at ``psi^(2*bit_reverse(i)+1)``)."""
        a, q, n = self._check(coefficients), self.modulus, self.degree
        m, gap = 1, n // 2
        while m < n:
            pairs = a.reshape(m, 2, gap)
            w = self._roots[m : 2 * m].reshape(m, 1)
            x, y = pairs[:, 0, :], pairs[:, 1, :] * w % q
            a = np.stack([(x + y) % q, (x - y) % q], axis=1).reshape(n)
            m, gap = m * 2, gap // 2
        return a

    def inverse(self, values: np.ndarray | Sequence[int]) -> np.ndarray:
        """NTT form -> coefficients in ``[0, modulus)`` (undoes :meth:`forward`)."""
        a, q, n = self._check(values), self.modulus, self.degree
        m, gap = n // 2, 1
        while m >= 1:
            pairs = a.reshape(m, 2, gap)
            w_inv = self._inverse_roots[m : 2 * m].reshape(m, 1)
            u, v = pairs[:, 0, :], pairs[:, 1, :]
            x = (u + v) * self._half % q
            y = (u - v) * self._half % q * w_inv % q
            a = np.stack([x, y], axis=1).reshape(n)
            m, gap = m // 2, gap * 2
        return a


@lru_cache(maxsize=64)
def negacyclic_ntt(modulus: int, degree: int) -> NegacyclicNTT:
    """The (cached) transform for one prime and degree."""
    return NegacyclicNTT(modulus, degree)


def _moduli_list(moduli: Tensor | Sequence[int]) -> list[int]:
    if isinstance(moduli, Tensor):
        return [int(q) for q in moduli.tolist()]
    return [int(q) for q in moduli]


def _as_objects(limbs: Tensor) -> np.ndarray:
    return limbs.detach().to("cpu").numpy().astype(object)


def _to_tensor(residues: np.ndarray) -> Tensor:
    return torch.from_numpy(np.asarray(residues, dtype=object).astype(np.int64))


def to_ntt(coefficients: np.ndarray | Sequence[int], moduli: Tensor | Sequence[int]) -> Tensor:
    """An integer polynomial (``N`` coefficients of any size and sign) as
    int64 limbs ``[L, N]`` in SEAL's NTT form, one limb per modulus."""
    coefficients = np.asarray(coefficients, dtype=object)
    qs = _moduli_list(moduli)
    rows = [negacyclic_ntt(q, coefficients.shape[-1]).forward_words(coefficients) for q in qs]
    return torch.from_numpy(np.stack(rows))


def from_ntt(limbs: Tensor, moduli: Tensor | Sequence[int]) -> np.ndarray:
    """Limbs ``[L, N]`` in NTT form -> coefficient residues ``[L, N]`` (object)."""
    qs = _moduli_list(moduli)
    if limbs.dim() != 2 or limbs.shape[0] != len(qs):
        raise ValueError(f"expected limbs [L = {len(qs)}, N], got shape {list(limbs.shape)}")
    values = _as_objects(limbs)
    return np.stack(
        [negacyclic_ntt(q, limbs.shape[1]).inverse(values[i]) for i, q in enumerate(qs)]
    )


def centered(limbs: Tensor, moduli: Tensor | Sequence[int]) -> np.ndarray:
    """The integer polynomial whose NTT-form limbs these are: coefficients
    CRT-combined across the limbs and centred in ``(-Q/2, Q/2]`` (``object``
    array of ``N`` Python integers)."""
    qs = _moduli_list(moduli)
    residues = from_ntt(limbs, qs)
    big_q = 1
    for q in qs:
        big_q *= q
    total = np.zeros(limbs.shape[1], dtype=object)
    for i, q in enumerate(qs):
        basis = big_q // q * pow(big_q // q, -1, q)
        total = (total + residues[i] * basis) % big_q
    return np.where(total > big_q // 2, total - big_q, total)


def _column(moduli: Tensor | Sequence[int], limbs: Tensor) -> np.ndarray:
    qs = _moduli_list(moduli)
    if limbs.shape[-2] != len(qs):
        raise ValueError(
            f"limbs of shape {list(limbs.shape)} do not have one limb per modulus ({len(qs)})"
        )
    return np.array(qs, dtype=object).reshape(len(qs), 1)


def mul_mod(lhs: Tensor, rhs: Tensor, moduli: Tensor | Sequence[int]) -> Tensor:
    """Exact ``(lhs * rhs) mod q_l`` per limb (int64 ``[..., L, N]``, reduced
    inputs): in NTT form, the product of the two polynomials."""
    if lhs.shape != rhs.shape:
        raise ValueError(f"shapes differ: {list(lhs.shape)} vs {list(rhs.shape)}")
    q = _column(moduli, lhs)
    qs = _moduli_list(moduli)
    if all(_words_ok(m) for m in qs):
        x, w = lhs.detach().cpu().numpy(), rhs.detach().cpu().numpy()
        out = np.empty(x.shape, dtype=np.int64)
        for limb, m in enumerate(qs):
            out[..., limb, :] = mul_mod_words(x[..., limb, :], w[..., limb, :], m)
        return torch.from_numpy(out)
    return _to_tensor(_as_objects(lhs) * _as_objects(rhs) % q)


def sub_mod(lhs: Tensor, rhs: Tensor, moduli: Tensor | Sequence[int]) -> Tensor:
    """Exact ``(lhs - rhs) mod q_l`` per limb (reduced int64 inputs)."""
    if lhs.shape != rhs.shape:
        raise ValueError(f"shapes differ: {list(lhs.shape)} vs {list(rhs.shape)}")
    q = torch.tensor(_moduli_list(moduli), dtype=torch.int64).view(-1, 1)
    _column(moduli, lhs)
    difference = lhs - rhs  # |difference| < 2**62: no overflow
    return torch.where(difference < 0, difference + q, difference)
