"""Weight sync: a state dict in mixed layouts moves from a trainer mesh to
inference ranks on real gloo ranks, and every destination shard equals the
plain-torch oracle (the global tensor cut with torch.tensor_split); bad
declarations are refused by name before any byte moves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.ir.layouts import Mesh
from distir.runtime.weight_sync import (
    TensorLayout,
    WeightSyncFailed,
    WeightSyncSpecError,
    plan_weight_sync,
)

# name -> (shape, src dtype, dst dtype, src dims, src partial, dst dims)
TENSORS = {
    "rows_to_cols": ((6, 4), torch.float32, torch.float32, (0, None), (), (None, 0)),
    "replicated_to_cols": ((5, 3), torch.bfloat16, torch.bfloat16, None, (), (None, 0)),
    "partial_to_rows": ((7, 2), torch.float32, torch.float32, (None, None), (0,), (0, None)),
    "uneven_rows_to_replicated": ((3, 5), torch.int64, torch.int64, (0, None), (), None),
    "vector_cast": ((9,), torch.float32, torch.bfloat16, (0,), (), (0,)),
    "cols_to_rows_bf16": ((4, 10), torch.bfloat16, torch.bfloat16, (None, 0), (), (0, None)),
}


def _global(name: str, shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    # small integers: every partial sum and every cast is exact
    return torch.randint(-100, 100, shape, generator=g).to(dtype)


def _oracle_shard(x: torch.Tensor, dims, mesh_shape, coord) -> torch.Tensor:
    """The local shard, cut with torch.tensor_split per sharded dim."""
    if dims is None:
        return x.clone()
    for d, axis in enumerate(dims):
        if axis is not None:
            x = torch.tensor_split(x, mesh_shape[axis], dim=d)[coord[axis]]
    return x.clone()


def _coord(ranks, shape, rank):
    linear = ranks.index(rank)
    out = []
    for size in reversed(shape):
        linear, pos = divmod(linear, size)
        out.append(pos)
    return tuple(reversed(out))


def _declare(train: Mesh, infer: Mesh):
    source, dest = {}, {}
    for name, (shape, sdt, ddt, sdims, partial, ddims) in TENSORS.items():
        source[name] = TensorLayout(train, shape, sdt, sdims, partial)
        dest[name] = TensorLayout(infer, shape, ddt, ddims)
    return source, dest


def _source_shards(train: Mesh, rank: int) -> dict[str, torch.Tensor]:
    if rank not in train.ranks:
        return {}
    coord = _coord(train.ranks, train.shape, rank)
    shards = {}
    for name, (shape, sdt, _, sdims, partial, _) in TENSORS.items():
        x = _global(name, shape, sdt)
        if partial:
            # addends differing along the partial axis; they sum to x
            g = torch.Generator().manual_seed(7)
            first = torch.randint(-50, 50, shape, generator=g).to(sdt)
            x = first if coord[partial[0]] == 0 else x - first
        shards[name] = _oracle_shard(x, sdims, train.shape, coord)
    return shards


def _run(ctx, train, infer, bucket_bytes):
    source, dest = _declare(train, infer)
    plan = plan_weight_sync(source, dest, bucket_bytes=bucket_bytes)
    return plan.run(_source_shards(train, ctx.rank), timeout=30)


MESHES = {
    "disjoint": (Mesh("train", (2,), (0, 1)), Mesh("infer", (2,), (2, 3))),
    "overlapping": (Mesh("train", (2,), (0, 1)), Mesh("infer", (2,), (1, 2))),
    "reversed_overlap": (Mesh("train", (2,), (2, 3)), Mesh("infer", (2,), (3, 0))),
}


@pytest.mark.parametrize("meshes", sorted(MESHES))
@pytest.mark.parametrize("bucket_bytes", [64, 1 << 20])
def test_state_dict_matches_the_oracle_on_gloo_ranks(meshes, bucket_bytes):
    train, infer = MESHES[meshes]
    results = distir.launch(_run, 4, train, infer, bucket_bytes, pass_context=True, timeout=120)
    for rank, got in enumerate(results):
        if rank not in infer.ranks:
            assert got == {}
            continue
        assert sorted(got) == sorted(TENSORS)
        coord = _coord(infer.ranks, infer.shape, rank)
        for name, (shape, _, ddt, _, _, ddims) in TENSORS.items():
            want = _oracle_shard(_global(name, shape, torch.float64), ddims, infer.shape, coord)
            assert got[name].dtype == ddt, name
            assert torch.equal(got[name].to(torch.float64), want), (rank, name)


def test_small_buckets_make_several_buckets_and_the_plan_prints():
    train, infer = MESHES["disjoint"]
    plan = plan_weight_sync(*_declare(train, infer), bucket_bytes=64)
    assert len(plan.buckets) > 1
    assert all(b.nbytes <= 64 or len(b.messages) == 1 for b in plan.buckets)
    text = plan.describe()
    assert text.startswith("weight sync: 6 tensors")
    assert f"{plan.wire_bytes} bytes on the wire" in text
    big = plan_weight_sync(*_declare(train, infer))
    assert len(big.buckets) == 1 and big.wire_bytes == plan.wire_bytes


def test_wire_bytes_equal_the_bytes_each_receiver_lacks():
    """Disjoint meshes, no partial source: every destination element crosses once."""
    train, infer = MESHES["disjoint"]
    source, dest = _declare(train, infer)
    plan = plan_weight_sync(source, dest)
    expected = 0
    for shape, sdt, _, _, partial, ddims in TENSORS.values():
        numel = torch.zeros(shape).numel()
        copies = 2 if ddims is None else 1  # replicated on both receivers
        expected += numel * copies * sdt.itemsize * (2 if partial else 1)
    assert plan.wire_bytes == expected


TRAIN, INFER = MESHES["disjoint"]
F32 = torch.float32


@pytest.mark.parametrize(
    "source, dest, message",
    [
        ({"a": TensorLayout(TRAIN, (4,), F32)}, {"b": TensorLayout(INFER, (4,), F32)},
         "name different tensors: only in the source ['a'], only in the destination ['b']"),
        ({"a": TensorLayout(TRAIN, (4, 2), F32)}, {"a": TensorLayout(INFER, (2, 4), F32)},
         "tensor 'a': shapes differ: source [4, 2], destination [2, 4]"),
        ({"a": TensorLayout(TRAIN, (4,), torch.complex64)}, {"a": TensorLayout(INFER, (4,), F32)},
         "tensor 'a': source dtype torch.complex64 cannot be carried on the wire"),
        ({"a": TensorLayout(TRAIN, (4,), F32)}, {"a": TensorLayout(INFER, (4,), torch.bool)},
         "tensor 'a': destination dtype torch.bool cannot be carried on the wire"),
        ({"a": TensorLayout(TRAIN, (4,), F32, (1,))}, {"a": TensorLayout(INFER, (4,), F32)},
         "tensor 'a': source layout does not cover the tensor: layout names a mesh axis"),
        ({"a": TensorLayout(TRAIN, (4, 4), F32, (0,))}, {"a": TensorLayout(INFER, (4, 4), F32)},
         "tensor 'a': source layout does not cover the tensor: layout has 1 entries"),
        ({"a": TensorLayout(TRAIN, (4,), F32)}, {"a": TensorLayout(INFER, (4,), F32, (None,), (0,))},
         "tensor 'a': destination layout is partial"),
        ({"a": TensorLayout(TRAIN, (4, 4), F32, (0, 0))}, {"a": TensorLayout(INFER, (4, 4), F32)},
         "tensor 'a': source layout does not cover the tensor: layout shards two dims over one"),
        ({"a": TensorLayout(TRAIN, (4,), F32, (None,), (1,))}, {"a": TensorLayout(INFER, (4,), F32)},
         "tensor 'a': source layout does not cover the tensor: partial axis 1 must be a mesh axis"),
    ],
)  # fmt: skip
def test_bad_declarations_are_named_before_any_byte_moves(source, dest, message):
    # No process group exists here: the error comes from planning alone.
    with pytest.raises(WeightSyncSpecError) as info:
        plan_weight_sync(source, dest)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"wire": torch.float16}, "wire format torch.float16 is not supported"),
        ({"wire": torch.int8}, "wire format torch.int8 is not supported"),
        ({"bucket_bytes": 0}, "bucket_bytes must be a positive int, not 0"),
    ],
)
def test_a_wire_format_or_bucket_size_it_cannot_use_is_named_before_any_byte_moves(
    options, message
):
    source, dest = _declare(TRAIN, INFER)
    with pytest.raises(WeightSyncSpecError) as info:
        plan_weight_sync(source, dest, **options)
    assert message in str(info.value)


def _run_with_wrong_shard(ctx):
    source, dest = _declare(*MESHES["disjoint"])
    plan = plan_weight_sync(source, dest)
    shards = _source_shards(MESHES["disjoint"][0], ctx.rank)
    if ctx.rank == 1:
        shards["rows_to_cols"] = shards["rows_to_cols"][:1]
    try:
        plan.run(shards, timeout=30)
    except WeightSyncFailed as e:
        return str(e)
    return "no error"


def test_a_shard_that_does_not_fit_is_refused_on_every_rank():
    messages = distir.launch(_run_with_wrong_shard, 4, pass_context=True, timeout=120)
    assert "rank 1: tensor 'rows_to_cols' shard is [1, 4]" in messages[1]
    for rank in (0, 2, 3):
        assert "rank 1's source shards do not fit the plan" in messages[rank]


# -- integrity and versions ---------------------------------------------------


def _oracle_v(name: str, version: int, rank: int, infer: Mesh) -> torch.Tensor:
    shape, _, _, _, _, ddims = TENSORS[name]
    coord = _coord(infer.ranks, infer.shape, rank)
    x = _global(name, shape, torch.float64) + version
    return _oracle_shard(x, ddims, infer.shape, coord)


def _shards_v(train: Mesh, rank: int, version: int) -> dict[str, torch.Tensor]:
    """Version ``version`` of the source shards: the global tensors plus
    ``version``, spread over the partial addends' first one."""
    shards = _source_shards(train, rank)
    if rank in train.ranks:
        coord = _coord(train.ranks, train.shape, rank)
        for name, x in shards.items():
            partial = TENSORS[name][4]
            if not partial or coord[partial[0]] == 0:
                x += version
    return shards


