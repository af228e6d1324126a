"""Threshold CKKS: a collective key no rank holds, decrypted only by all shares together."""

from __future__ import annotations

import hashlib
import itertools
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts  # the `test` extra installs it: never skipped
import torch

sys.path.insert(0, str(Path(__file__).parent))
import threshold_reference as reference  # noqa: E402

from distir.he import threshold as th  # noqa: E402
from distir.he.ntt import centered, from_ntt, mul_mod, negacyclic_ntt, to_ntt  # noqa: E402
from distir.he.rns import TorchRNSBackend  # noqa: E402
from distir.he.seal import (  # noqa: E402
    ckks_to_limbs,
    key_moduli,
    public_key_limbs,
    secret_key_limbs,
)

SIZE = 4096
CRP_SEED = b"the group's public seed"


def seed(kind: str, parties: int, rank: int) -> bytes:
    return f"{kind}/{parties}/{rank}".encode()


def update(parties: int, rank: int) -> np.ndarray:
    return np.random.default_rng(1000 * parties + rank).normal(size=SIZE) * 0.01


def correlation(values, plain) -> float:
    return float(np.corrcoef(np.asarray(values[: len(plain)]), plain)[0, 1])


def modular_sum(tensors, moduli) -> torch.Tensor:
    q = torch.tensor(list(moduli), dtype=torch.int64)
    total = tensors[0].clone()
    for t in tensors[1:]:
        TorchRNSBackend().add_mod_(total, t, q)
    return total


class LocalGroup:
    """Every rank's part of the protocol, run in one process with fixed seeds
    (the collective sums are plain local sums here; multi-rank tests below
    run them as distir programs)."""

    def __init__(self, parties: int):
        self.params = th.ThresholdParameters(parties=parties)
        self.crp = th.common_random_polynomial(self.params, CRP_SEED)
        self.secrets = [
            th.generate_secret_share(self.params, seed=seed("secret", parties, r))
            for r in range(parties)
        ]
        self.key_shares = [
            th.public_key_share(s, self.crp, seed=seed("noise", parties, r))
            for r, s in enumerate(self.secrets)
        ]
        b = modular_sum(self.key_shares, self.params.key_moduli)
        self.key = th.CollectivePublicKey(self.params, torch.stack([b, self.crp]))
        self.context = th.encryption_context(self.key)
        self.updates = [update(parties, r) for r in range(parties)]
        self.ciphertexts = [ts.ckks_vector(self.context, u.tolist()) for u in self.updates]
        self.aggregate = self.ciphertexts[0]
        for c in self.ciphertexts[1:]:
            self.aggregate = self.aggregate + c
        self.plain = sum(self.updates)

    def shares_of(self, ciphertext) -> list[torch.Tensor]:
        return [
            th.decryption_share(s, ciphertext, seed=seed("smudging", self.params.parties, r))
            for r, s in enumerate(self.secrets)
        ]


@pytest.fixture(scope="module")
def group3() -> LocalGroup:
    return LocalGroup(3)


# ------------------------------------------------------------------ parameters
def test_smudging_width_security_and_precision_follow_the_documented_formulas():
    for parties, bits in [(2, 67), (4, 69), (8, 71)]:
        params = th.ThresholdParameters(parties=parties)
        n, bound = params.poly_modulus_degree, params.ciphertext_noise_bound
        assert bound == parties * (3 + n * parties) // 2 + parties
        assert params.smudging_bits == bits
        # N*B / 2^(b+1) <= 2^-40, and one bit less would not do.
        assert n * bound * 2**40 <= 2 ** (bits + 1) < 2 * n * bound * 2**40
        assert params.statistical_distance <= 2.0**-40
        want = 2.0**bits * math.sqrt(parties * n / 6) / 2.0**100
        assert params.smudging_error_std == pytest.approx(want)
    assert th.ThresholdParameters(parties=4).smudging_error_std < 4e-8
    with pytest.raises(ValueError, match="raise the scale"):
        th.ThresholdParameters(parties=4, scale=2.0**40)


def test_parameters_name_seal_primes(group3):
    template = group3.params.template_context()
    assert tuple(key_moduli(template).tolist()) == group3.params.key_moduli
    assert group3.params.data_moduli == group3.params.key_moduli[:-1]
    assert all(q % (2 * 8192) == 1 for q in group3.params.key_moduli)


