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
        decode_all = th.decode_all

        def spy(plaintexts, templates, headers=None):
            captured.append(plaintexts[0].clone())
            return decode_all(plaintexts, templates, headers)

        th.decode_all = spy
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


# ------------------------------------------------------ degenerate parameters
def test_threshold_1_is_refused_by_name_and_the_honest_minimum_is_stated():
    for parties in (1, 2, 5):
        with pytest.raises(th.InsecureParameters, match="threshold=1"):
            th.ThresholdParameters(parties=parties, threshold=1)
    # every (P, t) with 2 <= t <= P <= 8
    for parties in range(2, 9):
        for threshold in range(2, parties + 1):
            params = th.ThresholdParameters(parties=parties, threshold=threshold)
            assert params.minimum_honest_ranks == max(2, parties - threshold + 1)


def _receiver_keys(params, public_key) -> dict:
    """Receiver keys the ranks can decrypt under, each built independently
    of distir's check (zero, small, the collective key, its ``a`` reused)."""
    moduli = params.key_moduli
    n = params.poly_modulus_degree
    rng = np.random.default_rng(5)
    small = torch.stack(
        [to_ntt(rng.integers(-3, 4, size=n).astype(object), moduli) for _ in range(2)]
    )
    zero = torch.zeros(2, len(moduli), n, dtype=torch.int64)
    reused = public_key.limbs.clone()
    reused[0] = small[0]
    return {
        "zero": zero,
        "small": small,
        "collective": public_key.limbs.clone(),
        "collective a": reused,
        "p1 zero": torch.stack([public_key.limbs[0], zero[1]]),
    }


def test_receiver_keys_the_ranks_could_decrypt_under_are_named_and_real_ones_pass():
    from distir.he.seal import public_key_limbs

    params = th.ThresholdParameters(parties=2)
    crp = th.common_random_polynomial(params, b"seed")
    secrets_ = [th.generate_secret_share(params) for _ in range(2)]
    b = th.add_shares(
        torch.zeros_like(crp), [th.public_key_share(s, crp) for s in secrets_], params.key_moduli
    )
    key = th.collective_public_key_from_sum(params, b, crp)
    for name, bad in _receiver_keys(params, key).items():
        assert th.check_receiver_key(bad, key) is not None, name
    for _ in range(3):
        assert th.check_receiver_key(public_key_limbs(th.receiver_context(params)), key) is None


def zero_receiver_worker(ctx) -> dict:
    params = ta.ThresholdParameters(parties=2)
    share = ta.generate_keys(params)
    total = ta.aggregate(
        [ts.ckks_vector(share.public_key.context(), update(2, ctx.rank).tolist())], share
    )
    out = {}
    for name, key in _receiver_keys(params, share.public_key).items():
        try:
            ta.switch_key(total, share, key)
            out[name] = None
        except Exception as e:  # recorded for the parent
            out[name] = (type(e).__name__, str(e))
    return out


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_a_switch_to_a_zero_small_or_collective_receiver_key_is_refused_on_every_rank():
    # (0, 0): the switched ciphertext would be c0 + sum of the decryption
    # shares, the aggregate in the clear for every rank and the wire.
    from distir.runtime.launch import launch

    reports = launch(zero_receiver_worker, 2, pass_context=True, timeout=140)
    for report in reports:
        assert sorted(report) == ["collective", "collective a", "p1 zero", "small", "zero"]
        for name, error in report.items():
            assert error is not None, name
            assert error[0] == "UnsafeReceiverKey", (name, error)
            assert error[1].startswith("switch_key: a rank's receiver key is one the ranks may")


