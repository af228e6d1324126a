"""Threshold secure aggregation: a collective CKKS key that no rank holds.

N-out-of-N multiparty CKKS for semi-honest parties, after Mouchet,
Troncoso-Pastoriza, Bossuat and Hubaux, "Multiparty homomorphic encryption
from ring-learning-with-errors" (PETS 2021), as Lattigo's ``multiparty``
package implements it.  Every rank ``i`` of a group of ``P`` holds a secret
share ``s_i``; the collective secret ``s = s_1 + ... + s_P`` exists nowhere.

1. **Key generation.**  Every rank derives the same uniformly random
   polynomial ``a`` from a public seed (:func:`common_random_polynomial`),
   draws its secret ``s_i`` (:func:`generate_secret_share`: ternary, as
   SEAL's ``KeyGenerator`` draws it) and noise ``e_i`` (SEAL's centred
   binomial, sigma 3.2), and publishes ``h_i = e_i - a*s_i``
   (:func:`public_key_share`).  :func:`collective_public_key` sums the shares
   with a distir program (``dist.all_reduce_add_ciphertext``: the sum of
   polynomials in NTT form is a per-limb modular sum) into the key
   ``(b, a) = (sum_i h_i, a)``: an ordinary RLWE public key for ``s``, with
   error ``sum_i e_i``, loaded by SEAL as a ``PublicKey`` -- so that
   ``ts.ckks_vector(encryption_context(key), values)`` encrypts under it
   unchanged.
2. **Aggregation.**  Every rank encrypts its update under the collective key;
   :func:`aggregate` sums the ciphertexts with the same all-reduce.
3. **Decryption.**  For the aggregate ``(c0, c1)`` every rank publishes
   ``d_i = c1*s_i + e'_i`` (:func:`decryption_share`) with a *smudging* noise
   ``e'_i``; :func:`combine_decryption_shares` sums the shares (a distir
   program again) and adds ``c0``: ``m = c0 + c1*s + sum_i e'_i``, the
   plaintext plus noise.  ``(m, 0)`` decrypts to ``m`` under any key, so
   :func:`decode` lets SEAL decode it with the zero key.  Any proper subset
   of the shares leaves a term ``c1*s_j`` of a missing rank: uniformly
   random, it decodes to noise.

Everything is pointwise per limb in NTT form (SEAL's storage form, see
:mod:`distir.he.ntt`): sums are distir collectives, products exact integer
arithmetic.

Smudging noise: width, security, precision
------------------------------------------
Without smudging, ``m - Delta*z`` would be the aggregate ciphertext's own
noise ``e_ct``, which depends on the secret key (the Li-Micciancio attack on
CKKS decryption; in a threshold setting every share ``d_i`` carries it).  For
``P`` fresh public-key encryptions summed at ``N`` coefficients,
``|e_ct|_inf <= B = P*(3 + N*P)/2``: SEAL encrypts at the key level and
divides by the special prime, which leaves a rounding term ``r0 + r1*s`` with
``|r| <= 1/2`` and ``|s|_1 <= N*P`` (plus a part below 1).  Each rank adds
``e'_i`` with coefficients uniform in ``[-2^b, 2^b)``, where ``b =
ceil(log2(N*B)) + lambda - 1``; then for any coalition of ``P - 1`` ranks
the honest rank's ``e'_h`` alone makes ``e_ct + e'_h`` statistically close
to ``e'_h``: statistical distance at most ``N*B / 2^(b+1) <= 2^-lambda`` per
decryption (``lambda`` = ``statistical_security``, 40 by default; distances
add up over decryptions).  At the defaults (``N = 8192``) ``b`` is 67, 69 and
71 bits for ``P`` = 2, 4 and 8.

The price is precision: the decoded slots carry ``sum_i e'_i / Delta``, a
real-part standard deviation of ``2^b * sqrt(P*N/6) / Delta`` per slot
(:attr:`ThresholdParameters.smudging_error_std`).  That is why the defaults
use a large scale, ``Delta = 2^100``, inside a 160-bit data modulus
(``[60, 50, 50]`` plus a 50-bit special prime; 210 bits at ``N = 8192``,
within SEAL's 128-bit-security bound of 218): an aggregation needs no
multiplicative depth, so the whole modulus serves as headroom.  At ``P = 4``
the smudging costs about ``3.4e-8`` per slot (``1.9e-7`` at ``P = 8``), and
a rank's contribution is hidden with statistical distance ``2^-40``.

Not covered: malicious parties (no proofs that shares are well formed),
dropouts (N-out-of-N: a rank that leaves aborts the protocol), t-of-N
thresholds, relinearization or rotation keys (so no multiplications or
rotations under the collective key), and any audit of who decrypted what.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import torch
from torch import Tensor

from distir.durations import Duration, seconds
from distir.errors import DistirError
from distir.he.ntt import mul_mod, sub_mod, to_ntt
from distir.he.rns import TorchRNSBackend
from distir.he.seal import (
    ckks_to_limbs,
    context_from_key_limbs,
    import_tenseal,
    limbs_to_ckks,
)

__all__ = [
    "CollectivePublicKey",
    "SecretShare",
    "ThresholdMismatch",
    "ThresholdParameters",
    "add_decryption_shares",
    "aggregate",
    "collective_decrypt",
    "collective_public_key",
    "combine_decryption_shares",
    "common_random_polynomial",
    "decode",
    "decryption_share",
    "encryption_context",
    "generate_secret_share",
    "own_key_context",
    "public_key_share",
]

#: Domain-separation labels of the SHAKE-256 streams every draw comes from.
_LABEL = b"distir/threshold/v1/"
SEED_BYTES = 32


class ThresholdMismatch(DistirError):
    """Ranks of a threshold protocol step disagree on a value that must be
    the same everywhere (the common random polynomial, the ciphertext being
    decrypted); raised on every rank, and nothing is returned."""


# ------------------------------------------------------------------ parameters
@dataclass(frozen=True)
class ThresholdParameters:
    """CKKS parameters of a threshold group of ``parties`` ranks.

    ``coeff_mod_bit_sizes`` are SEAL's (the last prime is the special one);
    ``statistical_security`` is the ``lambda`` of the smudging bound (see the
    module docstring).  Raises ``ValueError`` when the smudging noise would
    drown the message at this scale."""

    parties: int
    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 50, 50, 50)
    scale: float = 2.0**100
    statistical_security: int = 40

    def __post_init__(self) -> None:
        object.__setattr__(self, "coeff_mod_bit_sizes", tuple(self.coeff_mod_bit_sizes))
        if self.parties < 1:
            raise ValueError(f"a threshold group needs at least one party, got {self.parties}")
        n = self.poly_modulus_degree
        if n < 1024 or n & (n - 1):
            raise ValueError(f"poly_modulus_degree must be a power of two >= 1024, got {n}")
        if len(self.coeff_mod_bit_sizes) < 2:
            raise ValueError("coeff_mod_bit_sizes needs a data prime and a special prime")
        if self.statistical_security < 1:
            raise ValueError(f"statistical_security must be >= 1, got {self.statistical_security}")
        if self.smudging_error_std > 2.0**-10:
            raise ValueError(
                f"smudging noise of {self.smudging_bits} bits for {self.parties} parties gives a "
                f"per-slot error of {self.smudging_error_std:.3g} at scale 2^"
                f"{math.log2(self.scale):.0f}: raise the scale or lower statistical_security"
            )
        data_bits = sum(self.coeff_mod_bit_sizes[:-1])
        if math.log2(self.scale) + 20 > data_bits:
            raise ValueError(
                f"scale 2^{math.log2(self.scale):.0f} leaves less than 20 bits of the "
                f"{data_bits}-bit data modulus for the values"
            )

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

    @property
    def smudging_bits(self) -> int:
        """``b``: each decryption share's smudging coefficients are uniform in
        ``[-2^b, 2^b)``, with ``N*B / 2^(b+1) <= 2^-statistical_security``."""
        worst = self.poly_modulus_degree * self.ciphertext_noise_bound
        return (worst - 1).bit_length() + self.statistical_security - 1

    @property
    def statistical_distance(self) -> float:
        """The bound ``N*B / 2^(b+1)`` on what one decryption reveals about
        the aggregate's noise (hence about the secret shares)."""
        worst = self.poly_modulus_degree * self.ciphertext_noise_bound
        return worst / 2.0 ** (self.smudging_bits + 1)

    @property
    def smudging_error_std(self) -> float:
        """Standard deviation of the error the smudging adds to each decoded
        slot (real part): ``2^b * sqrt(parties * N / 6) / scale``."""
        spread = math.sqrt(self.parties * self.poly_modulus_degree / 6)
        return 2.0**self.smudging_bits * spread / self.scale

    def template_context(self) -> Any:
        """A TenSEAL context with these parameters, used only as a format
        template (encryption parameters, ``parms_id``, scale); its own random
        keys are never used for data."""
        return _template_context(self.poly_modulus_degree, self.coeff_mod_bit_sizes, self.scale)