# ------------------------------------------------------------------------ NTT
def test_the_ntt_is_seals_own_secret_keys_are_ternary_after_the_inverse():
    context = ts.context(ts.SCHEME_TYPE.CKKS, 8192, coeff_mod_bit_sizes=[60, 50, 50, 50])
    moduli = key_moduli(context)
    secret = secret_key_limbs(context)
    coefficients = centered(secret, moduli)
    # SEAL draws s uniform in {-1, 0, 1}; every limb inverts to the same s.
    assert set(coefficients.tolist()) == {-1, 0, 1}
    for limb, q in zip(from_ntt(secret, moduli), moduli.tolist(), strict=True):
        assert set(limb.tolist()) == {0, 1, q - 1}
    assert torch.equal(to_ntt(coefficients, moduli), secret)
    # And the public key is (b, a) with b + a*s = -e, e SEAL's small noise.
    b, a = public_key_limbs(context)
    noise = centered(modular_sum([b, mul_mod(a, secret, moduli)], moduli.tolist()), moduli)
    assert 0 < max(abs(int(e)) for e in noise) <= 21


def test_the_ntt_matches_the_reference_evaluation_and_inverts():
    q = th.ThresholdParameters(parties=2).key_moduli[1]
    rng = np.random.default_rng(5)
    p = [int(x) for x in rng.integers(-(2**40), 2**40, size=8192)]
    transform = negacyclic_ntt(q, 8192)
    assert transform.root == reference.minimal_root(q, 8192)
    forward = transform.forward(p)
    assert forward.tolist() == reference.ntt(p, q)
    assert transform.inverse(forward).tolist() == [c % q for c in p]


# ------------------------------------------------------- bit-for-bit reference
def test_key_shares_collective_key_and_decryption_shares_equal_the_reference():
    group = LocalGroup(2)
    params, n = group.params, group.params.poly_modulus_degree
    key_q, data_q = list(params.key_moduli), list(params.data_moduli)
    a = reference.crp(CRP_SEED, key_q, n)
    assert group.crp.tolist() == a
    secrets_ = [reference.secret(seed("secret", 2, r), key_q, n) for r in range(2)]
    shares = [
        reference.key_share(s, a, seed("noise", 2, r), key_q, n) for r, s in enumerate(secrets_)
    ]
    for r in range(2):
        assert group.secrets[r].limbs.tolist() == secrets_[r]
        assert group.key_shares[r].tolist() == shares[r]
    assert group.key.limbs.tolist() == [reference.modular_sum(shares, key_q), a]
    c1 = ckks_to_limbs(group.aggregate)[0][1].tolist()
    for r, d in enumerate(group.shares_of(group.aggregate)):
        want = reference.decryption_share(
            c1,
            [row for row in secrets_[r][: len(data_q)]],
            seed("smudging", 2, r),
            params.smudging_bits,
            data_q,
            n,
        )
        assert d.tolist() == want


# ------------------------------------------------------------ key and decryption
def test_the_collective_key_is_a_public_tenseal_context_and_round_trips(group3):
    blob = group3.key.serialize()
    loaded = ts.context_from(blob)
    assert not loaded.is_private() and not loaded.has_secret_key()
    assert not group3.context.is_private()
    assert torch.equal(public_key_limbs(loaded), group3.key.limbs)
    assert loaded.global_scale == 2.0**100
    encrypted = ts.ckks_vector(loaded, group3.updates[0].tolist())
    shares = group3.shares_of(encrypted)
    values = th.decode(th.add_decryption_shares(encrypted, shares), encrypted)
    err = np.abs(np.array(values[:SIZE]) - group3.updates[0]).max()
    assert err <= 7 * group3.params.smudging_error_std


def test_the_ciphertext_noise_is_within_the_bound_the_smudging_assumes(group3):
    params, moduli = group3.params, group3.params.data_moduli
    secret = modular_sum([s.limbs[: len(moduli)] for s in group3.secrets], moduli)
    zero = ts.ckks_vector(group3.context, [0.0] * 16)  # encodes to the zero polynomial
    limbs = ckks_to_limbs(zero)[0]
    noise = centered(modular_sum([limbs[0], mul_mod(limbs[1], secret, moduli)], moduli), moduli)
    per_ciphertext = max(abs(int(e)) for e in noise)
    assert 0 < per_ciphertext <= params.ciphertext_noise_bound // params.parties


def test_the_aggregate_decrypts_within_the_smudging_error(group3):
    shares = group3.shares_of(group3.aggregate)
    values = np.array(
        th.decode(th.add_decryption_shares(group3.aggregate, shares), group3.aggregate)
    )
    err = np.abs(values[:SIZE] - group3.plain)
    sigma = group3.params.smudging_error_std
    assert err.max() <= 7 * sigma
    # The error is the smudging noise: of its documented size, not far below.
    assert 0.5 * sigma < err.std() < 1.5 * sigma