# ------------------------------------------------------------------ budget
def budget_worker(ctx, directory: str) -> dict:
    """2 ranks, max_decryptions = 2: save the share, decrypt two aggregates
    (the budget), restore the saved share and try two more."""
    import os

    params = ta.ThresholdParameters(parties=2, max_decryptions=2, decrypt_to_ranks=True)
    share = ta.generate_keys(params)
    path = os.path.join(directory, f"share-{ctx.rank}.pt")
    share.save(path)
    context = share.public_key.context()
    done, refused = 0, []
    for round_ in range(4):
        if round_ == 2:
            share = th.ThresholdShare.load(path)  # the holder restores the saved share
        values = (update(2, ctx.rank) * (round_ + 1)).tolist()
        total = ta.aggregate([ts.ckks_vector(context, values)], share)
        try:
            ta.decrypt(total, share)
            done += 1
        except ta.DecryptionBudgetExhausted as e:
            refused.append(str(e))
    return {"done": done, "refused": refused, "left": share.decryptions_left}


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_restoring_a_saved_share_keeps_its_spent_budget(tmp_path):
    from distir.runtime.launch import launch

    reports = launch(budget_worker, 2, str(tmp_path), pass_context=True, timeout=140)
    for report in reports:
        assert report["done"] == 2
        assert report["left"] == 0
        assert (
            report["refused"]
            == [
                "a rank's share has fewer than 1 decryptions left of 2 (max_decryptions); "
                "nothing was published"
            ]
            * 2
        )


def _local_share(tmp_path, budget: int = 3):
    params = th.ThresholdParameters(parties=2, max_decryptions=budget)
    crp = th.common_random_polynomial(params, b"seed")
    secret = th.generate_secret_share(params)
    key = th.collective_public_key_from_sum(params, th.public_key_share(secret, crp), crp)
    received = th.shamir_shares(secret)
    return th.new_threshold_share(params, 0, key, received)