@lru_cache(maxsize=8)
def _template_context(degree: int, bits: tuple[int, ...], scale: float) -> Any:
    ts = import_tenseal()
    context = ts.context(ts.SCHEME_TYPE.CKKS, degree, coeff_mod_bit_sizes=list(bits))
    context.global_scale = scale
    return context


# -------------------------------------------------------------------- sampling
def _fresh_seed(seed: bytes | None) -> bytes:
    if seed is None:
        return secrets.token_bytes(SEED_BYTES)
    if not isinstance(seed, bytes | bytearray) or len(seed) == 0:
        raise TypeError(f"seed must be non-empty bytes, got {seed!r}")
    return bytes(seed)


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
    """``count`` residues uniform modulo ``modulus``: little-endian 64-bit
    words below the largest multiple of ``modulus``, reduced (as SEAL's
    ``sample_poly_uniform``)."""
    limit = np.uint64((1 << 64) // modulus * modulus - 1)
    words = _accepted(label, seed, count, 8, lambda w: w <= limit)
    return (words % np.uint64(modulus)).astype(np.int64)


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
    raw = _stream(label, seed, width * count)
    mask = (1 << (bits + 1)) - 1
    values = [
        (int.from_bytes(raw[k * width : (k + 1) * width], "little") & mask) - (1 << bits)
        for k in range(count)
    ]
    return np.array(values, dtype=object)


def _moduli_tensor(moduli: Sequence[int]) -> Tensor:
    return torch.tensor(list(moduli), dtype=torch.int64)


def _digest(*tensors: Tensor) -> int:
    """A 62-bit digest of tensors' bytes (for agreement, not for security)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().to("cpu").contiguous().numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little") >> 2


# ------------------------------------------------------------------ key shares
@dataclass(frozen=True, eq=False)
class SecretShare:
    """One rank's share ``s_i`` of the collective secret key: int64 limbs
    ``[K, N]`` in NTT form at the key level (``parameters.key_moduli``).
    It never leaves its rank; its repr does not show it."""

    parameters: ThresholdParameters
    limbs: Tensor = field(repr=False)


@dataclass(frozen=True, eq=False)
class CollectivePublicKey:
    """The collective public key ``(b, a) = (sum_i h_i, a)``: int64 limbs
    ``[2, K, N]`` in NTT form at the key level, an RLWE public key for the
    secret ``s = sum_i s_i`` that no rank holds."""

    parameters: ThresholdParameters
    limbs: Tensor = field(repr=False)

    def context(self) -> Any:
        """A public TenSEAL context (no secret key) that encrypts under this
        key: ``ts.ckks_vector(key.context(), values)``."""
        return context_from_key_limbs(self.parameters.template_context(), public_key=self.limbs)

    def serialize(self) -> bytes:
        """The public TenSEAL context, serialized (``ts.context_from`` loads it)."""
        return self.context().serialize()


def common_random_polynomial(parameters: ThresholdParameters, seed: bytes) -> Tensor:
    """The common random polynomial ``a``: int64 ``[K, N]``, uniform modulo
    every key-level prime (special prime included), read in NTT form.

    Every rank calls this with the same public ``seed``; limb ``l`` is drawn
    from the SHAKE-256 stream labelled ``crp/<l>`` (64-bit words below the
    largest multiple of ``q_l``, reduced).  A uniform vector is uniform in
    either form, so no transform is needed."""
    if seed is None:
        raise TypeError("the common random polynomial needs the group's public seed (bytes)")
    seed = _fresh_seed(seed)
    n = parameters.poly_modulus_degree
    rows = [
        _uniform_mod(f"crp/{index}", seed, q, n) for index, q in enumerate(parameters.key_moduli)
    ]
    return torch.from_numpy(np.stack(rows))


def generate_secret_share(
    parameters: ThresholdParameters, *, seed: bytes | None = None
) -> SecretShare:
    """Draw this rank's secret ``s_i``: ``N`` coefficients uniform in
    {-1, 0, 1} (SEAL's ``sample_poly_ternary``), from the stream labelled
    ``secret`` of ``seed`` (fresh randomness when None), in NTT form at the
    key level.  Never reuse a seed."""
    coefficients = _ternary("secret", _fresh_seed(seed), parameters.poly_modulus_degree)
    return SecretShare(parameters, to_ntt(coefficients, parameters.key_moduli))


def public_key_share(secret: SecretShare, crp: Tensor, *, seed: bytes | None = None) -> Tensor:
    """This rank's public key share ``h_i = e_i - a*s_i`` (int64 ``[K, N]``,
    NTT form, key level), with ``e_i`` SEAL's centred binomial noise drawn
    from the stream labelled ``key-noise`` of ``seed`` (fresh when None).

    ``(h_i, a)`` alone is an ordinary public key for ``s_i``; the shares are
    public, their sum is the collective key."""
    parameters = secret.parameters
    moduli = parameters.key_moduli
    _check_limbs(crp, (len(moduli), parameters.poly_modulus_degree), moduli, "crp")
    noise = _centered_binomial("key-noise", _fresh_seed(seed), parameters.poly_modulus_degree)
    return sub_mod(to_ntt(noise, moduli), mul_mod(crp, secret.limbs, moduli), moduli)


def _check_limbs(limbs: Tensor, shape: tuple[int, ...], moduli: Sequence[int], what: str) -> None:
    if not isinstance(limbs, Tensor) or limbs.dtype != torch.int64:
        raise TypeError(f"{what} must be an int64 torch.Tensor, got {limbs!r:.60}")
    if tuple(limbs.shape) != shape:
        raise ValueError(f"{what} must have shape {list(shape)}, got {list(limbs.shape)}")
    TorchRNSBackend().check_reduced(limbs, _moduli_tensor(moduli))


# ------------------------------------------------------------ distir programs
def _sum_program_text(shape: tuple[int, ...], agree: bool) -> str:
    ty = "tensor<" + "x".join(str(d) for d in shape) + "xi64>"
    moduli = f"tensor<{shape[-2]}xi64>"
    if not agree:
        return f"""func.func @main(%share: {ty}, %moduli: {moduli}) -> {ty} {{
  %sum = dist.all_reduce_add_ciphertext %share, %moduli max_modulus_bits 60 : {ty}, {moduli}
  func.return %sum : {ty}
}}
"""
    return f"""func.func @main(%share: {ty}, %moduli: {moduli}, %digest: tensor<2xi64>) -> ({ty}, tensor<2xi64>) {{
  %agreed = dist.all_reduce max %digest : tensor<2xi64>
  %sum = dist.all_reduce_add_ciphertext %share, %moduli max_modulus_bits 60 : {ty}, {moduli}
  func.return %sum, %agreed : {ty}, tensor<2xi64>
}}
"""


@lru_cache(maxsize=32)
def _sum_program(shape: tuple[int, ...], agree: bool, pipeline: str, deadline_s: float) -> Any:
    import distir

    return distir.compile(_sum_program_text(shape, agree), pipeline, deadline=deadline_s)


def _modular_sum(
    share: Tensor,
    moduli: Sequence[int],
    *,
    agree_on: Tensor | None,
    what: str,
    group: Any,
    deadline: Duration,
    pipeline: str,
) -> Tensor:
    """``sum_i share_i mod q`` over the group (every rank gets it); with
    ``agree_on``, every rank must pass the same tensor there."""
    deadline_s = seconds(deadline, "deadline")
    program = _sum_program(tuple(share.shape), agree_on is not None, pipeline, deadline_s)
    q = _moduli_tensor(moduli)
    if agree_on is None:
        return program.run(share, q, group=group)
    digest = _digest(agree_on)
    total, agreed = program.run(share, q, torch.tensor([digest, -digest]), group=group)
    if int(agreed[0]) != digest or int(agreed[1]) != -digest:
        raise ThresholdMismatch(
            f"ranks of the group passed different {what}; the result was discarded"
        )
    return total


def collective_public_key(
    share: Tensor,
    crp: Tensor,
    parameters: ThresholdParameters,
    *,
    group: Any = None,
    deadline: Duration = 60.0,
    pipeline: str = "",
) -> CollectivePublicKey:
    """Sum every rank's public key share into the collective key (collective:
    every rank of ``group`` calls it, and every rank gets the same key).

    Runs one distir program: a check that all ranks used the same ``crp``
    (else :class:`ThresholdMismatch` on every rank) and a
    ``dist.all_reduce_add_ciphertext`` of the shares.  Every collective
    completes within ``deadline`` or raises distir's named error
    (``DeadlineExceeded``, ``CollectiveFailed``, ``Poisoned``); no partial
    key is ever returned."""
    moduli = parameters.key_moduli
    shape = (len(moduli), parameters.poly_modulus_degree)
    _check_limbs(share, shape, moduli, "share")
    _check_limbs(crp, shape, moduli, "crp")
    b = _modular_sum(
        share,
        moduli,
        agree_on=crp,
        what="common random polynomials (public seeds)",
        group=group,
        deadline=deadline,
        pipeline=pipeline,
    )
    return CollectivePublicKey(parameters, torch.stack([b, crp]))


def encryption_context(public_key: CollectivePublicKey) -> Any:
    """The public TenSEAL context a rank encrypts its update with (it holds
    the collective public key and no secret key)."""
    return public_key.context()


def aggregate(
    ciphertext: Any, *, group: Any = None, deadline: Duration = 60.0, pipeline: str = ""
) -> Any:
    """The homomorphic sum of every rank's ``CKKSVector`` (collective), as a
    ``CKKSVector`` of the same context: one ``dist.all_reduce_add_ciphertext``
    over the limbs, bit for bit SEAL's own addition."""
    limbs, moduli = ckks_to_limbs(ciphertext)
    total = _sum_program(tuple(limbs.shape), False, pipeline, seconds(deadline, "deadline")).run(
        limbs, moduli, group=group
    )
    return limbs_to_ckks(total, ciphertext)


