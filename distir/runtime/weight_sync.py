"""Weight sync: a whole state dict moved between two layouts as one plan.

A trainer holds each named tensor in one layout on its mesh (sharded,
replicated or partial per mesh axis); the inference ranks want it in another
layout on theirs (disjoint or overlapping ranks). `plan_weight_sync` takes
both sides' declarations per tensor name and builds one plan, once, from the
same transfer map that `dist.transfer` executes (`distir.ops.transfer.ir.transfer_map`):
every piece of every tensor, then the remote pieces packed into a few large
buckets, each bucket one message per (source rank, destination rank) pair.
`WeightSyncPlan.describe` prints it; `WeightSyncPlan.run` executes it on the
default process group, packing the next bucket while the current one is on
the wire.

Every declaration error (names or shapes that differ between the sides, a
dtype the wire cannot carry, a layout that does not cover the tensor) is a
`WeightSyncSpecError` raised while planning, before any byte moves. Local
shards that do not match the plan are found by every rank in one agreed
exchange before the first bucket, so every rank raises the named error.

Ranks named in a mesh are global ranks of the default group.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from distir.errors import DistirError
from distir.ir.layouts import Box, Layout, Mesh, local_box
from distir.ops.transfer.ir import Transfer, transfer_map

__all__ = [
    "WIRE_DTYPES",
    "TensorLayout",
    "WeightSyncError",
    "WeightSyncFailed",
    "WeightSyncPlan",
    "WeightSyncSpecError",
    "WeightVersions",
    "plan_weight_sync",
]

#: dtypes the wire carries (as raw bytes) and that partial sums can add
WIRE_DTYPES = (
    torch.float64, torch.float32, torch.bfloat16, torch.float16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
)  # fmt: skip

#: default bucket size: few large messages, small enough to pipeline
DEFAULT_BUCKET_BYTES = 16 << 20


_ALIGN = 8
_DIGEST_BYTES = 16


class WeightSyncError(DistirError):
    """Base of the weight-sync errors."""


class WeightSyncSpecError(WeightSyncError, ValueError):
    """The two sides' declarations cannot make a plan (raised before any byte moves)."""


class WeightSyncFailed(WeightSyncError):
    """A sync did not complete: a rank's inputs were refused, a peer failed,
    or a message missed its deadline. Raised on every rank that took part."""


@dataclass(frozen=True)
class TensorLayout:
    """One side's declaration of one named tensor: its global shape and
    dtype, and how it lives on ``mesh``: ``dims[d]`` is the mesh axis that
    shards tensor dim ``d`` (None: whole), ``partial`` the mesh axes holding
    partial sums; any other axis replicates it (see `distir.ir.layouts.Layout`).
    ``dims=None`` means replicated on every rank of the mesh."""

    mesh: Mesh
    shape: tuple[int, ...]
    dtype: torch.dtype
    dims: tuple[int | None, ...] | None = None
    partial: tuple[int, ...] = ()

    def layout(self) -> Layout:
        """The `Layout` this declaration names."""
        dims = (None,) * len(self.shape) if self.dims is None else tuple(self.dims)
        return Layout(dims, tuple(self.partial))