def test_spending_is_written_before_it_counts_and_a_failed_write_spends_nothing(
    tmp_path, monkeypatch
):
    share = _local_share(tmp_path)
    path = tmp_path / "share.pt"
    share.save(path)
    share._spend([b"a" * 32])
    # the file already holds the spending (before any share is published)
    assert th.ThresholdShare.load(path).decryptions_left == 2
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(th.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        share._spend([b"b" * 32])
    assert share.decryptions_left == 2  # nothing spent in memory either
    assert path.read_bytes() == before  # the old file intact
    assert [p.name for p in tmp_path.iterdir()] == ["share.pt"]  # no temporary left
    monkeypatch.undo()
    loaded = th.ThresholdShare.load(path)
    loaded._spend([b"c" * 32])  # a loaded share is bound to its file too
    assert th.ThresholdShare.load(path).decryptions_left == 1
    assert oct(path.stat().st_mode & 0o777) == "0o600"


# ------------------------------------------------------------- commitments
def lying_commitment_worker(ctx) -> dict:
    """3 ranks; rank 1 commits to Enc(0) (SHA-256 of its limbs, as the
    protocol commits) and puts Enc(100) into the sum."""
    import hashlib

    params = ta.ThresholdParameters(parties=3, decrypt_to_ranks=True)
    share = ta.generate_keys(params)
    context = share.public_key.context()
    value = 100.0 if ctx.rank == 1 else 1.0
    encrypted = ts.ckks_vector(context, [value] * SIZE)
    if ctx.rank == 1:
        zero = ckks_to_limbs(ts.ckks_vector(context, [0.0] * SIZE))[0].unsqueeze(0)
        committed = hashlib.sha256(zero.contiguous().numpy().tobytes()).digest()
        ta._commitment = lambda limbs: committed
    return _aggregate_and_decrypt(encrypted, share)


def _aggregate_and_decrypt(encrypted, share) -> dict:
    """A rank's report of `aggregate` then `decrypt`: the first values, or
    the error (its type's name and message)."""
    out: dict = {"error": None, "values": None}
    try:
        total = ta.aggregate([encrypted], share)
        out["values"] = ta.decrypt(total, share)[0][:4]
    except Exception as e:  # recorded for the parent
        out["error"] = (type(e).__name__, str(e))
    return out


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_a_ciphertext_other_than_the_committed_one_is_a_named_error_on_every_rank():
    from distir.runtime.launch import launch

    reports = launch(lying_commitment_worker, 3, pass_context=True, timeout=140)
    for report in reports:
        assert report["values"] is None, report
        assert report["error"] is not None
        assert report["error"][0] == "CommitmentMismatch", report["error"]
        assert report["error"][1] == (
            "aggregate: the ciphertexts of rank 1 are not those it committed to; nothing was summed"
        )


def framing_worker(ctx) -> dict:
    """3 ranks, every input as committed; rank 1 reports rank 0 as the
    liar (its check says so, whatever the data)."""
    params = ta.ThresholdParameters(parties=3, decrypt_to_ranks=True)
    share = ta.generate_keys(params)
    encrypted = ts.ckks_vector(share.public_key.context(), [1.0] * SIZE)
    if ctx.rank == 1:
        ta._unfaithful_ranks = lambda *args: [0]
    return _aggregate_and_decrypt(encrypted, share)


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_a_rank_that_reports_an_honest_one_as_lying_stops_the_sum_but_frames_nobody():
    from distir.runtime.launch import launch

    reports = launch(framing_worker, 3, pass_context=True, timeout=140)
    for rank, report in enumerate(reports):
        assert report["values"] is None, report
        assert report["error"][0] == "CommitmentMismatch", report["error"]
        if rank != 1:  # the honest ranks' own check: nobody lied about an input
            assert "every commitment checks out on this rank" in report["error"][1], report
            assert "a rank of the group lies about the check" in report["error"][1]


# -------------------------------------------------------- passive observer
def _record_the_wire(record: list) -> None:
    """Every distir program the protocol runs on this rank records its
    inputs (what the rank sends) and results (what it receives), by run."""
    from distir.aggregation import programs

    compiled = programs._compiled

    class Recorded:
        def __init__(self, program):
            self.program = program

        def run(self, *inputs, **kwargs):
            results = self.program.run(*inputs, **kwargs)
            outs = results if isinstance(results, tuple) else (results,)
            record.append(
                (
                    [x.contiguous().numpy().tobytes() for x in inputs],
                    [y.contiguous().numpy().tobytes() for y in outs],
                )
            )
            return results

    programs._compiled = lambda text, deadline_s: Recorded(compiled(text, deadline_s))


def observed_worker(ctx, receiver_key: torch.Tensor) -> dict:
    """3 ranks aggregate, decrypt (opted in) and switch to a receiver while
    every byte their programs send or receive is recorded. Each rank also
    recomputes the decryption share it published (its noise is derived:
    the same call gives the same share) for the parent to look for."""
    record: list = []
    _record_the_wire(record)
    params = ta.ThresholdParameters(parties=3, decrypt_to_ranks=True)
    share = ta.generate_keys(params)
    encrypted = ts.ckks_vector(share.public_key.context(), update(3, ctx.rank).tolist())
    total = ta.aggregate([encrypted], share)
    start = len(record)
    values = ta.decrypt(total, share)[0][:SIZE]
    decryption_round = record[start:]
    ta.switch_key(total, share, receiver_key)
    published, _ = th.decryption_shares(share, total.limbs, total.moduli, [0, 1, 2])
    return {
        "wire": b"".join(b for sent, got in record for b in sent + got),
        "sent in decryption": [b"".join(sent) for sent, _ in decryption_round],
        "share": published[0].contiguous().numpy().tobytes(),
        "c0": total.limbs[0, 0].clone(),  # public: the sum of the ciphertexts on the wire
        "values": np.array(values),
    }


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_a_passive_observer_of_the_wire_cannot_add_the_decryption_shares_to_c0():
    from distir.he.seal import public_key_limbs
    from distir.runtime.launch import launch

    params = th.ThresholdParameters(parties=3)
    receiver = th.receiver_context(params)
    reports = launch(observed_worker, 3, public_key_limbs(receiver), pass_context=True, timeout=140)
    plain = sum(update(3, r) for r in range(3))
    template = ts.ckks_vector(receiver, [0.0] * SIZE)
    moduli = params.data_moduli
    c0 = reports[0]["c0"]
    assert np.abs(reports[0]["values"] - plain).max() < 1e-6  # the ranks did decrypt
    wire = b"".join(r["wire"] for r in reports)
    for report in reports:
        # the exact share each rank published appears nowhere on the wire
        assert report["share"] not in wire
    # The observer's attack: c0 plus, from each rank, the first L x N words
    # it sent in each program of the decryption round, reduced.
    width = len(moduli) * params.poly_modulus_degree
    q = torch.tensor(moduli, dtype=torch.int64).view(-1, 1)
    rounds, tried = len(reports[0]["sent in decryption"]), 0
    for k in range(rounds):
        guesses = []
        for report in reports:
            sent = np.frombuffer(report["sent in decryption"][k], dtype=np.int64)
            if sent.size < width:
                break
            block = torch.from_numpy(sent[:width].copy()).view(len(moduli), -1)
            guesses.append(torch.remainder(block, q))
        if len(guesses) < 3:
            continue
        opened = np.array(th.decode(th.add_shares(c0, guesses, moduli), template)[:SIZE])
        assert not np.abs(opened - plain).max() < 1.0, f"round {k} leaked the aggregate"
        tried += 1
    assert tried >= 1  # the round that carries the shares was among them


# ------------------------------------------------------ the threat model table
def test_every_row_of_the_threat_model_table_names_tests_that_exist():
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "secure-aggregation.md").read_text()
    modules = {
        "security": "test_aggregation_security.py",
        "aggregation": "test_aggregation.py",
        "threshold": "test_threshold.py",
    }
    defined = {}
    for key, name in modules.items():
        tree = ast.parse((root / "tests" / "he" / name).read_text())
        defined[key] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    header = rows.index("| party | learns | can change | backed by |")
    parties = {}
    for row in rows[header + 1 :]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) != 4:
            break
        named = 0
        for part in cells[3].split(";"):
            key, _, names = part.strip().partition(":")
            for test in re.findall(r"`(test_\w+)`", names):
                assert test in defined[key.strip()], (cells[0], test)
                named += 1
        parties[cells[0]] = named
    assert sorted(parties) == sorted(
        [
            "a rank",
            "a coalition of `k` ranks",
            "the receiver",
            "a passive network observer",
            "a rank that lies about its input",
        ]
    )
    assert all(parties.values()), parties


