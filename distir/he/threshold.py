"""Threshold CKKS arithmetic: key shares, Shamir shares, decryption and
key-switch shares, all per RNS limb in SEAL's NTT form.

The local half of multiparty CKKS for semi-honest parties (Mouchet,
Troncoso-Pastoriza, Bossuat and Hubaux, PETS 2021; t-out-of-N after Mouchet,
Bertrand and Hubaux, ePrint 2022/780, as Lattigo's ``multiparty``
``Thresholdizer``/``Combiner`` implement it).  Nothing here talks to another
rank: the protocol -- which values are summed, gathered or agreed, and over
which channel -- is :mod:`distir.aggregation`, above the runtime.

* **Key generation** (N-out-of-N).  Party ``i`` draws a ternary secret
  ``s_i`` and SEAL's centred binomial noise ``e_i`` and publishes
  ``h_i = e_i - a*s_i`` for a public uniform ``a``; ``(sum_i h_i, a)`` is an
  ordinary RLWE public key for ``s = sum_i s_i``, which exists nowhere.
* **Thresholdization** (t-out-of-N).  Party ``i`` draws a polynomial
  ``f_i(X) = s_i + c_1 X + ... + c_(t-1) X^(t-1)`` whose coefficients are
  ring elements uniform modulo every key prime, and hands party ``j`` the
  Shamir share ``f_i(x_j)`` at the public point ``x_j = j + 1``
  (:func:`shamir_shares`).  Party ``j`` keeps ``sk_j = sum_i f_i(x_j)``.
  Any set ``T`` of ``t`` parties holds ``s = sum_(j in T) lambda_j * sk_j``
  with the Lagrange coefficients ``lambda_j = prod_(k in T, k != j)
  x_k / (x_k - x_j)`` modulo each prime (:func:`lagrange_coefficients`);
  fewer than ``t`` shares are jointly uniform, independent of ``s``.
* **Decryption.**  For ``(c0, c1)`` each active party publishes
  ``d_j = c1 * lambda_j * sk_j + e'_j`` (:func:`decryption_share`) and
  ``m = c0 + sum_j d_j`` decodes to the plaintext plus smudging noise.
* **Public-key switching** (Lattigo's ``PublicKeySwitchProtocol``).  For a
  receiver's public key ``(p0, p1)``, each active party publishes
  ``(h0_j, h1_j) = (lambda_j*sk_j*c1 + u_j*p0 + e0_j, u_j*p1 + e1_j)`` with
  a fresh ternary ``u_j``, smudging ``e0_j`` and centred binomial ``e1_j``
  (:func:`key_switch_share`); ``(c0 + sum h0_j, sum h1_j)`` is a ciphertext
  of the same plaintext under the receiver's key.

Randomness
----------
Secrets, Shamir coefficients and key noise come from :mod:`secrets` only:
no public function takes a seed (a reused seed turns two decryption shares
into ``(c1 - c1')*s_j``, which reveals ``s_j``).  Smudging noise is derived,
not drawn: a keyed BLAKE2b of the share's private ``noise_key``, the
ciphertext's digest and the active set seeds a SHAKE-256 stream, so a retry
of the same decryption publishes the same share (nothing new) and any other
decryption gets independent noise.  Tests reach the private ``_seed`` hooks.

Smudging noise: width, security, budget, precision
--------------------------------------------------
For ``P`` fresh public-key encryptions summed at ``N`` coefficients the
aggregate's noise ``e_ct`` satisfies ``|e_ct|_inf <= B = P*(3 + N*P)/2 + P``
(SEAL's rounding ``r0 + r1*s`` after dividing by the special prime with
``|r| <= 1/2`` and ``|s|_1 <= N*P``).  Without smudging, a decryption
reveals ``e_ct``, which depends on the secret key (Li-Micciancio).  Each
share adds ``e'_j`` uniform in ``[-2^b, 2^b)`` with ``b = ceil(log2(N*B)) +
lambda + ceil(log2(D)) - 1`` for ``D = max_decryptions``: one decryption is
within statistical distance ``N*B / 2^(b+1) <= 2^-lambda / D`` of one that
reveals nothing beyond the plaintext, so all ``D`` of a share's budget are
within ``2^-lambda`` together.  A key switch must hide in addition the
receiver-dependent ``sum_j (u_j*e_pk + s_out*e1_j)``, ``|.| <= 2*21*N*P``
(``B_ks = B + 42*N*P``; its width is :attr:`key_switch_bits`).  The noise
costs precision: a decoded slot carries a real-part standard deviation of
``2^b * sqrt(P*N/6) / Delta`` (:attr:`ThresholdParameters.smudging_error_std`),
paid for with the default ``Delta = 2^120`` in a 160-bit data modulus: an
aggregation needs no multiplicative depth.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from torch import Tensor

from distir.errors import DistirError
from distir.he import batched
from distir.he.ntt import from_ntt, mul_mod, sub_mod, to_ntt
from distir.he.rns import TorchRNSBackend
from distir.he.seal import (
    CiphertextHeader,
    context_from_key_limbs,
    import_tenseal,
    limbs_to_ckks,
    limbs_to_vector,
    parse_ckks_chunks,
)

__all__ = [
    "CollectivePublicKey",
    "DecryptionBudgetExhausted",
    "InsecureParameters",
    "RankDecryptionRefused",
    "ShareFileRefused",
    "ThresholdMismatch",
    "ThresholdParameters",
    "ThresholdShare",
    "UnsafeReceiverKey",
    "add_shares",
    "check_receiver_key",
    "collective_public_key_from_sum",
    "common_random_polynomial",
    "decode",
    "decode_all",
    "decoder",
    "decryption_share",
    "decryption_shares",
    "generate_secret_share",
    "key_switch_share",
    "key_switch_shares",
    "lagrange_coefficients",
    "new_threshold_share",
    "public_key_share",
    "receiver_context",
    "reshare_shares",
    "shamir_point",
    "shamir_shares",
]

#: Domain-separation labels of the SHAKE-256 streams every draw comes from.
_LABEL = b"distir/threshold/v1/"
SEED_BYTES = 32
_SHARE_FORMAT = "distir-threshold-share/v1"
_SEALED = b"distir-threshold-share/v1+chacha20-poly1305\n"  # header of an encrypted file


class ThresholdMismatch(DistirError):
    """Ranks of a threshold protocol step disagree on something that must be
    the same everywhere (the parameters, the group size, the public key, the
    aggregate being decrypted) or a step was called with a group it cannot
    serve; raised on every rank, and nothing is returned."""


class InsecureParameters(DistirError, ValueError):
    """Threshold parameters that give no protection: ``threshold=1`` (every
    rank would hold the whole key, a decryption of anything by itself)."""


class UnsafeReceiverKey(DistirError, ValueError):
    """A receiver public key that the ranks can decrypt under (zero, small
    or structured polynomials, or the collective key itself): a key switch
    to it would hand them the aggregate in the clear."""


class ShareFileRefused(DistirError, PermissionError):
    """A share file that is a symbolic link, or that does not decrypt under
    the key given (or was given none and is encrypted, or the reverse)."""


class RankDecryptionRefused(DistirError):
    """``decrypt`` under a key whose parameters do not allow decryption to
    the ranks (``decrypt_to_ranks=False``, the default): a rank's crafted
    input would make that decryption reveal the collective secret key.
    Raised on every rank, before anything secret-dependent is published."""


class DecryptionBudgetExhausted(DistirError):
    """A share has published ``max_decryptions`` decryption (or key-switch)
    shares: one more would exceed the smudging bound's budget."""