def _synced(versions, infer: Mesh, rank: int, version: int) -> bool:
    if rank not in infer.ranks:
        return versions.weights == {}
    return all(
        torch.equal(versions.weights[name].to(torch.float64), _oracle_v(name, version, rank, infer))
        for name in TENSORS
    )


def _fault_cases():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import weight_sync_faults

    return weight_sync_faults


#: a sample of benchmarks/weight_sync_faults.py's 50 cases: every fault kind,
#: a sender and a receiver, waits early and late, both all-reduces
FAULT_SAMPLE = [
    ("flipped byte", 1, "0", 2),
    ("killed receiver", 2, "wait 0", 1),
    ("killed sender", 1, "agreeing the digests", 1),
    ("frozen rank", 0, "wait 2", 1),
    ("frozen rank", 3, "agreeing the inputs", 1),
]


@pytest.mark.parametrize("fault, victim, at, repeats", FAULT_SAMPLE)
def test_a_fault_is_named_everywhere_in_time_keeps_the_version_and_the_next_sync_goes_on(
    fault, victim, at, repeats
):
    """Every rank that took part raises a `WeightSyncFailed` (or, a frozen
    rank the others recovered without, `Excluded`) within the deadline + 2 s
    of the fault, every receiver keeps version 1 equal to the oracle, and the
    next attempt (after `distir.recover()` and a new plan where a rank is
    lost or frozen) publishes version 2 equal to the oracle."""
    injected, problems = _fault_cases().run_case(fault, victim, at, repeats)
    assert injected == repeats
    assert problems == []


