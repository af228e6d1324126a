"""The threshold protocol against the parties of its threat model, on real
gloo ranks: a rank that lies about its input (a crafted ciphertext that
would reveal the collective key; a ciphertext other than the one it
committed to), a passive observer of the wire, a holder who restores a
saved share, degenerate parameters and receiver keys.

Each attack is carried out in full, by the attacker's own code (patched
into its rank process), and the test states what it gets: a named error on
every rank, or nothing usable."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ts = pytest.importorskip("tenseal")

from distir.aggregation import threshold as ta  # noqa: E402
from distir.he import threshold as th  # noqa: E402
from distir.he.ntt import centered, mul_mod, sub_mod, to_ntt  # noqa: E402
from distir.he.seal import ckks_to_limbs, limbs_to_ckks  # noqa: E402

SIZE = 4096
CRAFT = 130  # the crafted ciphertext is 2^CRAFT * (b, a)


def update(parties: int, rank: int) -> np.ndarray:
    return np.random.default_rng(7000 * parties + rank).normal(size=SIZE) * 0.01


def _times(limbs: torch.Tensor, scalar: int, moduli) -> torch.Tensor:
    column = torch.tensor([scalar % q for q in moduli], dtype=torch.int64)
    return mul_mod(limbs, column.view(-1, 1).expand_as(limbs).contiguous(), moduli)


def _inverse(limbs: torch.Tensor, moduli) -> torch.Tensor:
    rows = [[pow(int(x), q - 2, q) for x in row.tolist()] for row, q in zip(limbs, moduli)]
    return torch.tensor(rows, dtype=torch.int64)


def key_recovery_worker(ctx, opt_in: bool) -> dict:
    """3 ranks, t = 3. Rank 0 submits ``2^130 * (b, a)`` built from the
    collective public key: its decryption is ``2^130 * e``, the key's noise,
    and ``s = (e - b) / a``. Rank 0's code captures the plaintext
    polynomial its decryption computes, recovers ``s`` and decrypts rank 1's
    individual ciphertext (which reaches it in the sum, as in gather-fold)."""
    extra = {"decrypt_to_ranks": True} if opt_in else {}
    params = ta.ThresholdParameters(parties=3, **extra)
    share = ta.generate_keys(params)
    moduli = params.data_moduli
    levels = len(moduli)
    honest = ts.ckks_vector(share.public_key.context(), update(3, ctx.rank).tolist())
    mine = honest
    if ctx.rank == 0:
        b, a = share.public_key.limbs[0, :levels], share.public_key.limbs[1, :levels]
        crafted = torch.stack([_times(b, 2**CRAFT, moduli), _times(a, 2**CRAFT, moduli)])
        mine = limbs_to_ckks(crafted, honest)
    individual = [None] * 3
    torch.distributed.all_gather_object(individual, ckks_to_limbs(honest)[0])
    captured: list[torch.Tensor] = []
    if ctx.rank == 0:
        decode = th.decode

        def spy(plaintext, template, zero_key_context=None):
            captured.append(plaintext.clone())
            return decode(plaintext, template, zero_key_context)

        th.decode = spy
    out: dict = {"error": None, "stolen": None}
    try:
        total = ta.aggregate([mine], share)
        ta.decrypt(total, share)
    except Exception as e:  # recorded for the parent
        out["error"] = (type(e).__name__, str(e))
    if captured:
        noise = [(int(v) + 2 ** (CRAFT - 1)) >> CRAFT for v in centered(captured[0], moduli)]
        b, a = share.public_key.limbs[0, :levels], share.public_key.limbs[1, :levels]
        s = mul_mod(
            sub_mod(to_ntt(np.array(noise, dtype=object), moduli), b, moduli),
            _inverse(a, moduli),
            moduli,
        )
        c0, c1 = individual[1]
        plain = th.add_shares(c0, [mul_mod(c1, s, moduli)], moduli)
        out["stolen"] = np.array(th.decode(plain, honest)[:SIZE])
    return out


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_a_crafted_input_cannot_recover_the_key_by_default_decryption_to_ranks_is_refused():
    from distir.runtime.launch import launch

    reports = launch(key_recovery_worker, 3, False, pass_context=True, timeout=140)
    for report in reports:
        assert report["stolen"] is None
        assert report["error"] is not None
        assert report["error"][0] == "RankDecryptionRefused", report["error"]
        assert "decrypt_to_ranks" in report["error"][1]


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_with_decrypt_to_ranks_the_stated_risk_is_real_a_crafted_input_reveals_the_key():
    # Why decryption to the ranks is an opt-in: the attack works there.
    from distir.runtime.launch import launch

    reports = launch(key_recovery_worker, 3, True, pass_context=True, timeout=140)
    assert [r["error"] for r in reports] == [None, None, None]
    stolen = reports[0]["stolen"]
    assert stolen is not None
    assert np.abs(stolen - update(3, 1)).max() < 1e-6