# ------------------------------------------------------------------ parameters
@dataclass(frozen=True)
class ThresholdParameters:
    """CKKS parameters of a threshold group of ``parties`` ranks, any
    ``threshold`` of which decrypt (default: all of them).

    ``coeff_mod_bit_sizes`` are SEAL's (the last prime is the special one);
    ``statistical_security`` is the ``lambda`` and ``max_decryptions`` the
    ``D`` of the smudging bound (see the module docstring).  Raises
    ``ValueError`` when the smudging noise would drown the message at this
    scale.

    ``decrypt_to_ranks`` (default False) allows the ranks themselves to
    decrypt an aggregate.  Nothing checks that a rank's input is a
    well-formed fresh encryption, and a crafted one (``2^k * (b, a)`` from
    the public key ``(b, a)``) decrypts to ``2^k * e``, the key's noise,
    from which ``s = (e - b) / a``: whoever sees that decryption holds the
    collective key and decrypts every rank's individual ciphertext.  By
    default an aggregate therefore leaves only through ``switch_key`` to an
    outside receiver; set it True only where every rank is trusted with
    its input (or the receiver of the decryption is)."""

    parties: int
    threshold: int | None = None
    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 50, 50, 50)
    scale: float = 2.0**120
    statistical_security: int = 40
    max_decryptions: int = 2**16
    decrypt_to_ranks: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "coeff_mod_bit_sizes", tuple(self.coeff_mod_bit_sizes))
        if self.threshold is None:
            object.__setattr__(self, "threshold", self.parties)
        if self.parties < 1:
            raise ValueError(f"a threshold group needs at least one party, got {self.parties}")
        if not 1 <= self.threshold <= self.parties:
            raise ValueError(
                f"threshold must be between 1 and parties ({self.parties}), got {self.threshold}"
            )
        if self.threshold < 2:
            raise InsecureParameters(
                f"threshold=1 for {self.parties} parties: every rank would hold the whole "
                "collective key and decrypt any rank's ciphertext alone; use threshold >= 2 "
                "(input privacy needs max(2, parties - threshold + 1) honest ranks)"
            )
        n = self.poly_modulus_degree
        if n < 1024 or n & (n - 1):
            raise ValueError(f"poly_modulus_degree must be a power of two >= 1024, got {n}")
        if len(self.coeff_mod_bit_sizes) < 2:
            raise ValueError("coeff_mod_bit_sizes needs a data prime and a special prime")
        if self.statistical_security < 1:
            raise ValueError(f"statistical_security must be >= 1, got {self.statistical_security}")
        if self.max_decryptions < 1:
            raise ValueError(f"max_decryptions must be >= 1, got {self.max_decryptions}")
        worst = max(self.smudging_error_std, self.key_switch_error_std)
        if worst > 2.0**-10:
            raise ValueError(
                f"smudging noise of {self.key_switch_bits} bits for {self.parties} parties and "
                f"{self.max_decryptions} decryptions gives a per-slot error of {worst:.3g} at "
                f"scale 2^{math.log2(self.scale):.0f}: raise the scale, lower "
                "statistical_security or max_decryptions"
            )
        data_bits = sum(self.coeff_mod_bit_sizes[:-1])
        if math.log2(self.scale) + 20 > data_bits:
            raise ValueError(
                f"scale 2^{math.log2(self.scale):.0f} leaves less than 20 bits of the "
                f"{data_bits}-bit data modulus for the values"
            )

    @property
    def minimum_honest_ranks(self) -> int:
        """``max(2, parties - threshold + 1)``: the honest ranks each rank's
        input privacy needs.  A coalition of ``threshold`` ranks decrypts any
        individual ciphertext, so fewer than ``threshold`` may collude; and a
        sum minus the inputs of all ranks but one is that rank's input, so
        at least two must be honest."""
        return max(2, self.parties - self.threshold + 1)

    @cached_property
    def key_moduli(self) -> tuple[int, ...]:
        """Every prime of the coefficient modulus, the special one last
        (SEAL's ``CoeffModulus::Create``): the level keys live at."""
        ts = import_tenseal()
        primes = ts.sealapi.CoeffModulus.Create(
            self.poly_modulus_degree, list(self.coeff_mod_bit_sizes)
        )
        return tuple(int(p.value()) for p in primes)

    @property
    def data_moduli(self) -> tuple[int, ...]:
        """The primes of fresh ciphertexts (the key level minus the special prime)."""
        return self.key_moduli[:-1]

    @property
    def ciphertext_noise_bound(self) -> int:
        """``B``: a bound on ``|e_ct|_inf`` for the sum of ``parties`` fresh
        encryptions under the collective key."""
        p, n = self.parties, self.poly_modulus_degree
        return p * (3 + n * p) // 2 + p

    def _bits(self, bound: int) -> int:
        worst = self.poly_modulus_degree * bound
        budget = (self.max_decryptions - 1).bit_length()
        return (worst - 1).bit_length() + self.statistical_security + budget - 1

    @property
    def smudging_bits(self) -> int:
        """``b``: a decryption share's smudging coefficients are uniform in
        ``[-2^b, 2^b)``, with ``D * N*B / 2^(b+1) <= 2^-statistical_security``."""
        return self._bits(self.ciphertext_noise_bound)

    @property
    def key_switch_bits(self) -> int:
        """The width of a key-switch share's smudging, for ``B_ks = B + 42*N*P``."""
        return self._bits(
            self.ciphertext_noise_bound + 42 * self.poly_modulus_degree * self.parties
        )

    @property
    def statistical_distance(self) -> float:
        """The bound ``N*B / 2^(b+1)`` on what one decryption reveals about
        the aggregate's noise; ``max_decryptions`` of them stay within
        ``2^-statistical_security``."""
        worst = self.poly_modulus_degree * self.ciphertext_noise_bound
        return worst / 2.0 ** (self.smudging_bits + 1)

    def _std(self, bits: int) -> float:
        return 2.0**bits * math.sqrt(self.parties * self.poly_modulus_degree / 6) / self.scale

    @property
    def smudging_error_std(self) -> float:
        """Standard deviation of the error the smudging adds to each decoded
        slot (real part), at most ``parties`` shares:
        ``2^b * sqrt(parties * N / 6) / scale``."""
        return self._std(self.smudging_bits)

    @property
    def key_switch_error_std(self) -> float:
        """The same for a key switch (width :attr:`key_switch_bits`)."""
        return self._std(self.key_switch_bits)

    def digest(self) -> bytes:
        """A SHA-256 of every field: ranks agree on it before any step."""
        return hashlib.sha256(repr(sorted(asdict(self).items())).encode()).digest()