# -- delta mode ---------------------------------------------------------------


def _receiver_dies_before_its_install(ctx):
    """Rank 3 (a receiver) dies after the vote of version 2, before its
    install; the survivors' next sync names the loss, they recover and admit
    a replacement (version 0), and the sync after repairs it."""
    import os
    import time

    import distir.runtime.weight_sync as ws
    from distir.runtime import elastic

    train, infer = MESHES["disjoint"]
    plan = plan_weight_sync(*_declare(train, infer), bucket_bytes=64)
    versions = ws.WeightVersions()
    state = [torch.zeros(1)]
    if ctx.joining:
        m = elastic.join(state, deadline=60)
        plan.sync(_shards_v(train, ctx.rank, 3), versions, delta=True, timeout=30, group=m.group)
        return {"joined": True, "v3": (versions.version, _synced(versions, infer, ctx.rank, 3))}
    plan.sync(_shards_v(train, ctx.rank, 1), versions, delta=True, timeout=30)
    if ctx.rank == 3:
        versions.publish = lambda *a, **k: os._exit(9)  # after the vote, before the install
    plan.sync(_shards_v(train, ctx.rank, 2), versions, delta=True, timeout=30)
    v2 = (versions.version, _synced(versions, infer, ctx.rank, 2))
    try:
        plan.sync(_shards_v(train, ctx.rank, 3), versions, delta=True, timeout=3)
        lost = "no error"
    except ws.WeightSyncFailed as e:
        lost = type(e).__name__
    kept = (versions.version, _synced(versions, infer, ctx.rank, 2))
    distir.recover(deadline=10)
    until = time.monotonic() + 60
    while not elastic.join_requests() and time.monotonic() < until:
        time.sleep(0.05)
    m = elastic.grow(state, deadline=30)
    plan.sync(_shards_v(train, ctx.rank, 3), versions, delta=True, timeout=30, group=m.group)
    v3 = (versions.version, _synced(versions, infer, ctx.rank, 3))
    return {"joined": False, "v2": v2, "lost": lost, "kept": kept, "v3": v3, "ranks": m.ranks}