# ------------------------------------------------------------ share files
def test_a_share_is_not_saved_or_loaded_through_a_symlink(tmp_path):
    share = _local_share(tmp_path)
    target = tmp_path / "elsewhere.pt"
    target.write_bytes(b"not yours")
    link = tmp_path / "share.pt"
    link.symlink_to(target)
    with pytest.raises(th.ShareFileRefused, match="symlink"):
        share.save(link)
    assert target.read_bytes() == b"not yours"  # nothing written through it
    real = tmp_path / "real.pt"
    share.save(real)
    link.unlink()
    link.symlink_to(real)
    with pytest.raises(th.ShareFileRefused, match="symlink"):
        th.ThresholdShare.load(link)


def test_a_share_file_encrypted_under_the_callers_key_needs_it_and_keeps_the_budget(tmp_path):
    import os

    share = _local_share(tmp_path)
    key = os.urandom(32)
    path = tmp_path / "share.pt"
    share.save(path, key=key)
    data = path.read_bytes()
    # neither the share's limbs nor its noise key are in the file
    assert share._limbs.numpy().tobytes()[:64] not in data
    assert share._noise_key not in data
    with pytest.raises(th.ShareFileRefused, match="encrypted but load was given no key"):
        th.ThresholdShare.load(path)
    with pytest.raises(th.ShareFileRefused, match="does not decrypt under this key"):
        th.ThresholdShare.load(path, key=os.urandom(32))
    loaded = th.ThresholdShare.load(path, key=key)
    assert torch.equal(loaded._limbs, share._limbs) and loaded._noise_key == share._noise_key
    loaded._spend([b"x" * 32])  # rewritten encrypted, under the same key
    assert th.ThresholdShare.load(path, key=key).decryptions_left == 2
    assert path.read_bytes().startswith(b"distir-threshold-share/v1+chacha20-poly1305")


