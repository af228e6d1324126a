"""`aggregate` receives the other ranks' ciphertexts slice by slice, and
the sealed decryption shares travel slice by slice: a rank never holds
more than one slice of every rank's at once, the sum is still every rank's
input summed, and a rank whose ciphertext in a later slice differs from
its commitment is still named on every rank."""

from __future__ import annotations

import numpy as np
import pytest

ts = pytest.importorskip("tenseal")

from distir.aggregation import programs  # noqa: E402
from distir.aggregation import threshold as ta  # noqa: E402
from distir.he.seal import ckks_to_limbs  # noqa: E402

SIZE = 4096
COUNT = 3  # ciphertexts per rank


def _values(rank: int, k: int) -> np.ndarray:
    return np.random.default_rng(100 * rank + k).normal(size=SIZE)


def stream_worker(ctx, liar: int | None) -> dict:
    """Slices of one ciphertext (every rank's): the received tensors are
    recorded; rank ``liar`` commits to Enc(0) in place of its last
    ciphertext (which only arrives in the last slice)."""
    import hashlib

    import torch

    params = ta.ThresholdParameters(parties=ctx.world_size, decrypt_to_ranks=True)
    share = ta.generate_keys(params)
    context = share.public_key.context()
    encrypted = [ts.ckks_vector(context, _values(ctx.rank, k).tolist()) for k in range(COUNT)]
    one = ckks_to_limbs(encrypted[0])[0]
    ta.STREAM_BYTES = ctx.world_size * one.numel() * 8  # one ciphertext of every rank's
    received: list[int] = []
    for name in ("gather_committed", "gather_limbs"):
        original = getattr(programs, name, None)
        if original is None:
            continue

        def recording(*args, _original=original, **kwargs):
            out = _original(*args, **kwargs)
            limbs = out[1] if isinstance(out, tuple) else out
            received.append(limbs.numel() * 8)
            return out

        setattr(programs, name, recording)
    if ctx.rank == liar:
        limbs = torch.stack([ckks_to_limbs(c)[0] for c in encrypted])
        limbs[-1] = ckks_to_limbs(ts.ckks_vector(context, [0.0] * SIZE))[0]
        committed = hashlib.sha256(limbs.contiguous().numpy().tobytes()).digest()
        ta._commitment = lambda limbs: committed
    sent: list[int] = []
    exchange = programs.exchange

    def recording_exchange(words, counts, **kwargs):
        sent.append(words.numel() * 8)
        return exchange(words, counts, **kwargs)

    programs.exchange = recording_exchange
    out: dict = {"error": None, "values": None, "received": received, "bound": ta.STREAM_BYTES}
    out["sent"] = sent
    try:
        total = ta.aggregate(encrypted, share)
        # the sealed decryption shares: one share (c0's size) for every other rank
        ta.STREAM_BYTES = out["share bound"] = (ctx.world_size - 1) * one[0].numel() * 8
        out["values"] = [np.array(v[:SIZE]) for v in ta.decrypt(total, share)]
    except Exception as e:  # recorded for the parent
        out["error"] = (type(e).__name__, str(e))
    return out


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_a_rank_holds_one_slice_of_the_other_ranks_ciphertexts_at_a_time_and_sums_them_all():
    from distir.runtime.launch import launch

    reports = launch(stream_worker, 2, None, pass_context=True, timeout=140)
    for report in reports:
        assert report["error"] is None, report["error"]
        assert len(report["received"]) == COUNT, report["received"]
        assert max(report["received"]) <= report["bound"], report["received"]
        # the decryption shares, sealed, went one ciphertext's at a time
        assert len(report["sent"]) == COUNT, report["sent"]
        assert max(report["sent"]) <= report["share bound"] + 16, report["sent"]
        for k in range(COUNT):
            want = _values(0, k) + _values(1, k)  # plain numpy: the oracle
            np.testing.assert_allclose(report["values"][k], want, atol=1e-6)


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_a_ciphertext_unlike_its_commitment_in_the_last_slice_is_named_on_every_rank():
    from distir.runtime.launch import launch

    reports = launch(stream_worker, 3, 2, pass_context=True, timeout=140)
    for report in reports:
        assert report["values"] is None, report
        assert report["error"] == (
            "CommitmentMismatch",
            "aggregate: the ciphertexts of rank 2 are not those it committed to; nothing was "
            "summed",
        )


def test_two_purposes_on_one_channel_never_share_a_keystream():
    """Every message is sealed under the fixed nonce, so each (direction,
    purpose) needs its own key: a stream's slices are sealed to the same
    rank under different purposes, and two ciphertexts under one keystream
    XOR to the XOR of their plaintexts."""
    from distir.aggregation import channels as ch

    a, b = ch.Channels(0, b"session"), ch.Channels(1, b"session")
    for x in (a, b):
        x.connect([a.public_key, b.public_key])
    first, second = bytes(64), bytes(range(64))
    one = a.seal(1, first, b"share/0")
    two = a.seal(1, second, b"share/1")
    xor = bytes(p ^ q for p, q in zip(one[:64], two[:64], strict=True))
    assert xor != bytes(p ^ q for p, q in zip(first, second, strict=True))
    assert b.open(0, one, b"share/0") == first
    assert b.open(0, two, b"share/1") == second
    with pytest.raises(ch.ChannelError, match="failed authentication"):
        b.open(0, one, b"share/1")  # another purpose: another key