@pytest.mark.timeout(200)
def test_a_receiver_that_dies_before_its_install_is_repaired_by_the_next_sync():
    outcome = distir.launch(
        _receiver_dies_before_its_install, 4,
        pass_context=True, tolerate=1, replace=True, timeout=150,
    )  # fmt: skip
    assert 3 in outcome.lost, outcome
    for rank in (0, 1, 2):
        report = outcome.results[rank]
        assert report["v2"] == (2, True), (rank, report)
        assert report["lost"] in ("WeightSyncPeerLost", "WeightSyncTimeout"), (rank, report)
        assert report["kept"] == (2, True), (rank, report)
        assert report["ranks"] == (0, 1, 2, 3), (rank, report)
        assert report["v3"] == (3, True), (rank, report)
    # the replacement held no version; the sync repaired it to the others' next
    assert outcome.results[3] == {"joined": True, "v3": (3, True)}


def _delta_syncs(ctx, change: str):
    import distir.runtime.weight_sync as ws

    train, infer = MESHES["overlapping"]
    plan = plan_weight_sync(*_declare(train, infer), bucket_bytes=64)
    versions = ws.WeightVersions()
    shards = _shards_v(train, ctx.rank, 1)
    plan.sync(shards, versions, delta=True, timeout=10)  # first: dense
    dense = versions.last_sent_bytes
    v1 = _synced(versions, infer, ctx.rank, 1)
    changed = {name: x.clone() for name, x in shards.items()}
    if "rows_to_cols" in changed:
        x = changed["rows_to_cols"]
        if change == "few":
            x[0, 1] = -0.0 if ctx.rank == 0 else float("nan")
        else:
            x += 0.5
    plan.sync(changed, versions, delta=True, timeout=10)
    got = dict(versions.weights)
    return {"v1": v1, "dense": dense, "delta": versions.last_sent_bytes, "got": got}


def _expected_rows_to_cols(change: str, rank: int, infer: Mesh) -> torch.Tensor:
    shape = TENSORS["rows_to_cols"][0]
    x = _global("rows_to_cols", shape, torch.float32) + 1
    if change == "few":
        x[0, 1] = -0.0
        x[3, 1] = float("nan")  # row 0 of train rank 1's block of 3 rows
    else:
        x += 0.5
    return _oracle_shard(x, (None, 0), infer.shape, _coord(infer.ranks, infer.shape, rank))


@pytest.mark.parametrize("change", ["few", "all"])
def test_delta_sync_is_bit_exact_and_sends_only_changes(change):
    train, infer = MESHES["overlapping"]
    reports = distir.launch(_delta_syncs, 4, change, pass_context=True, timeout=120)
    for rank, report in enumerate(reports):
        assert report["v1"], rank
        if rank in infer.ranks:
            for name in TENSORS:
                want = (
                    _expected_rows_to_cols(change, rank, infer)
                    if name == "rows_to_cols"
                    else _oracle_v(name, 1, rank, infer)
                )
                got = report["got"][name].to(torch.float64)
                want = want.to(torch.float64)
                # bit exact: -0.0 keeps its sign, NaN stays NaN
                assert torch.equal(torch.signbit(got), torch.signbit(want)), (rank, name)
                assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)), (rank, name)
    delta = sum(reports[r]["delta"] for r in train.ranks)
    if change == "few":
        # rank 0's change crosses the wire as one entry (rank 1's is a local
        # copy); every other message is unchanged and sends nothing
        assert delta == 6
    else:
        # every word of rows_to_cols changed: its messages fall back to dense
        plan = plan_weight_sync(*_declare(train, infer), bucket_bytes=64)
        touched = sum(
            bucket.message_bytes(pair)
            for bucket in plan.buckets
            for pair, pieces in bucket.messages.items()
            if any(p.name == "rows_to_cols" for p in pieces)
        )
        assert delta == touched