# ------------------------------------------------------------- channels
def test_channel_keys_bind_every_public_key_and_the_bound_transcript():
    from distir.aggregation import channels as ch

    ranks = [ch.Channels(r, b"session") for r in range(3)]
    keys = [x.public_key for x in ranks]
    stranger = ch.Channels(2, b"session").public_key
    ranks[0].connect(keys)
    ranks[1].connect([keys[0], keys[1], stranger])  # another view of rank 2's key
    blob = ranks[0].seal(1, b"secret share", b"shamir")
    with pytest.raises(ch.ChannelError, match="failed authentication"):
        ranks[1].open(0, blob, b"shamir")
    # the same views, another bound transcript (the collective key): refused
    a, b = ch.Channels(0, b"session"), ch.Channels(1, b"session")
    for x in (a, b):
        x.connect([a.public_key, b.public_key])
    a.bind(b"collective key digest")
    b.bind(b"another collective key")
    with pytest.raises(ch.ChannelError, match="failed authentication"):
        b.open(0, a.seal(1, b"secret share", b"shamir"), b"shamir")
    c, d = ch.Channels(0, b"session"), ch.Channels(1, b"session")
    for x in (c, d):
        x.connect([c.public_key, d.public_key])
        x.bind(b"collective key digest")
    assert d.open(0, c.seal(1, b"secret share", b"shamir"), b"shamir") == b"secret share"
    with pytest.raises(ch.ChannelError, match="before any message"):
        c.bind(b"late")


# ------------------------------------------------------------- re-sharing
def reshare_worker(ctx) -> dict:
    """P = 4, t = 3; rank 3 exits after aggregation; ranks 0-2 recover and
    re-share the key to themselves as a 2-of-3 group, aggregate again and
    decrypt; each also computes its decryption share for every pair."""
    import itertools
    import os

    import distir

    old = ta.ThresholdParameters(parties=4, threshold=3, decrypt_to_ranks=True)
    share = ta.generate_keys(old)
    context = share.public_key.context()
    before = ta.aggregate([ts.ckks_vector(context, update(4, ctx.rank).tolist())], share)
    ta.decrypt(before, share)  # one spent
    if ctx.rank == 3:
        os._exit(3)
    m = distir.recover(deadline=30.0)
    new = ta.ThresholdParameters(parties=3, threshold=2, decrypt_to_ranks=True)
    fresh = ta.reshare(share, new, group=m.group)
    out: dict = {"party": fresh.party, "left": fresh.decryptions_left, "key": None}
    out["key"] = fresh.public_key.limbs.equal(share.public_key.limbs)
    try:
        ta.decrypt(before, fresh, group=m.group)
        out["old aggregate"] = None
    except ta.ThresholdMismatch as e:
        out["old aggregate"] = str(e)
    after = ta.aggregate(
        [ts.ckks_vector(context, (2 * update(3, m.rank)).tolist())], fresh, group=m.group
    )
    out["values"] = np.array(ta.decrypt(after, fresh, group=m.group)[0][:SIZE])
    out["c0"] = after.limbs[0, 0].clone()
    out["pairs"] = {}
    for pair in itertools.combinations(range(3), 2):
        if fresh.party in pair:
            d, _ = th.decryption_shares(fresh, after.limbs, after.moduli, list(pair))
            out["pairs"][pair] = d[0].clone()
    return out


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_survivors_reshare_the_key_to_a_new_threshold_and_any_two_new_shares_decrypt():
    from distir.runtime.launch import launch

    outcome = launch(reshare_worker, 4, pass_context=True, tolerate=1, timeout=140)
    reports = outcome.results
    assert sorted(reports) == [0, 1, 2]
    plain = 2 * sum(update(3, r) for r in range(3))
    params = th.ThresholdParameters(parties=3, threshold=2)
    template = ts.ckks_vector(th.receiver_context(params), [0.0] * SIZE)
    moduli = params.data_moduli
    for rank, report in reports.items():
        assert report["party"] == rank and report["key"] is True
        assert report["left"] == params.max_decryptions - 1  # the old share's one, carried
        assert report["old aggregate"].startswith("some rank's aggregate is not one aggregate()")
        assert np.abs(report["values"] - plain).max() < 1e-6
    c0 = reports[0]["c0"]
    for pair in [(0, 1), (0, 2), (1, 2)]:
        shares = [reports[r]["pairs"][pair] for r in pair]
        opened = np.array(th.decode(th.add_shares(c0, shares, moduli), template)[:SIZE])
        assert np.abs(opened - plain).max() < 1e-6, pair
    # one new share alone decodes to noise
    alone = np.array(th.decode(th.add_shares(c0, [reports[0]["pairs"][(0, 1)]], moduli), template))
    assert np.abs(alone[:SIZE]).max() > 1e6