@lru_cache(maxsize=8)
def _template_context(degree: int, bits: tuple[int, ...], scale: float) -> Any:
    """A TenSEAL context used only as a format template (encryption
    parameters, ``parms_id``, scale).  UNSAFE for data: it holds a
    single-party key pair of its own, which nothing here ever uses."""
    ts = import_tenseal()
    context = ts.context(ts.SCHEME_TYPE.CKKS, degree, coeff_mod_bit_sizes=list(bits))
    context.global_scale = scale
    return context


def _template(parameters: ThresholdParameters) -> Any:
    return _template_context(
        parameters.poly_modulus_degree, parameters.coeff_mod_bit_sizes, parameters.scale
    )


def receiver_context(parameters: ThresholdParameters) -> Any:
    """An outside receiver's own private TenSEAL context with these
    parameters (SEAL's ``KeyGenerator``): the receiver keeps it and hands the
    ranks ``distir.he.seal.public_key_limbs(context)``."""
    ts = import_tenseal()
    context = ts.context(
        ts.SCHEME_TYPE.CKKS,
        parameters.poly_modulus_degree,
        coeff_mod_bit_sizes=list(parameters.coeff_mod_bit_sizes),
    )
    context.global_scale = parameters.scale
    return context


# -------------------------------------------------------------------- sampling
def _fresh(seed: bytes | None) -> bytes:
    return secrets.token_bytes(SEED_BYTES) if seed is None else bytes(seed)


def _stream(label: str, seed: bytes, nbytes: int) -> bytes:
    """The first ``nbytes`` of SHAKE-256(``_LABEL + label + b"\\0" + seed``)."""
    return hashlib.shake_256(_LABEL + label.encode() + b"\0" + seed).digest(nbytes)


def _accepted(label: str, seed: bytes, count: int, width: int, accept: Any) -> np.ndarray:
    """The first ``count`` words of ``width`` bytes of a stream that
    ``accept`` keeps (rejection sampling; the stream is prefix-stable)."""
    words = count + count // 8 + 64
    while True:
        raw = np.frombuffer(_stream(label, seed, words * width), dtype=f"<u{width}")
        kept = raw[accept(raw)]
        if kept.size >= count:
            return kept[:count]
        words *= 2