def _many_syncs(ctx):
    import distir.runtime.weight_sync as ws

    train, infer = MESHES["overlapping"]
    plan = plan_weight_sync(*_declare(train, infer), bucket_bytes=64)
    versions = ws.WeightVersions()
    outcomes, kept = [], []
    # From the third sync on, a sync reuses the message buffers of the
    # version before the last: no published tensor may change with them.
    for version, delta in [(1, False), (2, True), (5, False), (3, True), (4, True), (6, False)]:
        plan.sync(_shards_v(train, ctx.rank, version), versions, delta=delta, timeout=30)
        kept.append((version, versions.weights))
        outcomes.append(all(_synced_dict(w, infer, ctx.rank, v) for v, w in kept))
    return outcomes


def _synced_dict(weights, infer: Mesh, rank: int, version: int) -> bool:
    if rank not in infer.ranks:
        return weights == {}
    return all(
        torch.equal(weights[name].to(torch.float64), _oracle_v(name, version, rank, infer))
        for name in TENSORS
    )


def test_repeated_syncs_on_one_versions_object_keep_every_published_version():
    results = distir.launch(_many_syncs, 4, pass_context=True, timeout=120)
    for rank in range(4):
        assert results[rank] == [True] * 6


@given(
    st.integers(1, 64).map(lambda n: n * 8),
    st.integers(0, 2**32 - 1),
    st.floats(0, 1),
)
@settings(max_examples=100, deadline=None)
def test_delta_encoding_round_trips_bit_for_bit(nbytes, seed, share):
    from distir.runtime.weight_sync import _decode, _encode

    g = torch.Generator().manual_seed(seed)
    old = torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8)
    new = old.clone()
    mask = torch.rand(nbytes, generator=g) < share
    new[mask] = torch.randint(0, 256, (int(mask.sum()),), generator=g, dtype=torch.uint8)
    count, payload = _encode(new, old)
    words_changed = int((new.view(torch.int16) != old.view(torch.int16)).sum())
    if count < 0:
        assert torch.equal(payload, new) and words_changed * 6 >= nbytes
    else:
        assert count == words_changed and payload.numel() == 6 * count < nbytes
        assert torch.equal(_decode(payload, count, old), new)
        # into a reused buffer holding anything
        into = torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8)
        assert torch.equal(_decode(payload, count, old, into), new)


# -- fp8 on the wire ----------------------------------------------------------

# name -> (shape, source dtype, destination dtype, source dims, partial, destination dims)
FP8_TENSORS = {
    "rows_to_cols": ((6, 300), torch.float32, torch.float32, (0, None), False, (None, 0)),
    "bf16_cols_to_rows": ((4, 10), torch.bfloat16, torch.bfloat16, (None, 0), False, (0, None)),
    "replicated_to_bf16": ((5, 130), torch.float32, torch.bfloat16, None, False, (0, None)),
    "partial_to_cols": ((7, 260), torch.float32, torch.float32, (None, None), True, (None, 0)),
    "ints_exact": ((3, 5), torch.int64, torch.int64, (0, None), False, None),
}


def _fp8_global(name: str, version: int) -> torch.Tensor:
    """Values with few mantissa bits (multiples of 2^-6 below 16): the
    partial addends below sum to them exactly in float32."""
    shape, sdt = FP8_TENSORS[name][0], FP8_TENSORS[name][1]
    g = torch.Generator().manual_seed(sum(map(ord, name)) + version)
    return (torch.randint(-1024, 1024, shape, generator=g).to(torch.float64) / 64).to(sdt)


def _fp8_declare(train: Mesh, infer: Mesh):
    source, dest = {}, {}
    for name, (shape, sdt, ddt, sdims, partial, ddims) in FP8_TENSORS.items():
        source[name] = TensorLayout(train, shape, sdt, sdims, (0,) if partial else ())
        dest[name] = TensorLayout(infer, shape, ddt, ddims)
    return source, dest


