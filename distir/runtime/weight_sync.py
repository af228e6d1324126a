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
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from distir.errors import CollectiveFailed, DeadlineExceeded, DistirError, Excluded
from distir.ir.layouts import Box, Layout, Mesh, local_box
from distir.ops.transfer.ir import Transfer, transfer_map
from distir.transport.domain import domain_for
from distir.transport.epochs import membership

__all__ = [
    "WIRE_DTYPES",
    "TensorLayout",
    "WeightSyncError",
    "WeightSyncCorrupted",
    "WeightSyncFailed",
    "WeightSyncPeerLost",
    "WeightSyncRefused",
    "WeightSyncTimeout",
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

#: the smallest piece that travels as a message of its own (as a view of its
#: shard, or straight into its destination); smaller ones are packed. Alone,
#: a piece saves one copy of itself and costs one more message (a gloo
#: send/receive pair, its digest call and its Python: ~0.1 ms unloaded),
#: which a 1 MiB copy costs too. (Measured on the loaded 2-core machine, 4
#: ranks, every piece of 64 KiB alone against every piece packed: 0.93x,
#: 1.04x and 0.91x the time in three runs, within the noise.)
_ALONE_BYTES = 1 << 20


class WeightSyncError(DistirError):
    """Base of the weight-sync errors."""


class WeightSyncSpecError(WeightSyncError, ValueError):
    """The two sides' declarations cannot make a plan (raised before any byte moves)."""


class WeightSyncFailed(WeightSyncError):
    """A sync did not complete and published nothing: raised on every rank
    that took part, as one of the subclasses below, which say whether the
    group still works (`group_broken`)."""

    #: whether the process group can run no more collectives: its execution
    #: domain is poisoned and the survivors call `distir.recover()`
    group_broken = False


class WeightSyncRefused(WeightSyncFailed):
    """Refused before any byte moved (a rank's shards, the plan, the
    versions or the mode differ); every rank saw it, the group still works."""


class WeightSyncCorrupted(WeightSyncFailed):
    """A message arrived with another digest than it was sent with; every
    rank saw it in the vote, the group still works."""


class WeightSyncTimeout(WeightSyncFailed):
    """A wait ran past the sync's deadline (a peer frozen, late or gone)."""

    group_broken = True


class WeightSyncPeerLost(WeightSyncFailed):
    """The backend failed (a peer exited, a connection broke), or a peer
    reported that its part failed."""

    group_broken = True


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
    #: the `Reduction` whose sum it carries (-1: a piece of a source shard)
    slot: int = -1


@dataclass(frozen=True)
class Reduction:
    """Partial addends of one destination box summed on a source rank (the
    reducer) before the sum is quantised for the wire: ``addends`` are the
    plan's transfers of that box, in source-rank order; the reducer receives
    the others' in full precision in the pre-stage."""

    name: str
    reducer: int
    dst_rank: int
    addends: tuple[Transfer, ...]


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


def _buckets(pieces: Iterable[tuple[str, Transfer, int, int]], limit: int) -> list[Bucket]:
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

    for name, t, nbytes, slot in pieces:
        pair = (t.src_rank, t.dst_rank)
        offset, cost = placed(pair, nbytes)
        if used and used + cost > limit:
            close()
            offset, cost = placed(pair, nbytes)
        current.setdefault(pair, []).append(Piece(name, t, offset, nbytes, slot))
        used += cost
    close()
    return buckets


@dataclass(frozen=True)
class _Outgoing:
    """A message this rank packs: message index ``k`` of the plan, its
    receiver and size, its pieces as (name, source slices, byte offset,
    bytes, box sizes) and the padding byte ranges between them."""

    k: int
    dst: int
    nbytes: int
    #: (name, source slices, byte offset, bytes, box sizes, reduction slot, quantised)
    pieces: tuple[tuple[str, tuple[slice, ...], int, int, tuple[int, ...], int, bool], ...]
    gaps: tuple[tuple[int, int], ...]
    #: one piece, sent as a view of its shard where the shard is contiguous
    #: (a segment of the dense path, `_segments`)
    view: bool = False


@dataclass(frozen=True)
class _Incoming:
    """A message this rank receives: its pieces as (name, destination
    slices, byte offset, bytes, box sizes, partial, plan order)."""

    k: int
    src: int
    nbytes: int
    pieces: tuple[
        tuple[str, tuple[slice, ...], int, int, tuple[int, ...], bool, tuple[int, int], bool], ...
    ]
    #: one piece, received straight into its slice of the staged tensor
    #: (a segment of the dense path, `_segments`)
    direct: bool = False


@dataclass(frozen=True)
class _Schedule:
    """One rank's part of a sync, per bucket, worked out once."""

    #: the source shard shape of every tensor this rank holds
    shapes: dict[str, tuple[int, ...]]
    outgoing: tuple[tuple[_Outgoing, ...], ...]
    incoming: tuple[tuple[_Incoming, ...], ...]
    #: (name, source slices, destination slices, partial, plan order, reduction slot)
    local: tuple[tuple[str, tuple[slice, ...], tuple[slice, ...], bool, tuple[int, int], int], ...]
    #: per destination tensor: (sizes, staging dtype, zero-filled)
    staged: dict[str, tuple[tuple[int, ...], torch.dtype, bool]]
    #: the dense path's segments (`_segments`), per bucket: what this rank
    #: sends and receives, ``k`` their index in `WeightSyncPlan.segments`
    send_segments: tuple[tuple[_Outgoing, ...], ...] = ()
    recv_segments: tuple[tuple[_Incoming, ...], ...] = ()


def _slices(offsets: Sequence[int], sizes: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(o, o + s) for o, s in zip(offsets, sizes))


def _box_contiguous(sizes: Sequence[int], full: Sequence[int]) -> bool:
    """Whether a box of ``sizes`` is one contiguous run of a row-major
    tensor of shape ``full``: whole in every dim after some dim d, of size
    1 in every dim before it."""
    d = len(sizes) - 1
    while d >= 0 and sizes[d] == full[d]:
        d -= 1
    return all(s == 1 for s in sizes[:d])


def _layout(pieces: Sequence[Piece]) -> tuple[list[int], int]:
    """Offsets of ``pieces`` packed one after the other, each 8-byte aligned
    (so that it can be viewed in its dtype), and the segment's size."""
    offsets, end = [], 0
    for p in pieces:
        at = -(-end // _ALIGN) * _ALIGN
        offsets.append(at)
        end = at + p.nbytes
    return offsets, end


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
    #: the wire format of floating tensors (None: their own dtype)
    wire: torch.dtype | None = None
    #: partial sums formed on a source rank before quantising (`Reduction`)
    reductions: tuple[Reduction, ...] = ()
    #: local copies of those sums (reducer == destination): (name, transfer, slot)
    local_reduced: tuple[tuple[str, Transfer, int], ...] = ()
    #: per rank, what it does in a sync (`_schedule`), worked out at its first
    _schedules: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def quantised(self, name: str) -> bool:
        """Whether ``name`` travels in the wire format (block-scaled fp8)."""
        return self.wire is not None and self.source[name].dtype.is_floating_point

    @property
    def local_pieces(self) -> tuple[tuple[str, Transfer, int], ...]:
        """Every local copy: (name, transfer, reduction slot or -1)."""
        return tuple((name, t, -1) for name, t in self.local) + self.local_reduced

    @property
    def pre_messages(
        self,
    ) -> tuple[tuple[tuple[int, int], tuple[tuple[int, int, Transfer], ...]], ...]:
        """The pre-stage: per (source rank, reducer) pair, the addends it
        carries as (reduction slot, position in the sum, transfer)."""
        by_pair: dict[tuple[int, int], list[tuple[int, int, Transfer]]] = {}
        for slot, red in enumerate(self.reductions):
            for j, t in enumerate(red.addends):
                if t.src_rank != red.reducer:
                    by_pair.setdefault((t.src_rank, red.reducer), []).append((slot, j, t))
        return tuple((pair, tuple(v)) for pair, v in sorted(by_pair.items()))

    def _pre_part_bytes(self, slot: int, t: Transfer) -> int:
        nbytes = t.numel * self.source[self.reductions[slot].name].dtype.itemsize
        return -(-nbytes // _ALIGN) * _ALIGN

    def _reduce(
        self,
        shards: Mapping[str, torch.Tensor],
        me: int,
        end: float,
        group: Any,
        sent: torch.Tensor,
        got: torch.Tensor,
        buffers: _Pinned | None,
        base: int | None = None,
    ) -> dict[int, torch.Tensor]:
        """The pre-stage: every partial sum of a quantised tensor formed on
        its reducer, in the source dtype, in source-rank order, so that a
        block is quantised once, from the sum. Its messages (one per pair)
        are digested into the vote after the buckets' (index n + i, n: the
        number of messages, or ``base``)."""
        if not self.reductions:
            return {}
        n = len(self.messages) if base is None else base
        ops, incoming = [], []
        for i, ((src, dst), addends) in enumerate(self.pre_messages):
            if src == me:
                buffer = torch.zeros(
                    sum(self._pre_part_bytes(slot, t) for slot, _, t in addends), dtype=torch.uint8
                )
                at = 0
                for slot, _, t in addends:
                    x = shards[self.reductions[slot].name][_slices(t.src_offsets, t.box.sizes)]
                    buffer[at : at + t.numel * x.dtype.itemsize].view(x.dtype).view(
                        t.box.sizes
                    ).copy_(x)
                    at += self._pre_part_bytes(slot, t)
                sent[n + i] = _digest(buffer)
                if buffers is not None:
                    buffers.wire_bytes += buffer.numel()
                ops.append(dist.P2POp(dist.isend, buffer, dst, group))
            elif dst == me:
                size = sum(self._pre_part_bytes(slot, t) for slot, _, t in addends)
                buffer = torch.empty(size, dtype=torch.uint8)
                ops.append(dist.P2POp(dist.irecv, buffer, src, group))
                incoming.append((i, addends, buffer))
        for work in _post(ops, "the pre-stage"):
            _wait(work, end, "the pre-stage")
        parts: dict[int, dict[int, torch.Tensor]] = {}
        for slot, red in enumerate(self.reductions):
            for j, t in enumerate(red.addends):
                if red.reducer == me and t.src_rank == me:
                    parts.setdefault(slot, {})[j] = shards[red.name][
                        _slices(t.src_offsets, t.box.sizes)
                    ]
        for i, addends, buffer in incoming:
            got[n + i] = _digest(buffer)
            at = 0
            for slot, j, t in addends:
                dtype = self.source[self.reductions[slot].name].dtype
                raw = buffer[at : at + t.numel * dtype.itemsize]
                parts.setdefault(slot, {})[j] = raw.view(dtype).view(t.box.sizes)
                at += self._pre_part_bytes(slot, t)
        reduced = {}
        for slot, addends in parts.items():
            total = addends[0].clone()
            for j in range(1, len(addends)):
                total += addends[j]
            reduced[slot] = total
        return reduced

    @property
    def names(self) -> tuple[str, ...]:
        """Tensor names in plan order."""
        return tuple(self.source)

    @property
    def wire_bytes(self) -> int:
        """Tensor bytes sent between ranks by one sync (alignment padding left
        out), the pre-stage's (full-precision partial addends) included."""
        pre = sum(
            t.numel * self.source[self.reductions[slot].name].dtype.itemsize
            for _, addends in self.pre_messages
            for slot, _, t in addends
        )
        return pre + sum(b.payload_bytes(pair) for b in self.buckets for pair in b.messages)

    def bytes_into(self, rank: int) -> int:
        """Bytes ``rank`` receives in one sync (buckets and pre-stage): the
        busiest receiver's, over its NIC's bandwidth, bounds a sync from below."""
        pre = sum(
            t.numel * self.source[self.reductions[slot].name].dtype.itemsize
            for (_, dst), addends in self.pre_messages
            if dst == rank
            for slot, _, t in addends
        )
        return pre + sum(
            b.payload_bytes(pair) for b in self.buckets for pair in b.messages if pair[1] == rank
        )

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
        wire = "" if self.wire is None else f", {str(self.wire).removeprefix('torch.')} on the wire"
        lines = [
            f"weight sync: {len(self.names)} tensors, {len(self.buckets)} buckets "
            f"(limit {self.bucket_bytes} bytes){wire}",
            line(header),
            "-+-".join("-" * w for w in widths),
            *(line(r) for r in rows),
            f"{sum(len(b.messages) for b in self.buckets)} messages, {self.wire_bytes} bytes "
            f"on the wire; {len(self.local)} local copies, {local_bytes} bytes",
        ]
        if self.pre_messages:
            lines.insert(
                -1,
                f"pre-stage: {len(self.pre_messages)} messages of partial addends, summed on "
                f"{len({r.reducer for r in self.reductions})} source rank(s) before quantising",
            )
        return "\n".join(lines)

    # -- execution -----------------------------------------------------------

    def _schedule(self, me: int) -> _Schedule:
        """What rank ``me`` packs, sends, receives and applies, worked out
        once per rank (a sync then does no planning and no per-element work
        in Python: one strided copy per piece on each side)."""
        cached = self._schedules.get(me)
        if cached is not None:
            return cached
        order = {
            (name, id(t)): (i, k)
            for i, name in enumerate(self.names)
            for k, t in enumerate(self.transfers[name])
        }
        shapes = {}
        for name in self.names:
            shape = self.source_shape(name, me)
            if shape is not None:
                shapes[name] = shape
        blocks, _ = self._shared_blocks()
        outgoing, incoming = [], []
        k = 0
        for bucket in self.buckets:
            outs, ins = [], []
            for (src, dst), pieces in bucket.messages.items():
                size = bucket.message_bytes((src, dst))
                if src == me:
                    placed, gaps, end = [], [], 0
                    for p in pieces:
                        if p.offset > end:
                            gaps.append((end, p.offset))
                        t = p.transfer
                        placed.append(
                            (p.name, _slices(t.src_offsets, t.box.sizes), p.offset, p.nbytes,
                             t.box.sizes, p.slot, blocks.get((p.name, id(t))))
                        )  # fmt: skip
                        end = p.offset + p.nbytes
                    if size > end:
                        gaps.append((end, size))
                    outs.append(_Outgoing(k, dst, size, tuple(placed), tuple(gaps)))
                if dst == me:
                    placed = []
                    for p in pieces:
                        t = p.transfer
                        placed.append(
                            (p.name, _slices(t.dst_offsets, t.box.sizes), p.offset, p.nbytes,
                             t.box.sizes, t.partial, order.get((p.name, id(t)), (0, 0)),
                             blocks.get((p.name, id(t))))
                        )  # fmt: skip
                    ins.append(_Incoming(k, src, size, tuple(placed)))
                k += 1
            outgoing.append(tuple(outs))
            incoming.append(tuple(ins))
        local = tuple(
            (name, _slices(t.src_offsets, t.box.sizes), _slices(t.dst_offsets, t.box.sizes),
             t.partial, order.get((name, id(t)), (0, 0)), slot)
            for name, t, slot in self.local_pieces
            if t.dst_rank == me
        )  # fmt: skip
        staged = {}
        for name in self.names:
            box = self.dest_box(name, me)
            if box is not None:
                # Partial addends are added onto zeros; every other element is
                # written by exactly one piece, so it needs no zero fill. A
                # quantised tensor arrives summed, decoded in its destination dtype.
                if self.quantised(name):
                    staged[name] = (box.sizes, self.dest[name].dtype, False)
                else:
                    zero = bool(self.source[name].partial)
                    staged[name] = (box.sizes, self.source[name].dtype, zero)
        send_segments, recv_segments = [], []
        for k, (bucket, (src, dst), pieces, alone) in enumerate(self.segments):
            while len(send_segments) <= bucket:
                send_segments.append([])
                recv_segments.append([])
            offsets, size = _layout(pieces)
            if src == me:
                placed, gaps, end = [], [], 0
                for p, at in zip(pieces, offsets):
                    if at > end:
                        gaps.append((end, at))
                    t = p.transfer
                    placed.append(
                        (p.name, _slices(t.src_offsets, t.box.sizes), at, p.nbytes,
                         t.box.sizes, p.slot, blocks.get((p.name, id(t))))
                    )  # fmt: skip
                    end = at + p.nbytes
                view = alone and self._sends_view(pieces[0])
                send_segments[bucket].append(
                    _Outgoing(k, dst, size, tuple(placed), tuple(gaps), view)
                )
            if dst == me:
                placed = []
                for p, at in zip(pieces, offsets):
                    t = p.transfer
                    placed.append(
                        (p.name, _slices(t.dst_offsets, t.box.sizes), at, p.nbytes,
                         t.box.sizes, t.partial, order.get((p.name, id(t)), (0, 0)),
                         blocks.get((p.name, id(t))))
                    )  # fmt: skip
                direct = alone and self._lands_direct(pieces[0])
                recv_segments[bucket].append(_Incoming(k, src, size, tuple(placed), direct))
        while len(send_segments) < len(self.buckets):
            send_segments.append([])
            recv_segments.append([])
        schedule = _Schedule(
            shapes, tuple(outgoing), tuple(incoming), local, staged,
            tuple(map(tuple, send_segments)), tuple(map(tuple, recv_segments)),
        )  # fmt: skip
        self._schedules[me] = schedule
        return schedule

    def _sends_view(self, p: Piece) -> bool:
        """Whether piece ``p`` can be sent as a view of its source shard
        (in its own dtype, one contiguous run of a contiguous shard)."""
        if self.quantised(p.name) or p.slot >= 0 or p.nbytes < _ALONE_BYTES:
            return False
        shape = self.source_shape(p.name, p.transfer.src_rank)
        return shape is not None and _box_contiguous(p.transfer.box.sizes, shape)

    def _lands_direct(self, p: Piece) -> bool:
        """Whether piece ``p`` can be received straight into its slice of
        the staged destination tensor (one contiguous run of it, written by
        this piece alone, in the destination's dtype)."""
        t = p.transfer
        if self.quantised(p.name) or p.slot >= 0 or t.partial or p.nbytes < _ALONE_BYTES:
            return False
        if self.source[p.name].dtype != self.dest[p.name].dtype:
            return False
        box = self.dest_box(p.name, t.dst_rank)
        return box is not None and _box_contiguous(t.box.sizes, box.sizes)

    @property
    def segments(self) -> tuple[tuple[int, tuple[int, int], tuple[Piece, ...], bool], ...]:
        """The dense path's wire units, as (bucket index, (src, dst), pieces,
        alone), in plan order: each message of a bucket cut so that a piece
        that can be sent as a view of its shard, or received straight into
        the staged destination, travels alone (one message of its own: no
        packing, or no copy-out), and the other pieces of the message
        travel packed together between them. The same on every rank."""
        cached = self._schedules.get("segments")
        if cached is not None:
            return cached
        out = []
        for bucket in self.buckets:
            for pair, pieces in bucket.messages.items():
                run: list[Piece] = []
                for p in pieces:
                    if self._sends_view(p) or self._lands_direct(p):
                        if run:
                            out.append((bucket.index, pair, tuple(run), False))
                            run = []
                        out.append((bucket.index, pair, (p,), True))
                    else:
                        run.append(p)
                if run:
                    out.append((bucket.index, pair, tuple(run), False))
        cached = self._schedules["segments"] = tuple(out)
        return cached

    def _shared_blocks(self) -> tuple[dict[tuple[str, int], _Blocks], int]:
        """Every quantised piece's `_Blocks` (by name and transfer id), and
        the length of the vector of agreed maxima of the shared blocks: per
        (tensor, destination rank, block column) of which some piece holds
        only part of the width (the rest is another's: the pieces partition
        the destination shard), one float32 per row of the destination
        shard. The same on every rank."""
        cached = self._schedules.get("blocks")
        if cached is not None:
            return cached
        pieces = [p for b in self.buckets for ps in b.messages.values() for p in ps]
        tables: dict[tuple[str, int, int], int] = {}
        length = 0
        out: dict[tuple[str, int], _Blocks] = {}
        for p in pieces:
            if not self.quantised(p.name):
                continue
            t = p.transfer
            c0 = t.dst_offsets[-1] if t.dst_offsets else 0
            width = _split(t.box.sizes)[1]
            lead = c0 % FP8_BLOCK
            box = self.dest_box(p.name, t.dst_rank)
            assert box is not None
            dest_lead, dest_width = tuple(box.sizes[:-1]), _split(box.sizes)[1]
            shared = []
            for j, col in enumerate(range(c0 // FP8_BLOCK, -(-(c0 + width) // FP8_BLOCK))):
                first = max(c0, col * FP8_BLOCK) - c0
                last = min(c0 + width, (col + 1) * FP8_BLOCK) - c0
                if last - first == min(dest_width, (col + 1) * FP8_BLOCK) - col * FP8_BLOCK:
                    continue  # the piece holds the block's whole width in its rows
                key = (p.name, t.dst_rank, col)
                if key not in tables:
                    tables[key] = length
                    length += _split(box.sizes)[0]
                rows = _slices(t.dst_offsets[:-1], t.box.sizes[:-1])
                shared.append((j, first, last, tables[key], dest_lead, rows))
            out[(p.name, id(t))] = _Blocks(lead, tuple(shared))
        cached = self._schedules["blocks"] = (out, length)
        return cached

    def _agree_scales(
        self,
        shards: Mapping[str, torch.Tensor],
        reduced: Mapping[int, torch.Tensor],
        me: int,
        end: float,
        group: Any,
        contribute: bool = True,
    ) -> torch.Tensor | None:
        """The maximum of every shared block (`_shared_blocks`) over the
        pieces that share it, agreed by every rank in one all-reduce before
        any piece is quantised, so that each block has one scale (None:
        the plan has no shared block; no exchange). A rank that failed
        before takes part with ``contribute=False``, so that every rank
        posts the same collectives."""
        _, length = self._shared_blocks()
        if not length:
            return None
        agreed = torch.zeros(length, dtype=torch.float32)
        for outs in self._schedule(me).outgoing if contribute else ():
            for out in outs:
                for name, slices, _, _, sizes, slot, blocks in out.pieces:
                    if blocks is None or not blocks.shared:
                        continue
                    x = shards[name][slices] if slot < 0 else reduced[slot]
                    x = x.reshape(_split(sizes)).to(torch.float32)
                    for _, first, last, at, dest_lead, rows in blocks.shared:
                        table = _table(agreed, at, dest_lead)
                        mine = x[:, first:last].abs().amax(dim=1).view(table[rows].shape)
                        table[rows] = torch.maximum(table[rows], mine)
        _all_reduce(agreed, dist.ReduceOp.MAX, group, end, "agreeing the block scales")
        return agreed

    def _check_local(self, shards: Mapping[str, torch.Tensor], me: int) -> str | None:
        """Why this rank's shards do not fit the plan, or None."""
        for name, shape in self._schedule(me).shapes.items():
            if name not in shards:
                return f"rank {me}: tensor {name!r} is missing from its source shards"
            x = shards[name]
            want = self.source[name].dtype
            if tuple(x.shape) != shape or x.dtype != want:
                return (
                    f"rank {me}: tensor {name!r} shard is {list(x.shape)} {x.dtype}, "
                    f"the plan needs {list(shape)} {want}"
                )
            if self.quantised(name) and not bool(torch.isfinite(x).all()):
                # Refused whatever the layout (a local copy would carry it).
                return (
                    f"rank {me}: tensor {name!r} holds NaN or infinite values; "
                    f"{str(self.wire).removeprefix('torch.')} cannot carry them"
                )
        return None

    @property
    def fingerprint(self) -> int:
        """A 62-bit hash of the plan (declarations, transfers, buckets): ranks
        agree on it before any byte moves."""
        cached = self._schedules.get("fingerprint")
        if cached is None:
            text = repr(
                (self.source, self.dest, self.transfers, self.buckets, self.local_pieces,
                 self.wire, self.reductions)
            )  # fmt: skip
            digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
            cached = self._schedules["fingerprint"] = int.from_bytes(digest, "little") >> 2
        return cached

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every rank a sync involves (the ranks of every mesh, sorted)."""
        meshes = [d.mesh for d in (*self.source.values(), *self.dest.values())]
        return tuple(sorted({r for m in meshes for r in m.ranks}))

    def _agree(
        self, problem: str | None, me: int, end: float, group: Any, mine: tuple[int, int, int]
    ) -> tuple[bool, int]:
        """Every rank learns, before any byte moves, whether any rank's shards
        are refused or the ranks differ in the plan or the mode; returns
        whether every rank can take a delta, and the newest published
        version of any rank (``mine``: this rank's version, delta asked,
        delta possible).

        Ranks that hold different versions are repaired, not refused: a
        receiver that missed an install (it died between the vote and its
        install and was replaced, or its install raised) holds an older
        version than its peers, but a dense sync writes every element of
        every destination shard whatever a rank held before, so the sync
        goes dense and every rank publishes the same next version."""
        version, delta, pinned = mine
        words = [0 if problem is None else me + 1]
        for value in (self.fingerprint, version, delta, pinned):
            words += [value, -value]  # MAX of both: the max and the min
        flag = torch.tensor(words, dtype=torch.int64)
        _all_reduce(flag, dist.ReduceOp.MAX, group, end, "agreeing the inputs")
        high = {
            k: int(flag[1 + 2 * i]) for i, k in enumerate(("plan", "version", "delta", "pinned"))
        }
        low = {
            k: -int(flag[2 + 2 * i]) for i, k in enumerate(("plan", "version", "delta", "pinned"))
        }
        refused = "weight sync refused before any byte moved: "
        if problem is not None:
            raise WeightSyncRefused(refused + problem)
        if int(flag[0]) != 0:
            raise WeightSyncRefused(
                f"{refused}rank {int(flag[0]) - 1}'s source shards do not fit the plan"
            )
        if high["plan"] != low["plan"]:
            raise WeightSyncRefused(refused + "the ranks run different plans")
        if high["delta"] != low["delta"]:
            raise WeightSyncRefused(refused + "some ranks asked for a delta sync, some not")
        # A delta needs the last version's messages of this very plan on
        # every rank, the same version everywhere.
        same = high["version"] == low["version"]
        return bool(low["delta"] and low["pinned"] and same), high["version"]

    def _pack(
        self,
        out: _Outgoing,
        shards: Mapping[str, torch.Tensor],
        reduced: Mapping[int, torch.Tensor],
        nonfinite: list[str] | None = None,
        buffer: torch.Tensor | None = None,
        agreed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One message: every piece copied once, straight from its (strided)
        shard into its place (``buffer``, a recycled one, or a new one); the
        alignment padding zeroed so that it never differs between versions (delta)."""
        if buffer is None:
            buffer = torch.empty(out.nbytes, dtype=torch.uint8)
        for name, slices, offset, nbytes, sizes, slot, blocks in out.pieces:
            x = shards[name][slices] if slot < 0 else reduced[slot]
            if blocks is not None:
                shared = [
                    (j, _table(agreed, at, lead)[rows].reshape(-1))
                    for j, _, _, at, lead, rows in blocks.shared
                    if agreed is not None
                ]
                if not _quantise(x, buffer[offset : offset + nbytes], blocks.lead, shared):
                    if nonfinite is not None:
                        nonfinite.append(name)
            else:
                dtype = self.source[name].dtype
                buffer[offset : offset + nbytes].view(dtype).view(sizes).copy_(x)
        for start, stop in out.gaps:
            buffer[start:stop] = 0
        return buffer

    @property
    def messages(self) -> tuple[tuple[int, tuple[int, int]], ...]:
        """Every message of every bucket, as (bucket index, (src, dst)), in plan order."""
        return tuple((b.index, pair) for b in self.buckets for pair in b.messages)

    def _exchange_counts(self, counts: dict[int, int], me: int, end: float, group: Any) -> None:
        """Send each receiver the delta entry count (-1: dense) of every message
        this rank sends it; fill ``counts`` with those of the messages it receives."""
        by_pair: dict[tuple[int, int], list[int]] = {}
        for k, (_, pair) in enumerate(self.messages):
            by_pair.setdefault(pair, []).append(k)
        ops, incoming = [], []
        for (src, dst), ks in by_pair.items():
            if src == me:
                header = torch.tensor([counts[k] for k in ks], dtype=torch.int64)
                ops.append(dist.P2POp(dist.isend, header, dst, group))
            elif dst == me:
                header = torch.empty(len(ks), dtype=torch.int64)
                ops.append(dist.P2POp(dist.irecv, header, src, group))
                incoming.append((ks, header))
        for work in _post(ops, "exchanging the delta sizes"):
            _wait(work, end, "exchanging the delta sizes")
        for ks, header in incoming:
            counts.update(zip(ks, header.tolist()))

    def _staging(
        self, schedule: _Schedule, reuse: Mapping[str, torch.Tensor] | None
    ) -> dict[str, torch.Tensor]:
        """The tensors a sync stages into: those of ``reuse`` (a retired
        version's, `WeightVersions` with ``install="swap"``) where they fit,
        fresh ones otherwise."""
        staged = {}
        for name, (sizes, dtype, zero) in schedule.staged.items():
            old = None if reuse is None else reuse.get(name)
            if old is not None and tuple(old.shape) == tuple(sizes) and old.dtype == dtype:
                staged[name] = old.zero_() if zero else old
            else:
                staged[name] = (torch.zeros if zero else torch.empty)(sizes, dtype=dtype)
        return staged

    def _prologue(
        self,
        shards: Mapping[str, torch.Tensor],
        me: int,
        end: float,
        group: Any,
        sent: torch.Tensor,
        got: torch.Tensor,
        buffers: _Pinned | None,
        base: int | None,
        staged: Mapping[str, torch.Tensor],
        addends: list[tuple[tuple[int, int], str, tuple[slice, ...], torch.Tensor]],
    ) -> tuple[dict[int, torch.Tensor], torch.Tensor | None]:
        """What every sync does before its buckets: the pre-stage of partial
        sums (`_reduce`), the shared blocks' scales (`_agree_scales`) and the
        local copies; returns the sums and the agreed scales."""
        try:
            reduced = self._reduce(shards, me, end, group, sent, got, buffers, base)
        except WeightSyncFailed:
            # Still take part in the scales' all-reduce (every rank posts
            # the same collectives), then fail.
            if self._shared_blocks()[1]:
                self._agree_scales(shards, {}, me, end, group, contribute=False)
            raise
        agreed = self._agree_scales(shards, reduced, me, end, group)
        schedule = self._schedule(me)
        for name, src_slices, dst_slices, partial, order, slot in schedule.local:
            piece = shards[name][src_slices] if slot < 0 else reduced[slot]
            if partial:
                addends.append((order, name, dst_slices, piece))
            else:
                staged[name][dst_slices].copy_(piece)
        return reduced, agreed

    def _unpack(
        self,
        inc: _Incoming,
        buffer: torch.Tensor,
        staged: Mapping[str, torch.Tensor],
        addends: list[tuple[tuple[int, int], str, tuple[slice, ...], torch.Tensor]],
    ) -> None:
        """Each piece of a received message (or segment) into its staged
        tensor: decoded from fp8, copied, or (partial addends) kept in
        ``addends`` to be summed in plan order once every piece arrived."""
        for name, slices, offset, nbytes, sizes, partial, order, blocks in inc.pieces:
            if blocks is not None:
                staged[name][slices].copy_(
                    _dequantise(buffer[offset : offset + nbytes], sizes, blocks.lead)
                )
                continue
            dtype = self.source[name].dtype
            piece = buffer[offset : offset + nbytes].view(dtype).view(sizes)
            if partial:
                addends.append((order, name, slices, piece))
            else:
                staged[name][slices].copy_(piece)

    def _finish(
        self, staged: dict[str, torch.Tensor], reuse: Mapping[str, torch.Tensor] | None
    ) -> dict[str, torch.Tensor]:
        """The staged tensors in their destination dtypes: cast where the
        staging dtype differs, into ``reuse``'s tensor where it fits."""
        out = {}
        for name, y in staged.items():
            dtype = self.dest[name].dtype
            if y.dtype == dtype:
                out[name] = y
                continue
            old = None if reuse is None else reuse.get(name)
            if old is not None and old.shape == y.shape and old.dtype == dtype:
                out[name] = old.copy_(y)
            else:
                out[name] = y.to(dtype)
        return out

    def _transfer_dense(
        self,
        shards: Mapping[str, torch.Tensor],
        me: int,
        end: float,
        group: Any,
        sent: torch.Tensor,
        got: torch.Tensor,
        nonfinite: list[str],
        reuse: Mapping[str, torch.Tensor] | None,
        counter: _Pinned,
    ) -> dict[str, torch.Tensor]:
        """Move every bucket as `segments`: a piece that is a contiguous run
        of its shard is sent as a view of it (no packing), a piece that is a
        contiguous run of its destination is received straight into the
        staged tensor (no copy-out), the rest packed together. Sets
        ``sent[k]`` / ``got[k]`` to the digest of segment k as this rank
        sent / received it. Two buckets are in flight at a time.
        ``counter``: its ``wire_bytes`` counts the bytes this rank sends;
        its ``sent`` / ``received`` hand in the packed segments' buffers of
        the sync before (by segment index; a fresh buffer costs a page fault
        per page on its first write) and take this sync's."""
        schedule = self._schedule(me)
        spare_sent, spare_received = dict(counter.sent), dict(counter.received)
        counter.sent.clear()
        counter.received.clear()

        def recycled(kept: dict[int, torch.Tensor], k: int, size: int) -> torch.Tensor:
            old = kept.pop(k, None)
            if old is not None and old.numel() == size:
                return old
            return torch.empty(size, dtype=torch.uint8)

        staged = self._staging(schedule, reuse)
        addends: list[tuple[tuple[int, int], str, tuple[slice, ...], torch.Tensor]] = []
        base = len(self.segments)
        reduced, agreed = self._prologue(
            shards, me, end, group, sent, got, counter, base, staged, addends
        )

        def post(i: int) -> tuple[list, list]:
            ops, received = [], []
            for out in schedule.send_segments[i]:
                wire = None
                if out.view:
                    x = shards[out.pieces[0][0]][out.pieces[0][1]]
                    if x.is_contiguous():
                        wire = x.reshape(-1).view(torch.uint8)
                if wire is None:
                    into = recycled(spare_sent, out.k, out.nbytes)
                    wire = self._pack(out, shards, reduced, nonfinite, into, agreed)
                    counter.sent[out.k] = wire
                sent[out.k] = _digest(wire)
                counter.wire_bytes += out.nbytes
                if out.nbytes:
                    ops.append(dist.P2POp(dist.isend, wire, out.dst, group))
            for inc in schedule.recv_segments[i]:
                if inc.direct:
                    name, slices = inc.pieces[0][0], inc.pieces[0][1]
                    buffer = staged[name][slices].view(-1).view(torch.uint8)
                else:
                    buffer = recycled(spare_received, inc.k, inc.nbytes)
                    counter.received[inc.k] = buffer
                if inc.nbytes:
                    ops.append(dist.P2POp(dist.irecv, buffer, inc.src, group))
                received.append((inc, buffer))
            return _post(ops, f"bucket {i}"), received

        def land(received: list) -> None:
            for inc, buffer in received:
                got[inc.k] = _digest(buffer)
                if inc.direct:
                    continue
                self._unpack(inc, buffer, staged, addends)

        n = len(self.buckets)
        inflight = post(0) if n else None
        for i in range(n):
            ahead = post(i + 1) if i + 1 < n else None
            works, received = inflight
            for work in works:
                _wait(work, end, f"bucket {i}")
            land(received)
            inflight = ahead
        addends.sort(key=lambda a: a[0])
        for _, name, slices, piece in addends:
            staged[name][slices].add_(piece)
        return self._finish(staged, reuse)

    def _transfer(
        self,
        shards: Mapping[str, torch.Tensor],
        me: int,
        end: float,
        group: Any,
        sent: torch.Tensor,
        received_digests: torch.Tensor,
        pinned: _Pinned | None = None,
        buffers: _Pinned | None = None,
        nonfinite: list[str] | None = None,
        spare: _Pinned | None = None,
        reuse: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Move every bucket; set ``sent[k]`` / ``received_digests[k]`` to the
        digest of message k as this rank sent / received it (dense, decoded),
        and fill ``buffers`` with those dense messages. With ``pinned`` (the
        messages of the last published version) each message travels as a
        delta against it where that is smaller. ``spare``: the dense
        messages of a retired version, whose buffers are reused (a fresh
        buffer costs a page fault per page on its first write, about as
        much as the copy into it).

        Two buckets are in flight at a time: bucket i+1 is packed, digested
        and posted before bucket i is awaited, and bucket i is digested and
        unpacked while bucket i+1 is on the wire."""
        schedule = self._schedule(me)
        staged = self._staging(schedule, reuse)
        # Partial addends are added at the end, in plan order, so that they
        # sum in source-rank order whatever order they arrive in.
        addends: list[tuple[tuple[int, int], str, tuple[slice, ...], torch.Tensor]] = []
        reduced, agreed = self._prologue(
            shards, me, end, group, sent, received_digests, buffers, None, staged, addends
        )
        counts: dict[int, int] = {}
        wires: dict[int, torch.Tensor] = {}
        dense: dict[int, torch.Tensor] = {}

        def recycled(kept: dict[int, torch.Tensor] | None, k: int, size: int) -> torch.Tensor:
            old = None if kept is None else kept.pop(k, None)
            if old is not None and old.numel() == size:
                return old
            return torch.empty(size, dtype=torch.uint8)

        def prepare(i: int) -> None:
            for out in schedule.outgoing[i]:
                reuse = recycled(None if spare is None else spare.sent, out.k, out.nbytes)
                buffer = self._pack(out, shards, reduced, nonfinite, reuse, agreed)
                sent[out.k] = _digest(buffer)
                dense[out.k] = buffer
                if pinned is not None:
                    counts[out.k], wires[out.k] = _encode(buffer, pinned.sent[out.k])
                else:
                    wires[out.k] = buffer

        if pinned is not None:
            # Delta sizes are data-dependent: pack everything, then tell each
            # receiver the size of each of its messages in one exchange.
            for i in range(len(self.buckets)):
                prepare(i)
            self._exchange_counts(counts, me, end, group)

        def post(i: int) -> tuple[list, list]:
            if pinned is None:
                prepare(i)
            ops, received = [], []
            for out in schedule.outgoing[i]:
                wire, message = wires.pop(out.k), dense.pop(out.k)
                if buffers is not None:
                    buffers.sent[out.k] = message
                    buffers.wire_bytes += wire.numel()
                if wire.numel():
                    ops.append(dist.P2POp(dist.isend, wire, out.dst, group))
            for inc in schedule.incoming[i]:
                if pinned is not None and counts[inc.k] >= 0:
                    size = counts[inc.k] * _DELTA_ENTRY_BYTES
                    buffer = torch.empty(size, dtype=torch.uint8)
                else:
                    size = inc.nbytes
                    buffer = recycled(None if spare is None else spare.received, inc.k, size)
                if size:
                    ops.append(dist.P2POp(dist.irecv, buffer, inc.src, group))
                received.append((inc, buffer))
            return _post(ops, f"bucket {i}"), received

        def land(i: int, received: list) -> None:
            for inc, buffer in received:
                if pinned is not None and counts[inc.k] >= 0:
                    into = recycled(None if spare is None else spare.received, inc.k, inc.nbytes)
                    buffer = _decode(buffer, counts[inc.k], pinned.received[inc.k], into)
                received_digests[inc.k] = _digest(buffer)
                if buffers is not None:
                    buffers.received[inc.k] = buffer
                self._unpack(inc, buffer, staged, addends)

        n = len(self.buckets)
        inflight = post(0) if n else None
        for i in range(n):
            ahead = post(i + 1) if i + 1 < n else None
            works, received = inflight
            for work in works:
                _wait(work, end, f"bucket {i}")
            land(i, received)
            inflight = ahead
        addends.sort(key=lambda a: a[0])
        for _, name, slices, piece in addends:
            staged[name][slices].add_(piece)
        return self._finish(staged, reuse)

    def run(
        self,
        shards: Mapping[str, torch.Tensor],
        *,
        timeout: float = 60.0,
        group: Any = None,
        _versions: WeightVersions | None = None,
        _delta: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Move the state dict and agree that it arrived intact.

        ``shards`` are this rank's source shards (by name; ignored on ranks
        outside every source mesh). Returns this rank's destination shards,
        fresh tensors in the destination dtypes (empty on ranks outside every
        destination mesh). Every rank of ``group`` calls it (None: the
        current membership's group, `distir.membership()`: the default group
        until a `distir.recover()`); the meshes name global ranks, all of
        them in ``group``. Partial addends are summed in the source dtype in
        source-rank order, then cast.

        Before any byte moves the ranks agree (one small all-reduce) on the
        plan, the mode and the published version, and that every rank's
        shards fit. Before returning, every rank takes part in one vote (an
        all-reduce): each rank's status, and the digest (`_digest`) of every
        message (a delta sync's) or segment (`segments`, a dense sync's) as
        its sender sent it and as its receiver received it. The
        whole sync, both all-reduces included, is bounded by ``timeout``
        seconds. Every failure raises a `WeightSyncFailed` on every rank
        that took part, within ``timeout`` plus the 2 s of the failure path:
        `WeightSyncRefused` or `WeightSyncCorrupted` leave the group
        working (the next sync may go on at once); `WeightSyncTimeout` and
        `WeightSyncPeerLost` poison the group's execution domain (as every
        distir failure does, the reason published for the peers) and the
        survivors call `distir.recover()` before syncing on its group.
        """
        with torch.no_grad():
            return self._run(shards, timeout, group, _versions, _delta)

    def _run(
        self,
        shards: Mapping[str, torch.Tensor],
        timeout: float,
        group: Any,
        versions: WeightVersions | None,
        delta: bool,
    ) -> dict[str, torch.Tensor]:
        end = time.monotonic() + timeout
        pg = membership().group if group is None else group
        domain = domain_for(pg)
        try:
            domain.check("weight sync")
        except Excluded:
            raise
        except DistirError as e:
            raise WeightSyncPeerLost(
                f"weight sync not started: {e} (the survivors call distir.recover() and "
                "sync on its group)"
            ) from None
        members = dist.get_process_group_ranks(pg)
        outside = sorted(set(self.ranks) - set(members))
        if outside:
            # The same on every rank of the group: no exchange needed to agree.
            raise WeightSyncRefused(
                f"weight sync refused before any byte moved: the plan names rank(s) {outside}, "
                f"which the group (ranks {sorted(members)}) does not hold: plan again "
                "for the ranks that are left"
            )
        try:
            return self._attempt(shards, end, pg, versions, delta)
        except WeightSyncFailed as e:
            if not e.group_broken:
                raise
            # What a peer published first says who failed and why.
            published, excluded = domain.failure_evidence()
            if excluded is not None:
                raise excluded from None
            # As the domain's own types, so that it counts as a backend failure
            # (no reset_domain: the survivors recover).
            kind = DeadlineExceeded if isinstance(e, WeightSyncTimeout) else CollectiveFailed
            domain.poison(kind("weight sync", str(e).removeprefix("weight sync: ")))
            if published and f"rank {dist.get_rank()}:" not in published:
                who, _, why = published.partition(": ")
                raise type(e)(f"{e}; {who} failed first: {why}") from None
            raise

    def _attempt(
        self,
        shards: Mapping[str, torch.Tensor],
        end: float,
        group: Any,
        versions: WeightVersions | None,
        delta: bool,
    ) -> dict[str, torch.Tensor]:
        me = dist.get_rank()
        members = dist.get_process_group_ranks(group)
        pinned = None if versions is None else versions.pinned
        usable = pinned is not None and pinned.plan == self.fingerprint
        mine = (0 if versions is None else versions.version, int(delta), int(usable))
        # Every rank learns the same answer, so all choose the same mode.
        delta_ok, newest = self._agree(self._check_local(shards, me), me, end, group, mine)
        if not delta_ok:
            pinned = None
        # Only a sync asked to be a delta keeps (pins) its messages for the
        # next delta; the others take the dense path (`segments`: views,
        # straight into the staged tensors), which keeps no message.
        keep = versions is not None and bool(delta)
        buffers = _Pinned({}, {}, self.fingerprint) if keep else None
        spare = versions.take_spare(self.fingerprint) if keep else None
        reuse = None if versions is None else versions.take_retired()
        units = self.messages if delta else self.segments
        n = len(units) + len(self.pre_messages)
        sent = torch.zeros(n, 2, dtype=torch.int64)
        got = torch.zeros(n, 2, dtype=torch.int64)
        failure: WeightSyncFailed | None = None
        nonfinite: list[str] = []
        try:
            if delta:
                staged = self._transfer(
                    shards, me, end, group, sent, got, pinned, buffers, nonfinite, spare, reuse
                )
            else:
                # Counts the bytes sent; recycles the packed segments' buffers.
                buffers = _Pinned({}, {}) if versions is None else versions.take_segments()
                staged = self._transfer_dense(
                    shards, me, end, group, sent, got, nonfinite, reuse, buffers
                )
        except WeightSyncFailed as e:
            failure = e
        status = torch.zeros(len(members), dtype=torch.int64)
        status[members.index(me)] = 1 if failure is not None else 2 if nonfinite else 0
        vote = torch.cat([status, sent.view(-1), got.view(-1)])
        try:
            _all_reduce(vote, dist.ReduceOp.SUM, group, end, "agreeing the digests")
        except WeightSyncFailed as e:
            raise (failure or e) from None
        if failure is not None:
            raise failure
        failed = [members[i] for i in range(len(members)) if int(vote[i]) == 1]
        refused = [members[i] for i in range(len(members)) if int(vote[i]) == 2]
        if refused and not failed:
            # Every transfer completed: the group still works.
            mine = f" (here: {', '.join(sorted(set(nonfinite)))})" if nonfinite else ""
            raise WeightSyncRefused(
                f"weight sync: rank(s) {refused} hold NaN or infinite values in a tensor "
                f"that travels as {str(self.wire).removeprefix('torch.')}, which cannot "
                f"carry them{mine}; nothing published"
            )
        if failed:
            # Their waits may still be posted: the group's connections are not trusted again.
            raise WeightSyncPeerLost(
                f"weight sync failed on rank(s) {failed} (reported in the vote); nothing published"
            )
        sent, got = vote[len(members) :].reshape(2, n, 2)
        for k in (sent != got).any(dim=1).nonzero().flatten().tolist():
            if k >= len(units):
                (src, dst), _ = self.pre_messages[k - len(units)]
                raise WeightSyncCorrupted(
                    f"weight sync: the pre-stage message {src} -> {dst} arrived with a "
                    "different digest than it was sent with; nothing published"
                )
            bucket, (src, dst) = units[k][:2]
            raise WeightSyncCorrupted(
                f"weight sync: bucket {bucket} message {src} -> {dst} arrived with a "
                "different digest than it was sent with; nothing published"
            )
        if versions is not None:
            # The commit: every rank that completed the vote saw the same
            # outcome, so every receiver installs this version or none does.
            versions.publish(staged, buffers if keep else None, newest + 1)
            versions.last_sent_bytes = 0 if buffers is None else buffers.wire_bytes
            if not delta and buffers is not None:
                buffers.wire_bytes = 0
                versions._segments = buffers
        return staged

    def sync(
        self,
        shards: Mapping[str, torch.Tensor],
        versions: WeightVersions,
        *,
        delta: bool = False,
        timeout: float = 60.0,
        group: Any = None,
    ) -> int:
        """`run`, then publish the result as ``versions``' next version.

        The new version is installed only after the vote succeeded, so on
        any failure ``versions`` keeps its current version and tensors
        untouched (the staged tensors are fresh, or with
        ``WeightVersions(install="swap")`` those of the version before the
        current one) and `WeightSyncFailed` propagates. Returns the version now published (every rank that
        returns publishes the same number: the newest version any rank held,
        plus one). Ranks holding different versions (a receiver that missed
        an install: killed between the vote and its install and replaced by
        a new process, or its install raised) are repaired by the next sync:
        it goes dense (a dense sync does not read what a receiver held) and
        every rank publishes the same version.

        With ``delta=True`` each message travels as the 2-byte words that
        changed since the last published version (an int32 index and the
        word each, 6 bytes an entry), or dense where that is not smaller, or
        when some rank has no version of this plan published by a sync with
        ``delta=True`` (the first such sync, one after a sync without it, or
        after a re-plan). Such syncs pin the dense messages of the version
        they publish on both sides (memory: the bytes they send and
        receive); a sync without ``delta`` pins nothing and takes the dense
        path (`segments`). The digests are of the dense messages, so the
        vote checks the reconstruction bit for bit.
        """
        self.run(shards, timeout=timeout, group=group, _versions=versions, _delta=delta)
        return versions.version


class WeightVersions:
    """The published weights of one rank: a version number and a dict of
    tensors, swapped in as a whole when a sync commits (version v stays
    intact until then, and after any failed sync).

    ``install`` says where a sync stages the next version, which is what a
    caller holding references to older tensors sees:

    - ``"fresh"`` (the default): fresh tensors for every version; no sync
      ever writes a published tensor, so a reference to any version keeps
      its values for as long as it is held;
    - ``"swap"``: double-buffered: a sync stages into the tensors of the
      version before the current one (same names, shapes and dtypes) and
      they become the live ones at its commit. The current version's
      tensors are never written while they are current, nor by the next
      sync; the sync after that writes into them (a failed one may leave
      them partly written). So a caller may use ``weights`` until it calls
      the sync after next, and must not keep older tensors. This saves
      allocating, and first touching, every destination byte per sync.
    """

    def __init__(self, install: str = "fresh") -> None:
        if install not in ("fresh", "swap"):
            raise ValueError(
                f"WeightVersions: install must be 'fresh' or 'swap', not {install!r}"
            )
        self.install = install
        self.version = 0
        self.weights: dict[str, torch.Tensor] = {}
        self.pinned: _Pinned | None = None
        #: the pinned messages of the version before, whose buffers the next
        #: sync of the same plan reuses (every wait on them completed)
        self._spare: _Pinned | None = None
        #: install="swap": the tensors of the version before the current one
        self._retired: dict[str, torch.Tensor] | None = None
        #: bytes this rank sent in the sync that published the current version
        self.last_sent_bytes = 0
        #: the dense path's packed-segment buffers of the last sync (reused)
        self._segments: _Pinned | None = None

    def publish(
        self,
        weights: dict[str, torch.Tensor],
        pinned: _Pinned | None = None,
        version: int | None = None,
    ) -> int:
        """Install ``weights`` (and the messages that built them) as
        ``version`` (default: the next one); returns its number."""
        self._spare = self.pinned if pinned is not None else None
        if self.install == "swap":
            self._retired = self.weights
        self.weights, self.pinned = weights, pinned
        self.version = self.version + 1 if version is None else version
        return self.version

    def take_spare(self, plan: int) -> _Pinned | None:
        """The retired messages for a sync of the plan with fingerprint
        ``plan`` to reuse, handed out once (a failed sync may leave a wait
        posted on them, so they are not handed out again)."""
        spare, self._spare = self._spare, None
        return spare if spare is not None and spare.plan == plan else None

    def take_segments(self) -> _Pinned:
        """The dense path's packed-segment buffers of the last sync, handed
        out once (not after a failed sync, which may leave a wait posted)."""
        kept, self._segments = self._segments, None
        return kept if kept is not None else _Pinned({}, {})

    def take_retired(self) -> dict[str, torch.Tensor] | None:
        """install="swap": the retired version's tensors for a sync to stage
        into, handed out once (a failed sync may leave a receive posted into
        them, so they are not handed out again)."""
        retired, self._retired = self._retired, None
        return retired


@dataclass
class _Pinned:
    """The dense messages of one version, by message index: as this rank sent
    them and as it received them (a delta is taken against these)."""

    sent: dict[int, torch.Tensor]
    received: dict[int, torch.Tensor]
    #: the fingerprint of the plan whose messages these are
    plan: int = 0
    #: bytes this rank put on the wire in the sync that built them
    wire_bytes: int = 0


#: a delta entry: an int32 index and an int16 value
_DELTA_ENTRY_BYTES = 6


def _encode(buffer: torch.Tensor, old: torch.Tensor) -> tuple[int, torch.Tensor]:
    """``buffer`` as (entry count, changed 2-byte words) against ``old``, or
    (-1, buffer) where the delta would not be smaller. Words compare as
    bits, so -0.0, NaN payloads and every other change travel exactly."""
    new16, old16 = buffer.view(torch.int16), old.view(torch.int16)
    if buffer.numel() % 8 == 0:
        # Compare 8-byte words first (a quarter of the elements to scan and
        # compact), then the four 2-byte words of each changed one.
        words = (buffer.view(torch.int64) != old.view(torch.int64)).nonzero().flatten()
        if words.numel() * _DELTA_ENTRY_BYTES >= buffer.numel():
            return -1, buffer
        # The changed words' four 2-byte words, compared as a (words, 4)
        # block: no boolean-mask indexing, and the values gathered once.
        fresh = new16.view(-1, 4).index_select(0, words)
        at = (fresh != old16.view(-1, 4).index_select(0, words)).nonzero()
        changed = words[at[:, 0]] * 4 + at[:, 1]
        values = fresh[at[:, 0], at[:, 1]]
    else:
        changed = (new16 != old16).nonzero().flatten()
        values = new16[changed]
    if changed.numel() * _DELTA_ENTRY_BYTES >= buffer.numel():
        return -1, buffer
    indices = changed.to(torch.int32)
    payload = torch.cat([indices.view(torch.uint8), values.contiguous().view(torch.uint8)])
    return changed.numel(), payload


def _decode(
    payload: torch.Tensor, count: int, old: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The dense message: ``old`` with the ``count`` entries of ``payload``
    applied, written into ``out`` (a buffer of old's size) or a new tensor."""
    out = old.clone() if out is None else out.copy_(old)
    indices = payload[: 4 * count].view(torch.int32).long()
    out.view(torch.int16)[indices] = payload[4 * count :].view(torch.int16)
    return out


#: elements per fp8 block (along the last dimension of the destination
#: shard): each block is scaled by its own float32 scale
FP8_BLOCK = 128
#: the largest finite float8_e4m3fn
_FP8_MAX = 448.0
#: float8_e4m3fn's machine epsilon (3 mantissa bits): a value in the normal
#: range rounds to within FP8_EPS / 2 of itself, relatively
FP8_EPS = 2.0**-3


def fp8_bytes(numel: int, blocks: int | None = None) -> int:
    """Wire bytes of ``numel`` elements as block-scaled fp8: one byte each
    and a float32 scale per block (``blocks``; default: one per
    `FP8_BLOCK` elements)."""
    return numel + 4 * (-(-numel // FP8_BLOCK) if blocks is None else blocks)


@dataclass(frozen=True)
class _Blocks:
    """Where a quantised piece lies in its destination's blocks: ``lead``,
    its first column's place in its block (its destination column mod
    `FP8_BLOCK`), and ``shared``: the blocks it shares with other pieces
    (other source ranks, or other pieces of this one), whose scale is the
    agreed maximum, as (block column j, first and last piece column, offset
    of the block's table in the agreed vector, the destination shard's
    leading shape, the piece's rows in it)."""

    lead: int
    shared: tuple[tuple[int, int, int, int, tuple[int, ...], tuple[slice, ...]], ...] = ()


def _split(sizes: Sequence[int]) -> tuple[int, int]:
    """(rows, columns) of a box: blocks run along its last dimension."""
    width = sizes[-1] if sizes else 1
    rows = 1
    for s in sizes[:-1]:
        rows *= s
    return rows, width


def _table(agreed: torch.Tensor, at: int, lead: tuple[int, ...]) -> torch.Tensor:
    """The agreed maxima of one shared block column, one per row of the
    destination shard (of leading shape ``lead``), as a view of ``agreed``."""
    return agreed[at : at + _split((*lead, 1))[0]].view(lead)


def _block_count(sizes: Sequence[int], lead: int) -> int:
    rows, width = _split(sizes)
    return rows * -(-(lead + width) // FP8_BLOCK)


def _quantise(
    x: torch.Tensor,
    out: torch.Tensor,
    lead: int = 0,
    agreed: Sequence[tuple[int, torch.Tensor]] = (),
) -> bool:
    """Write ``x`` into the uint8 ``out`` as block-scaled fp8. Blocks run
    along the last dimension of the destination shard: `FP8_BLOCK` columns
    of one row, the piece's first column being column ``lead`` of its
    first block. ``out`` holds the blocks' float32 scales (amax / 448, so
    that the largest element of a block maps to fp8's largest finite
    value; 1 for an all-zero block; ``agreed``: (block column, amax per
    row) of the blocks shared with other pieces), then one float8_e4m3fn
    per element (x / scale, rounded to nearest even). Returns False if
    ``x`` holds a NaN or an infinity, which fp8 cannot carry."""
    rows, width = _split(tuple(x.shape))
    nb = -(-(lead + width) // FP8_BLOCK)
    padded = torch.zeros(rows, nb * FP8_BLOCK, dtype=torch.float32)
    padded[:, lead : lead + width] = x.reshape(rows, width)
    blocks = padded.view(rows, nb, FP8_BLOCK)
    amax = blocks.abs().amax(dim=2)
    finite = bool(torch.isfinite(amax).all())
    for j, shared in agreed:
        amax[:, j] = shared
    scale = amax / _FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (blocks / scale[:, :, None]).to(torch.float8_e4m3fn).view(rows, nb * FP8_BLOCK)
    out[: 4 * rows * nb].view(torch.float32).copy_(scale.view(-1))
    values = out[4 * rows * nb : 4 * rows * nb + rows * width].view(torch.float8_e4m3fn)
    values.view(rows, width).copy_(q[:, lead : lead + width])
    return finite


def _dequantise(buffer: torch.Tensor, sizes: Sequence[int], lead: int = 0) -> torch.Tensor:
    """The float32 values a `_quantise`d piece of shape ``sizes`` stands for."""
    rows, width = _split(sizes)
    nb = -(-(lead + width) // FP8_BLOCK)
    scale = buffer[: 4 * rows * nb].view(torch.float32).view(rows, nb)
    values = torch.zeros(rows, nb * FP8_BLOCK, dtype=torch.float32)
    fp8 = buffer[4 * rows * nb : 4 * rows * nb + rows * width].view(torch.float8_e4m3fn)
    values[:, lead : lead + width] = fp8.view(rows, width).to(torch.float32)
    out = values.view(rows, nb, FP8_BLOCK) * scale[:, :, None]
    return out.view(rows, nb * FP8_BLOCK)[:, lead : lead + width].reshape(tuple(sizes))


def _digest(buffer: torch.Tensor) -> torch.Tensor:
    """The digest of a contiguous byte buffer: its CRC-32 and its length,
    two int64 (summable in the vote's int64 all-reduce).

    A checksum against corruption on the wire, not an authenticator:
    CRC-32 detects every error burst of up to 32 bits (so every flipped
    byte) and every pair of flipped bits in a message under 512 MiB (its
    Hamming distance is 3 up to 2^32 bits), and any other corruption but
    for a 2^-32 chance. Sums of words are cheaper but blind to changes that
    cancel (one bit set in one word, the same bit cleared in another): a
    corrupted version published as correct is the failure this check
    exists to prevent, so it keeps CRC-32. One pass over the bytes, and
    zlib releases the GIL while it runs."""
    data = buffer.detach().numpy()
    return torch.tensor([zlib.crc32(data), data.nbytes], dtype=torch.int64)


def _call(post, what: str):
    """``post()``, its backend failure (a peer already gone) as the named error."""
    try:
        return post()
    except Exception as e:  # noqa: BLE001 - any backend failure becomes the named error
        raise _backend_failure(e, what) from e


def _backend_failure(error: Exception, what: str) -> WeightSyncFailed:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if "timed out" in text.lower() or "timeout" in text.lower():
        return WeightSyncTimeout(f"weight sync: {what} missed the sync's deadline ({text})")
    return WeightSyncPeerLost(f"weight sync failed while {what} (a peer may have exited): {text}")


def _all_reduce(tensor: torch.Tensor, op: Any, group: Any, end: float, what: str) -> None:
    """An all-reduce on the process group ``group`` under the sync's deadline:
    the deadline is the backend's own timeout too (not the group's default)."""
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    opts.timeout = timedelta(seconds=max(end - time.monotonic(), 0.001))
    work = _call(lambda: group.allreduce([tensor], opts), what)
    _wait(work, end, what)


def _post(ops: list, what: str) -> list:
    """Post a batch of point-to-point ops; a backend failure is the named error."""
    return _call(lambda: dist.batch_isend_irecv(ops), what) if ops else []


def _wait(work: dist.Work, end: float, what: str) -> None:
    """Wait for ``work`` until the sync's deadline ``end`` (time.monotonic)."""
    left = end - time.monotonic()
    if left <= 0:
        # A rank that stalled past the deadline may find the work done (the
        # backend's thread finished it): then it counts, or this rank would
        # miss a vote every other rank saw succeed.
        if not work.is_completed():
            raise WeightSyncTimeout(f"weight sync: {what} missed the sync's deadline")
        left = 0.001
    try:
        completed = work.wait(timedelta(seconds=left))
    except Exception as e:  # noqa: BLE001 - any backend failure becomes the named error
        if time.monotonic() >= end - 0.05:
            raise WeightSyncTimeout(f"weight sync: {what} missed the sync's deadline") from e
        raise _backend_failure(e, what) from e
    if completed is False:
        raise WeightSyncTimeout(f"weight sync: {what} missed the sync's deadline")


def _fp8_piece_bytes(t: Transfer) -> int:
    lead = t.dst_offsets[-1] % FP8_BLOCK if t.dst_offsets else 0
    return fp8_bytes(t.numel, _block_count(t.box.sizes, lead))


def plan_weight_sync(
    source: Mapping[str, TensorLayout],
    dest: Mapping[str, TensorLayout],
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    wire: torch.dtype | None = None,
) -> WeightSyncPlan:
    """Plan the move of every named tensor from its ``source`` layout to its ``dest`` layout.

    Args:
        source: per tensor name, the trainer side's declaration.
        dest: per tensor name, the inference side's declaration (same names,
            same global shapes; the dtype may differ: the receiver casts).
        bucket_bytes: the most bytes one bucket carries (a larger piece
            travels alone).
        wire: None (every tensor travels in its source dtype) or
            ``torch.float8_e4m3fn``: floating tensors travel as fp8 in the
            destination's blocks (`FP8_BLOCK` consecutive elements along the
            last dimension of each destination shard, a row's last block
            shorter), each block with one float32 scale (its absolute
            maximum / 448, where pieces from several source ranks share a
            block, the maximum over all of them, agreed in one all-reduce
            before quantising), and are decoded by the receiver into its
            declared dtype; partial addends are summed on a source rank
            first (in full precision, a pre-stage), so that a block is
            quantised once, from the sum.
            Each element x of a block with scale s arrives within
            ``FP8_EPS / 2 * |x| + 2**-10 * s`` of x (fp8 rounding: half an
            ulp in the normal range, half the subnormal spacing below it),
            plus the rounding of the destination dtype. Integer tensors,
            and local copies, travel exactly. A NaN or infinity in a
            quantised tensor is refused (`WeightSyncRefused`) on every rank.

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
    if wire not in (None, torch.float8_e4m3fn):
        raise WeightSyncSpecError(
            f"weight sync: wire format {wire} is not supported (supported: None, the "
            "tensors' own dtypes; torch.float8_e4m3fn, block-scaled)"
        )
    transfers: dict[str, tuple[Transfer, ...]] = {}
    remote: list[tuple[str, Transfer, int, int]] = []
    local: list[tuple[str, Transfer]] = []
    reductions: list[Reduction] = []
    local_reduced: list[tuple[str, Transfer, int]] = []
    for name in source:
        ts = tuple(_tensor_transfers(name, source[name], dest[name]))
        transfers[name] = ts
        quantised = wire is not None and source[name].dtype.is_floating_point
        if quantised and source[name].partial:
            # Sum the addends of each destination box on its first source
            # rank before quantising: a block is quantised once, from the sum.
            boxes: dict[tuple[int, Box], list[Transfer]] = {}
            for t in ts:
                boxes.setdefault((t.dst_rank, t.box), []).append(t)
            for (dst_rank, box), addends in boxes.items():
                slot = len(reductions)
                reducer = addends[0].src_rank
                reductions.append(Reduction(name, reducer, dst_rank, tuple(addends)))
                zero = (0,) * len(box.sizes)
                t = Transfer(reducer, dst_rank, box, zero, addends[0].dst_offsets)
                if t.is_local:
                    local_reduced.append((name, t, slot))
                else:
                    remote.append((name, t, _fp8_piece_bytes(t), slot))
            continue
        itemsize = source[name].dtype.itemsize
        for t in ts:
            if t.is_local:
                local.append((name, t))
            else:
                nbytes = _fp8_piece_bytes(t) if quantised else t.numel * itemsize
                remote.append((name, t, nbytes, -1))
    return WeightSyncPlan(
        source=dict(source),
        dest={name: dest[name] for name in source},
        transfers=transfers,
        buckets=tuple(_buckets(remote, bucket_bytes)),
        local=tuple(local),
        bucket_bytes=bucket_bytes,
        wire=wire,
        reductions=tuple(reductions),
        local_reduced=tuple(local_reduced),
    )
