"""Share arithmetic batched over every ciphertext of a call: ``[C, L, N]``.

A decryption or key-switch share is, per ciphertext, a product of the
ciphertext's ``c1`` with the party's weighted key share and the NTT of
fresh smudging noise.  :mod:`distir.he.ntt` does one polynomial and one
limb at a time (and the noise as Python integers); here one call does every
ciphertext and every limb at once, on torch int64 words, with no
per-ciphertext or per-coefficient Python beyond the one SHAKE-256 stream
each ciphertext's noise is read from.  The results are bit for bit those of
the unbatched functions (tests check both, and against exact Python
integers).

Why the word products are exact
-------------------------------
Residues are reduced, ``0 <= x < q`` with ``q < 2**62``
(:data:`distir.ir.modular.MAX_MODULUS_EXCLUSIVE`).  A multiplier ``w`` is
prepared once (:class:`Multiplier`) with ``w' = w * 2**31 mod q`` and the
float64 ratios ``w/q`` and ``w'/q``.  Splitting ``x = xh * 2**31 + xl``
(``xh < 2**31``, ``xl < 2**31``, both exact in float64),
``x * w = xh * w' + xl * w (mod q)``, and the quotient
``T = (xh*w' + xl*w) / q`` is below ``2**32``.  Its float64 estimate
``xh*(w'/q) + xl*(w/q)`` carries at most about five roundings of relative
``2**-53`` each, an absolute error below ``2**-18``, so its floor (a
truncation: every term is non-negative) is within one of ``floor(T)`` and
``r = xh*w' + xl*w - qhat*q`` lies in ``[-q, 2q)``.  That window is
narrower than ``2**64``, so ``r`` computed on wrapping int64 words (every
product overflows; two's complement keeps it exact modulo ``2**64``) is the
true value; two branch-free corrections (the subtract-and-mask form of
:mod:`distir.he.rns`: the sign bit, by an arithmetic shift, selects ``q``)
bring it into ``[0, q)``.  ``w'`` itself is ``w << 31`` minus
``floor(w * (2**31/q)) * q`` by the same argument (quotient below
``2**31``).  A sum of two residues is below ``2q < 2**63``: the int64
headroom of :mod:`distir.ir.modular` for two terms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from distir.he.ntt import negacyclic_ntt
from distir.ir.modular import MAX_MODULUS_EXCLUSIVE

__all__ = [
    "Multiplier",
    "add_mod",
    "forward_ntt",
    "moduli_column",
    "mul_mod",
    "multiplier",
    "signed_residues",
    "slices",
    "small_residues",
    "sub_mod",
]

_SPLIT = 31
_LOW = (1 << _SPLIT) - 1
_GRAIN = 32768  # at::internal::GRAIN_SIZE: larger elementwise kernels fork threads


def moduli_column(moduli: Sequence[int], dims: int = 1) -> Tensor:
    """The moduli as int64 ``[L, 1, ..., 1]`` (``dims`` trailing axes), checked."""
    qs = [int(q) for q in moduli]
    if not qs or any(not 2 <= q < MAX_MODULUS_EXCLUSIVE for q in qs):
        raise ValueError(f"moduli must be in [2, 2**62), got {qs}")
    return torch.tensor(qs, dtype=torch.int64).view((-1,) + (1,) * dims)


def _reduce_window_(r: Tensor, q: Tensor) -> Tensor:
    """``r mod q`` in place for ``r`` in ``[-q, 2q)``: add ``q`` where the sign
    bit is set, then subtract ``q`` and add it back where that went negative."""
    r += (r >> 63) & q
    r -= q
    r += (r >> 63) & q
    return r


@dataclass(frozen=True)
class Multiplier:
    """A reduced multiplier ``w`` (int64, broadcastable against what it
    multiplies, limb axis matching the moduli column), ``w' = w*2^31 mod q``
    and the float64 ratios ``w/q``, ``w'/q``: prepared once for every
    product it enters (a key share for every ciphertext, NTT twiddles)."""

    w: Tensor
    shifted: Tensor
    ratio: Tensor
    shifted_ratio: Tensor
    q: Tensor


def multiplier(w: Tensor, q: Tensor) -> Multiplier:
    """:class:`Multiplier` of the reduced ``w`` modulo the column ``q``."""
    w = w.to(torch.int64).contiguous()
    qf = q.double()
    qhat = (w.double() * (float(1 << _SPLIT) / qf)).long()  # quotient < 2^31: off by <= 1
    shifted = _reduce_window_((w << _SPLIT) - qhat * q, q)
    return Multiplier(w, shifted, w.double() / qf, shifted.double() / qf, q)


def mul_mod(x: Tensor, m: Multiplier) -> Tensor:
    """``x * w mod q`` per limb, exactly, for reduced int64 ``x``; a new tensor."""
    high = x >> _SPLIT
    low = x & _LOW
    estimate = high.double().mul_(m.shifted_ratio)
    estimate += low.double().mul_(m.ratio)
    qhat = estimate.long()  # non-negative: truncation is the floor
    high *= m.shifted  # wraps: exact modulo 2^64, and the result is in [-q, 2q)
    low *= m.w
    high += low
    high -= qhat.mul_(m.q)
    return _reduce_window_(high, m.q)


def add_mod(x: Tensor, y: Tensor, q: Tensor) -> Tensor:
    """``(x + y) mod q`` for reduced int64 residues; a new tensor."""
    s = x + y  # < 2q < 2^63
    s -= q
    s += (s >> 63) & q
    return s


def sub_mod(x: Tensor, y: Tensor, q: Tensor) -> Tensor:
    """``(x - y) mod q`` for reduced int64 residues; a new tensor."""
    d = x - y  # in (-q, q)
    d += (d >> 63) & q
    return d


@lru_cache(maxsize=16)
def _stages(moduli: tuple[int, ...], degree: int) -> tuple[Multiplier, ...]:
    """Per butterfly stage (``m = 1, 2, 4, ...``): SEAL's twiddles
    ``psi^bit_reverse`` of every limb as a :class:`Multiplier` ``[L, m, 1]``."""
    roots = torch.from_numpy(
        np.stack([negacyclic_ntt(q, degree)._word_tables()[0] for q in moduli])
    )
    q = moduli_column(moduli, 2)
    out, m = [], 1
    while m < degree:
        out.append(multiplier(roots[:, m : 2 * m].reshape(len(moduli), m, 1), q))
        m *= 2
    return tuple(out)


def forward_ntt(residues: Tensor, moduli: Sequence[int]) -> Tensor:
    """SEAL's forward NTT of every polynomial of ``residues`` (reduced int64
    ``[C, L, N]``, limb ``l`` modulo ``moduli[l]``), all at once: the
    Cooley-Tukey butterflies of :class:`distir.he.ntt.NegacyclicNTT`, each
    stage one vectorised step over ``[C, L, m, gap]``.  Returns a new tensor."""
    moduli = tuple(int(q) for q in moduli)
    if residues.dim() != 3 or residues.shape[1] != len(moduli):
        raise ValueError(
            f"expected residues [C, {len(moduli)}, N], got shape {list(residues.shape)}"
        )
    a = residues.to(torch.int64).clone().contiguous()
    for part in slices(a.shape[0], a.shape[1] * a.shape[2]):
        _forward_ntt_(a[part], moduli)
    return a


def slices(count: int, size: int) -> list[slice]:
    """``count`` items of ``size`` elements each, in slices of at most one
    parallel grain of torch's elementwise kernels (32768 elements: one
    ciphertext at N = 8192 and 3 limbs), at least one item per slice.  Each
    slice stays in cache through every step, and no kernel forks threads:
    on a loaded machine forking cost several times what it saved (measured
    in ``benchmarks/share_arithmetic.py``: 216 against 22 ms per share)."""
    step = max(1, _GRAIN // max(1, size))
    return [slice(lo, min(lo + step, count)) for lo in range(0, count, step)]


def _forward_ntt_(a: Tensor, moduli: tuple[int, ...]) -> None:
    count, limbs, n = a.shape
    q = moduli_column(moduli, 2)
    m, gap = 1, n // 2
    for stage in _stages(moduli, n):
        pairs = a.view(count, limbs, m, 2, gap)
        x, y = pairs[:, :, :, 0, :], pairs[:, :, :, 1, :]
        wy = mul_mod(y, stage)
        y.copy_(sub_mod(x, wy, q))
        x += wy  # in [0, 2q)
        x -= q
        x += (x >> 63) & q
        m, gap = m * 2, gap // 2


def small_residues(values: np.ndarray | Tensor, moduli: Sequence[int]) -> Tensor:
    """Small signed integers (``[C, N]``, ``|v| < min(q)``) as residues
    int64 ``[C, L, N]`` modulo every prime."""
    q = moduli_column(moduli)
    v = torch.as_tensor(values, dtype=torch.int64)[:, None, :]
    return v + ((v >> 63) & q)


def signed_residues(
    streams: Sequence[bytes], bits: int, count: int, moduli: Sequence[int]
) -> Tensor:
    """The integers ``v`` uniform in ``[-2^bits, 2^bits)`` that
    ``distir.he.threshold._uniform_signed`` reads from each stream (``count``
    little-endian chunks of ``ceil((bits + 1) / 8)`` bytes, masked to
    ``bits + 1`` bits, minus ``2^bits``), as residues int64 ``[C, L, N]``
    modulo every prime, with no Python integer per coefficient: a chunk is
    two 64-bit words ``(high, low)`` and ``v = high * 2^64 + low - 2^bits``,
    reduced word by word (``low`` and ``high`` by one exact unsigned
    remainder each, ``high * (2^64 mod q)`` by :func:`mul_mod`)."""
    width = (bits + 8) // 8
    if not 1 <= bits <= 126:
        raise ValueError(f"signed_residues takes 1 to 126 bits (two words), got {bits}")
    qs = [int(q) for q in moduli]
    raw = np.frombuffer(b"".join(streams), dtype=np.uint8).reshape(len(streams), count, width)
    padded = np.zeros((len(streams), count, 16), dtype=np.uint8)
    padded[..., :width] = raw
    words = padded.view("<u8")  # [C, N, 2]
    low, high = words[..., 0].copy(), words[..., 1].copy()
    if bits + 1 <= 64:
        low &= np.uint64((1 << (bits + 1)) - 1)
        high[:] = 0
    else:
        high &= np.uint64((1 << (bits + 1 - 64)) - 1)
    qu = np.array(qs, dtype=np.uint64).reshape(-1, 1)
    low_r = torch.from_numpy((low[:, None, :] % qu).view(np.int64))
    high_r = torch.from_numpy((high[:, None, :] % qu).view(np.int64))
    q = moduli_column(qs)
    shift = multiplier(torch.tensor([(1 << 64) % p for p in qs], dtype=torch.int64).view(-1, 1), q)
    offset = torch.tensor([(1 << bits) % p for p in qs], dtype=torch.int64).view(-1, 1)
    return sub_mod(add_mod(mul_mod(high_r, shift), low_r, q), offset.expand_as(low_r), q)