def _fp8_sync(ctx, meshes: str):
    import distir.runtime.weight_sync as ws

    train, infer = MESHES[meshes]
    plan = plan_weight_sync(*_fp8_declare(train, infer), bucket_bytes=1024,
                            wire=torch.float8_e4m3fn)  # fmt: skip

    def shards(version: int, poison: bool = False) -> dict[str, torch.Tensor]:
        if ctx.rank not in train.ranks:
            return {}
        coord = _coord(train.ranks, train.shape, ctx.rank)
        out = {}
        for name, (shape, sdt, _, sdims, partial, _) in FP8_TENSORS.items():
            x = _fp8_global(name, version).to(torch.float64)
            if partial:
                # Large addends that cancel (multiples of 64 below 2^17: the
                # sums stay exact in float32): quantising each addend alone
                # would miss the bound by far.
                g = torch.Generator().manual_seed(3)
                big = torch.randint(-2048, 2048, shape, generator=g).to(torch.float64) * 64
                x = x + big if coord[0] == 0 else -big
            shard = _oracle_shard(x, sdims, train.shape, coord).to(sdt)
            if poison and name == "rows_to_cols" and coord[0] == 1:
                shard[0, 0] = float("inf")
            out[name] = shard
        return out

    versions = ws.WeightVersions()
    plan.sync(shards(1), versions, timeout=30)
    first = dict(versions.weights)
    try:
        plan.sync(shards(2, poison=True), versions, timeout=30)
        refused = None
    except ws.WeightSyncFailed as e:
        refused = (type(e).__name__, str(e))
    kept = versions.version == 1 and all(torch.equal(first[k], versions.weights[k]) for k in first)
    plan.sync(shards(2), versions, timeout=30)
    return {
        "first": first,
        "second": dict(versions.weights),
        "refused": refused,
        "kept": kept,
    }


def _fp8_bound_holds(got: torch.Tensor, want: torch.Tensor, ddt: torch.dtype) -> bool:
    """The documented bound, with the tensor's absolute maximum standing in
    for each block's (a block's maximum is never larger): |got - want| <=
    eps/2 |want| + 2^-10 amax/448, plus half an ulp of the destination dtype."""
    got, want = got.to(torch.float64), want.to(torch.float64)
    scale = float(want.abs().max()) / 448
    dest_round = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}[ddt]
    bound = (2.0**-4 + dest_round * 1.1) * want.abs() + 2.0**-10 * scale * 1.01
    return bool(((got - want).abs() <= bound).all())


@pytest.mark.parametrize("meshes", ["disjoint", "overlapping"])
def test_fp8_on_the_wire_is_within_the_stated_bound_and_cuts_the_bytes(meshes):
    train, infer = MESHES[meshes]
    reports = distir.launch(_fp8_sync, 4, meshes, pass_context=True, timeout=120)
    for rank, report in enumerate(reports):
        # a NaN or infinity in a quantised tensor: refused everywhere, v1 kept
        assert report["refused"][0] == "WeightSyncRefused", rank
        if rank == train.ranks[1]:
            assert "'rows_to_cols' holds NaN or infinite values" in report["refused"][1]
            assert "cannot carry them" in report["refused"][1]
        assert report["kept"], rank
        if rank not in infer.ranks:
            assert report["second"] == {}
            continue
        coord = _coord(infer.ranks, infer.shape, rank)
        for version, got in ((1, report["first"]), (2, report["second"])):
            for name, (_, _, ddt, _, _, ddims) in FP8_TENSORS.items():
                want = _oracle_shard(_fp8_global(name, version), ddims, infer.shape, coord)
                assert got[name].dtype == ddt, name
                if ddt == torch.int64:
                    assert torch.equal(got[name], want), name  # integers travel exactly
                else:
                    assert _fp8_bound_holds(got[name], want, ddt), (rank, version, name)
    # The floating tensors' bytes into the receivers (the buckets; the
    # pre-stage moves partial addends between trainer ranks) at most ~half.
    fp8 = plan_weight_sync(*_fp8_declare(train, infer), wire=torch.float8_e4m3fn)
    dense = plan_weight_sync(*_fp8_declare(train, infer))

    def floating_bytes(plan):
        return sum(
            p.nbytes
            for b in plan.buckets
            for pieces in b.messages.values()
            for p in pieces
            if FP8_TENSORS[p.name][1].is_floating_point
        )

    assert floating_bytes(fp8) <= 0.55 * floating_bytes(dense)
    assert fp8.wire_bytes < dense.wire_bytes


def _e4m3_oracle(y: np.ndarray) -> np.ndarray:
    """Round float32 values (|y| <= 448) to the float8_e4m3fn grid, to
    nearest even, with plain numpy: 3 mantissa bits, exponent >= -6, and the
    subnormal spacing 2^-9 below 2^-6."""
    y = y.astype(np.float64)
    exponent = np.floor(np.log2(np.maximum(np.abs(y), 2.0**-6)))
    spacing = 2.0 ** (exponent - 3)
    return (np.round(y / spacing) * spacing).astype(np.float32)


