"""Threshold CKKS arithmetic (local, one process): keys, Shamir shares,
decryption and key-switch shares, smudging, budget, saved shares."""

from __future__ import annotations

import inspect
import itertools
import math
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts  # the `test` extra installs it: never skipped
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import threshold_reference as reference  # noqa: E402
from strategies import examples  # noqa: E402

from distir.aggregation import channels as ch  # noqa: E402
from distir.aggregation import threshold as ta  # noqa: E402
from distir.he import threshold as th  # noqa: E402
from distir.he.ntt import (  # noqa: E402
    WORD_ARITHMETIC,
    centered,
    from_ntt,
    mul_mod,
    mul_mod_words,
    negacyclic_ntt,
    to_ntt,
)
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
    """Every party's local steps in one process with fixed private seeds (the
    collective sums are local sums here; tests/he/test_aggregation.py runs
    the protocol on gloo ranks)."""

    def __init__(self, parties: int, threshold: int | None = None, **kw):
        self.params = th.ThresholdParameters(parties=parties, threshold=threshold, **kw)
        self.crp = th.common_random_polynomial(self.params, CRP_SEED)
        self.secrets = [
            th._secret_share(self.params, seed("secret", parties, r)) for r in range(parties)
        ]
        self.key_shares = [
            th._public_key_share(s, self.crp, seed("noise", parties, r))
            for r, s in enumerate(self.secrets)
        ]
        b = modular_sum(self.key_shares, self.params.key_moduli)
        self.key = th.collective_public_key_from_sum(self.params, b, self.crp)
        self.context = self.key.context()
        dealt = [
            th._shamir_shares(s, seed("shamir", parties, r)) for r, s in enumerate(self.secrets)
        ]
        self.shares = [
            th.new_threshold_share(self.params, j, self.key, [dealt[i][j] for i in range(parties)])
            for j in range(parties)
        ]
        self.updates = [update(parties, r) for r in range(parties)]
        self.ciphertexts = [ts.ckks_vector(self.context, u.tolist()) for u in self.updates]
        self.aggregate = self.ciphertexts[0]
        for c in self.ciphertexts[1:]:
            self.aggregate = self.aggregate + c
        self.plain = sum(self.updates)

    def limbs(self, ciphertext):
        limbs, moduli = ckks_to_limbs(ciphertext)
        return limbs, [int(q) for q in moduli.tolist()]

    def decrypt_with(self, ciphertext, active, published=None) -> list[float]:
        """c0 + the shares of `published` (default: all of `active`), each
        made for the active set `active`, decoded."""
        limbs, moduli = self.limbs(ciphertext)
        shares = [
            th.decryption_share(self.shares[j], limbs, moduli, active)[0]
            for j in (active if published is None else published)
        ]
        return th.decode(th.add_shares(limbs[0], shares, moduli), ciphertext)


@pytest.fixture(scope="module")
def group3() -> LocalGroup:
    return LocalGroup(3)


@pytest.fixture(scope="module")
def group5() -> LocalGroup:
    return LocalGroup(5, threshold=3)


# ------------------------------------------------------------------ parameters
def test_smudging_width_budget_and_precision_follow_the_documented_formulas():
    for parties, bits in [(2, 67), (4, 69), (8, 71)]:
        for budget, extra in [(1, 0), (2, 1), (2**16, 16), (2**16 + 1, 17)]:
            params = th.ThresholdParameters(parties=parties, max_decryptions=budget)
            n, bound = params.poly_modulus_degree, params.ciphertext_noise_bound
            assert bound == parties * (3 + n * parties) // 2 + parties
            assert params.smudging_bits == bits + extra
            # D * N*B / 2^(b+1) <= 2^-40, and one bit less would not do.
            b = params.smudging_bits
            assert budget * n * bound * 2**40 <= 2 ** (b + 1) < 2 * (2**extra) * n * bound * 2**40
            assert params.statistical_distance * budget <= 2.0**-40
            ks = bound + 42 * n * parties
            assert 2 ** (params.key_switch_bits + 1) >= budget * n * ks * 2**40
            want = 2.0**b * math.sqrt(parties * n / 6) / 2.0**120
            assert params.smudging_error_std == pytest.approx(want)
    assert th.ThresholdParameters(parties=8).key_switch_error_std < 1e-7
    with pytest.raises(ValueError, match="raise the scale"):
        th.ThresholdParameters(parties=4, scale=2.0**80)
    with pytest.raises(ValueError, match="threshold must be between 1 and parties"):
        th.ThresholdParameters(parties=4, threshold=5)
    assert th.ThresholdParameters(parties=4).threshold == 4


