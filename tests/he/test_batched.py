"""Batched share arithmetic over [C, L, N] (distir.he.batched) against exact
Python integers: word products, the NTT, the smudging residues, and whole
decryption and key-switch shares of several ciphertexts at once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import threshold_reference as reference  # noqa: E402
from strategies import examples  # noqa: E402

from distir.he import batched  # noqa: E402
from distir.he import threshold as th  # noqa: E402

# SEAL's primes of the default parameters, the largest 61- and 62-bit NTT
# primes for N = 16 (the headroom's edge), and a small one.
PRIMES = (
    *th.ThresholdParameters(parties=2).key_moduli,
    2305843009213693921,  # < 2^61, = 1 mod 32
    4611686018427387617,  # < 2^62, = 1 mod 32
    97,
)


def residues(draw_list, qs):
    return torch.tensor([[v % q for v in row] for row, q in zip(draw_list, qs)], dtype=torch.int64)


@settings(max_examples=examples(0.6), deadline=None)
@given(
    q=st.sampled_from(PRIMES),
    xs=st.lists(st.integers(0, 2**64), min_size=1, max_size=40),
    w=st.integers(0, 2**64),
)
def test_word_products_are_exact_at_every_prime_up_to_the_headroom(q, xs, w):
    extremes = [0, 1, q - 1, q // 2, q - 2 if q > 2 else 0]
    values = [x % q for x in xs] + extremes
    for multiplier in (w % q, q - 1, 1, 0):
        m = batched.multiplier(torch.tensor([[multiplier]]), batched.moduli_column([q]))
        got = batched.mul_mod(torch.tensor([values]), m)
        assert got.tolist() == [[v * multiplier % q for v in values]]


@settings(max_examples=examples(0.4), deadline=None)
@given(
    qs=st.lists(st.sampled_from(PRIMES[:-1]), min_size=1, max_size=3),
    count=st.integers(1, 3),
    data=st.data(),
)
def test_the_batched_ntt_is_the_reference_evaluation_of_every_polynomial(qs, count, data):
    n = 16
    polys = [
        data.draw(st.lists(st.integers(-(2**70), 2**70), min_size=n, max_size=n))
        for _ in range(count)
    ]
    x = torch.stack([residues([p] * len(qs), qs) for p in polys])
    got = batched.forward_ntt(x, qs)
    assert got.tolist() == [[reference.ntt(p, q) for q in qs] for p in polys]


@settings(max_examples=examples(0.5), deadline=None)
@given(
    bits=st.integers(1, 126),
    count=st.integers(1, 40),
    seeds=st.lists(st.binary(min_size=1, max_size=8), min_size=1, max_size=3),
)
def test_smudging_residues_are_the_streams_integers_modulo_each_prime(bits, count, seeds):
    width = (bits + 8) // 8
    qs = list(PRIMES[:4])
    streams = [reference.stream("smudging", s, width * count) for s in seeds]
    got = batched.signed_residues(streams, bits, count, qs)
    want = [
        [
            [
                (
                    (int.from_bytes(raw[k * width : (k + 1) * width], "little") % 2 ** (bits + 1))
                    - 2**bits
                )
                % q
                for k in range(count)
            ]
            for q in qs
        ]
        for raw in streams
    ]
    assert got.tolist() == want


# --------------------------------------------------- whole shares, several at once
N = 1024


@pytest.fixture(scope="module")
def small_share():
    # A share of made-up limbs (nothing here needs a real key): the formulas
    # are checked coefficient by coefficient at N = 1024.
    params = th.ThresholdParameters(parties=3, threshold=2, poly_modulus_degree=N)
    g = torch.Generator().manual_seed(3)
    q = torch.tensor(params.key_moduli).view(-1, 1)

    def uniform(*shape):
        return torch.randint(0, 2**62, (*shape, len(params.key_moduli), N), generator=g) % q

    key = th.CollectivePublicKey(params, uniform(2))
    share = th.ThresholdShare(params, 1, key, uniform(), b"k" * 32)
    data_q = list(params.data_moduli)
    limbs = uniform(3, 2)[:, :, : len(data_q)].contiguous()
    return params, share, limbs, data_q, uniform(2)


def _words(label, seed, width, accept, count):
    return reference._words(label, seed, width, accept, count)


def test_batched_decryption_shares_of_three_ciphertexts_are_the_integer_formula(small_share):
    params, share, limbs, qs, _ = small_share
    active = [0, 1]
    got, tags = th.decryption_shares(share, limbs, qs, active)
    sk = share._limbs.tolist()
    for c in range(limbs.shape[0]):
        seed, tag = share._noise_seed("decrypt", th._context_bytes(limbs[c], active))
        assert tags[c] == tag
        want = reference.decryption_share(
            limbs[c, 1].tolist(), sk[: len(qs)], active, 1, seed, params.smudging_bits, qs, N
        )
        assert got[c].tolist() == want


def test_batched_key_switch_shares_of_three_ciphertexts_are_the_integer_formula(small_share):
    import hashlib

    params, share, limbs, qs, receiver = small_share
    active = [1, 2]
    got, _tags = th.key_switch_shares(share, limbs, qs, active, receiver)
    extra = hashlib.sha256(receiver.contiguous().numpy().tobytes()).digest()
    sk, p0, p1 = share._limbs.tolist(), receiver[0].tolist(), receiver[1].tolist()
    for c in range(limbs.shape[0]):
        seed, _ = share._noise_seed("switch", th._context_bytes(limbs[c], active, extra))
        u = [b % 3 - 1 for b in _words("switch-u", seed, 1, lambda b: b < 255, N)]
        raw = reference.stream("switch-e1", seed, 6 * N)
        e1 = []
        for k in range(N):
            x = list(raw[6 * k : 6 * k + 6])
            x[2] &= 0x1F
            x[5] &= 0x1F
            e1.append(sum(bin(v).count("1") for v in x[:3]) - sum(bin(v).count("1") for v in x[3:]))
        bits = params.key_switch_bits
        width = (bits + 8) // 8
        raw = reference.stream("switch-e0", seed, width * N)
        e0 = [
            (int.from_bytes(raw[k * width : (k + 1) * width], "little") % 2 ** (bits + 1)) - 2**bits
            for k in range(N)
        ]
        c1 = limbs[c, 1].tolist()
        for j, q in enumerate(qs):
            weight = reference.lagrange(active, 1, q)
            u_j, e0_j, e1_j = (reference.ntt(v, q) for v in (u, e0, e1))
            h0 = [
                (c1[j][k] * weight * sk[j][k] + u_j[k] * p0[j][k] + e0_j[k]) % q for k in range(N)
            ]
            h1 = [(u_j[k] * p1[j][k] + e1_j[k]) % q for k in range(N)]
            assert got[c, 0, j].tolist() == h0
            assert got[c, 1, j].tolist() == h1


@settings(max_examples=examples(0.4), deadline=None)
@given(
    qs=st.lists(st.sampled_from(PRIMES), min_size=1, max_size=3),
    ranks=st.integers(1, 9),
    data=st.data(),
)
def test_the_aggregate_sum_is_the_integer_sum_with_or_without_the_headroom(qs, ranks, data):
    from distir.aggregation.threshold import _modular_sum, _unfaithful_ranks

    n = 4
    values = [
        [[data.draw(st.sampled_from([0, 1, q - 1, q // 2])) for _ in range(n)] for q in qs]
        for _ in range(ranks)
    ]
    per_rank = torch.tensor(values, dtype=torch.int64).view(ranks, 1, 1, len(qs), n)
    got = _modular_sum(per_rank, qs)
    want = [[sum(v[j][k] for v in values) % q for k in range(n)] for j, q in enumerate(qs)]
    assert got.view(len(qs), n).tolist() == want
    # Every rank's limbs are reduced and match their commitments; one limb
    # of one rank out of range (or a commitment altered) names that rank.
    from distir.aggregation.threshold import _commitment

    commitments = [_commitment(per_rank[i]) for i in range(ranks)]
    assert _unfaithful_ranks(per_rank, commitments, qs) == []
    bad = data.draw(st.integers(0, ranks - 1))
    altered = per_rank.clone()
    altered[bad, 0, 0, -1, 0] = qs[-1]
    assert _unfaithful_ranks(altered, commitments, qs) == [bad]
    assert _unfaithful_ranks(
        per_rank, commitments[:bad] + [bytes(32)] + commitments[bad + 1 :], qs
    ) == [bad]
