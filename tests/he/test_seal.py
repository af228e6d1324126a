"""TenSEAL interop: limbs extracted from SEAL ciphertexts add exactly like SEAL does."""

from __future__ import annotations

import pytest
import tenseal as ts  # the `test` extra installs it: never skipped
import tenseal.sealapi  # noqa: E402, F401
import torch
import zstandard  # noqa: E402, F401

from distir.he.rns import TorchRNSBackend, prepare_ciphertext_add_combine  # noqa: E402
from distir.he.seal import (  # noqa: E402
    _encode_varint,
    _proto_fields,
    _read_varint,
    ckks_moduli,
    ckks_to_limbs,
    limbs_to_ckks,
    parse_ckks_vector,
)

POLY_DEGREE = 8192
BIT_SIZES = [60, 40, 40, 60]
SCALE = 2.0**40


@pytest.fixture(scope="module")
def context():
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, POLY_DEGREE, coeff_mod_bit_sizes=BIT_SIZES)
    ctx.global_scale = SCALE
    return ctx


@pytest.fixture(scope="module")
def plain():
    g = torch.Generator().manual_seed(0)
    return [
        (torch.rand(200, generator=g, dtype=torch.float64) * 20 - 10).tolist() for _ in range(4)
    ]


@pytest.fixture(scope="module")
def vectors(context, plain):
    return [ts.ckks_vector(context, p) for p in plain]


def _close(got, want, rel=1e-6):
    assert len(got) == len(want)
    scale = max(1.0, max(abs(w) for w in want))
    worst = max(abs(g - w) for g, w in zip(got, want, strict=True))
    assert worst <= rel * scale, worst


def test_extraction_shape_and_reduced(context, vectors):
    limbs, moduli = ckks_to_limbs(vectors[0])
    assert limbs.dtype == moduli.dtype == torch.int64
    assert limbs.shape == (2, len(BIT_SIZES) - 1, POLY_DEGREE)
    # the top data level: all key-level primes but the last (special) one
    expected = [m.value() for m in ts.sealapi.CoeffModulus.Create(POLY_DEGREE, BIT_SIZES)][:-1]
    assert moduli.tolist() == expected
    assert torch.equal(ckks_moduli(context), moduli)
    assert bool((limbs >= 0).all()) and bool((limbs < moduli.view(-1, 1)).all())
    # limbs look uniformly random in [0, q_l): every limb uses its high bits
    for limb, q in zip(limbs[0], moduli.tolist(), strict=True):
        assert int(limb.max()) > q // 2
    layout = parse_ckks_vector(vectors[0])
    assert layout.is_ntt_form and layout.scale == SCALE and layout.compr_mode == 2


def test_torch_sum_is_bit_identical_to_seal_add(vectors, plain):
    v1, v2 = vectors[0], vectors[1]
    l1, moduli = ckks_to_limbs(v1)
    l2, moduli2 = ckks_to_limbs(v2)
    assert torch.equal(moduli, moduli2)
    summed = TorchRNSBackend().add_mod(l1, l2, moduli)

    seal_sum = v1 + v2
    seal_limbs, _ = ckks_to_limbs(seal_sum)
    assert torch.equal(summed, seal_limbs)

    rebuilt = limbs_to_ckks(summed, v1)
    assert torch.equal(ckks_to_limbs(rebuilt)[0], seal_limbs)
    want = [a + b for a, b in zip(plain[0], plain[1], strict=True)]
    _close(rebuilt.decrypt(), want)
    assert rebuilt.decrypt() == seal_sum.decrypt()


@pytest.mark.parametrize("implementation", [None, "subtract-and-mask", "remainder"])
def test_fold_of_four_matches_seal(vectors, plain, implementation):
    combine = prepare_ciphertext_add_combine("torch", implementation=implementation)
    acc, moduli = ckks_to_limbs(vectors[0])
    for v in vectors[1:]:
        combine.in_place(acc, ckks_to_limbs(v)[0], moduli)
    seal_sum = vectors[0] + vectors[1] + vectors[2] + vectors[3]
    assert torch.equal(acc, ckks_to_limbs(seal_sum)[0])
    want = [sum(col) for col in zip(*plain, strict=True)]
    _close(limbs_to_ckks(acc, vectors[0]).decrypt(), want)


def test_round_trip_is_lossless(vectors):
    v = vectors[2]
    limbs, _ = ckks_to_limbs(v)
    back = limbs_to_ckks(limbs, v)
    assert back.size() == v.size()
    assert back.decrypt() == v.decrypt()
    assert torch.equal(ckks_to_limbs(back)[0], limbs)
    # and the rebuilt ciphertext still composes with SEAL arithmetic
    assert torch.equal(ckks_to_limbs(back + v)[0], ckks_to_limbs(v + v)[0])


def test_lower_level_ciphertext(context, vectors, plain):
    prod = vectors[0] * vectors[1]  # relinearized and rescaled: one limb dropped
    limbs, moduli = ckks_to_limbs(prod)
    assert limbs.shape == (2, len(BIT_SIZES) - 2, POLY_DEGREE)
    assert moduli.tolist() == ckks_moduli(context).tolist()[:-1]
    doubled = TorchRNSBackend().add_mod(limbs, limbs, moduli)
    assert torch.equal(doubled, ckks_to_limbs(prod + prod)[0])
    want = [2 * a * b for a, b in zip(plain[0], plain[1], strict=True)]
    _close(limbs_to_ckks(doubled, prod).decrypt(), want, rel=1e-4)


def test_unrelinearized_ciphertext_has_three_polys(plain):
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, POLY_DEGREE, coeff_mod_bit_sizes=BIT_SIZES)
    ctx.global_scale = SCALE
    ctx.auto_relin = False
    ctx.auto_rescale = False
    v = ts.ckks_vector(ctx, plain[0][:8])
    sq = v * v
    limbs, moduli = ckks_to_limbs(sq)
    assert limbs.shape == (3, len(BIT_SIZES) - 1, POLY_DEGREE)
    back = limbs_to_ckks(limbs, sq)
    assert torch.equal(ckks_to_limbs(back)[0], limbs)


def test_limbs_to_ckks_rejects_bad_input(vectors):
    v = vectors[0]
    limbs, moduli = ckks_to_limbs(v)
    with pytest.raises(ValueError, match=r"\[size, L, N\]"):
        limbs_to_ckks(limbs[:, :2], v)
    bad = limbs.clone()
    bad[1, 2, 5] = int(moduli[2])
    with pytest.raises(ValueError, match="limb 2"):
        limbs_to_ckks(bad, v)
    with pytest.raises(ValueError, match="int64"):
        limbs_to_ckks(limbs.to(torch.float64), v)
    with pytest.raises(TypeError, match="CKKSVector"):
        ckks_to_limbs(limbs)


def test_protobuf_helpers_round_trip():
    for value in [0, 1, 127, 128, 300, 2**32, 2**63 - 1]:
        encoded = _encode_varint(value)
        assert _read_varint(encoded, 0) == (value, len(encoded))
    msg = b"\x0a\x01\x03" + b"\x12" + _encode_varint(3) + b"abc" + b"\x19" + bytes(8)
    assert [(f[0], f[1]) for f in _proto_fields(msg)] == [(1, 2), (2, 2), (3, 1)]