@dataclass(frozen=True)
class Piece:
    """One transfer of one tensor, with its place in a bucket's message."""

    name: str
    transfer: Transfer
    #: byte offset inside the (src, dst) message of its bucket
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    """Pieces sent together: one message per (src rank, dst rank) pair."""

    index: int
    messages: dict[tuple[int, int], tuple[Piece, ...]]

    def message_bytes(self, pair: tuple[int, int]) -> int:
        """Bytes of the message between ``pair`` (pieces start 8-byte aligned)."""
        last = self.messages[pair][-1]
        return -(-(last.offset + last.nbytes) // _ALIGN) * _ALIGN

    def payload_bytes(self, pair: tuple[int, int]) -> int:
        """Tensor bytes in the message between ``pair`` (its padding left out)."""
        return sum(p.nbytes for p in self.messages[pair])

    @property
    def nbytes(self) -> int:
        """Bytes of this bucket's messages, alignment padding included."""
        return sum(self.message_bytes(pair) for pair in self.messages)


def _spec_error(name: str, message: str) -> WeightSyncSpecError:
    return WeightSyncSpecError(f"weight sync: tensor {name!r}: {message}")


def _check_side(name: str, side: str, decl: TensorLayout) -> Layout:
    if decl.dtype not in WIRE_DTYPES:
        raise _spec_error(
            name,
            f"{side} dtype {decl.dtype} cannot be carried on the wire "
            f"(carried: {', '.join(str(d).removeprefix('torch.') for d in WIRE_DTYPES)})",
        )
    try:
        layout = decl.layout()
        layout.check(decl.mesh, decl.shape)
    except ValueError as e:
        raise _spec_error(name, f"{side} layout does not cover the tensor: {e}") from None
    return layout


def _tensor_transfers(name: str, src: TensorLayout, dst: TensorLayout) -> list[Transfer]:
    if tuple(src.shape) != tuple(dst.shape):
        raise _spec_error(
            name, f"shapes differ: source {list(src.shape)}, destination {list(dst.shape)}"
        )
    src_layout = _check_side(name, "source", src)
    dst_layout = _check_side(name, "destination", dst)
    try:
        return transfer_map(src.mesh, src_layout, dst.mesh, dst_layout, src.shape)
    except ValueError as e:
        raise _spec_error(name, str(e)) from None


def _buckets(pieces: Iterable[tuple[str, Transfer, int]], limit: int) -> list[Bucket]:
    """Cut the remote pieces, in plan order, into buckets of at most ``limit``
    bytes (a larger piece travels alone)."""
    buckets: list[Bucket] = []
    current: dict[tuple[int, int], list[Piece]] = {}
    used = 0

    def close() -> None:
        nonlocal current, used
        if current:
            messages = {pair: tuple(ps) for pair, ps in sorted(current.items())}
            buckets.append(Bucket(len(buckets), messages))
        current, used = {}, 0

    def placed(pair: tuple[int, int], nbytes: int) -> tuple[int, int]:
        """(offset, bytes added to the bucket) of a piece appended to ``pair``'s message."""
        message = current.get(pair)
        if not message:
            return 0, nbytes
        end = message[-1].offset + message[-1].nbytes
        # Every piece starts 8-byte aligned so that it can be viewed in its dtype.
        offset = -(-end // _ALIGN) * _ALIGN
        return offset, offset - end + nbytes

    for name, t, nbytes in pieces:
        pair = (t.src_rank, t.dst_rank)
        offset, cost = placed(pair, nbytes)
        if used and used + cost > limit:
            close()
            offset, cost = placed(pair, nbytes)
        current.setdefault(pair, []).append(Piece(name, t, offset, nbytes))
        used += cost
    close()
    return buckets


def _slices(offsets: Sequence[int], sizes: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(o, o + s) for o, s in zip(offsets, sizes))


@dataclass(frozen=True)
class WeightSyncPlan:
    """A state dict's move from the source layouts to the destination layouts.

    Built by `plan_weight_sync`; pure data apart from `run`.
    """

    source: dict[str, TensorLayout]
    dest: dict[str, TensorLayout]
    transfers: dict[str, tuple[Transfer, ...]]
    buckets: tuple[Bucket, ...]
    local: tuple[tuple[str, Transfer], ...]
    bucket_bytes: int

    @property
    def names(self) -> tuple[str, ...]:
        """Tensor names in plan order."""
        return tuple(self.source)

    @property
    def wire_bytes(self) -> int:
        """Tensor bytes sent between ranks by one sync (alignment padding left out)."""
        return sum(b.payload_bytes(pair) for b in self.buckets for pair in b.messages)

    def source_shape(self, name: str, rank: int) -> tuple[int, ...] | None:
        """The local shard shape ``rank`` holds of ``name`` (None: not a source rank)."""
        decl = self.source[name]
        if rank not in decl.mesh.ranks:
            return None
        return local_box(decl.mesh, decl.layout(), decl.shape, rank).sizes

    def dest_box(self, name: str, rank: int) -> Box | None:
        """The box of ``name`` that ``rank`` receives (None: not a destination rank)."""
        decl = self.dest[name]
        if rank not in decl.mesh.ranks:
            return None
        return local_box(decl.mesh, decl.layout(), decl.shape, rank)

    def describe(self) -> str:
        """The plan as text: one row per message of each bucket, then totals."""
        header = ("bucket", "src rank", "->", "dst rank", "bytes", "pieces", "tensors")
        rows = []
        for bucket in self.buckets:
            for (src, dst), pieces in bucket.messages.items():
                names = list(dict.fromkeys(p.name for p in pieces))
                shown = ", ".join(names[:3]) + (
                    f", ... (+{len(names) - 3})" if len(names) > 3 else ""
                )
                rows.append(
                    (str(bucket.index), str(src), "->", str(dst),
                     str(bucket.payload_bytes((src, dst))), str(len(pieces)), shown)
                )  # fmt: skip
        widths = [max(len(c) for c in col) for col in zip(header, *rows)]
        right = {0, 1, 3, 4, 5}

        def line(cells: Sequence[str]) -> str:
            return " | ".join(
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths))
            ).rstrip()

        local_bytes = sum(t.numel * self.source[name].dtype.itemsize for name, t in self.local)
        lines = [
            f"weight sync: {len(self.names)} tensors, {len(self.buckets)} buckets "
            f"(limit {self.bucket_bytes} bytes)",
            line(header),
            "-+-".join("-" * w for w in widths),
            *(line(r) for r in rows),
            f"{sum(len(b.messages) for b in self.buckets)} messages, {self.wire_bytes} bytes "
            f"on the wire; {len(self.local)} local copies, {local_bytes} bytes",
        ]
        return "\n".join(lines)

    # -- execution -----------------------------------------------------------

    def _check_local(self, shards: Mapping[str, torch.Tensor], me: int) -> str | None:
        """Why this rank's shards do not fit the plan, or None."""
        for name in self.names:
            shape = self.source_shape(name, me)
            if shape is None:
                continue
            if name not in shards:
                return f"rank {me}: tensor {name!r} is missing from its source shards"
            x = shards[name]
            want = self.source[name].dtype
            if tuple(x.shape) != shape or x.dtype != want:
                return (
                    f"rank {me}: tensor {name!r} shard is {list(x.shape)} {x.dtype}, "
                    f"the plan needs {list(shape)} {want}"
                )
        return None

    def _agree_inputs(
        self, problem: str | None, me: int, timeout: timedelta, version: int = 0
    ) -> None:
        """Every rank learns whether any rank's shards are refused, or the
        ranks hold different published versions, before any byte moves."""
        flag = torch.tensor([0 if problem is None else me + 1, version, -version])
        work = _call(
            lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True),
            "agreeing the inputs",
        )
        _wait(work, timeout, "agreeing the inputs")
        if problem is not None:
            raise WeightSyncFailed(f"weight sync refused before any byte moved: {problem}")
        if int(flag[1]) != -int(flag[2]):
            raise WeightSyncFailed(
                "weight sync refused before any byte moved: the ranks hold different "
                f"published versions (from {-int(flag[2])} to {int(flag[1])})"
            )
        if int(flag[0]) != 0:
            raise WeightSyncFailed(
                f"weight sync refused before any byte moved: rank {int(flag[0]) - 1}'s "
                "source shards do not fit the plan"
            )

    def _pack(
        self, bucket: Bucket, shards: Mapping[str, torch.Tensor], me: int
    ) -> list[tuple[int, torch.Tensor]]:
        out = []
        for (src, dst), pieces in bucket.messages.items():
            if src != me:
                continue
            # zeros: the alignment padding must not differ between versions (delta)
            buffer = torch.zeros(bucket.message_bytes((src, dst)), dtype=torch.uint8)
            for p in pieces:
                t = p.transfer
                part = shards[p.name][_slices(t.src_offsets, t.box.sizes)].contiguous()
                buffer[p.offset : p.offset + p.nbytes].copy_(part.reshape(-1).view(torch.uint8))
            out.append((dst, buffer))
        return out

    @property
    def messages(self) -> tuple[tuple[int, tuple[int, int]], ...]:
        """Every message of every bucket, as (bucket index, (src, dst)), in plan order."""
        return tuple((b.index, pair) for b in self.buckets for pair in b.messages)

    def _exchange_counts(self, counts: dict[int, int], me: int, deadline: timedelta) -> None:
        """Send each receiver the delta entry count (-1: dense) of every message
        this rank sends it; fill ``counts`` with those of the messages it receives."""
        by_pair: dict[tuple[int, int], list[int]] = {}
        for k, (_, pair) in enumerate(self.messages):
            by_pair.setdefault(pair, []).append(k)
        ops, incoming = [], []
        for (src, dst), ks in by_pair.items():
            if src == me:
                header = torch.tensor([counts[k] for k in ks], dtype=torch.int64)
                ops.append(dist.P2POp(dist.isend, header, dst))
            elif dst == me:
                header = torch.empty(len(ks), dtype=torch.int64)
                ops.append(dist.P2POp(dist.irecv, header, src))
                incoming.append((ks, header))
        for work in _post(ops, "exchanging the delta sizes"):
            _wait(work, deadline, "exchanging the delta sizes")
        for ks, header in incoming:
            counts.update(zip(ks, header.tolist()))

    def _transfer(
        self,
        shards: Mapping[str, torch.Tensor],
        me: int,
        deadline: timedelta,
        sent: torch.Tensor,
        received_digests: torch.Tensor,
        pinned: _Pinned | None = None,
        buffers: _Pinned | None = None,
    ) -> dict[str, torch.Tensor]:
        """Move every bucket; fill row k of ``sent`` / ``received_digests`` with the
        digest of message k as this rank sent / received it (dense, decoded),
        and ``buffers`` with those dense messages. With ``pinned`` (the
        messages of the last published version) each message travels as a
        delta against it where that is smaller."""
        index = {message: k for k, message in enumerate(self.messages)}
        staged: dict[str, torch.Tensor] = {}
        for name in self.names:
            box = self.dest_box(name, me)
            if box is not None:
                staged[name] = torch.zeros(box.sizes, dtype=self.source[name].dtype)
        arrivals: list[tuple[Piece, torch.Tensor]] = []
        for name, t in self.local:
            if t.dst_rank == me:
                arrivals.append(
                    (Piece(name, t, 0, 0), shards[name][_slices(t.src_offsets, t.box.sizes)])
                )
        counts: dict[int, int] = {}
        if pinned is not None:
            # Delta sizes are data-dependent: pack everything, then tell each
            # receiver the size of each of its messages in one exchange.
            everything = [self._pack(b, shards, me) for b in self.buckets]
            encoded: dict[int, torch.Tensor] = {}
            for bucket, packed in zip(self.buckets, everything):
                for dst, buffer in packed:
                    k = index[(bucket.index, (me, dst))]
                    counts[k], encoded[k] = _encode(buffer, pinned.sent[k])
            self._exchange_counts(counts, me, deadline)
        packed = self._pack(self.buckets[0], shards, me) if self.buckets and pinned is None else []
        for i, bucket in enumerate(self.buckets):
            if pinned is not None:
                packed = everything[i]
            ops, received = [], []
            for dst, buffer in packed:
                k = index[(bucket.index, (me, dst))]
                sent[k] = _digest(buffer)
                if buffers is not None:
                    buffers.sent[k] = buffer
                wire = encoded[k] if pinned is not None else buffer
                if buffers is not None:
                    buffers.wire_bytes += wire.numel()
                if wire.numel():
                    ops.append(dist.P2POp(dist.isend, wire, dst))
            for (src, dst), pieces in bucket.messages.items():
                if dst == me:
                    k = index[(bucket.index, (src, dst))]
                    size = bucket.message_bytes((src, dst))
                    if pinned is not None and counts[k] >= 0:
                        size = counts[k] * _DELTA_ENTRY_BYTES
                    buffer = torch.empty(size, dtype=torch.uint8)
                    if size:
                        ops.append(dist.P2POp(dist.irecv, buffer, src))
                    received.append((k, pieces, buffer))
            works = _post(ops, f"bucket {bucket.index}")
            # Pack the next bucket while this one is on the wire.
            if pinned is None:
                packed = (
                    self._pack(self.buckets[i + 1], shards, me) if i + 1 < len(self.buckets) else []
                )
            for work in works:
                _wait(work, deadline, f"bucket {bucket.index}")
            for k, pieces, buffer in received:
                if pinned is not None and counts[k] >= 0:
                    buffer = _decode(buffer, counts[k], pinned.received[k])
                received_digests[k] = _digest(buffer)
                if buffers is not None:
                    buffers.received[k] = buffer
                for p in pieces:
                    dtype = self.source[p.name].dtype
                    raw = buffer[p.offset : p.offset + p.nbytes].view(dtype)
                    arrivals.append((p, raw.view(p.transfer.box.sizes)))
        # Apply in plan order so that partial addends sum in source-rank order.
        order = {id(t): k for name in self.names for k, t in enumerate(self.transfers[name])}
        arrivals.sort(key=lambda a: (self.names.index(a[0].name), order[id(a[0].transfer)]))
        for p, piece in arrivals:
            t = p.transfer
            target = staged[p.name][_slices(t.dst_offsets, t.box.sizes)]
            if t.partial:
                target.add_(piece)
            else:
                target.copy_(piece)
        return {
            name: y.to(self.dest[name].dtype) if y.dtype != self.dest[name].dtype else y
            for name, y in staged.items()
        }

    def run(
        self,
        shards: Mapping[str, torch.Tensor],
        *,
        timeout: float = 60.0,
        _versions: WeightVersions | None = None,
        _delta: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Move the state dict and agree that it arrived intact.

        ``shards`` are this rank's source shards (by name; ignored on ranks
        outside every source mesh). Returns this rank's destination shards,
        fresh tensors in the destination dtypes (empty on ranks outside every
        destination mesh). Every rank of the default group calls it. Partial
        addends are summed in the source dtype in source-rank order, then cast.

        Before returning, every rank takes part in one vote (an all-reduce):
        each rank's status, and the digest (BLAKE2b) of every message as its
        sender sent it and as its receiver received it. Any failed rank or
        differing digest raises `WeightSyncFailed` on every rank that
        completes the vote, naming the rank or the bucket and message; a
        rank that cannot complete it (a peer is gone, the deadline passed)
        raises it too. Each wait is bounded by ``timeout`` seconds.
        """
        me = dist.get_rank()
        world = dist.get_world_size()
        deadline = timedelta(seconds=timeout)
        version = 0 if _versions is None else _versions.version
        self._agree_inputs(self._check_local(shards, me), me, deadline, version)
        # Every rank holds the same version (agreed), so all choose the same mode.
        pinned = _versions.pinned if _delta and _versions is not None else None
        buffers = _Pinned({}, {}) if _versions is not None else None
        n = len(self.messages)
        sent = torch.zeros((n, _DIGEST_BYTES), dtype=torch.int64)
        got = torch.zeros((n, _DIGEST_BYTES), dtype=torch.int64)
        failure: WeightSyncFailed | None = None
        try:
            staged = self._transfer(shards, me, deadline, sent, got, pinned, buffers)
        except WeightSyncFailed as e:
            failure = e
        status = torch.zeros(world, dtype=torch.int64)
        status[me] = 0 if failure is None else 1
        vote = torch.cat([status, sent.reshape(-1), got.reshape(-1)])
        try:
            vote_work = _call(lambda: dist.all_reduce(vote, async_op=True), "agreeing the digests")
            _wait(vote_work, deadline, "agreeing the digests")
        except WeightSyncFailed as e:
            raise (failure or e) from None
        if failure is not None:
            raise failure
        failed = [r for r in range(world) if int(vote[r])]
        if failed:
            raise WeightSyncFailed(f"weight sync failed on rank(s) {failed}; nothing published")
        sent, got = vote[world:].reshape(2, n, _DIGEST_BYTES)
        for k, (bucket, (src, dst)) in enumerate(self.messages):
            if not torch.equal(sent[k], got[k]):
                raise WeightSyncFailed(
                    f"weight sync: bucket {bucket} message {src} -> {dst} arrived with a "
                    "different digest than it was sent with; nothing published"
                )
        if _versions is not None:
            _versions.publish(staged, buffers)
        return staged

    def sync(
        self,
        shards: Mapping[str, torch.Tensor],
        versions: WeightVersions,
        *,
        delta: bool = False,
        timeout: float = 60.0,
    ) -> int:
        """`run`, then publish the result as ``versions``' next version.

        The new version is installed only after the vote succeeded, so on
        any failure ``versions`` keeps its current version and tensors
        untouched (the staged tensors are fresh) and `WeightSyncFailed`
        propagates. Returns the version now published (every rank that
        returns publishes the same number).

        With ``delta=True`` each message travels as the 2-byte words that
        changed since the last published version (an int32 index and the
        word each, 6 bytes an entry), or dense where that is not smaller, or
        on the first sync. Both sides pin the dense messages of each
        published version for this (memory: the bytes they send and
        receive). The digests are of the dense messages, so the vote checks
        the reconstruction bit for bit.
        """
        self.run(shards, timeout=timeout, _versions=versions, _delta=delta)
        return versions.version


class WeightVersions:
    """The published weights of one rank: a version number and a dict of
    tensors that no sync writes in place (a sync stages fresh tensors and
    swaps them in as a whole)."""

    def __init__(self) -> None:
        self.version = 0
        self.weights: dict[str, torch.Tensor] = {}
        self.pinned: _Pinned | None = None

    @property
    def last_sent_bytes(self) -> int:
        """Bytes this rank sent in the sync that published the current version."""
        return 0 if self.pinned is None else self.pinned.wire_bytes

    def publish(self, weights: dict[str, torch.Tensor], pinned: _Pinned | None = None) -> int:
        """Install ``weights`` (and the messages that built them) as the next
        version; returns its number."""
        self.weights, self.pinned = weights, pinned
        self.version += 1
        return self.version


@dataclass
class _Pinned:
    """The dense messages of one version, by message index: as this rank sent
    them and as it received them (a delta is taken against these)."""

    sent: dict[int, torch.Tensor]
    received: dict[int, torch.Tensor]
    #: bytes this rank put on the wire in the sync that built them
    wire_bytes: int = 0


#: a delta entry: an int32 index and an int16 value
_DELTA_ENTRY_BYTES = 6


def _encode(buffer: torch.Tensor, old: torch.Tensor) -> tuple[int, torch.Tensor]:
    """``buffer`` as (entry count, changed 2-byte words) against ``old``, or
    (-1, buffer) where the delta would not be smaller. Words compare as
    bits, so -0.0, NaN payloads and every other change travel exactly."""
    new16, old16 = buffer.view(torch.int16), old.view(torch.int16)
    changed = (new16 != old16).nonzero().flatten()
    if changed.numel() * _DELTA_ENTRY_BYTES >= buffer.numel():
        return -1, buffer
    indices = changed.to(torch.int32)
    payload = torch.cat([indices.view(torch.uint8), new16[changed].contiguous().view(torch.uint8)])
    return changed.numel(), payload


def _decode(payload: torch.Tensor, count: int, old: torch.Tensor) -> torch.Tensor:
    """The dense message: ``old`` with the ``count`` entries of ``payload`` applied."""
    out = old.clone()
    indices = payload[: 4 * count].view(torch.int32).long()
    out.view(torch.int16)[indices] = payload[4 * count :].view(torch.int16)
    return out


def _digest(buffer: torch.Tensor) -> torch.Tensor:
    """BLAKE2b of a byte buffer, as int64 values 0..255 (summable in the vote)."""
    digest = hashlib.blake2b(buffer.numpy(), digest_size=_DIGEST_BYTES).digest()
    return torch.tensor(list(digest), dtype=torch.int64)


def _call(post, what: str):
    """``post()``, its backend failure (a peer already gone) as the named error."""
    try:
        return post()
    except Exception as e:  # noqa: BLE001 - any backend failure becomes the named error
        raise WeightSyncFailed(f"weight sync failed while {what}: {e}") from e


def _post(ops: list, what: str) -> list:
    """Post a batch of point-to-point ops; a backend failure is the named error."""
    return _call(lambda: dist.batch_isend_irecv(ops), what) if ops else []


def _wait(work: dist.Work, timeout: timedelta, what: str) -> None:
    try:
        completed = work.wait(timeout)
    except Exception as e:  # noqa: BLE001 - any backend failure becomes the named error
        raise WeightSyncFailed(f"weight sync failed while {what}: {e}") from e
    if completed is False:
        raise WeightSyncFailed(f"weight sync: {what} missed its deadline of {timeout}")


def plan_weight_sync(
    source: Mapping[str, TensorLayout],
    dest: Mapping[str, TensorLayout],
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> WeightSyncPlan:
    """Plan the move of every named tensor from its ``source`` layout to its ``dest`` layout.

    Args:
        source: per tensor name, the trainer side's declaration.
        dest: per tensor name, the inference side's declaration (same names,
            same global shapes; the dtype may differ: the receiver casts).
        bucket_bytes: the most bytes one bucket carries (a larger piece
            travels alone).

    Returns:
        The plan; ``print(plan.describe())`` shows it, ``plan.run(shards)``
        executes it on every rank.

    Raises:
        WeightSyncSpecError: names or shapes differ between the sides, a dtype
            the wire cannot carry, a layout that does not cover its tensor.

    Example::

        train = Mesh("train", (2,), (0, 1)); infer = Mesh("infer", (2,), (2, 3))
        plan = plan_weight_sync(
            {"w": TensorLayout(train, (8, 4), torch.float32, dims=(0, None))},
            {"w": TensorLayout(infer, (8, 4), torch.float32, dims=(None, 0))},
        )
    """
    if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise WeightSyncSpecError(
            f"weight sync: bucket_bytes must be a positive int, not {bucket_bytes!r}"
        )
    only_source = sorted(set(source) - set(dest))
    only_dest = sorted(set(dest) - set(source))
    if only_source or only_dest:
        raise WeightSyncSpecError(
            "weight sync: the two sides name different tensors: "
            f"only in the source {only_source}, only in the destination {only_dest}"
        )
    transfers: dict[str, tuple[Transfer, ...]] = {}
    remote: list[tuple[str, Transfer, int]] = []
    local: list[tuple[str, Transfer]] = []
    for name in source:
        ts = tuple(_tensor_transfers(name, source[name], dest[name]))
        transfers[name] = ts
        itemsize = source[name].dtype.itemsize
        for t in ts:
            if t.is_local:
                local.append((name, t))
            else:
                remote.append((name, t, t.numel * itemsize))
    return WeightSyncPlan(
        source=dict(source),
        dest={name: dest[name] for name in source},
        transfers=transfers,
        buckets=tuple(_buckets(remote, bucket_bytes)),
        local=tuple(local),
        bucket_bytes=bucket_bytes,
    )
