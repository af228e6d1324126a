"""CKKS vectors longer than the slot count: TenSEAL packs them into several
SEAL ciphertexts, which `ckks_to_limbs` returns as `[C, size, L, N]` limbs,
chunk by chunk, and a dist ciphertext sum adds along that leading axis."""

from __future__ import annotations

import pytest
import torch

import distir
from distir.he.seal import ckks_to_limbs, limbs_to_ckks, parse_ckks_chunks, parse_ckks_vector

ts = pytest.importorskip("tenseal")

N = 4096
SLOTS = N // 2
LENGTH = 2 * SLOTS + 900  # three ciphertexts


@pytest.fixture(scope="module")
def context():
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, N, coeff_mod_bit_sizes=[40, 21, 40])
    ctx.global_scale = 2**21
    return ctx


def _values(seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(LENGTH, generator=g, dtype=torch.float64) - 0.5).tolist()


def test_a_long_vector_is_read_chunk_by_chunk_and_written_back(context) -> None:
    vector = ts.ckks_vector(context, _values(0))
    assert len(parse_ckks_chunks(vector)) == 3
    limbs, moduli = ckks_to_limbs(vector)
    assert limbs.shape == (3, 2, 2, N) and moduli.shape == (2,)
    assert not torch.equal(limbs[0], limbs[1])
    back = limbs_to_ckks(limbs, vector)
    assert torch.equal(ckks_to_limbs(back)[0], limbs)
    decrypted = torch.tensor(back.decrypt(), dtype=torch.float64)
    assert decrypted.tolist() == vector.decrypt()  # the same ciphertexts
    # (this small test context keeps about 2^-9 of precision)
    assert torch.allclose(decrypted, torch.tensor(_values(0), dtype=torch.float64), atol=1e-2)


def test_parse_ckks_vector_points_long_vectors_to_the_chunked_reader(context) -> None:
    with pytest.raises(ValueError, match="holds 3 SEAL ciphertexts .* ckks_to_limbs"):
        parse_ckks_vector(ts.ckks_vector(context, _values(1)))


def test_wrongly_shaped_limbs_name_the_chunked_shape(context) -> None:
    vector = ts.ckks_vector(context, _values(2))
    limbs, _ = ckks_to_limbs(vector)
    with pytest.raises(ValueError, match=r"\[C ciphertexts, size, L, N\] = \[3, 2, 2, 4096\]"):
        limbs_to_ckks(limbs[0], vector)


SUM = f"""\
func.func @main(%ct: tensor<3x2x2x{N}xi64>, %q: tensor<2xi64>) -> tensor<3x2x2x{N}xi64> {{
  %s = dist.all_reduce_add_ciphertext %ct, %q : tensor<3x2x2x{N}xi64>, tensor<2xi64>
  func.return %s : tensor<3x2x2x{N}xi64>
}}
"""


def test_the_ciphertext_sum_of_long_vectors_is_seals_sum(context) -> None:
    vectors = [ts.ckks_vector(context, _values(10 + r)) for r in range(3)]
    inputs = [list(ckks_to_limbs(v)) for v in vectors]
    for pipeline in ("", "lower-ciphertext-add"):
        (total, *_) = distir.compile(SUM, pipeline).simulate(inputs)
        seal_sum = vectors[0] + vectors[1] + vectors[2]
        assert torch.equal(total, ckks_to_limbs(seal_sum)[0])
        decrypted = torch.tensor(limbs_to_ckks(total, vectors[0]).decrypt(), dtype=torch.float64)
        expected = sum(torch.tensor(_values(10 + r), dtype=torch.float64) for r in range(3))
        assert torch.allclose(decrypted, expected, atol=3e-2)
