"""The threshold protocol on real gloo ranks: key generation, aggregation,
decryption by survivors, key switch to an outside receiver, agreement
failures named on every rank, the budget, saved shares, faults."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from datetime import timedelta

import numpy as np
import pytest
import torch

ts = pytest.importorskip("tenseal")

from distir.aggregation import threshold as ta  # noqa: E402
from distir.he import threshold as th  # noqa: E402
from distir.he.seal import public_key_limbs  # noqa: E402

SIZE = 4096
DEADLINE_S = 2.0


def update(parties: int, rank: int) -> np.ndarray:
    return np.random.default_rng(1000 * parties + rank).normal(size=SIZE) * 0.01


LOST = (0, 3)  # rank 0 too: the launcher hosts the store, not rank 0


def survival_worker(ctx, receiver_key: torch.Tensor) -> dict:
    """P = 5, t = 3: keys, aggregate, key switch for a receiver; ranks 0 and
    3 exit; the others agree on who is left with `distir.recover()` and
    decrypt on its group with their own party indices. Then rank 4 leaves
    too and ranks 1-2, recovered again, try alone."""
    import distir

    params = ta.ThresholdParameters(parties=5, threshold=3, decrypt_to_ranks=True)
    share = ta.generate_keys(params)
    encrypted = ts.ckks_vector(share.public_key.context(), update(5, ctx.rank).tolist())
    total = ta.aggregate([encrypted], share)
    switched = ta.switch_key(total, share, receiver_key)
    if ctx.rank in LOST:
        os._exit(3)  # killed between aggregation and decryption
    m = distir.recover(deadline=30.0)
    values = ta.decrypt(total, share, group=m.group)
    # The share this rank published (its noise is derived, so recomputing
    # it gives the same one), for the parent to combine two of them.
    published, _tags = th.decryption_shares(share, total.limbs, total.moduli, m.ranks)
    out = {
        "membership": (m.epoch, m.ranks, m.lost, m.rank),
        "values": np.array(values[0][:SIZE]),
        "switched": switched[0],
        "c0": total.limbs[0, 0].clone(),
        "published": published[0].clone(),
        "key": share.public_key.digest(),
        "count": total.count,
        "party": share.party,
        "left": share.decryptions_left,
    }
    store = torch.distributed.distributed_c10d._get_default_store()
    if ctx.rank == 4:
        # Leaves once ranks 1-2 finished the decryption (an event, not a sleep).
        store.wait(["test/decrypted/1", "test/decrypted/2"], timedelta(seconds=60))
        return out
    store.set(f"test/decrypted/{ctx.rank}", "1")
    pair = distir.recover(deadline=30.0)
    out["pair membership"] = (pair.epoch, pair.ranks, pair.lost)
    try:
        ta.decrypt(total, share, group=pair.group)
        out["pair"] = None
    except ta.ThresholdMismatch as e:
        out["pair"] = str(e)
    return out


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_3_of_5_decrypt_after_ranks_0_and_3_die_any_2_get_noise_and_the_receiver_gets_the_sum():
    from distir.runtime.launch import launch

    params = th.ThresholdParameters(parties=5, threshold=3)
    receiver = th.receiver_context(params)
    outcome = launch(
        survival_worker, 5, public_key_limbs(receiver), pass_context=True, tolerate=2, timeout=140
    )
    assert multiprocessing.active_children() == []
    assert sorted(outcome.lost) == list(LOST)
    reports = outcome.results
    assert sorted(reports) == [1, 2, 4]
    plain = sum(update(5, r) for r in range(5))
    for rank, report in reports.items():
        # recover's membership: the survivors, in the same order everywhere
        assert report["membership"] == (1, (1, 2, 4), LOST, (1, 2, 4).index(rank))
        # the share's party index is still the rank's original one
        assert report["party"] == rank and report["count"] == 5
        assert report["key"] == reports[1]["key"]
        assert np.array_equal(report["values"], reports[1]["values"])
        # one decryption and one key switch spent
        assert report["left"] == params.max_decryptions - 2
    assert np.abs(reports[1]["values"] - plain).max() <= 7 * params.smudging_error_std
    # The receiver decrypts what the ranks switched to its key.
    switched = ts.ckks_vector_from(receiver, reports[1]["switched"])
    received = np.array(switched.decrypt()[:SIZE])
    assert np.abs(received - plain).max() <= 7 * params.key_switch_error_std
    # c0 plus the three published shares is what every survivor decoded;
    # c0 plus any two of them decodes to noise.
    c0, moduli = reports[1]["c0"], params.key_moduli[: reports[1]["c0"].shape[0]]
    published = {rank: report["published"] for rank, report in reports.items()}

    def decoded(ranks) -> np.ndarray:
        m = th.add_shares(c0, [published[r] for r in ranks], moduli)
        return np.array(th.decode(m, switched)[:SIZE])

    assert np.array_equal(decoded([1, 2, 4]), reports[1]["values"])
    for pair in itertools.combinations([1, 2, 4], 2):
        noise = decoded(pair)
        assert abs(np.corrcoef(noise, plain)[0, 1]) < 0.08, pair
        assert np.abs(noise).max() > 1e6, pair
    for rank in (1, 2):
        assert reports[rank]["pair membership"] == (2, (1, 2), (4,))
        assert reports[rank]["pair"] == (
            "a group of 2 ranks cannot decrypt: it needs between 3 and 5 parties"
        )


def agreement_worker(ctx, directory: str) -> dict:
    """3 ranks: wrong `parties`; parameters that differ on rank 0; then the
    budget (max_decryptions = 1) and a saved share."""
    out: dict = {}
    try:
        ta.generate_keys(ta.ThresholdParameters(parties=4))
    except ta.ThresholdMismatch as e:
        out["parties"] = str(e)
    threshold = 2 if ctx.rank == 0 else 3
    try:
        ta.generate_keys(ta.ThresholdParameters(parties=3, threshold=threshold))
    except ta.ThresholdMismatch as e:
        out["differ"] = str(e)
    params = ta.ThresholdParameters(parties=3, max_decryptions=1, decrypt_to_ranks=True)
    share = ta.generate_keys(params)
    context = share.public_key.context()
    first = ta.aggregate([ts.ckks_vector(context, update(3, ctx.rank).tolist())], share)
    out["first"] = np.array(ta.decrypt(first, share)[0][:SIZE])
    out["retry"] = np.array(ta.decrypt(first, share)[0][:SIZE])  # the same shares again
    path = os.path.join(directory, f"share-{ctx.rank}.pt")
    share.save(path)
    out["mode"] = os.stat(path).st_mode & 0o777
    second = ta.aggregate([ts.ckks_vector(context, update(3, ctx.rank).tolist())], share)
    try:
        ta.decrypt(second, share)
    except ta.DecryptionBudgetExhausted as e:
        out["budget"] = str(e)
    loaded = th.ThresholdShare.load(path)
    out["loaded"] = np.array(ta.decrypt(first, loaded)[0][:SIZE])
    forged = ta.Aggregate(**{**vars(first), "count": 2})
    try:
        ta.decrypt(forged, share)
    except ta.ThresholdMismatch as e:
        out["forged"] = str(e)
    return out


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_mismatches_and_a_spent_budget_are_named_on_every_rank_and_saved_shares_decrypt(tmp_path):
    from distir.runtime.launch import launch

    reports = launch(agreement_worker, 3, str(tmp_path), pass_context=True, timeout=140)
    plain = sum(update(3, r) for r in range(3))
    sigma = th.ThresholdParameters(parties=3, max_decryptions=1).smudging_error_std
    for report in reports:
        assert report["parties"] == (
            "threshold parameters are for parties=4 but the group has 3 ranks"
        )
        assert report["differ"] == (
            "ranks of the group passed different threshold parameters; nothing was done"
        )
        assert np.abs(report["first"] - plain).max() <= 7 * sigma
        assert np.array_equal(report["retry"], report["first"])
        assert np.array_equal(report["loaded"], report["first"])
        assert report["mode"] == 0o600
        assert report["budget"] == (
            "a rank's share has fewer than 1 decryptions left of 1 (max_decryptions); "
            "nothing was published"
        )
        assert report["forged"].startswith("some rank's aggregate is not one aggregate() returned")


def fault_worker(ctx, phase: str) -> dict:
    """The last rank exits in the middle of `phase`; survivors report."""
    params = ta.ThresholdParameters(parties=ctx.world_size, decrypt_to_ranks=True)
    quitter = ctx.rank == ctx.world_size - 1
    result: dict = {"share": None, "values": None, "error": None}
    start = time.monotonic()
    try:
        if phase == "keygen" and quitter:
            os._exit(3)
        share = ta.generate_keys(params, deadline=DEADLINE_S)
        result["share"] = repr(share) if phase == "keygen" else None
        encrypted = ts.ckks_vector(share.public_key.context(), update(3, ctx.rank).tolist())
        total = ta.aggregate([encrypted], share, deadline=DEADLINE_S)
        if phase == "decryption" and quitter:
            os._exit(3)
        start = time.monotonic()
        result["values"] = ta.decrypt(total, share, deadline=DEADLINE_S)
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
        launch(fault_worker, 3, phase, pass_context=True, timeout=80)
    assert multiprocessing.active_children() == [], "a rank process survived"
    assert "exited with code 3" in caught.value.failures[2]
    survivors = caught.value.results
    assert sorted(survivors) == [0, 1], caught.value.failures
    for report in survivors.values():
        assert report["error"] in ("CollectiveFailed", "DeadlineExceeded", "Poisoned"), report
        assert report["seconds"] < DEADLINE_S + 2, report
        assert report["share"] is None and report["values"] is None


def _switch_with_a_negation_view(ctx, receiver_key: torch.Tensor) -> bytes:
    params = ta.ThresholdParameters(parties=2, threshold=2)
    share = ta.generate_keys(params)
    encrypted = ts.ckks_vector(share.public_key.context(), update(2, ctx.rank).tolist())
    total = ta.aggregate([encrypted], share)
    # rank 1 holds the same key as a negation view: memory -key, the negative bit set
    key = torch._neg_view(-receiver_key) if ctx.rank == 1 else receiver_key
    return ta.switch_key(total, share, key)[0]


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_receiver_key_passed_as_a_negation_view_is_switched_to_by_its_value():
    # Its bytes are digested and agreed on: before, numpy() refused the
    # view on that rank alone, after the others had started the switch.
    from distir.runtime.launch import launch

    params = th.ThresholdParameters(parties=2, threshold=2)
    receiver = th.receiver_context(params)
    blobs = launch(
        _switch_with_a_negation_view, 2, public_key_limbs(receiver), pass_context=True, timeout=100
    )
    plain = update(2, 0) + update(2, 1)
    for blob in blobs:
        received = np.array(ts.ckks_vector_from(receiver, blob).decrypt()[:SIZE])
        assert np.abs(received - plain).max() <= 7 * params.key_switch_error_std


def metadata_worker(ctx) -> dict:
    """3 ranks aggregate one ciphertext each: rank 0's at twice the scale,
    then rank 0's one level down (times a plaintext 1, rescaled);
    each try must be refused by name on every rank, and the honest sum
    after them must still decrypt."""
    out: dict = {}
    share = ta.generate_keys(ta.ThresholdParameters(parties=3, decrypt_to_ranks=True))
    context = share.public_key.context()
    values = update(3, ctx.rank).tolist()
    scale = context.global_scale * (2 if ctx.rank == 0 else 1)
    try:
        ta.aggregate([ts.ckks_vector(context, values, scale)], share)
    except ta.ThresholdMismatch as e:
        out["scale"] = str(e)
    encrypted = ts.ckks_vector(context, values)
    if ctx.rank == 0:
        # one level down: a small scale leaves room for a product, rescaled
        encrypted = ts.ckks_vector(context, values, 2.0**40) * ([1.0] * SIZE)
    try:
        ta.aggregate([encrypted], share)
    except ta.ThresholdMismatch as e:
        out["level"] = str(e)
    # A vector of more values than slots is two ciphertexts in one
    # CKKSVector: on one rank, then on every rank (which once passed here
    # and failed later, in decryption).
    slots = share.parameters.poly_modulus_degree // 2
    for name, ranks in (("chunks on one rank", {0}), ("chunks everywhere", {0, 1, 2})):
        long = values * (-(-(slots + 1) // len(values))) if ctx.rank in ranks else values
        try:
            ta.aggregate([ts.ckks_vector(context, long)], share)
        except ta.ThresholdMismatch as e:
            out[name] = str(e)
    total = ta.aggregate([ts.ckks_vector(context, values)], share)
    out["honest"] = np.array(ta.decrypt(total, share)[0][:SIZE])
    return out


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_a_ciphertext_of_another_scale_level_or_chunk_count_is_refused_by_name_on_every_rank():
    from distir.runtime.launch import launch

    reports = launch(metadata_worker, 3, pass_context=True, timeout=140)
    plain = sum(update(3, r) for r in range(3))
    sigma = th.ThresholdParameters(parties=3).smudging_error_std
    for report in reports:
        assert report["scale"] == (
            "ranks of the group passed different ciphertext scales; nothing was done"
        )
        assert report["level"].startswith(
            "a rank's ciphertexts are not fresh 2-polynomial ciphertexts at the "
            "parameters' first data level"
        )
        for name in ("chunks on one rank", "chunks everywhere"):
            assert report[name].startswith(
                "a rank's ciphertexts are not fresh 2-polynomial ciphertexts at the "
                "parameters' first data level"
            ), report
            assert "one CKKSVector per 4096 values" in report[name]
        assert np.abs(report["honest"] - plain).max() <= 7 * sigma