@given(
    st.integers(1, 700),
    st.integers(0, 2**32 - 1),
    st.sampled_from([1e-30, 1e-3, 1.0, 1e4, 1e30]),
)
@settings(max_examples=100, deadline=None)
def test_fp8_blocks_round_like_a_numpy_oracle(numel, seed, magnitude):
    from distir.runtime.weight_sync import FP8_BLOCK, _dequantise, _quantise, fp8_bytes

    g = np.random.default_rng(seed)
    x = (g.standard_normal(numel) * magnitude).astype(np.float32)
    x[g.random(numel) < 0.05] = 0.0
    buffer = torch.empty(fp8_bytes(numel), dtype=torch.uint8)
    assert _quantise(torch.from_numpy(x), buffer)
    got = _dequantise(buffer, (numel,)).numpy()
    for start in range(0, numel, FP8_BLOCK):
        block = x[start : start + FP8_BLOCK]
        amax = np.float32(np.abs(block).max())
        scale = np.float32(amax / np.float32(448)) if amax > 0 else np.float32(1)
        want = _e4m3_oracle(block / scale) * scale
        np.testing.assert_array_equal(got[start : start + FP8_BLOCK], want)
        # the stated bound, per element
        err = np.abs(got[start : start + FP8_BLOCK].astype(np.float64) - block)
        assert (err <= 2.0**-4 * np.abs(block) + 2.0**-10 * float(scale) * 1.0001).all()


# -- fp8 blocks on the destination's layout ------------------------------------

#: name -> (source dims, partial, destination dims); every instance below
#: gives each a random shape, so that pieces from the two source ranks meet
#: inside a block of the destination (or do not)
STRADDLE_LAYOUTS = {
    "cols_to_rows": ((None, 0), False, (0, None)),
    "rows_to_cols": ((0, None), False, (None, 0)),
    "vector_to_replicated": ((0,), False, None),
    "partial_to_cols": ((None, None), True, (None, 0)),
}


def _straddle_instances(count: int = 8) -> list[dict]:
    """Random shapes, destination dtypes and values: each source rank's
    part scaled by its own magnitude (up to 2^12 apart), so that a block
    shared by two source ranks is scaled by the larger one's maximum."""
    rng = np.random.default_rng(37)
    instances = []
    for _ in range(count):
        rows, width = int(rng.integers(1, 5)), int(rng.integers(2, 420))
        ddt = [torch.float32, torch.bfloat16][int(rng.integers(0, 2))]
        tensors = {}
        for name, (sdims, partial, ddims) in STRADDLE_LAYOUTS.items():
            shape = (width,) if len(sdims) == 1 else (rows, width)
            x = rng.standard_normal(shape).astype(np.float32)
            cut = width // 2 + int(rng.integers(-1, 2))  # near the sources' split
            x[..., :cut] *= np.float32(2.0 ** rng.integers(-6, 7))
            tensors[name] = (shape, ddt, sdims, partial, ddims, x)
        instances.append(tensors)
    return instances


def _straddle_shard(x: np.ndarray, sdims, partial: bool, index: int) -> torch.Tensor:
    t = torch.from_numpy(x)
    if partial:  # two addends: x (exact in float32) and zeros
        return t.clone() if index == 0 else torch.zeros_like(t)
    return _oracle_shard(t, sdims, (2,), (index,))


def _straddle_syncs(ctx):
    train, infer = MESHES["disjoint"]
    out = []
    for tensors in _straddle_instances():
        source = {n: TensorLayout(train, v[0], torch.float32, v[2], (0,) if v[3] else ())
                  for n, v in tensors.items()}  # fmt: skip
        dest = {n: TensorLayout(infer, v[0], v[1], v[4]) for n, v in tensors.items()}
        plan = plan_weight_sync(source, dest, bucket_bytes=512, wire=torch.float8_e4m3fn)
        shards = {}
        if ctx.rank in train.ranks:
            index = train.ranks.index(ctx.rank)
            shards = {n: _straddle_shard(v[5], v[2], v[3], index) for n, v in tensors.items()}
        out.append(plan.run(shards, timeout=30))
    return out