# ------------------------------------------------------------------ decryption
def _ciphertext_limbs(ciphertext: Any) -> tuple[Tensor, list[int]]:
    limbs, moduli = ckks_to_limbs(ciphertext)
    if limbs.shape[0] != 2:
        raise ValueError(
            f"collective decryption needs a 2-polynomial ciphertext, got {limbs.shape[0]}"
        )
    return limbs, [int(q) for q in moduli.tolist()]


def decryption_share(secret: SecretShare, ciphertext: Any, *, seed: bytes | None = None) -> Tensor:
    """This rank's decryption share of ``ciphertext = (c0, c1)``:
    ``d_i = c1*s_i + e'_i`` (int64 ``[L, N]``, NTT form, the ciphertext's
    level), where ``e'_i`` has coefficients uniform in ``[-2^b, 2^b)``,
    ``b = parameters.smudging_bits``, from the stream labelled ``smudging``
    of ``seed`` (fresh when None; a seed must never serve two decryptions).

    The bound behind ``b`` holds for the sum of up to ``parties`` fresh
    encryptions (what :func:`aggregate` returns)."""
    limbs, moduli = _ciphertext_limbs(ciphertext)
    parameters = secret.parameters
    if tuple(moduli) != parameters.key_moduli[: len(moduli)]:
        raise ValueError("the ciphertext's moduli are not those of this secret share's parameters")
    noise = _uniform_signed(
        "smudging", _fresh_seed(seed), parameters.smudging_bits, parameters.poly_modulus_degree
    )
    c1s = mul_mod(limbs[1], secret.limbs[: len(moduli)], moduli)
    return TorchRNSBackend().add_mod(c1s, to_ntt(noise, moduli), _moduli_tensor(moduli))


