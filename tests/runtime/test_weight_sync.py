"""Weight sync: a state dict in mixed layouts moves from a trainer mesh to
inference ranks on real gloo ranks, and every destination shard equals the
plain-torch oracle (the global tensor cut with torch.tensor_split); bad
declarations are refused by name before any byte moves."""

from __future__ import annotations

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
    ],
)  # fmt: skip
def test_bad_declarations_are_named_before_any_byte_moves(source, dest, message):
    # No process group exists here: the error comes from planning alone.
    with pytest.raises(WeightSyncSpecError) as info:
        plan_weight_sync(source, dest)
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


def _sync_with_fault(ctx, fault: str, victim: int):
    """Publish version 1, then try version 2 with ``fault`` injected on rank
    ``victim``, then (when no rank was lost) version 2 again."""
    import os

    import distir.runtime.weight_sync as ws

    train, infer = MESHES["disjoint"]
    plan = plan_weight_sync(*_declare(train, infer), bucket_bytes=64)
    versions = ws.WeightVersions()
    plan.sync(_shards_v(train, ctx.rank, 1), versions, timeout=5)
    report = {"v1": _synced(versions, infer, ctx.rank, 1)}
    if ctx.rank == victim:
        if fault == "flipped byte":
            # on the wire: after the sender took its digest
            real_batch = ws.dist.batch_isend_irecv
            calls = []

            def flipping_batch(ops):
                calls.append(1)
                sends = [op for op in ops if op.op is ws.dist.isend]
                if len(calls) == 2 and sends:
                    sends[0].tensor[3] ^= 0x10
                return real_batch(ops)

            ws.dist.batch_isend_irecv = flipping_batch
        else:  # a killed rank: it dies waiting for its second bucket
            real_wait = ws._wait

            def dying_wait(work, timeout, what):
                if what == "bucket 1":
                    os._exit(17)
                return real_wait(work, timeout, what)

            ws._wait = dying_wait
    try:
        plan.sync(_shards_v(train, ctx.rank, 2), versions, timeout=5)
        report["error"] = None
    except ws.WeightSyncFailed as e:
        report["error"] = str(e)
    report["kept"] = versions.version == 1 and _synced(versions, infer, ctx.rank, 1)
    if fault == "flipped byte":
        if ctx.rank == victim:
            ws.dist.batch_isend_irecv = real_batch
        report["next"] = plan.sync(_shards_v(train, ctx.rank, 2), versions, timeout=5)
        report["v2"] = _synced(versions, infer, ctx.rank, 2)
    return report


@pytest.mark.parametrize("victim", [0, 1])  # a sender of each receiver
def test_a_flipped_byte_publishes_nothing_and_the_next_sync_succeeds(victim):
    reports = distir.launch(
        _sync_with_fault, 4, "flipped byte", victim, pass_context=True, timeout=120
    )
    for report in reports:
        assert report["v1"]
        assert "arrived with a different digest" in report["error"]
        assert "nothing published" in report["error"]
        assert report["kept"]
        assert report["next"] == 2 and report["v2"]


@pytest.mark.parametrize("fault, victim", [("killed sender", 0), ("killed receiver", 3)])
def test_a_killed_rank_leaves_every_survivor_on_the_old_version(fault, victim):
    outcome = distir.launch(
        _sync_with_fault, 4, fault, victim, pass_context=True, timeout=120, tolerate=1
    )
    assert sorted(outcome.lost) == [victim]
    assert sorted(outcome.results) == sorted(set(range(4)) - {victim})
    for rank, report in outcome.results.items():
        assert report["v1"], rank
        assert report["error"] is not None and report["error"].startswith("weight sync"), rank
        assert report["kept"], rank


# -- delta mode ---------------------------------------------------------------


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
