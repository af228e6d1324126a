"""Threshold secure aggregation: the protocol, as distir programs.

Ranks of a group of ``parties`` generate a collective CKKS key that no rank
holds, any ``threshold`` of them can decrypt an aggregate or switch it to an
outside receiver's key, and fewer learn nothing (see
:mod:`distir.he.threshold` for the arithmetic and the smudging bound).

    keys = generate_keys(ThresholdParameters(parties=5, threshold=3))  # every rank
    context = keys.public_key.context()        # public: encrypts, cannot decrypt
    total = aggregate([ts.ckks_vector(context, update)], keys)
    blobs = switch_key(total, keys, receiver_key)    # any >= 3 ranks, for a receiver
    # only with ThresholdParameters(..., decrypt_to_ranks=True):
    values = decrypt(total, keys, group=survivors)   # any >= 3 ranks

Inputs are not verified, so by default no rank sees a decryption
---------------------------------------------------------------
A rank controls its input, and nothing here proves that an input is a
well-formed fresh encryption with bounded noise.  A crafted one breaks any
party that sees its decryption: from the public collective key ``(b, a)``
(``b = e - a*s``) a rank submits ``2^k * (b, a)``, which decrypts to
``2^k * e`` (the key's noise) for ``2^k`` above the other inputs, so
whoever reads that plaintext computes ``s = (e - b) / a`` and decrypts every
rank's individual ciphertext (a rank receives them in the sum).  The
default protocol therefore never hands the ranks a decryption: the
aggregate leaves only through :func:`switch_key`, re-encrypted under an
outside receiver's key; the ranks see a ciphertext under a key they do not
hold (plus shares smudged for that receiver), so a crafted input gains a
rank nothing.  :func:`decrypt` is refused
(:class:`RankDecryptionRefused`, on every rank) unless the keys were
generated with ``decrypt_to_ranks=True``, an explicit opt-in that trusts
every rank's input.  What stays: the receiver sees the decryption, so a
receiver colluding with a lying rank recovers ``s`` the same way; the
receiver must not be a rank nor collude with one.  (Closing that needs
proofs that each input is well formed, e.g. lattice proofs of plaintext
knowledge amortised as in TopGear/Overdrive, which this package does not
have.)

Every step is collective over its ``group`` (default: the world), checks
first that the ranks agree (parameters, group size, the aggregate, the
budget) and raises the same named error on every rank when they do not:
:class:`ThresholdMismatch`, :class:`DecryptionBudgetExhausted`,
:class:`RankDecryptionRefused`, or distir's
``DeadlineExceeded``/``CollectiveFailed``/``Poisoned`` for a rank that
fails or is late; nothing partial is returned.

Rounds: key generation 3 (parameters and the public seed of ``a``; key
shares summed with the X25519 keys gathered; the key's digest agreed with
the encrypted Shamir shares gathered), aggregation 2 plus one per slice of
ciphertexts (parameters and ciphertext counts; commitments gathered, then
the ciphertexts, slice by slice of at most ``STREAM_BYTES`` of every
rank's together, each checked against its commitment and summed by every
rank as it arrives; the verdict and the sum's digest agreed),
decryption and key switch 5 (the aggregate, parameters and active parties;
budgets; fresh X25519 keys gathered after the aggregate's digest is
agreed; the shares exchanged sealed, pairwise; their opening agreed).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import Tensor

from distir.aggregation import programs
from distir.aggregation.channels import TAG_BYTES, ChannelError, Channels
from distir.durations import Duration, seconds
from distir.he import batched
from distir.he import threshold as th
from distir.he.rns import TorchRNSBackend
from distir.he.seal import (
    CiphertextHeader,
    ckks_to_limbs,
    limbs_to_ckks,
    parse_ckks_chunks,
    vector_proto,
)
from distir.he.threshold import (
    DecryptionBudgetExhausted,
    RankDecryptionRefused,
    ThresholdMismatch,
    ThresholdParameters,
    ThresholdShare,
    UnsafeReceiverKey,
)
from distir.ir.modular import int64_sum_is_exact
from distir.runtime.ownership import plain_inputs

__all__ = [
    "Aggregate",
    "CommitmentMismatch",
    "DecryptionBudgetExhausted",
    "RankDecryptionRefused",
    "ThresholdMismatch",
    "ThresholdParameters",
    "ThresholdShare",
    "UnsafeReceiverKey",
    "aggregate",
    "decrypt",
    "generate_keys",
    "reshare",
    "switch_key",
]

_OK, _BAD_GROUP, _BUDGET, _BAD_AGGREGATE, _BAD_LEVEL, _REFUSED, _BAD_RECEIVER, _BAD_SEAL = (
    0,
    1,
    2,
    4,
    8,
    16,
    32,
    64,
)
_SHAMIR = b"shamir-share"


def _group_shape(group: Any) -> tuple[int, int]:
    return torch_dist.get_rank(group), torch_dist.get_world_size(group)


def _digest_words(data: bytes) -> list[int]:
    """Three non-negative 62-bit words of a digest (so that ``-w`` fits)."""
    return [int.from_bytes(data[8 * k : 8 * k + 8], "little") >> 2 for k in range(3)]


def _check_agreed(
    code: int,
    values: Sequence[int],
    *,
    group: Any,
    deadline_s: float,
    what: str | Sequence[tuple[str, int]],
    messages: dict[int, str],
    extra: Sequence[int] = (),
) -> list[int]:
    """One all-reduce: every rank's status ``code`` (a bit set), agreement on
    ``values``, and the maximum of ``extra`` over the group.  Raises the
    same error on every rank unless every code is 0 and every rank passed
    the same ``values``; ``what`` names them, or names consecutive runs of
    them ((name, count) pairs) so that the error says which differ."""
    words = [code, *values, *(-v for v in values), *extra]
    agreed = programs.agree_max(
        torch.tensor(words, dtype=torch.int64), group=group, deadline_s=deadline_s
    ).tolist()
    codes = agreed[0]
    k = len(values)
    same = agreed[1 : 1 + k] == list(values) and agreed[1 + k : 1 + 2 * k] == [-v for v in values]
    # every rank computes the same verdict from the same agreed row
    if codes & _BAD_SEAL:
        raise ChannelError(messages[_BAD_SEAL])
    if codes & _REFUSED:
        raise RankDecryptionRefused(messages[_REFUSED])
    if codes & _BAD_RECEIVER:
        raise UnsafeReceiverKey(messages[_BAD_RECEIVER])
    if codes & _BUDGET:
        raise DecryptionBudgetExhausted(messages[_BUDGET])
    for bit in (_BAD_GROUP, _BAD_AGGREGATE, _BAD_LEVEL):
        if codes & bit:
            raise ThresholdMismatch(messages[bit])
    if not same:
        if not isinstance(what, str):
            differ, start = [], 1
            for name, count in what:
                high, low = agreed[start : start + count], agreed[start + k : start + k + count]
                if high != [-v for v in low]:  # the max and the min of some word differ
                    differ.append(name)
                start += count
            what = " and ".join(differ)
        raise ThresholdMismatch(f"ranks of the group passed different {what}; nothing was done")
    return agreed[1 + 2 * k :]


# ----------------------------------------------------------------- key generation
def generate_keys(
    parameters: ThresholdParameters, *, group: Any = None, deadline: Duration = 60.0
) -> ThresholdShare:
    """Collective key generation and thresholdization (every rank of
    ``group``, which must have exactly ``parameters.parties`` ranks).

    Returns this rank's :class:`ThresholdShare` (party index = its rank in
    ``group``), which carries the collective public key.  The N-out-of-N
    secrets ``s_i`` exist only inside this call; the Shamir shares of them
    travel sealed over :class:`~distir.aggregation.channels.Channels`."""
    deadline_s = seconds(deadline, "deadline")
    rank, size = _group_shape(group)
    code = _OK if size == parameters.parties else _BAD_GROUP
    seed = secrets.token_bytes(32) if rank == 0 else bytes(32)
    seed_words = _digest_words(seed) if rank == 0 else [0, 0, 0]
    agreed_seed = _check_agreed(
        code,
        _digest_words(parameters.digest()),
        group=group,
        deadline_s=deadline_s,
        what="threshold parameters",
        messages={
            _BAD_GROUP: f"threshold parameters are for parties={parameters.parties} but the "
            f"group has {size} ranks"
        },
        extra=seed_words,
    )
    crp_seed = b"".join(w.to_bytes(8, "little") for w in agreed_seed)
    crp = th.common_random_polynomial(parameters, crp_seed)
    secret = th.generate_secret_share(parameters)
    h = th.public_key_share(secret, crp)
    channels = Channels(rank, parameters.digest() + crp_seed)
    q = torch.tensor(parameters.key_moduli, dtype=torch.int64)
    gathered, b = programs.gather_and_sum(
        programs.words(channels.public_key), h, q, group=group, deadline_s=deadline_s
    )
    raw = gathered.numpy().tobytes()
    channels.connect([raw[32 * i : 32 * (i + 1)] for i in range(size)])
    key = th.collective_public_key_from_sum(parameters, b, crp)
    channels.bind(key.digest())  # the Shamir shares open only under the same key
    shares = th.shamir_shares(secret)
    del secret
    blob = b"".join(
        channels.seal(j, shares[j].contiguous().numpy().tobytes(), _SHAMIR) for j in range(size)
    )
    del shares
    sealed = (
        programs.gather_rows(
            programs.words(blob),
            group=group,
            deadline_s=deadline_s,
            uniform=torch.tensor(_digest_words(key.digest()), dtype=torch.int64),
        )
        .numpy()
        .tobytes()
    )
    part = len(blob) // size
    received = []
    for i in range(size):
        chunk = sealed[i * len(blob) + rank * part : i * len(blob) + (rank + 1) * part]
        plain = channels.open(i, chunk, _SHAMIR)
        received.append(torch.frombuffer(bytearray(plain), dtype=torch.int64).view_as(h).clone())
    assert part == h.numel() * 8 + TAG_BYTES
    return th.new_threshold_share(parameters, rank, key, received)


# ---------------------------------------------------------------------- aggregation
class CommitmentMismatch(ThresholdMismatch):
    """A rank's ciphertexts differ from the commitment it published before
    them (or their limbs are not reduced): raised on every rank, naming the
    rank, and nothing is summed."""


@dataclass(frozen=True, eq=False)
class Aggregate:
    """The agreed sum of every rank's committed ciphertexts: only
    :func:`aggregate` makes one, and only one decrypts.

    ``count`` fresh encryptions per slot were summed (the group's size);
    ``commitments`` are the SHA-256 of every rank's ciphertexts, gathered
    before the ciphertexts, each checked by every rank against the
    ciphertexts that rank received before they entered the sum; ``digest``
    binds them to the sum and was agreed by every rank.  ``limbs`` are the
    summed ciphertexts (int64 ``[n, 2, L, N]``); ``templates`` this rank's
    own ciphertexts, whose metadata (level, scale, size) the sums share.

    ``_tag`` is a MAC under this rank's private noise key, checked before
    any decryption: it guards this rank against its own caller (an
    ``Aggregate`` built or altered by hand).  Against another rank it is
    not the tag that binds -- a lying rank forges its own at will -- but
    the agreement: every honest rank decrypts only the aggregate it summed
    and checked itself, and every decryption first agrees on the digest."""

    def ciphertexts(self) -> list[Any]:
        """The summed ciphertexts as ``CKKSVector``s (public: they encrypt
        the aggregate under the collective key)."""
        return [limbs_to_ckks(self.limbs[k], c) for k, c in enumerate(self.templates)]

    parameters: ThresholdParameters
    templates: tuple[Any, ...] = field(repr=False)
    limbs: Tensor = field(repr=False)
    moduli: tuple[int, ...]
    count: int
    commitments: tuple[bytes, ...] = field(repr=False)
    digest: bytes = field(repr=False)
    _tag: bytes = field(repr=False)
    #: The templates' formats (:class:`~distir.he.seal.CiphertextHeader`),
    #: kept from aggregation's one parse: results are written in them
    #: without serializing the templates again.
    headers: tuple[CiphertextHeader, ...] | None = field(default=None, repr=False)


def _mac(share: ThresholdShare, digest: bytes, count: int) -> bytes:
    key = hashlib.blake2b(share._noise_key, person=b"distir-aggregate", digest_size=32).digest()
    return hmac.new(key, digest + count.to_bytes(4, "little"), "sha256").digest()


def _aggregate_digest(commitments: Sequence[bytes], limbs: Tensor, count: int) -> bytes:
    h = hashlib.sha256(b"".join(commitments))
    h.update(limbs.contiguous().numpy())
    h.update(count.to_bytes(4, "little"))
    return h.digest()


def _commitment(limbs: Tensor) -> bytes:
    """A rank's commitment to its ciphertexts (int64 ``[n, 2, L, N]``)."""
    return hashlib.sha256(limbs.contiguous().numpy()).digest()  # the buffer, not a copy


class _ArrivalCheck:
    """Every rank's ciphertexts checked as they arrive, slice by slice in
    order: a running SHA-256 per rank (over the same bytes, in the same
    order, as the commitment over the whole ``[n, 2, L, N]`` buffer) and
    whether every limb so far was reduced.  A rank keeps one slice of
    every rank's ciphertexts at a time, not all of them."""

    def __init__(self, size: int, moduli: Sequence[int]):
        self.hashes = [hashlib.sha256() for _ in range(size)]
        self.reduced = [True] * size
        self.q = torch.tensor(list(moduli), dtype=torch.int64)

    def update(self, per_rank: Tensor) -> None:
        """The next slice of every rank's ciphertexts (``per_rank[i]``:
        int64 ``[k, 2, L, N]``, limb axis second to last)."""
        axes = tuple(d for d in range(1, per_rank.dim()) if d != per_rank.dim() - 2)
        low = (per_rank.amin(dim=axes) >= 0).all(dim=1)
        high = (per_rank.amax(dim=axes) < self.q).all(dim=1)
        for i, ok in enumerate((low & high).tolist()):
            self.reduced[i] = self.reduced[i] and ok
            self.hashes[i].update(per_rank[i].contiguous().numpy())  # the buffer, not a copy

    def unfaithful(self, commitments: Sequence[bytes]) -> list[int]:
        return [
            i
            for i, (h, ok) in enumerate(zip(self.hashes, self.reduced, strict=True))
            if not ok or h.digest() != commitments[i]
        ]


def _unfaithful_ranks(
    per_rank: Tensor | _ArrivalCheck, commitments: Sequence[bytes], moduli: Sequence[int]
) -> list[int]:
    """The ranks whose ciphertexts (``per_rank[i]``, int64 ``[n, 2, L, N]``,
    or what an :class:`_ArrivalCheck` saw of them) differ from their
    commitment or hold a limb outside ``[0, q_l)``."""
    if isinstance(per_rank, _ArrivalCheck):
        return per_rank.unfaithful(commitments)
    check = _ArrivalCheck(per_rank.shape[0], moduli)
    check.update(per_rank)
    return check.unfaithful(commitments)


#: What a rank holds of the other ranks' ciphertexts at once in
#: :func:`aggregate` (every rank's slice of them): 8 ranks of 1M floats,
#: 256 ciphertexts of 393 KB each, gathered whole, were 800 MB per rank.
STREAM_BYTES = 32 << 20


def _slice_ciphertexts(count: int, size: int, ciphertext_bytes: int) -> list[slice]:
    """Consecutive slices of ``count`` ciphertexts, at most
    :data:`STREAM_BYTES` of every rank's together (at least one each)."""
    step = max(1, STREAM_BYTES // max(1, size * ciphertext_bytes))
    return [slice(lo, min(lo + step, count)) for lo in range(0, count, step)]


def _modular_sum(per_rank: Tensor, moduli: Sequence[int]) -> Tensor:
    """``sum_i per_rank[i] mod q`` of reduced limbs: one int64 sum while the
    headroom of ``distir.ir.modular`` proves it exact (``P * (q - 1) <
    2^63``: 8 ranks at 60-bit primes), then one remainder; else pairwise
    subtract-and-mask sums."""
    q = torch.tensor(list(moduli), dtype=torch.int64)
    if int64_sum_is_exact(per_rank.shape[0], max(moduli)):
        total = per_rank.sum(dim=0)
        return torch.remainder(total, q.view(-1, 1), out=total)
    backend = TorchRNSBackend()
    total = per_rank[0].clone()
    for i in range(1, per_rank.shape[0]):
        backend.add_mod_(total, per_rank[i], q)
    return total


def aggregate(
    ciphertexts: Sequence[Any],
    share: ThresholdShare,
    *,
    group: Any = None,
    deadline: Duration = 60.0,
) -> Aggregate:
    """The homomorphic sum of every rank's ``CKKSVector``s (collective; every
    rank passes the same number, encrypted under ``share.public_key``).

    One distir program gathers every rank's SHA-256 commitment to its
    ciphertexts, then the ciphertexts themselves; every rank checks each
    rank's ciphertexts against its commitment (and that their limbs are
    reduced) and sums them (modular addition per limb, bit for bit SEAL's);
    one all-reduce agrees on the verdict and the sum's digest.  A rank whose
    ciphertexts differ from its commitment is :class:`CommitmentMismatch`
    on every rank, naming it, with nothing summed.  Every rank receives
    every rank's (encrypted) ciphertexts: that is what checking them takes,
    and no rank holds the key; they arrive in slices (at most
    :data:`STREAM_BYTES` of every rank's together), each hashed into its
    rank's running SHA-256, checked and added to the sum before the next,
    so a rank holds one slice of the other ranks' ciphertexts at a time.  The commitment binds a rank to what it sends
    before it sees any other rank's ciphertext; it proves nothing about
    what it committed to (see the module docstring)."""
    deadline_s = seconds(deadline, "deadline")
    _rank, size = _group_shape(group)
    parameters = share.parameters
    if not ciphertexts:
        raise ValueError("aggregate needs at least one ciphertext")
    # Each ciphertext serialized once: its limbs and its scales (the
    # serializations are dropped as soon as they are read).
    pairs, scales, headers = [], [], []
    for c in ciphertexts:
        chunks = parse_ckks_chunks(c)
        scales += [layout.scale for layout in chunks]
        pairs.append(ckks_to_limbs(c, layouts=chunks))
        headers.append(CiphertextHeader.of(chunks) if len(chunks) == 1 else None)
        del chunks
    moduli = parameters.data_moduli
    # A ciphertext at another level (or of another size) would be summed
    # limb by limb against its peers' and come out silently wrong, so the
    # check is agreed: every rank raises it, none waits on a sum.
    # A CKKSVector of more values than slots is several ciphertexts ([C, 2,
    # L, N] limbs, and C = 2 has the shape of one [2, L, N] ciphertext's
    # pair of polynomials): refused with the others, before anything moves.
    fresh = all(
        h is not None and p[0].shape[0] == 2 and tuple(p[1].tolist()) == moduli
        for p, h in zip(pairs, headers)
    )
    # The scale is the one fact of a ciphertext its limbs do not carry: SEAL
    # adds ciphertexts of different scales as if they were equal (a silently
    # wrong sum, different on each rank), so the scales of every chunk of
    # every ciphertext, in order, are agreed like the parameters.
    scale_digest = hashlib.sha256(struct.pack(f"<{len(scales)}d", *scales)).digest()
    code = (_OK if size <= parameters.parties else _BAD_GROUP) | (_OK if fresh else _BAD_LEVEL)
    _check_agreed(
        code,
        [
            *_digest_words(parameters.digest()),
            len(ciphertexts),
            *_digest_words(scale_digest),
        ],
        group=group,
        deadline_s=deadline_s,
        what=[("parameters", 3), ("numbers of ciphertexts", 1), ("ciphertext scales", 3)],
        messages={
            _BAD_GROUP: f"{size} ranks cannot aggregate under a key of "
            f"{parameters.parties} parties (the smudging bound covers at most that many)",
            _BAD_LEVEL: "a rank's ciphertexts are not fresh 2-polynomial ciphertexts at the "
            f"parameters' first data level ({len(moduli)} moduli), or a CKKSVector holds "
            "several ciphertexts (more values than slots: pass one CKKSVector per "
            f"{parameters.poly_modulus_degree // 2} values); nothing was summed",
        },
    )
    limbs = torch.stack([p[0] for p in pairs])
    del pairs
    commitment = _commitment(limbs)
    # The commitments travel first, with the first slice of ciphertexts;
    # the rest follow slice by slice, each checked and summed as it
    # arrives (``STREAM_BYTES``: a rank holds one slice of every rank's).
    parts = _slice_ciphertexts(limbs.shape[0], size, limbs[0].numel() * 8)
    check = _ArrivalCheck(size, moduli)
    total = torch.empty_like(limbs)
    commitments: tuple[bytes, ...] = ()
    for k, part in enumerate(parts):
        mine = limbs[part]
        if k == 0:
            gathered, received = programs.gather_committed(
                programs.words(commitment), mine, group=group, deadline_s=deadline_s
            )
            raw = gathered.numpy().tobytes()
            commitments = tuple(raw[32 * i : 32 * (i + 1)] for i in range(size))
        else:
            received = programs.gather_limbs(mine, group=group, deadline_s=deadline_s)
        per_rank = received.view(size, *mine.shape)
        check.update(per_rank)
        total[part] = _modular_sum(per_rank, moduli)
        del received, per_rank
    liars = _unfaithful_ranks(check, commitments, moduli)
    digest = _aggregate_digest(commitments, total, size)
    # One all-reduce agrees whether anyone found a liar (the lowest rank
    # found, as size - rank so that the max picks it) and on the sum's digest.
    words = _digest_words(digest)
    verdict = [size - min(liars) if liars else 0, *words, *(-w for w in words)]
    agreed = programs.agree_max(
        torch.tensor(verdict, dtype=torch.int64), group=group, deadline_s=deadline_s
    ).tolist()
    if agreed[0]:
        # Named from this rank's own check: the agreed verdict is only what
        # the worst report says, and a lying rank can report an honest one.
        if liars:
            raise CommitmentMismatch(
                f"aggregate: the ciphertexts of rank {min(liars)} are not those it committed "
                "to; nothing was summed"
            )
        raise CommitmentMismatch(
            f"aggregate: a rank reports that the ciphertexts of rank {size - agreed[0]} are not "
            "those it committed to, but every commitment checks out on this rank: a rank of "
            "the group lies about the check; nothing was summed"
        )
    if agreed[1:] != verdict[1:]:
        raise ThresholdMismatch("ranks of the group computed different ciphertext sums")
    return Aggregate(
        parameters,
        tuple(ciphertexts),
        total,
        moduli,
        size,
        commitments,
        digest,
        _mac(share, digest, size),
        tuple(headers),  # one ciphertext each: checked above
    )


# -------------------------------------------------------- decryption and key switch
def _prepare(
    total: Aggregate,
    share: ThresholdShare,
    group: Any,
    deadline_s: float,
    *,
    to_ranks: bool,
    receiver_problem: str | None = None,
) -> list[int]:
    """Round 1: ``total`` valid on every rank and the same, the group's size
    against the threshold, decryption to the ranks allowed (``to_ranks``),
    the receiver key safe (``receiver_problem``: this rank's objection),
    and the set of active parties."""
    if not isinstance(total, Aggregate):
        raise TypeError(f"only an Aggregate from aggregate() decrypts, got {type(total).__name__}")
    parameters = share.parameters
    _rank, size = _group_shape(group)
    valid = (
        total.parameters == parameters
        and total.count <= parameters.parties
        and hmac.compare_digest(total._tag, _mac(share, total.digest, total.count))
        and _aggregate_digest(total.commitments, total.limbs, total.count) == total.digest
    )
    code = (_OK if valid else _BAD_AGGREGATE) | (
        _OK if parameters.threshold <= size <= parameters.parties else _BAD_GROUP
    )
    if to_ranks and not parameters.decrypt_to_ranks:
        code |= _REFUSED
    if receiver_problem is not None:
        code |= _BAD_RECEIVER
    # The active parties ride in the same all-reduce, as a one-hot row.
    present = [1 if p == share.party else 0 for p in range(parameters.parties)]
    present = _check_agreed(
        code,
        [*_digest_words(parameters.digest()), *_digest_words(total.digest)],
        group=group,
        deadline_s=deadline_s,
        what="aggregates (or parameters)",
        messages={
            _BAD_AGGREGATE: "some rank's aggregate is not one aggregate() returned for its share "
            "(altered, or a sum of more fresh encryptions than parties)",
            _BAD_GROUP: f"a group of {size} ranks cannot decrypt: it needs between "
            f"{parameters.threshold} and {parameters.parties} parties",
            _REFUSED: "decrypt: these keys do not allow decryption to the ranks "
            "(ThresholdParameters.decrypt_to_ranks is False): an aggregate may hold a crafted "
            "input whose decryption reveals the collective secret key; use switch_key to an "
            "outside receiver, or generate keys with decrypt_to_ranks=True, which trusts every "
            "rank's input; nothing was published",
            _BAD_RECEIVER: "switch_key: a rank's receiver key is one the ranks may decrypt "
            f"under ({receiver_problem or 'seen on another rank'}); nothing was published",
        },
        extra=present,
    )
    parties = [p for p, here in enumerate(present) if here]
    if len(parties) != size:
        raise ThresholdMismatch(
            f"the {size} ranks of the group hold only {len(parties)} distinct shares {parties}"
        )
    return parties


def _spend_agreed(
    share: ThresholdShare, tags: Sequence[bytes], group: Any, deadline_s: float
) -> None:
    """Round 2: every rank's budget covers the new decryptions, or none
    publishes anything."""
    new = len(set(tags) - share._spent)
    code = _BUDGET if new > share.decryptions_left else _OK
    _check_agreed(
        code,
        [],
        group=group,
        deadline_s=deadline_s,
        what="budgets",
        messages={
            _BUDGET: f"a rank's share has fewer than {new} decryptions left of "
            f"{share.parameters.max_decryptions} (max_decryptions); nothing was published"
        },
    )
    share._spend(tags)


def _sealed_sum(
    shares: Tensor,
    moduli: Sequence[int],
    agreed: Sequence[int],
    *,
    purpose: bytes,
    group: Any,
    deadline_s: float,
) -> Tensor:
    """``sum_j shares_j mod q`` over the ranks of ``group``, with no share
    in the clear on the wire: every rank draws a fresh X25519 key pair for
    this call and the keys are gathered after a ``dist.assert_uniform`` of
    ``agreed`` (the digests the shares belong to, which also salt the
    channel keys); each rank seals its share for every other rank
    (:class:`~distir.aggregation.channels.Channels`: ChaCha20-Poly1305,
    one key per direction) and one ``dist.variable_all_to_all`` delivers
    them; every rank opens what it received and adds it.  A blob that fails
    authentication, or does not hold reduced limbs, is
    :class:`~distir.aggregation.channels.ChannelError` on every rank (one
    last all-reduce agrees on it).  The shares go slice by slice of
    ciphertexts (at most :data:`STREAM_BYTES` of what a rank seals for all
    the others at once), one exchange each, each under its own purpose."""
    rank, size = _group_shape(group)
    uniform = torch.tensor(list(agreed), dtype=torch.int64)
    session = hashlib.sha256(purpose + uniform.numpy().tobytes()).digest()
    channels = Channels(rank, session)
    raw = (
        programs.gather_rows(
            programs.words(channels.public_key),
            group=group,
            deadline_s=deadline_s,
            uniform=uniform,
        )
        .numpy()
        .tobytes()
    )
    channels.connect([raw[32 * i : 32 * (i + 1)] for i in range(size)])
    q = torch.tensor(list(moduli), dtype=torch.int64)
    backend = TorchRNSBackend()
    total = shares.clone()
    problem = None
    senders = [j for j in range(size) if j != rank]
    # Slice by slice of ciphertexts (at most STREAM_BYTES of what this rank
    # seals for all the others): each slice its own purpose, so its own
    # channel key, and one exchange; a rank holds one slice's messages.
    per = shares[0].numel() * 8 if shares.shape[0] else 1
    for k, part in enumerate(_slice_ciphertexts(shares.shape[0], max(1, size - 1), per)):
        label = purpose + b"/" + k.to_bytes(4, "little")
        plain = shares[part].contiguous().numpy().tobytes()
        sealed = [channels.seal(j, plain, label) for j in senders]
        width = (len(plain) + TAG_BYTES) // 8
        counts = torch.tensor([0 if j == rank else width for j in range(size)], dtype=torch.int64)
        received = programs.exchange(
            programs.words(b"".join(sealed)), counts, group=group, deadline_s=deadline_s
        )
        del sealed
        data = received.numpy().tobytes()
        del received
        if problem is not None:
            continue  # still in step with the others; nothing more is opened
        if len(data) != 8 * width * len(senders):
            problem = f"rank {rank} received {len(data)} bytes of sealed shares"
            continue
        for m, j in enumerate(senders):
            try:
                opened = channels.open(j, data[8 * width * m : 8 * width * (m + 1)], label)
                other = torch.frombuffer(bytearray(opened), dtype=torch.int64).view_as(shares[part])
                backend.check_reduced(other, q)
            except (ChannelError, ValueError) as e:
                problem = f"rank {rank}: the sealed share of rank {j} is unusable ({e})"
                break
            backend.add_mod_(total[part], other, q)
    _check_agreed(
        _OK if problem is None else _BAD_SEAL,
        [],
        group=group,
        deadline_s=deadline_s,
        what="sealed shares",
        messages={
            _BAD_SEAL: f"a sealed {purpose.decode()} failed authentication or held no reduced "
            f"limbs ({problem or 'seen on another rank'}); nothing was returned"
        },
    )
    return total


def decrypt(
    total: Aggregate, share: ThresholdShare, *, group: Any = None, deadline: Duration = 60.0
) -> list[list[float]]:
    """The values of every ciphertext of ``total`` (collective over
    ``group``: any ``threshold`` to ``parties`` ranks holding distinct
    shares, e.g. the survivors of a failure), only under keys generated
    with ``decrypt_to_ranks=True`` (else :class:`RankDecryptionRefused` on
    every rank: see the module docstring for why).  Every rank of the group gets
    them; each computes smudged decryption shares, summed sealed
    (:func:`_sealed_sum`: no share travels in the clear) after a
    ``dist.assert_uniform`` of the aggregate's digest."""
    deadline_s = seconds(deadline, "deadline")
    active = _prepare(total, share, group, deadline_s, to_ranks=True)
    shares, tags = th.decryption_shares(share, total.limbs, total.moduli, active)
    _spend_agreed(share, tags, group, deadline_s)
    summed = _sealed_sum(
        shares,
        total.moduli,
        _digest_words(total.digest),
        purpose=b"decryption share",
        group=group,
        deadline_s=deadline_s,
    )
    plain = batched.add_mod(total.limbs[:, 0], summed, batched.moduli_column(total.moduli))
    return th.decode_all(plain, total.templates, total.headers)


def switch_key(
    total: Aggregate,
    share: ThresholdShare,
    receiver_key: Tensor,
    *,
    group: Any = None,
    deadline: Duration = 60.0,
) -> list[bytes]:
    """``total`` re-encrypted under an outside receiver's public key
    ``receiver_key`` (int64 ``[2, K, N]``: ``distir.he.seal.public_key_limbs``
    of the receiver's context), as serialized ``CKKSVector``s the receiver
    loads with ``ts.ckks_vector_from(its_context, blob)``.

    Collective over any ``threshold`` to ``parties`` ranks; one sealed sum
    of smudged key-switch shares (after agreeing on the aggregate and the
    receiver key, which must not be one the ranks can decrypt under:
    :class:`UnsafeReceiverKey` on every rank otherwise).  The ranks get
    only the switched ciphertexts, which they cannot decrypt."""
    deadline_s = seconds(deadline, "deadline")
    # The key's value, in memory of its own: its bytes are digested and
    # agreed on (a negation view's memory holds -key).
    (receiver_key,) = plain_inputs([receiver_key], "switch_key: receiver key")
    try:
        problem = th.check_receiver_key(receiver_key, share.public_key)
    except (TypeError, ValueError) as e:  # malformed: agreed like an unsafe key
        problem = str(e)
    active = _prepare(total, share, group, deadline_s, to_ranks=False, receiver_problem=problem)
    shares, tags = th.key_switch_shares(share, total.limbs, total.moduli, active, receiver_key)
    _spend_agreed(share, tags, group, deadline_s)
    key_digest = hashlib.sha256(receiver_key.contiguous().numpy().tobytes()).digest()
    summed = _sealed_sum(
        shares,
        total.moduli,
        _digest_words(total.digest) + _digest_words(key_digest),
        purpose=b"key-switch share",
        group=group,
        deadline_s=deadline_s,
    )
    c0 = batched.add_mod(total.limbs[:, 0], summed[:, 0], batched.moduli_column(total.moduli))
    switched = torch.stack([c0, summed[:, 1]], dim=1)
    if total.headers is None:
        return [limbs_to_ckks(switched[k], c).serialize() for k, c in enumerate(total.templates)]
    # In the templates' format (uncompressed), with no TenSEAL call.
    return [vector_proto(switched[k : k + 1], [h]) for k, h in enumerate(total.headers)]


# ------------------------------------------------------------------- re-sharing
_RESHARE = b"reshare"


def reshare(
    share: ThresholdShare | None,
    parameters: ThresholdParameters,
    *,
    group: Any = None,
    deadline: Duration = 60.0,
    previous: ThresholdParameters | None = None,
) -> ThresholdShare:
    """Fresh Shamir shares of the same collective key for the ranks of
    ``group`` (collective), under ``parameters``: ``parties`` = the group's
    size, any new ``threshold``, the same ring.  The group holds at least
    the old threshold of share holders (e.g. the survivors that
    ``distir.recover()`` regrouped) and may hold ranks with no share (a
    rank that joined later: it passes ``share=None`` and ``previous``, the
    parameters of the key being re-shared, and receives the collective
    public key from the holders, who agreed on its digest).

    The first ``threshold`` (old) parties present each deal, sealed over
    fresh pairwise channels, Shamir shares of ``lambda_j * sk_j`` under a
    fresh polynomial; rank ``k`` of ``group`` becomes party ``k`` with the
    sum of what it received, joiners included: what a joiner receives
    travels only sealed for it.  The key, and every ciphertext under it,
    stay the same; the new shares are independent of the old ones beyond the
    key, so a coalition needs ``threshold`` shares *of one generation*
    (proactive security holds once every old share, and its files, are
    erased: that is the caller's part).  Each new share gets a fresh noise
    key and carries the largest spent count of the old shares present.
    Aggregates made before do not decrypt under the new shares (their
    parameters differ): aggregate again."""
    if share is None and previous is None:
        raise TypeError(
            "reshare: a rank without a share (a joiner) passes previous=, the parameters of "
            "the key being re-shared"
        )
    deadline_s = seconds(deadline, "deadline")
    rank, size = _group_shape(group)
    old = share.parameters if share is not None else previous
    assert old is not None
    same_ring = (
        parameters.poly_modulus_degree == old.poly_modulus_degree
        and parameters.coeff_mod_bit_sizes == old.coeff_mod_bit_sizes
        and parameters.scale == old.scale
    )
    code = _OK if parameters.parties == size and same_ring and old.threshold <= size else _BAD_GROUP
    if share is not None:
        key_words = _digest_words(share.public_key.digest())
        # agreed by the maximum: [w, -w] comes back as is only if every holder sent w
        key_row = [*key_words, *(-w for w in key_words)]
    else:
        key_row = [-1] * 3 + [-(1 << 62)] * 3  # below any holder's words: neutral
    spent = len(share._spent) if share is not None else 0
    agreed = _check_agreed(
        code,
        [*_digest_words(parameters.digest()), *_digest_words(old.digest())],
        group=group,
        deadline_s=deadline_s,
        what=[("new parameters", 3), ("old parameters", 3)],
        messages={
            _BAD_GROUP: f"a rank cannot re-share to a group of {size} ranks: the new parameters "
            f"must be for parties={size}, in the same ring, and the old threshold "
            f"({old.threshold}) must be present"
        },
        extra=[
            *(1 if share is not None and p == share.party else 0 for p in range(old.parties)),
            spent,
            *key_row,
        ],
    )
    carried, key_high, key_low = (
        agreed[old.parties],
        agreed[old.parties + 1 : old.parties + 4],
        agreed[old.parties + 4 :],
    )
    parties = programs.gather_rows(
        torch.tensor([share.party if share is not None else -1], dtype=torch.int64),
        group=group,
        deadline_s=deadline_s,
    ).tolist()
    holders = [p for p in parties if p >= 0]
    if len(set(holders)) != len(holders) or len(holders) < old.threshold:
        raise ThresholdMismatch(
            f"the {size} ranks of the group hold {len(holders)} shares, {len(set(holders))} "
            f"distinct: re-sharing needs {old.threshold} distinct shares of the key"
        )
    if key_high != [-w for w in key_low]:
        raise ThresholdMismatch("ranks of the group passed different collective keys")
    key_words = key_high
    public_key = share.public_key.limbs if share is not None else None
    if len(holders) < size:
        # A joiner has no key: every holder sends its own (public), the
        # joiner takes the first holder's and checks it against the digest
        # every holder agreed on.
        shape = (2, len(old.key_moduli), old.poly_modulus_degree)
        mine = public_key if public_key is not None else torch.zeros(shape, dtype=torch.int64)
        keys = programs.gather_rows(mine.reshape(-1), group=group, deadline_s=deadline_s).view(
            size, *shape
        )
        if public_key is None:
            public_key = keys[parties.index(holders[0])].clone()
    assert public_key is not None
    key_digest = hashlib.sha256(public_key.contiguous().numpy().tobytes()).digest()
    active = sorted(holders)[: old.threshold]
    dealers = [parties.index(p) for p in active]  # their ranks in the group
    uniform = torch.tensor(_digest_words(parameters.digest()) + key_words, dtype=torch.int64)
    channels = Channels(rank, hashlib.sha256(_RESHARE + uniform.numpy().tobytes()).digest())
    raw = (
        programs.gather_rows(
            programs.words(channels.public_key), group=group, deadline_s=deadline_s, uniform=uniform
        )
        .numpy()
        .tobytes()
    )
    channels.connect([raw[32 * i : 32 * (i + 1)] for i in range(size)])
    # A joiner handed another key than the holders' binds another digest:
    # its channels then fail authentication, on every rank (below).
    channels.bind(key_digest)
    shape = (len(old.key_moduli), old.poly_modulus_degree)
    width = (shape[0] * shape[1] * 8 + TAG_BYTES) // 8
    own = None
    blob = b""
    if rank in dealers and share is not None:
        dealt = th.reshare_shares(share, active, parameters)
        own = dealt[rank]
        blob = b"".join(
            channels.seal(k, dealt[k].contiguous().numpy().tobytes(), _RESHARE)
            for k in range(size)
            if k != rank
        )
        del dealt
    counts = torch.tensor(
        [width if rank in dealers and k != rank else 0 for k in range(size)], dtype=torch.int64
    )
    data = (
        programs.exchange(programs.words(blob), counts, group=group, deadline_s=deadline_s)
        .numpy()
        .tobytes()
    )
    received = [] if own is None else [own]
    senders = [d for d in dealers if d != rank]
    problem = None
    if _digest_words(key_digest) != key_words:
        problem = f"rank {rank} received a collective key other than the one agreed"
    elif len(data) != 8 * width * len(senders):
        problem = f"rank {rank} received {len(data)} bytes of sealed shares"
    else:
        for k, j in enumerate(senders):
            try:
                plain = channels.open(j, data[8 * width * k : 8 * width * (k + 1)], _RESHARE)
                received.append(torch.frombuffer(bytearray(plain), dtype=torch.int64).view(shape))
            except ChannelError as e:
                problem = str(e)
                break
    _check_agreed(
        _OK if problem is None else _BAD_SEAL,
        [],
        group=group,
        deadline_s=deadline_s,
        what="re-shared shares",
        messages={
            _BAD_SEAL: f"a sealed re-shared share failed authentication "
            f"({problem or 'seen on another rank'}); nothing was returned"
        },
    )
    key = th.CollectivePublicKey(parameters, public_key)
    fresh = th._new_threshold_share(parameters, rank, key, received)
    # The budget is the key's: carry the largest count, as records that
    # no real decryption's record equals.
    fresh._spent = {
        hashlib.sha256(b"distir/carried/" + i.to_bytes(8, "little")).digest()
        for i in range(carried)
    }
    return fresh