def _e4m3_blocks_oracle(shard: np.ndarray) -> np.ndarray:
    """``shard`` quantised in blocks of 128 consecutive elements along its
    last dimension, each with scale amax / 448, and decoded (numpy)."""
    rows = shard.reshape(-1, shard.shape[-1]) if shard.ndim else shard.reshape(1, 1)
    out = np.empty_like(rows)
    for start in range(0, rows.shape[1], 128):
        block = rows[:, start : start + 128]
        amax = np.abs(block).max(axis=1, keepdims=True).astype(np.float32)
        scale = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
        out[:, start : start + 128] = _e4m3_oracle(block / scale) * scale
    return out.reshape(shard.shape)


def test_fp8_blocks_are_the_destinations_and_round_like_a_numpy_oracle():
    """A block of the destination shard that two source ranks' pieces share
    has one scale, its whole maximum: every receiver's result equals numpy's
    quantisation of its destination shard, bit for bit."""
    train, infer = MESHES["disjoint"]
    results = distir.launch(_straddle_syncs, 4, pass_context=True, timeout=120)
    shared = 0
    for i, tensors in enumerate(_straddle_instances()):
        for rank in infer.ranks:
            for name, (_, ddt, _, _, ddims, x) in tensors.items():
                want = _oracle_shard(torch.from_numpy(x), ddims, (2,), (infer.ranks.index(rank),))
                oracle = torch.from_numpy(_e4m3_blocks_oracle(want.numpy())).to(ddt)
                got = results[rank][i][name]
                assert got.dtype == ddt and torch.equal(got, oracle), (i, rank, name)
        plan = plan_weight_sync(
            {
                n: TensorLayout(train, v[0], torch.float32, v[2], (0,) if v[3] else ())
                for n, v in tensors.items()
            },  # fmt: skip
            {n: TensorLayout(infer, v[0], v[1], v[4]) for n, v in tensors.items()},
            wire=torch.float8_e4m3fn,
        )
        shared += plan._shared_blocks()[1]
    assert shared > 0  # the instances do share blocks between source ranks


# -- the dense path: pieces alone (views, straight into the staged tensors) ---


def _alone_syncs(ctx, meshes: str, install: str, strided: bool):
    import distir.runtime.weight_sync as ws

    # Every piece that can travel alone does (at its default size only
    # pieces of 1 MiB and more do, and these tensors are small).
    ws._ALONE_BYTES = 0
    train, infer = MESHES[meshes]
    plan = plan_weight_sync(*_declare(train, infer), bucket_bytes=64)
    kinds = {
        (plan._sends_view(p), plan._lands_direct(p))
        for _, _, pieces, alone in plan.segments
        if alone
        for p in pieces
    }
    versions = ws.WeightVersions(install=install)
    published, ok = [], []
    for version in (1, 2, 3, 4):
        shards = _shards_v(train, ctx.rank, version)
        if strided:
            # the same values in non-contiguous tensors: no view can be sent
            shards = {n: x.t().contiguous().t() if x.dim() == 2 else x for n, x in shards.items()}
        plan.sync(shards, versions, timeout=30)
        published.append((version, dict(versions.weights)))
        ok.append(_synced(versions, infer, ctx.rank, version))
    # install="swap": the two versions before the last sync are the ones
    # whose tensors it did not write (the current one and the one before)
    intact = [_synced_dict(w, infer, ctx.rank, v) for v, w in published[-2:]]
    reused = [
        all(published[0][1][n].data_ptr() == published[2][1][n].data_ptr() for n in published[0][1])
    ]
    return {"kinds": kinds, "ok": ok, "intact": intact, "reused": reused}


@pytest.mark.parametrize(
    "meshes, install, strided",
    [("disjoint", "swap", False), ("overlapping", "fresh", True)],
)
def test_pieces_alone_land_equal_to_the_oracle_and_swap_reuses_the_version_before(
    meshes, install, strided
):
    results = distir.launch(
        _alone_syncs, 4, meshes, install, strided, pass_context=True, timeout=120
    )
    train, infer = MESHES[meshes]
    kinds = set().union(*(r["kinds"] for r in results))
    # views sent and pieces received straight into their destination both occur
    assert any(view for view, _ in kinds) and any(direct for _, direct in kinds)
    for rank, r in enumerate(results):
        assert r["ok"] == [True] * 4, rank
        assert r["intact"] == [True, True], rank
        if rank in infer.ranks:
            # swap: version 3 staged into version 1's tensors; fresh: never
            assert r["reused"] == [install == "swap"], rank


def test_an_install_mode_it_does_not_know_is_named():
    import distir.runtime.weight_sync as ws

    with pytest.raises(ValueError, match="install must be 'fresh' or 'swap'"):
        ws.WeightVersions(install="in place")
