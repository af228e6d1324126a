"""Many ciphertexts' limbs written into one TenSEAL vector from the headers
of one parse (`distir.he.seal.limbs_to_vector`, `vector_proto`) and
decoded by one decryption (`distir.he.threshold.decode_all`): the same
values, in order, as each ciphertext on its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

ts = pytest.importorskip("tenseal")

from distir.he import threshold as th  # noqa: E402
from distir.he.seal import (  # noqa: E402
    CiphertextHeader,
    ckks_to_limbs,
    limbs_to_vector,
    parse_ckks_chunks,
    vector_proto,
)

SLOTS = 2048


def _context():
    context = ts.context(ts.SCHEME_TYPE.CKKS, 4096, coeff_mod_bit_sizes=[40, 20, 40])
    context.global_scale = 2.0**20
    return context


CONTEXT = _context()


@settings(max_examples=8, deadline=None)
@given(sizes=st.lists(st.integers(1, SLOTS), min_size=1, max_size=4), seed=st.integers(0, 99))
def test_one_vector_of_many_ciphertexts_decrypts_to_each_ones_values_in_order(sizes, seed):
    rng = np.random.default_rng(seed)
    values = [rng.normal(size=n) for n in sizes]
    vectors = [ts.ckks_vector(CONTEXT, v.tolist()) for v in values]
    headers = [CiphertextHeader.of(parse_ckks_chunks(v)) for v in vectors]
    limbs = torch.stack([ckks_to_limbs(v)[0] for v in vectors])
    together = limbs_to_vector(limbs, headers, CONTEXT)
    assert together.size() == sum(sizes)
    # SEAL decrypts the rebuilt ciphertexts as it decrypts the originals
    expected = np.concatenate([np.array(v.decrypt()) for v in vectors])
    np.testing.assert_array_equal(np.array(together.decrypt()), expected)
    np.testing.assert_allclose(expected, np.concatenate(values), atol=1e-2)  # plain numpy
    # one ciphertext's proto loads back to the same limbs and values
    for k, v in enumerate(vectors):
        blob = vector_proto(limbs[k : k + 1], [headers[k]])
        loaded = ts.ckks_vector_from(CONTEXT, blob)
        assert torch.equal(ckks_to_limbs(loaded)[0], limbs[k])
        assert loaded.decrypt() == v.decrypt()


def test_decode_all_decodes_each_plaintext_with_its_templates_format_scales_mixed():
    """Plaintexts `(m, 0)` decode as SEAL decrypts `(m, 0)` under the zero
    key, in batches and one at a time where the scales differ."""
    rng = np.random.default_rng(3)
    vectors = [ts.ckks_vector(CONTEXT, rng.normal(size=n).tolist()) for n in (5, SLOTS, 7)]
    vectors.append(ts.ckks_vector(CONTEXT, rng.normal(size=9).tolist(), scale=2.0**19))
    plain = torch.stack([ckks_to_limbs(v)[0][0] for v in vectors])  # c0 as a plaintext
    saved = th.DECODE_BATCH
    try:
        for batch in (1, 2, 32):
            th.DECODE_BATCH = batch
            got = th.decode_all(plain, vectors)
            want = [th.decode(plain[k], v) for k, v in enumerate(vectors)]
            assert got == want
            assert [len(g) for g in got] == [5, SLOTS, 7, 9]
    finally:
        th.DECODE_BATCH = saved


def test_headers_of_another_shape_or_a_vector_of_many_ciphertexts_are_refused():
    one = ts.ckks_vector(CONTEXT, [1.0])
    many = ts.ckks_vector(CONTEXT, [1.0] * (SLOTS + 1))
    with pytest.raises(ValueError, match="describes one SEAL ciphertext"):
        CiphertextHeader.of(parse_ckks_chunks(many))
    header = CiphertextHeader.of(parse_ckks_chunks(one))
    limbs = ckks_to_limbs(one)[0]
    with pytest.raises(ValueError, match="int64"):
        limbs_to_vector(limbs, [header], CONTEXT)  # [size, L, N]: no leading C
    with pytest.raises(ValueError, match="scale or shape"):
        limbs_to_vector(limbs[:, :1].unsqueeze(0).contiguous(), [header], CONTEXT)