def test_parameters_name_seal_primes(group3):
    template = th._template(group3.params)
    assert tuple(key_moduli(template).tolist()) == group3.params.key_moduli
    assert group3.params.data_moduli == group3.params.key_moduli[:-1]
    assert all(q % (2 * 8192) == 1 for q in group3.params.key_moduli)


# ------------------------------------------------------------------------ NTT
def test_the_ntt_is_seals_own_secret_keys_are_ternary_after_the_inverse():
    context = ts.context(ts.SCHEME_TYPE.CKKS, 8192, coeff_mod_bit_sizes=[60, 50, 50, 50])
    moduli = key_moduli(context)
    secret = secret_key_limbs(context)
    coefficients = centered(secret, moduli)
    assert set(coefficients.tolist()) == {-1, 0, 1}
    for limb, q in zip(from_ntt(secret, moduli), moduli.tolist(), strict=True):
        assert set(limb.tolist()) == {0, 1, q - 1}
    assert torch.equal(to_ntt(coefficients, moduli), secret)
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


PRIMES = (*th.ThresholdParameters(parties=2).key_moduli, 2**61 - 1)  # the largest allowed


@pytest.mark.skipif(not WORD_ARITHMETIC, reason="needs a 64-bit-mantissa long double")
@settings(max_examples=examples(0.6), deadline=None)
@given(
    st.sampled_from(PRIMES),
    st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)), min_size=1, max_size=64),
)
def test_word_products_are_exact_modular_products(q, pairs):
    extremes = [(q - 1, q - 1), (q - 1, 1), (0, q - 1), (q // 2, q - 2)]
    xs, ws = zip(*[(a % q, b % q) for a, b in pairs] + extremes)
    got = mul_mod_words(np.array(xs, dtype=np.int64), np.array(ws, dtype=np.int64), q)
    assert got.tolist() == [a * b % q for a, b in zip(xs, ws)]


def test_the_word_ntt_equals_the_integer_ntt():
    rng = np.random.default_rng(7)
    for q in PRIMES[:-1]:
        transform = negacyclic_ntt(q, 8192)
        big = [int(v) * 2**25 - 5 for v in rng.integers(-(2**60), 2**60, size=8192)]
        assert transform.forward_words(big).tolist() == transform.forward(big).tolist()


# ------------------------------------------------------- bit-for-bit reference
def test_key_shares_shamir_shares_and_decryption_shares_equal_the_reference():
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
    # Shamir (t = 2): f_i(x) = s_i + c_i x, c_i from the stream shamir/1/<limb>.
    coefficient = [reference.crp_like("shamir/1", seed("shamir", 2, i), key_q, n) for i in range(2)]
    sk = [
        reference.modular_sum(
            [reference.shamir_share(secrets_[i], [coefficient[i]], j, key_q) for i in range(2)],
            key_q,
        )
        for j in range(2)
    ]
    for j in range(2):
        assert group.shares[j]._limbs.tolist() == sk[j]
    limbs, moduli = group.limbs(group.aggregate)
    c1 = limbs[1].tolist()
    for j in range(2):
        d, _tag = th.decryption_share(group.shares[j], limbs, moduli, [0, 1])
        smudging_seed, _ = group.shares[j]._noise_seed("decrypt", th._context_bytes(limbs, [0, 1]))
        want = reference.decryption_share(
            c1,
            [row for row in sk[j][: len(data_q)]],
            [0, 1],
            j,
            smudging_seed,
            params.smudging_bits,
            data_q,
            n,
        )
        assert d.tolist() == want


# ------------------------------------------------------------ key and decryption
def test_the_collective_key_is_a_public_tenseal_context_and_round_trips(group3):
    loaded = ts.context_from(group3.key.serialize())
    assert not loaded.is_private() and not loaded.has_secret_key()
    assert torch.equal(public_key_limbs(loaded), group3.key.limbs)
    assert loaded.global_scale == 2.0**120
    encrypted = ts.ckks_vector(loaded, group3.updates[0].tolist())
    values = group3.decrypt_with(encrypted, [0, 1, 2])
    err = np.abs(np.array(values[:SIZE]) - group3.updates[0]).max()
    assert err <= 7 * group3.params.smudging_error_std


def test_the_ciphertext_noise_is_within_the_bound_the_smudging_assumes(group3):
    params, moduli = group3.params, group3.params.data_moduli
    secret = modular_sum([s.limbs[: len(moduli)] for s in group3.secrets], moduli)
    zero = ts.ckks_vector(group3.context, [0.0] * 16)
    limbs = ckks_to_limbs(zero)[0]
    noise = centered(modular_sum([limbs[0], mul_mod(limbs[1], secret, moduli)], moduli), moduli)
    per_ciphertext = max(abs(int(e)) for e in noise)
    assert 0 < per_ciphertext <= params.ciphertext_noise_bound // params.parties


def test_the_aggregate_decrypts_within_the_smudging_error(group3):
    values = np.array(group3.decrypt_with(group3.aggregate, [0, 1, 2]))
    err = np.abs(values[:SIZE] - group3.plain)
    sigma = group3.params.smudging_error_std
    assert err.max() <= 7 * sigma
    # The error is the smudging noise of 3 shares (sigma is for `parties` = 3).
    assert 0.5 * sigma < err.std() < 1.5 * sigma


def test_every_3_of_5_shares_decrypt_and_no_2_do(group5):
    """t = 3 of P = 5: every active set of 3 decrypts; two colluding parties
    interpolating their own shares (or any 2 of an active set's published
    shares) get noise."""
    params, total, plain = group5.params, group5.aggregate, group5.plain
    limbs, moduli = group5.limbs(total)
    for active in itertools.combinations(range(5), 3):
        values = np.array(group5.decrypt_with(total, list(active)))
        assert np.abs(values[:SIZE] - plain).max() <= 7 * params.smudging_error_std, active
    for pair in itertools.combinations(range(5), 2):
        # The pair's best guess at s: Lagrange interpolation through its 2 points.
        weights = th.lagrange_coefficients(list(pair), moduli)
        guess = modular_sum(
            [
                th._scalar_mul(group5.shares[j]._limbs[: len(moduli)], weights[j], moduli)
                for j in pair
            ],
            moduli,
        )
        m = modular_sum([limbs[0], mul_mod(limbs[1], guess, moduli)], moduli)
        values = th.decode(m, total)
        assert abs(correlation(values, plain)) < 0.08, pair
        assert np.abs(np.array(values)).max() > 1e6
        third = next(k for k in range(5) if k not in pair)
        published = group5.decrypt_with(total, [*pair, third], list(pair))
        assert abs(correlation(published, plain)) < 0.08, pair
    with pytest.raises(ValueError, match="2 active parties cannot decrypt: the threshold is 3"):
        th.decryption_share(group5.shares[0], limbs, moduli, [0, 1])


@pytest.mark.parametrize("target", ["aggregate", "individual"])
def test_no_proper_subset_of_n_of_n_decryption_shares_decrypts(group3, target):
    ciphertext = group3.aggregate if target == "aggregate" else group3.ciphertexts[1]
    plain = group3.plain if target == "aggregate" else group3.updates[1]
    for size in range(3):
        for subset in itertools.combinations(range(3), size):
            values = group3.decrypt_with(ciphertext, [0, 1, 2], list(subset))
            assert abs(correlation(values, plain)) < 0.08, subset
            assert np.abs(np.array(values)).max() > 1e6
    full = group3.decrypt_with(ciphertext, [0, 1, 2])
    assert correlation(full, plain) > 0.999999


# ------------------------------------------------------- no seed, derived noise
def test_no_public_function_takes_a_seed_for_a_secret_or_a_noise_draw():
    for module in (th, ta):
        for name in module.__all__:
            obj = getattr(module, name)
            for fn in [obj, *vars(obj).values()] if inspect.isclass(obj) else [obj]:
                if not callable(fn):
                    continue
                try:
                    parameters = inspect.signature(fn).parameters
                except (TypeError, ValueError):
                    continue
                seeded = [p for p in parameters if "seed" in p]
                # Only the *public* common random polynomial is seeded.
                assert not seeded or fn is th.common_random_polynomial, (name, seeded)


def test_the_seed_reuse_recovery_of_a_secret_share_fails_and_a_retry_reveals_nothing(group3):
    """Today's attack: two decryption shares made with the same noise differ
    by (c1 - c1')*lambda*sk, and dividing per limb recovers sk.  Through the
    public API the noise depends on the ciphertext, so the quotient is not
    the secret; a retry of one decryption publishes the identical share."""
    share = group3.shares[0]
    one, moduli = group3.limbs(group3.ciphertexts[0])
    two, _ = group3.limbs(group3.ciphertexts[1])
    d1, tag1 = th.decryption_share(share, one, moduli, [0, 1, 2])
    d2, tag2 = th.decryption_share(share, two, moduli, [0, 1, 2])
    again, tag_again = th.decryption_share(share, one, moduli, [0, 1, 2])
    assert torch.equal(again, d1) and tag_again == tag1 and tag1 != tag2
    weight = th._active_weight(share, [0, 1, 2], moduli)
    for limb, q in enumerate(moduli):
        diff_d = (d1[limb] - d2[limb]) % q
        diff_c = (one[1][limb] - two[1][limb]) % q
        recovered = [int(a) * pow(int(b), -1, q) % q for a, b in zip(diff_d[:64], diff_c[:64])]
        assert recovered != weight[limb][:64].tolist()
    # Control: with the noise of one reused (the old API), the division works.
    noise = (d1 - mul_mod(one[1], weight, moduli)) % torch.tensor(moduli).view(-1, 1)
    forged = (mul_mod(two[1], weight, moduli) + noise) % torch.tensor(moduli).view(-1, 1)
    for limb, q in enumerate(moduli):
        diff_d = (d1[limb] - forged[limb]) % q
        diff_c = (one[1][limb] - two[1][limb]) % q
        recovered = [int(a) * pow(int(b), -1, q) % q for a, b in zip(diff_d[:64], diff_c[:64])]
        assert recovered == weight[limb][:64].tolist()


def test_another_active_set_gets_other_noise(group5):
    limbs, moduli = group5.limbs(group5.aggregate)
    share = group5.shares[0]
    d1, t1 = th.decryption_share(share, limbs, moduli, [0, 1, 2])
    d2, t2 = th.decryption_share(share, limbs, moduli, [0, 1, 3])
    w1, w2 = (th._active_weight(share, a, moduli) for a in ([0, 1, 2], [0, 1, 3]))
    q = torch.tensor(moduli).view(-1, 1)
    e1 = (d1 - mul_mod(limbs[1], w1, moduli)) % q
    e2 = (d2 - mul_mod(limbs[1], w2, moduli)) % q
    assert t1 != t2 and not torch.equal(e1, e2)


# ----------------------------------------------------------- budget and files
def test_the_budget_counts_new_decryptions_and_refuses_one_more():
    group = LocalGroup(2, max_decryptions=2)
    share = group.shares[0]
    tags = [
        th.decryption_share(share, group.limbs(c)[0], group.limbs(c)[1], [0, 1])[1]
        for c in group.ciphertexts
    ]
    share._spend(tags[:1])
    share._spend(tags[:1])  # a retry spends nothing
    assert share.decryptions_left == 1
    extra = th.decryption_share(
        share, group.limbs(group.aggregate)[0], group.limbs(group.aggregate)[1], [0, 1]
    )[1]
    with pytest.raises(th.DecryptionBudgetExhausted, match="1 of 2 decryptions left, 2 requested"):
        share._spend([tags[1], extra])
    share._spend([tags[1]])
    assert share.decryptions_left == 0
    with pytest.raises(th.DecryptionBudgetExhausted):
        share._spend([extra])


def test_a_saved_share_is_private_and_loads_to_the_same_share(group3, tmp_path):
    share = group3.shares[1]
    assert "limbs" not in repr(share) and "noise" not in repr(share)
    assert repr(share) == "ThresholdShare(party=1, parties=3, threshold=3, decryptions=0/65536)"
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(share)
    path = tmp_path / "share.pt"
    path.write_bytes(b"old")
    os.chmod(path, 0o644)
    share.save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    loaded = th.ThresholdShare.load(path)
    assert repr(loaded) == repr(share)
    limbs, moduli = group3.limbs(group3.aggregate)
    assert torch.equal(
        th.decryption_share(loaded, limbs, moduli, [0, 1, 2])[0],
        th.decryption_share(share, limbs, moduli, [0, 1, 2])[0],
    )
    os.chmod(path, 0o640)
    with pytest.raises(PermissionError, match="must be private"):
        th.ThresholdShare.load(path)


# ------------------------------------------------------------ outside receiver
def test_a_key_switch_reaches_the_receiver_and_the_ranks_shares_decode_to_noise(group5):
    receiver = th.receiver_context(group5.params)
    receiver_key = public_key_limbs(receiver)
    total = group5.aggregate
    limbs, moduli = group5.limbs(total)
    active = [0, 2, 4]
    parts = [
        th.key_switch_share(group5.shares[j], limbs, moduli, active, receiver_key)[0]
        for j in active
    ]
    h0 = th.add_shares(limbs[0], [p[0] for p in parts], moduli)
    h1 = th.add_shares(torch.zeros_like(limbs[0]), [p[1] for p in parts], moduli)
    switched = ts.ckks_vector_from(
        receiver, th.limbs_to_ckks(torch.stack([h0, h1]), total).serialize()
    )
    values = np.array(switched.decrypt())
    err = np.abs(values[:SIZE] - group5.plain).max()
    assert err <= 7 * group5.params.key_switch_error_std
    assert err > 0.1 * group5.params.key_switch_error_std  # smudged, not exact
    # What the ranks hold -- c0 + the summed shares, decoded as a plaintext --
    # is noise, and the collective key's view of it too.
    assert abs(correlation(th.decode(h0, total), group5.plain)) < 0.08
    mine = group5.decrypt_with(ts.ckks_vector_from(group5.context, switched.serialize()), active)
    assert abs(correlation(mine, group5.plain)) < 0.08


# ----------------------------------------------------------------- channels
def test_channels_seal_for_one_receiver_only_and_refuse_tampering():
    a, b, c = (ch.Channels(r, b"session") for r in range(3))
    keys = [x.public_key for x in (a, b, c)]
    for x in (a, b, c):
        x.connect(keys)
    blob = a.seal(1, b"secret share", b"shamir")
    assert len(blob) == len(b"secret share") + ch.TAG_BYTES and b"secret" not in blob
    assert b.open(0, blob, b"shamir") == b"secret share"
    with pytest.raises(ch.ChannelError, match="rank 2: the message from rank 0 failed"):
        c.open(0, blob, b"shamir")
    with pytest.raises(ch.ChannelError, match="failed authentication"):
        b.open(0, blob[:-1] + bytes([blob[-1] ^ 1]), b"shamir")
    with pytest.raises(ch.ChannelError, match="failed authentication"):
        b.open(2, blob, b"shamir")  # claimed from another sender
    with pytest.raises(ch.ChannelError, match="already sealed"):
        a.seal(1, b"another", b"shamir")
    other = ch.Channels(1, b"another session")
    other.connect([keys[0], other.public_key, keys[2]])
    with pytest.raises(ch.ChannelError):
        other.open(0, blob, b"shamir")


# --------------------------------------------------------- Shamir, generated
@settings(max_examples=8, deadline=None)
@given(st.data())
def test_any_t_shamir_shares_rebuild_the_sum_of_secrets_and_t_minus_1_do_not(data):
    parties = data.draw(st.integers(2, 6), label="parties")
    threshold = data.draw(st.integers(2, parties), label="threshold")
    params = th.ThresholdParameters(parties=parties, threshold=threshold)
    moduli = params.key_moduli
    secrets_ = [th.generate_secret_share(params) for _ in range(parties)]
    dealt = [th.shamir_shares(s) for s in secrets_]
    held = [modular_sum([dealt[i][j] for i in range(parties)], moduli) for j in range(parties)]
    want = modular_sum([s.limbs for s in secrets_], moduli)

    def rebuild(active):
        weights = th.lagrange_coefficients(active, moduli)
        return modular_sum([th._scalar_mul(held[j], weights[j], moduli) for j in active], moduli)

    active = sorted(data.draw(st.permutations(range(parties)), label="order")[:threshold])
    assert torch.equal(rebuild(active), want)
    assert not torch.equal(rebuild(active[:-1]), want)


@settings(max_examples=examples(0.5), deadline=None)
@given(bits=st.integers(1, 200), count=st.integers(1, 300), seed=st.binary(min_size=1, max_size=8))
def test_uniform_signed_noise_is_the_streams_masked_chunks_minus_the_offset(bits, count, seed):
    # The oracle: SHAKE-256 and int.from_bytes, chunk by chunk.
    import hashlib

    width = (bits + 8) // 8
    stream = hashlib.shake_256(b"distir/threshold/v1/noise\0" + seed).digest(width * count)
    want = [
        (int.from_bytes(stream[k * width : (k + 1) * width], "little") % 2 ** (bits + 1)) - 2**bits
        for k in range(count)
    ]
    got = th._uniform_signed("noise", seed, bits, count)
    assert got.dtype == object and list(got) == want
    assert all(-(2**bits) <= v < 2**bits for v in got)
