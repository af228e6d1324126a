"""Re-sharing the collective key to a rank that holds no share (a joiner),
on real gloo ranks: after a loss and a join every threshold subset of the
new group decrypts, and what the joiner receives never crosses the wire in
the clear."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts
import torch

sys.path.insert(0, str(Path(__file__).parent))

from distir.aggregation import threshold as ta  # noqa: E402
from distir.he import threshold as th  # noqa: E402

SIZE = 64


def update(rank: int) -> np.ndarray:
    return np.random.default_rng(500 + rank).normal(size=SIZE)


def _record(record: list) -> None:
    """Every distir program this rank runs records the bytes it sends and
    receives (what a passive observer of its links sees)."""
    from distir.aggregation import programs

    compiled = programs._compiled

    class Recorded:
        def __init__(self, program):
            self.program = program

        def run(self, *inputs, **kwargs):
            results = self.program.run(*inputs, **kwargs)
            outs = results if isinstance(results, tuple) else (results,)
            record.append(b"".join(x.contiguous().numpy().tobytes() for x in (*inputs, *outs)))
            return results

    programs._compiled = lambda text, deadline_s: Recorded(compiled(text, deadline_s))


def join_worker(ctx) -> dict:
    """4 ranks.  Ranks 0-2 generate a 2-of-3 key; rank 2 is lost (its share
    dropped, it takes no further part), rank 3 joins holding nothing; ranks
    0, 1 and 3 re-share to a 2-of-3 group, aggregate and publish their
    decryption share for every pair."""
    import torch.distributed as dist

    first = dist.new_group([0, 1, 2])
    second = dist.new_group([0, 1, 3])
    old = ta.ThresholdParameters(parties=3, threshold=2, decrypt_to_ranks=True)
    new = ta.ThresholdParameters(parties=3, threshold=2, decrypt_to_ranks=True)
    share = ta.generate_keys(old, group=first) if ctx.rank < 3 else None
    if ctx.rank == 2:
        return {"lost": True}
    wire: list = []
    _record(wire)
    opened: list = []
    channels_open = ta.Channels.open

    def recording_open(self, sender, blob, purpose):
        plain = channels_open(self, sender, blob, purpose)
        opened.append(plain)  # what this rank opens from its sealed channels
        return plain

    ta.Channels.open = recording_open
    try:
        fresh = ta.reshare(share, new, group=second, previous=old)
    finally:
        ta.Channels.open = channels_open
    out: dict = {"party": fresh.party, "wire": b"".join(wire), "opened": opened}
    out["share"] = fresh._limbs.contiguous().numpy().tobytes()
    out["key"] = fresh.public_key.limbs.clone()
    total = ta.aggregate(
        [ts.ckks_vector(fresh.public_key.context(), update(ctx.rank).tolist())],
        fresh,
        group=second,
    )
    out["c0"] = total.limbs[0, 0].clone()
    out["moduli"] = total.moduli
    out["pairs"] = {}
    for pair in itertools.combinations(range(3), 2):
        if fresh.party in pair:
            d, _ = th.decryption_shares(fresh, total.limbs, total.moduli, list(pair))
            out["pairs"][pair] = d[0].clone()
    return out


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_after_a_loss_and_a_join_every_pair_decrypts_and_the_joiners_share_is_never_in_clear():
    from distir.runtime.launch import launch

    reports = launch(join_worker, 4, pass_context=True, timeout=140)
    assert reports[2] == {"lost": True}
    members = {0: reports[0], 1: reports[1], 3: reports[3]}
    assert [members[r]["party"] for r in (0, 1, 3)] == [0, 1, 2]
    assert all(torch.equal(m["key"], reports[0]["key"]) for m in members.values())
    plain = update(0) + update(1) + update(3)
    params = th.ThresholdParameters(parties=3, threshold=2)
    template = ts.ckks_vector(th.receiver_context(params), [0.0] * SIZE)
    c0, moduli = reports[0]["c0"], reports[0]["moduli"]
    by_party = {m["party"]: m for m in members.values()}
    for pair in itertools.combinations(range(3), 2):
        shares = [by_party[p]["pairs"][pair] for p in pair]
        opened = np.array(th.decode(th.add_shares(c0, shares, moduli), template)[:SIZE])
        assert np.abs(opened - plain).max() < 1e-6, pair
    alone = np.array(th.decode(th.add_shares(c0, [by_party[2]["pairs"][(0, 2)]], moduli), template))
    assert np.abs(alone[:SIZE]).max() > 1e6  # one share decodes to noise
    # The joiner (party 2) received one sealed piece from each of the two
    # dealers and its share is their sum: neither piece nor the share
    # appears on any member's wire (every limb's first 64 bytes looked for).
    joiner = by_party[2]
    assert len(joiner["opened"]) == 2
    wire = b"".join(m["wire"] for m in members.values())
    limb = len(joiner["share"]) // len(th.ThresholdParameters(parties=3).key_moduli)
    for secret in [joiner["share"], *joiner["opened"]]:
        assert len(secret) == len(joiner["share"])
        for start in range(0, len(secret), limb):
            assert secret[start : start + 64] not in wire


def test_a_joiner_without_the_previous_parameters_is_told_what_to_pass():
    new = ta.ThresholdParameters(parties=3, threshold=2)
    with pytest.raises(TypeError, match="previous="):
        ta.reshare(None, new)


def test_a_rank_that_sends_nothing_sends_no_words():
    # A holder beyond the old threshold deals nothing; an empty buffer was
    # a ValueError from torch.frombuffer, so re-sharing with more holders
    # than the old threshold (or with a joiner) failed on every rank.
    from distir.aggregation import programs

    assert programs.words(b"").shape == (0,)
    assert programs.words(bytes(range(16))).tolist() == [
        int.from_bytes(bytes(range(8)), "little"),
        int.from_bytes(bytes(range(8, 16)), "little"),
    ]