def add_decryption_shares(ciphertext: Any, shares: Sequence[Tensor]) -> Tensor:
    """``c0 + sum(shares)`` per limb, locally (no collective): with every
    rank's share this is the plaintext; with a proper subset, noise."""
    limbs, moduli = _ciphertext_limbs(ciphertext)
    q = _moduli_tensor(moduli)
    backend = TorchRNSBackend()
    total = limbs[0].clone()
    for share in shares:
        _check_limbs(share, tuple(limbs.shape[1:]), moduli, "decryption share")
        backend.add_mod_(total, share, q)
    return total


def combine_decryption_shares(
    share: Tensor,
    ciphertext: Any,
    *,
    group: Any = None,
    deadline: Duration = 60.0,
    pipeline: str = "",
) -> Tensor:
    """The plaintext limbs ``m = c0 + sum_i d_i`` (int64 ``[L, N]``, NTT form)
    of ``ciphertext`` (collective: every rank passes its own share and the
    same ciphertext, else :class:`ThresholdMismatch`; every rank gets ``m``).

    The sum is one distir program; a failed or late rank raises distir's
    named error on every survivor within ``deadline``, and nothing is
    returned.  :func:`decode` turns ``m`` into values."""
    limbs, moduli = _ciphertext_limbs(ciphertext)
    _check_limbs(share, tuple(limbs.shape[1:]), moduli, "decryption share")
    total = _modular_sum(
        share,
        moduli,
        agree_on=limbs,
        what="ciphertexts to decrypt",
        group=group,
        deadline=deadline,
        pipeline=pipeline,
    )
    return TorchRNSBackend().add_mod(total, limbs[0], _moduli_tensor(moduli))