@pytest.mark.parametrize("target", ["aggregate", "individual"])
def test_no_proper_subset_of_decryption_shares_decrypts(group3, target):
    ciphertext = group3.aggregate if target == "aggregate" else group3.ciphertexts[1]
    plain = group3.plain if target == "aggregate" else group3.updates[1]
    shares = group3.shares_of(ciphertext)
    for size in range(3):
        for subset in itertools.combinations(range(3), size):
            m = th.add_decryption_shares(ciphertext, [shares[i] for i in subset])
            values = th.decode(m, ciphertext)
            # Uncorrelated with the plaintext (|r| of independent data: ~1/64).
            assert abs(correlation(values, plain)) < 0.08, subset
            assert np.abs(np.array(values)).max() > 1e6
    full = th.decode(th.add_decryption_shares(ciphertext, shares), ciphertext)
    assert correlation(full, plain) > 0.999999


def test_a_ranks_own_secret_decrypts_neither_its_ciphertext_nor_the_aggregate(group3):
    for r, secret in enumerate(group3.secrets):
        own = th.own_key_context(secret)
        assert own.is_private()
        mine = ts.ckks_vector_from(own, group3.ciphertexts[r].serialize()).decrypt()
        assert abs(correlation(mine, group3.updates[r])) < 0.08
        total = ts.ckks_vector_from(own, group3.aggregate.serialize()).decrypt()
        assert abs(correlation(total, group3.plain)) < 0.08
    # Control: the same secret with its own key share (h_i, a) is a working
    # SEAL key pair, so the secret did load as what it is.
    pair = torch.stack([group3.key_shares[0], group3.crp])
    alone = th.own_key_context(group3.secrets[0], pair)
    encrypted = ts.ckks_vector(alone, group3.updates[0].tolist())
    assert np.abs(np.array(encrypted.decrypt()) - group3.updates[0]).max() < 1e-9


def test_draws_are_fresh_without_a_seed_and_reproducible_with_one():
    params = th.ThresholdParameters(parties=2)
    one, two = th.generate_secret_share(params), th.generate_secret_share(params)
    assert not torch.equal(one.limbs, two.limbs)
    again = [th.generate_secret_share(params, seed=b"s").limbs for _ in range(2)]
    assert torch.equal(*again)
    assert "limbs" not in repr(one)
    with pytest.raises(TypeError, match="public seed"):
        th.common_random_polynomial(params, None)


def test_bad_inputs_are_rejected_with_their_name(group3):
    secret = group3.secrets[0]
    with pytest.raises(ValueError, match="crp must have shape"):
        th.public_key_share(secret, group3.crp[:2])
    bad = group3.crp.clone()
    bad[0, 0] = group3.params.key_moduli[0]
    with pytest.raises(ValueError, match="not reduced"):
        th.public_key_share(secret, bad)
    with pytest.raises(ValueError, match="decryption share must have shape"):
        th.add_decryption_shares(group3.aggregate, [group3.crp])


# ------------------------------------------------------------------ multi-rank
DEADLINE_S = 2.0
GROUP_SIZES = (2, 3, 8)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def protocol_worker(ctx) -> dict:
    """Rank `ctx.rank` of an 8-rank launch: the whole protocol on groups of
    2, 3 and 8 ranks (fixed seeds), then a key generation where rank 0 uses
    another common random polynomial."""
    import torch.distributed as dist

    groups = {size: dist.new_group(list(range(size))) for size in GROUP_SIZES[:-1]}
    groups[ctx.world_size] = None
    out: dict = {}
    for size, group in groups.items():
        if ctx.rank >= size:
            continue
        params = th.ThresholdParameters(parties=size)
        crp = th.common_random_polynomial(params, CRP_SEED)
        secret = th.generate_secret_share(params, seed=seed("secret", size, ctx.rank))
        share = th.public_key_share(secret, crp, seed=seed("noise", size, ctx.rank))
        key = th.collective_public_key(share, crp, params, group=group)
        encrypted = ts.ckks_vector(th.encryption_context(key), update(size, ctx.rank).tolist())
        total = th.aggregate(encrypted, group=group)
        d = th.decryption_share(secret, total, seed=seed("smudging", size, ctx.rank))
        m = th.combine_decryption_shares(d, total, group=group)
        out[size] = {
            "key_digest": _digest(key.limbs),
            "key": key.limbs if ctx.rank == 0 else None,
            "aggregate": ckks_to_limbs(total)[0] if ctx.rank == 0 else None,
            "share": d,
            "plaintext": m,
            "values": np.array(th.decode(m, total)[:SIZE]),
        }
    params = th.ThresholdParameters(parties=ctx.world_size)
    crp = th.common_random_polynomial(params, b"another seed" if ctx.rank == 0 else CRP_SEED)
    secret = th.generate_secret_share(params)
    try:
        th.collective_public_key(th.public_key_share(secret, crp), crp, params)
        out["mismatch"] = None
    except th.ThresholdMismatch as e:
        out["mismatch"] = str(e)
    return out