def _uniform_mod(label: str, seed: bytes, modulus: int, count: int) -> np.ndarray:
    """``count`` residues uniform modulo ``modulus`` (64-bit words below the
    largest multiple of ``modulus``, reduced; SEAL's ``sample_poly_uniform``)."""
    limit = np.uint64((1 << 64) // modulus * modulus - 1)
    words = _accepted(label, seed, count, 8, lambda w: w <= limit)
    return (words % np.uint64(modulus)).astype(np.int64)


def _uniform_poly(label: str, seed: bytes, moduli: Sequence[int], n: int) -> Tensor:
    rows = [_uniform_mod(f"{label}/{index}", seed, q, n) for index, q in enumerate(moduli)]
    return torch.from_numpy(np.stack(rows))


def _ternary(label: str, seed: bytes, count: int) -> np.ndarray:
    """``count`` coefficients uniform in {-1, 0, 1}: ``byte % 3 - 1`` for the
    stream's bytes below 255."""
    kept = _accepted(label, seed, count, 1, lambda b: b < 255)
    return kept.astype(np.int64) % 3 - 1


def _centered_binomial(label: str, seed: bytes, count: int) -> np.ndarray:
    """SEAL's centred binomial noise (sigma ~ 3.24, |e| <= 21): per
    coefficient 6 bytes ``x``, ``x[2]`` and ``x[5]`` masked to 5 bits,
    ``popcount(x[0:3]) - popcount(x[3:6])``."""
    raw = np.frombuffer(_stream(label, seed, 6 * count), dtype=np.uint8).reshape(count, 6)
    raw = raw & np.array([0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x1F], dtype=np.uint8)
    bits = np.unpackbits(raw, axis=1).reshape(count, 2, 24).sum(axis=2, dtype=np.int64)
    return bits[:, 0] - bits[:, 1]


def _uniform_signed(label: str, seed: bytes, bits: int, count: int) -> np.ndarray:
    """``count`` integers uniform in ``[-2^bits, 2^bits)``: consecutive
    little-endian chunks of ``ceil((bits + 1) / 8)`` bytes, masked to
    ``bits + 1`` bits, minus ``2^bits`` (object array of Python ints)."""
    width = (bits + 8) // 8
    if width > 16:  # wider than two words: one Python int per chunk
        raw = _stream(label, seed, width * count)
        mask = (1 << (bits + 1)) - 1
        chunks = [raw[k * width : (k + 1) * width] for k in range(count)]
        values = [(int.from_bytes(c, "little") & mask) - (1 << bits) for c in chunks]
        return np.array(values, dtype=object)
    raw = np.frombuffer(_stream(label, seed, width * count), dtype=np.uint8).reshape(count, width)
    # Whole chunks as (high, low) 64-bit words, combined once as Python
    # ints (no per-coefficient Python loop); the mask keeps bits + 1 bits.
    padded = np.zeros((count, 16), dtype=np.uint8)
    padded[:, :width] = raw
    words = padded.view("<u8")
    low, high = words[:, 0].copy(), words[:, 1].copy()
    if bits + 1 <= 64:
        low &= np.uint64((1 << (bits + 1)) - 1)
        high[:] = 0
    else:
        high &= np.uint64((1 << (bits + 1 - 64)) - 1)
    values = high.astype(object) * (1 << 64) + low.astype(object)
    return values - (1 << bits)


def _moduli_tensor(moduli: Sequence[int]) -> Tensor:
    return torch.tensor(list(moduli), dtype=torch.int64)


def _scalar_mul(limbs: Tensor, scalars: Sequence[int], moduli: Sequence[int]) -> Tensor:
    """``limbs * scalars[l] mod q_l`` per limb ``l`` (exact)."""
    column = torch.tensor([s % q for s, q in zip(scalars, moduli, strict=True)], dtype=torch.int64)
    return mul_mod(limbs, column.view(-1, 1).expand_as(limbs).contiguous(), moduli)


def _check_limbs(limbs: Tensor, shape: tuple[int, ...], moduli: Sequence[int], what: str) -> None:
    if not isinstance(limbs, Tensor) or limbs.dtype != torch.int64:
        raise TypeError(f"{what} must be an int64 torch.Tensor, got {limbs!r:.60}")
    if tuple(limbs.shape) != shape:
        raise ValueError(f"{what} must have shape {list(shape)}, got {list(limbs.shape)}")
    TorchRNSBackend().check_reduced(limbs, _moduli_tensor(moduli))


def add_shares(base: Tensor, shares: Sequence[Tensor], moduli: Sequence[int]) -> Tensor:
    """``base + sum(shares)`` per limb (local, exact)."""
    q = _moduli_tensor(moduli)
    backend = TorchRNSBackend()
    total = base.clone()
    for share in shares:
        _check_limbs(share, tuple(base.shape), moduli, "share")
        backend.add_mod_(total, share, q)
    return total


# ------------------------------------------------------------------ key shares
@dataclass(frozen=True, eq=False)
class _AdditiveSecret:
    """A party's N-out-of-N secret ``s_i`` (int64 ``[K, N]``, NTT form, key
    level).  Lives only inside key generation; never returned to a user."""

    parameters: ThresholdParameters
    limbs: Tensor = field(repr=False)


@dataclass(frozen=True, eq=False)
class CollectivePublicKey:
    """The collective public key ``(b, a)``: int64 limbs ``[2, K, N]`` in
    NTT form at the key level, an RLWE public key for ``s`` that no rank holds."""

    parameters: ThresholdParameters
    limbs: Tensor = field(repr=False)

    def context(self) -> Any:
        """A public TenSEAL context (no secret key) that encrypts under this
        key: ``ts.ckks_vector(key.context(), values)``."""
        return context_from_key_limbs(_template(self.parameters), public_key=self.limbs)

    def serialize(self) -> bytes:
        """The public TenSEAL context, serialized (``ts.context_from`` loads it)."""
        return self.context().serialize()

    def digest(self) -> bytes:
        return hashlib.sha256(self.limbs.contiguous().numpy().tobytes()).digest()


def common_random_polynomial(parameters: ThresholdParameters, seed: bytes) -> Tensor:
    """The common random polynomial ``a``: int64 ``[K, N]``, uniform modulo
    every key prime, from a *public* ``seed`` every rank shares (limb ``l``
    from the SHAKE-256 stream labelled ``crp/<l>``)."""
    if not isinstance(seed, bytes | bytearray) or not seed:
        raise TypeError("the common random polynomial needs the group's public seed (bytes)")
    return _uniform_poly("crp", bytes(seed), parameters.key_moduli, parameters.poly_modulus_degree)


def generate_secret_share(parameters: ThresholdParameters) -> _AdditiveSecret:
    """A fresh ternary secret ``s_i`` (SEAL's ``sample_poly_ternary``) in NTT
    form at the key level."""
    return _secret_share(parameters)


def _secret_share(parameters: ThresholdParameters, _seed: bytes | None = None) -> _AdditiveSecret:
    coefficients = _ternary("secret", _fresh(_seed), parameters.poly_modulus_degree)
    return _AdditiveSecret(parameters, to_ntt(coefficients, parameters.key_moduli))


def public_key_share(secret: _AdditiveSecret, crp: Tensor) -> Tensor:
    """``h_i = e_i - a*s_i`` (int64 ``[K, N]``) with fresh centred binomial ``e_i``."""
    return _public_key_share(secret, crp)


def _public_key_share(secret: _AdditiveSecret, crp: Tensor, _seed: bytes | None = None) -> Tensor:
    parameters = secret.parameters
    moduli = parameters.key_moduli
    _check_limbs(crp, (len(moduli), parameters.poly_modulus_degree), moduli, "crp")
    noise = _centered_binomial("key-noise", _fresh(_seed), parameters.poly_modulus_degree)
    return sub_mod(to_ntt(noise, moduli), mul_mod(crp, secret.limbs, moduli), moduli)


def collective_public_key_from_sum(
    parameters: ThresholdParameters, b: Tensor, crp: Tensor
) -> CollectivePublicKey:
    """``(sum_i h_i, a)`` as a key, once the sum is known."""
    shape = (len(parameters.key_moduli), parameters.poly_modulus_degree)
    _check_limbs(b, shape, parameters.key_moduli, "summed key share")
    return CollectivePublicKey(parameters, torch.stack([b, crp]))


# -------------------------------------------------------------- Shamir shares
def shamir_point(party: int) -> int:
    """The public evaluation point of party ``party`` (0-based): ``party + 1``."""
    return party + 1


def shamir_shares(secret: _AdditiveSecret) -> list[Tensor]:
    """``f_i(x_j)`` for every party ``j`` (int64 ``[K, N]`` each): Shamir
    shares of ``s_i`` under a fresh polynomial of degree ``threshold - 1``
    whose coefficients are uniform modulo every key prime."""
    return _shamir_shares(secret)


def _shamir_shares(secret: _AdditiveSecret, _seed: bytes | None = None) -> list[Tensor]:
    parameters = secret.parameters
    moduli = parameters.key_moduli
    seed = _fresh(_seed)
    coefficients = [
        _uniform_poly(f"shamir/{k}", seed, moduli, parameters.poly_modulus_degree)
        for k in range(1, parameters.threshold)
    ]
    backend, q = TorchRNSBackend(), _moduli_tensor(moduli)
    out = []
    for party in range(parameters.parties):
        x = shamir_point(party)
        value = torch.zeros_like(secret.limbs)
        for c in reversed(coefficients):  # Horner: ((c_(t-1) x + c_(t-2)) x + ...) x + s
            value = _scalar_mul(backend.add_mod(value, c, q), [x] * len(moduli), moduli)
        out.append(backend.add_mod(value, secret.limbs, q))
    return out


def lagrange_coefficients(parties: Sequence[int], moduli: Sequence[int]) -> dict[int, list[int]]:
    """``lambda_j`` modulo every prime, for each party ``j`` of the active set
    ``parties``: ``sum_j lambda_j * f(x_j) = f(0)`` for any polynomial of
    degree below ``len(parties)``."""
    if len(set(parties)) != len(parties):
        raise ValueError(f"active parties must be distinct, got {list(parties)}")
    out = {}
    for j in parties:
        xj = shamir_point(j)
        row = []
        for q in moduli:
            num, den = 1, 1
            for k in parties:
                if k != j:
                    xk = shamir_point(k)
                    num = num * xk % q
                    den = den * (xk - xj) % q
            row.append(num * pow(den, -1, q) % q)
        out[j] = row
    return out


# ------------------------------------------------------------ threshold share
class ThresholdShare:
    """Party ``party``'s Shamir share ``sk_j`` of the collective secret (int64
    ``[K, N]``, NTT form, key level), with the private ``noise_key`` its
    smudging noise is derived from and the record of decryptions spent.

    It never leaves its rank: its repr shows neither, :meth:`save` writes a
    file only its owner can read (mode 0600), :meth:`load` refuses a file
    others can read.

    The budget sticks to the file: once saved or loaded, the share is bound
    to its path, and every spending rewrites that file (a new file, synced,
    renamed over the old one, the folder synced) *before* the share's
    decryption shares are published, so a crash at any point leaves a file
    whose count covers everything published, and loading the file again
    keeps the count.  What software cannot stop: a holder who copies the
    file and later restores the copy gets the copy's count back.  That
    rank alone gains nothing -- every decryption first agrees on every
    active rank's budget, so the others still refuse -- but if every rank
    of a decrypting group restores old copies, their shares exceed the
    budget the smudging bound assumes."""

    def __init__(
        self,
        parameters: ThresholdParameters,
        party: int,
        public_key: CollectivePublicKey,
        limbs: Tensor,
        noise_key: bytes,
        spent: Sequence[bytes] = (),
    ):
        self.parameters = parameters
        self.party = party
        self.public_key = public_key
        self._limbs = limbs
        self._noise_key = bytes(noise_key)
        self._spent = set(spent)
        self._path: Path | None = None  # where spending is persisted, once saved or loaded
        self._file_key: bytes | None = None  # the caller's key for that file, if encrypted

    def __repr__(self) -> str:
        p = self.parameters
        return (
            f"ThresholdShare(party={self.party}, parties={p.parties}, threshold={p.threshold}, "
            f"decryptions={len(self._spent)}/{p.max_decryptions})"
        )

    def __reduce__(self) -> Any:
        raise TypeError("a ThresholdShare is not pickled (it would leave its rank); use save()")

    @property
    def decryptions_left(self) -> int:
        return self.parameters.max_decryptions - len(self._spent)

    def _noise_seed(self, what: str, context: bytes) -> tuple[bytes, bytes]:
        """(seed, tag): the smudging seed of this decryption and its record."""
        tag = hashlib.blake2b(what.encode() + b"\0" + context, digest_size=32).digest()
        seed = hashlib.blake2b(
            tag, key=self._noise_key, person=b"distir-smudging", digest_size=32
        ).digest()
        return seed, tag

    def _spend(self, tags: Sequence[bytes]) -> None:
        new = set(tags) - self._spent
        if len(self._spent) + len(new) > self.parameters.max_decryptions:
            raise DecryptionBudgetExhausted(
                f"share of party {self.party} has {self.decryptions_left} of "
                f"{self.parameters.max_decryptions} decryptions left, {len(new)} requested"
            )
        if new and self._path is not None:
            # persisted first: a failed write raises with nothing spent or published
            self._write(self._path, self._spent | new)
        self._spent |= new

    def save(self, path: str | os.PathLike, *, key: bytes | None = None) -> None:
        """Write the share to ``path`` (mode 0600, atomically: a new file
        renamed over the old one) and bind the share to it: every later
        spending is written there before it is published.  ``path`` must not
        be a symbolic link (:class:`ShareFileRefused`).

        With ``key`` (32 bytes of the caller's, e.g. from a key manager) the
        file is encrypted at rest with ChaCha20-Poly1305 (``cryptography``'s),
        and :meth:`load` needs the same key; the share keeps the key in
        memory to rewrite the file as it spends."""
        if key is not None and (not isinstance(key, bytes) or len(key) != 32):
            raise TypeError("a share file's key must be 32 bytes")
        path = Path(path)
        if path.is_symlink():
            raise ShareFileRefused(f"{path}: a threshold share is not saved through a symlink")
        self._file_key = key
        self._write(path, self._spent)
        self._path = path

    def _write(self, path: Path, spent: set[bytes]) -> None:
        record = {
            "format": _SHARE_FORMAT,
            "parameters": {k: v for k, v in asdict(self.parameters).items()},
            "party": self.party,
            "public_key": self.public_key.limbs,
            "share": self._limbs,
            "noise_key": torch.frombuffer(bytearray(self._noise_key), dtype=torch.uint8),
            "spent": sorted(t.hex() for t in spent),
        }
        record["parameters"]["coeff_mod_bit_sizes"] = list(self.parameters.coeff_mod_bit_sizes)
        buffer = io.BytesIO()
        torch.save(record, buffer)
        data = buffer.getvalue()
        if self._file_key is not None:
            nonce = secrets.token_bytes(12)
            data = _SEALED + nonce + ChaCha20Poly1305(self._file_key).encrypt(nonce, data, _SEALED)
        folder = path.parent
        temporary = folder / f".{path.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        folder_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(folder_fd)
        finally:
            os.close(folder_fd)

    @classmethod
    def load(cls, path: str | os.PathLike, *, key: bytes | None = None) -> ThresholdShare:
        """Read a share :meth:`save` wrote, bound to ``path`` as :meth:`save`
        binds it (its spending goes on being written there); the file must
        not be readable by group or others, nor a symbolic link, and
        ``key`` is the one it was saved with (None: saved unencrypted)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            if Path(path).is_symlink():
                raise ShareFileRefused(
                    f"{path}: a threshold share is not loaded through a symlink"
                ) from None
            raise e
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise PermissionError(
                    f"{path}: a threshold share file must be private (mode 0600), got "
                    f"{oct(mode & 0o777)}"
                )
            data = f.read()
        if data.startswith(_SEALED) != (key is not None):
            raise ShareFileRefused(
                f"{path}: the share file is {'' if data.startswith(_SEALED) else 'not '}"
                f"encrypted but load was given {'a' if key is not None else 'no'} key"
            )
        if key is not None:
            nonce, sealed = data[len(_SEALED) : len(_SEALED) + 12], data[len(_SEALED) + 12 :]
            try:
                data = ChaCha20Poly1305(key).decrypt(nonce, sealed, _SEALED)
            except InvalidTag:
                raise ShareFileRefused(
                    f"{path}: the share file does not decrypt under this key (wrong key, or "
                    "altered)"
                ) from None
        record = torch.load(io.BytesIO(data), weights_only=True)
        if not isinstance(record, dict) or record.get("format") != _SHARE_FORMAT:
            raise ValueError(f"{path} is not a {_SHARE_FORMAT} file")
        fields = dict(record["parameters"])
        fields["coeff_mod_bit_sizes"] = tuple(fields["coeff_mod_bit_sizes"])
        parameters = ThresholdParameters(**fields)
        moduli = parameters.key_moduli
        shape = (len(moduli), parameters.poly_modulus_degree)
        _check_limbs(record["share"], shape, moduli, f"{path}: share")
        _check_limbs(record["public_key"][0], shape, moduli, f"{path}: public key")
        public_key = CollectivePublicKey(parameters, record["public_key"])
        share = cls(
            parameters,
            int(record["party"]),
            public_key,
            record["share"],
            bytes(record["noise_key"].tolist()),
            [bytes.fromhex(t) for t in record["spent"]],
        )
        share._path = Path(path)
        share._file_key = key
        return share


def _new_threshold_share(
    parameters: ThresholdParameters,
    party: int,
    public_key: CollectivePublicKey,
    received: Sequence[Tensor],
) -> ThresholdShare:
    """``sk_j = sum_i f_i(x_j)`` from the Shamir shares party ``party`` received."""
    moduli = parameters.key_moduli
    total = add_shares(torch.zeros_like(received[0]), received, moduli)
    return ThresholdShare(parameters, party, public_key, total, secrets.token_bytes(SEED_BYTES))


def new_threshold_share(
    parameters: ThresholdParameters,
    party: int,
    public_key: CollectivePublicKey,
    received: Sequence[Tensor],
) -> ThresholdShare:
    """The share of party ``party`` from the ``parties`` Shamir shares it
    received (one from every party, its own included)."""
    if len(received) != parameters.parties:
        raise ValueError(f"expected {parameters.parties} Shamir shares, got {len(received)}")
    return _new_threshold_share(parameters, party, public_key, received)


# ------------------------------------------------- decryption and key switch
def _active_weight(share: ThresholdShare, active: Sequence[int], moduli: Sequence[int]) -> Tensor:
    """``lambda_j * sk_j`` at the ciphertext's level for the active set."""
    parameters = share.parameters
    if share.party not in active:
        raise ValueError(f"party {share.party} is not in the active set {sorted(active)}")
    if len(active) < parameters.threshold:
        raise ValueError(
            f"{len(active)} active parties cannot decrypt: the threshold is {parameters.threshold}"
        )
    if any(not 0 <= p < parameters.parties for p in active):
        raise ValueError(f"active parties {sorted(active)} outside 0..{parameters.parties - 1}")
    weights = lagrange_coefficients(sorted(active), moduli)[share.party]
    return _scalar_mul(share._limbs[: len(moduli)], weights, moduli)


def reshare_shares(
    share: ThresholdShare, active: Sequence[int], parameters: ThresholdParameters
) -> list[Tensor]:
    """Party ``share.party``'s part of a re-sharing by the set ``active`` (at
    least ``share.parameters.threshold`` old parties): Shamir shares, for
    the ``parameters.parties`` new parties with the new threshold, of
    ``lambda_j * sk_j`` (int64 ``[K, N]`` each).  Summed over the active
    set, new party ``k`` gets a fresh Shamir share of the same key ``s``;
    the new polynomial's coefficients are fresh, so the new shares say
    nothing about the old ones beyond ``s`` itself."""
    moduli = share.parameters.key_moduli
    if parameters.key_moduli != moduli:
        raise ValueError("re-sharing keeps the key's ring: the new parameters' moduli differ")
    weight = _active_weight(share, active, moduli)
    return _shamir_shares(_AdditiveSecret(parameters, weight))


def _check_level(parameters: ThresholdParameters, limbs: Tensor, moduli: Sequence[int]) -> None:
    if tuple(moduli) != parameters.key_moduli[: len(moduli)]:
        raise ValueError("the ciphertext's moduli are not those of this share's parameters")
    if limbs.dim() != 4 or limbs.shape[1] != 2:
        raise ValueError(
            "collective decryption needs 2-polynomial ciphertexts [n, 2, L, N], got shape "
            f"{list(limbs.shape)}"
        )


def _context_bytes(limbs: Tensor, active: Sequence[int], extra: bytes = b"") -> bytes:
    h = hashlib.sha256(limbs.contiguous().numpy().tobytes())
    h.update(np.array(sorted(active), dtype="<i8").tobytes())
    h.update(extra)
    return h.digest()


def _noise_seeds(
    share: ThresholdShare, what: str, limbs: Tensor, active: Sequence[int], extra: bytes = b""
) -> tuple[list[bytes], list[bytes]]:
    """The smudging seed and budget record of every ciphertext of ``limbs``."""
    pairs = [share._noise_seed(what, _context_bytes(c, active, extra)) for c in limbs]
    return [seed for seed, _ in pairs], [tag for _, tag in pairs]


def decryption_shares(
    share: ThresholdShare, limbs: Tensor, moduli: Sequence[int], active: Sequence[int]
) -> tuple[Tensor, list[bytes]]:
    """``(d, tags)``: party ``share.party``'s decryption shares of the
    ciphertexts ``limbs = [(c0, c1), ...]`` (int64 ``[n, 2, L, N]`` at
    ``moduli``) for the set of ``active`` parties,
    ``d_j = c1 * lambda_j * sk_j + e'_j`` (int64 ``[n, L, N]``), and the
    budget records they spend (``share._spend(tags)``; the caller spends them
    once every rank agreed to go ahead).  ``e'_j`` is derived from the
    share's noise key, the ciphertext and the active set: the same
    decryption repeated yields the same share."""
    parameters = share.parameters
    _check_level(parameters, limbs, moduli)
    weight = batched.multiplier(
        _active_weight(share, active, moduli), batched.moduli_column(moduli)
    )
    n, bits = parameters.poly_modulus_degree, parameters.smudging_bits
    seeds, tags = _noise_seeds(share, "decrypt", limbs, active)
    # Every ciphertext and limb at once (distir.he.batched): the noise as
    # residues from its streams, one batched NTT, one batched product.
    streams = [_stream("smudging", seed, ((bits + 8) // 8) * n) for seed in seeds]
    out = torch.empty(limbs[:, 1].shape, dtype=torch.int64)
    for part in batched.slices(len(seeds), len(moduli) * n):
        noise = batched.forward_ntt(batched.signed_residues(streams[part], bits, n, moduli), moduli)
        out[part] = batched.add_mod(batched.mul_mod(limbs[part, 1], weight), noise, weight.q)
    return out, tags


def decryption_share(
    share: ThresholdShare, limbs: Tensor, moduli: Sequence[int], active: Sequence[int]
) -> tuple[Tensor, bytes]:
    """:func:`decryption_shares` of one ciphertext ``limbs`` (``[2, L, N]``)."""
    d, tags = decryption_shares(share, limbs.unsqueeze(0), moduli, active)
    return d[0], tags[0]


def key_switch_shares(
    share: ThresholdShare,
    limbs: Tensor,
    moduli: Sequence[int],
    active: Sequence[int],
    receiver_key: Tensor,
) -> tuple[Tensor, list[bytes]]:
    """``(h, tags)``: the public-key-switch shares ``(h0_j, h1_j)`` (int64
    ``[n, 2, L, N]``) of the ciphertexts ``limbs`` (``[n, 2, L, N]``) towards
    the receiver's public key ``receiver_key`` (int64 ``[2, K, N]``, NTT
    form, key level), and the budget records they spend.  ``u_j``, ``e0_j``
    and ``e1_j`` are derived like a decryption share's noise (the receiver
    key is part of the context)."""
    parameters = share.parameters
    _check_level(parameters, limbs, moduli)
    key_q = parameters.key_moduli
    _check_limbs(
        receiver_key, (2, len(key_q), parameters.poly_modulus_degree), key_q, "receiver public key"
    )
    receiver = receiver_key[:, : len(moduli)].contiguous()
    extra = hashlib.sha256(receiver_key.contiguous().numpy().tobytes()).digest()
    q = batched.moduli_column(moduli)
    weight = batched.multiplier(_active_weight(share, active, moduli), q)
    n, bits = parameters.poly_modulus_degree, parameters.key_switch_bits
    seeds, tags = _noise_seeds(share, "switch", limbs, active, extra)
    p0, p1 = batched.multiplier(receiver[0], q), batched.multiplier(receiver[1], q)
    out = torch.empty((len(seeds), 2, len(moduli), n), dtype=torch.int64)
    for part in batched.slices(len(seeds), len(moduli) * n):
        h0, h1 = _key_switch_part(limbs[part, 1], seeds[part], moduli, bits, weight, p0, p1)
        out[part, 0], out[part, 1] = h0, h1
    return out, tags


def _key_switch_part(
    c1: Tensor,
    seeds: Sequence[bytes],
    moduli: Sequence[int],
    bits: int,
    weight: batched.Multiplier,
    p0: batched.Multiplier,
    p1: batched.Multiplier,
) -> tuple[Tensor, Tensor]:
    """``(h0, h1)`` of the ciphertexts whose ``c1`` and seeds these are."""
    n, q = c1.shape[-1], weight.q
    u = np.stack([_ternary("switch-u", seed, n) for seed in seeds])
    e1 = np.stack([_centered_binomial("switch-e1", seed, n) for seed in seeds])
    streams = [_stream("switch-e0", seed, ((bits + 8) // 8) * n) for seed in seeds]
    u = batched.forward_ntt(batched.small_residues(u, moduli), moduli)
    e1 = batched.forward_ntt(batched.small_residues(e1, moduli), moduli)
    e0 = batched.forward_ntt(batched.signed_residues(streams, bits, n, moduli), moduli)
    h0 = batched.add_mod(batched.mul_mod(c1, weight), batched.mul_mod(u, p0), q)
    h0 = batched.add_mod(h0, e0, q)
    h1 = batched.add_mod(batched.mul_mod(u, p1), e1, q)
    return h0, h1


def key_switch_share(
    share: ThresholdShare,
    limbs: Tensor,
    moduli: Sequence[int],
    active: Sequence[int],
    receiver_key: Tensor,
) -> tuple[Tensor, bytes]:
    """:func:`key_switch_shares` of one ciphertext ``limbs`` (``[2, L, N]``)."""
    h, tags = key_switch_shares(share, limbs.unsqueeze(0), moduli, active, receiver_key)
    return h[0], tags[0]


def check_receiver_key(receiver_key: Tensor, public_key: CollectivePublicKey) -> str | None:
    """Why ``receiver_key`` (int64 ``[2, K, N]``, NTT form) is not a key to
    switch to, or None.  A public key ``(p0, p1) = (-p1*s' + e', p1)`` has
    both halves uniform modulo every prime; one that is zero, small or
    otherwise far from uniform in coefficient form (more than half of its
    coefficients within ``q/8`` of 0, where a uniform one has a quarter) is
    one whose secret the ranks may know, and the collective key (or its
    ``a``) is one the ranks can decrypt under.  A key that the ranks
    generated themselves looks like any other: it must reach them
    authenticated from the receiver."""
    parameters = public_key.parameters
    moduli = parameters.key_moduli
    n = parameters.poly_modulus_degree
    _check_limbs(receiver_key, (2, len(moduli), n), moduli, "receiver public key")
    a = public_key.limbs[1]
    if torch.equal(receiver_key, public_key.limbs):
        return "it is the collective public key (any threshold of ranks decrypts under it)"
    negated_a = sub_mod(torch.zeros_like(a), a, moduli)
    if torch.equal(receiver_key[1], a) or torch.equal(receiver_key[1], negated_a):
        return "it reuses the collective key's public polynomial a"
    for half, name in ((0, "p0"), (1, "p1")):
        coefficients = from_ntt(receiver_key[half], moduli)
        for limb, q in enumerate(moduli):
            row = np.asarray(coefficients[limb], dtype=object)
            far = int(np.count_nonzero(np.minimum(row, q - row) > q // 8))
            if far < n // 2:
                return (
                    f"its {name} is not uniform modulo the prime {q} ({far} of {n} "
                    "coefficients far from 0): a zero, small or structured key the ranks may "
                    "decrypt under"
                )
    return None


def decoder(template: Any) -> Any:
    """The context :func:`decode` decrypts with: ``template``'s parameters
    and the zero secret key (build it once for many ciphertexts)."""
    context = template.context()
    keys = context.seal_context().data.key_context_data().parms()
    zero_key = torch.zeros(len(keys.coeff_modulus()), keys.poly_modulus_degree(), dtype=torch.int64)
    return context_from_key_limbs(context, secret_key=zero_key)


def decode(plaintext: Tensor, template: Any, zero_key_context: Any = None) -> list[float]:
    """Decode plaintext limbs ``m`` (``[L, N]``, NTT form, ``template``'s
    level, scale and slot count) to values: SEAL decrypts ``(m, 0)`` -- to
    ``m`` under any key -- with a zero secret key (``zero_key_context``,
    :func:`decoder`'s, built here when None)."""
    context = zero_key_context if zero_key_context is not None else decoder(template)
    zero = torch.zeros_like(plaintext)
    return limbs_to_ckks(torch.stack([plaintext, zero]), template, context=context).decrypt()


#: Ciphertexts decoded by one TenSEAL call in :func:`decode_all` (a bound
#: on the transient serialization it builds: 393 KB each at N = 8192).
DECODE_BATCH = 32


def decode_all(
    plaintexts: Tensor,
    templates: Sequence[Any],
    headers: Sequence[CiphertextHeader] | None = None,
) -> list[list[float]]:
    """:func:`decode` of every plaintext ``plaintexts[k]`` (``[C, L, N]``,
    NTT form) with ``templates[k]``'s format, :data:`DECODE_BATCH` at a
    time through one vector of that many ciphertexts
    (:func:`distir.he.seal.limbs_to_vector`) and one SEAL decryption under
    the zero key; ``headers`` (the templates' :class:`CiphertextHeader`,
    kept from an earlier parse) spare serializing each template again.
    Ciphertexts whose scales differ are decoded one at a time."""
    if headers is None or len(headers) != len(templates):
        headers = [CiphertextHeader.of(parse_ckks_chunks(t)) for t in templates]
    context = decoder(templates[0])
    out: list[list[float]] = []
    for lo in range(0, len(templates), DECODE_BATCH):
        part = slice(lo, min(lo + DECODE_BATCH, len(templates)))
        plain = plaintexts[part]
        limbs = torch.stack([plain, torch.zeros_like(plain)], dim=1)
        sizes = [t.size() for t in templates[part]]
        try:
            vectors = [(limbs_to_vector(limbs, list(headers[part]), context), sizes)]
        except ValueError:  # different scales: one vector each
            vectors = [
                (limbs_to_vector(limbs[k : k + 1], [h], context), [n])
                for k, (h, n) in enumerate(zip(headers[part], sizes, strict=True))
            ]
        for vector, counts in vectors:
            flat = vector.decrypt()
            start = 0
            for n in counts:
                out.append(flat[start : start + n])
                start += n
    return out