def decode(plaintext: Tensor, ciphertext: Any) -> list[float]:
    """Decode plaintext limbs ``m`` (``[L, N]``, NTT form, ``ciphertext``'s
    level, scale and slot count) to values: SEAL decrypts ``(m, 0)`` -- to
    ``m`` under any key -- with a zero secret key."""
    context = ciphertext.context()
    keys = context.seal_context().data.key_context_data().parms()
    zero_key = torch.zeros(len(keys.coeff_modulus()), keys.poly_modulus_degree(), dtype=torch.int64)
    decoder = context_from_key_limbs(context, secret_key=zero_key)
    zero = torch.zeros_like(plaintext)
    return limbs_to_ckks(torch.stack([plaintext, zero]), ciphertext, context=decoder).decrypt()


def collective_decrypt(
    secret: SecretShare,
    ciphertext: Any,
    *,
    group: Any = None,
    deadline: Duration = 60.0,
    seed: bytes | None = None,
    pipeline: str = "",
) -> list[float]:
    """:func:`decryption_share`, :func:`combine_decryption_shares` and
    :func:`decode` in one call (collective)."""
    share = decryption_share(secret, ciphertext, seed=seed)
    plaintext = combine_decryption_shares(
        share, ciphertext, group=group, deadline=deadline, pipeline=pipeline
    )
    return decode(plaintext, ciphertext)


def own_key_context(secret: SecretShare, public_key: Tensor | None = None) -> Any:
    """A private TenSEAL context whose secret key is this rank's share
    ``s_i`` (and, if given, public key ``[2, K, N]``, e.g. ``(h_i, a)``).
    It decrypts what was encrypted for ``s_i`` alone -- not anything
    encrypted under the collective key."""
    return context_from_key_limbs(
        secret.parameters.template_context(), public_key=public_key, secret_key=secret.limbs
    )