@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_threshold_aggregation_decrypts_on_2_3_and_8_gloo_ranks():
    from distir.runtime.launch import launch

    reports = launch(protocol_worker, 8, pass_context=True, timeout=220)
    for size in GROUP_SIZES:
        members = [reports[r][size] for r in range(size)]
        params = th.ThresholdParameters(parties=size)
        key_q, data_q = params.key_moduli, params.data_moduli
        # Every member holds the same key: the modular sum of the key shares.
        assert {m["key_digest"] for m in members} == {_digest(members[0]["key"])}
        crp = th.common_random_polynomial(params, CRP_SEED)
        secrets_ = [
            th.generate_secret_share(params, seed=seed("secret", size, r)) for r in range(size)
        ]
        shares = [
            th.public_key_share(s, crp, seed=seed("noise", size, r)) for r, s in enumerate(secrets_)
        ]
        assert torch.equal(members[0]["key"], torch.stack([modular_sum(shares, key_q), crp]))
        # m = c0 + sum of the published decryption shares, on every member.
        c0 = members[0]["aggregate"][0]
        m = modular_sum([c0] + [x["share"] for x in members], data_q)
        assert all(torch.equal(x["plaintext"], m) for x in members)
        plain = sum(update(size, r) for r in range(size))
        for x in members:
            assert np.array_equal(x["values"], members[0]["values"])
        assert np.abs(members[0]["values"] - plain).max() <= 7 * params.smudging_error_std
        if size == 2:  # bit for bit against the independent reference
            n = params.poly_modulus_degree
            a = reference.crp(CRP_SEED, list(key_q), n)
            ref_s = [reference.secret(seed("secret", 2, r), list(key_q), n) for r in range(2)]
            ref_h = [
                reference.key_share(s, a, seed("noise", 2, r), list(key_q), n)
                for r, s in enumerate(ref_s)
            ]
            assert members[0]["key"].tolist() == [reference.modular_sum(ref_h, list(key_q)), a]
            c1 = members[0]["aggregate"][1].tolist()
            for r in range(2):
                want = reference.decryption_share(
                    c1,
                    ref_s[r][: len(data_q)],
                    seed("smudging", 2, r),
                    params.smudging_bits,
                    list(data_q),
                    n,
                )
                assert members[r]["share"].tolist() == want
    for r in range(8):
        assert "different common random polynomials" in reports[r]["mismatch"]


def fault_worker(ctx, phase: str) -> dict:
    """The last rank exits in the middle of `phase`; survivors report."""
    params = th.ThresholdParameters(parties=ctx.world_size)
    crp = th.common_random_polynomial(params, CRP_SEED)
    secret = th.generate_secret_share(params)
    share = th.public_key_share(secret, crp)
    quitter = ctx.rank == ctx.world_size - 1
    result: dict = {"key": None, "plaintext": None, "error": None}
    start = time.monotonic()
    try:
        if phase == "keygen" and quitter:
            os._exit(3)
        key = th.collective_public_key(share, crp, params, deadline=DEADLINE_S)
        result["key"] = key.limbs if phase == "keygen" else None
        encrypted = ts.ckks_vector(th.encryption_context(key), update(3, ctx.rank).tolist())
        total = th.aggregate(encrypted, deadline=DEADLINE_S)
        d = th.decryption_share(secret, total)
        if phase == "decryption" and quitter:
            os._exit(3)
        start = time.monotonic()
        result["plaintext"] = th.combine_decryption_shares(d, total, deadline=DEADLINE_S)
    except Exception as e:  # recorded for the parent to assert on
        result["error"] = type(e).__name__
        result["message"] = str(e)
    result["seconds"] = time.monotonic() - start
    return result


@pytest.mark.multirank
@pytest.mark.timeout(90)
@pytest.mark.parametrize("phase", ["keygen", "decryption"])
def test_a_rank_that_exits_fails_every_survivor_promptly_with_nothing_returned(phase):
    from distir.runtime.launch import LaunchError, launch

    with pytest.raises(LaunchError) as caught:
        launch(fault_worker, 3, phase, pass_context=True, timeout=60)
    assert multiprocessing.active_children() == [], "a rank process survived"
    assert "exited with code 3" in caught.value.failures[2]
    survivors = caught.value.results
    assert sorted(survivors) == [0, 1]
    for report in survivors.values():
        assert report["error"] in ("CollectiveFailed", "DeadlineExceeded", "Poisoned"), report
        assert report["seconds"] < DEADLINE_S + 2, report
        assert report["key"] is None and report["plaintext"] is None
