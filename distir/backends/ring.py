"""All-reduce algorithms built from point-to-point messages.

gloo's native all-reduce only knows sum, prod, min, max and the bitwise kinds;
a generic all-reduce (a combine region) and the ciphertext sum need their own
algorithms. Four implementations live here, each selected by name (the op's
`algorithm` property, `compile(..., implementations=...)`) or, for the
ciphertext op, by priority:

* `ring` (commutative elementwise combines, and native kinds): reduce-scatter
  then all-gather around the ring of ranks, P-1 steps each. Every chunk is cut
  into segments that are sent as soon as they are combined, so combining one
  segment overlaps the transfer of the next. The result is built in a reused
  buffer, the first send goes straight from the input, nothing is copied.
* `halving-doubling` (elementwise combines, rank order kept): reduce-scatter by
  recursive halving and all-gather by recursive doubling (Rabenseifner). Each
  round combines the blocks of two adjacent rank ranges, lower range on the
  left, so the fold order is the rank order; a group size that is not a power
  of two first folds neighbouring pairs (2i, 2i+1).
* `recursive-doubling` (any combine, rank order kept): whole tensors are
  exchanged and combined log2(P) times; the only choice for a combine that is
  not elementwise, which cannot be cut into chunks.
* `ciphertext-auto` (`dist.all_reduce_add_ciphertext`, chosen by default):
  the ring with lazy modular reduction: limbs are added without reducing
  while the headroom P·(q_max−1) ≤ 2^63−1 lasts and the owned 1/P chunk is
  reduced once before the all-gather; with less headroom a segment is reduced
  only before it would overflow, which for q_max near 2^62 is a modular ring.

"Elementwise" means the combine region computes every output element from the
same element of its operands: arith ops on tensors of the op's shape, splat
constants, `tensor.splat`. Such a region is evaluated on flat chunks by
`RegionCombine`; two region shapes are recognised and run in place instead:
one native-like op (`arith.addi %lhs, %rhs`, ...) and the modular addition that
`lower-ciphertext-add` produces.

Memory: the ring and halving-doubling keep two receive buffers of one chunk
(ring) or one half (halving-doubling), O(N); a non-power-of-two group adds one
N-element buffer on the ranks that fold a pair. Results come from
`ResultBuffers`, which reuses a result tensor once no tensor anywhere shares
its storage, because a fresh 64 MiB CPU allocation costs about as much as the
transfer (page faults). Every rank must call with the same shape and dtype,
as for any collective.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from xdsl.dialects import arith, tensor
from xdsl.dialects.builtin import (
    DenseIntOrFPElementsAttr,
    IndexType,
    IntegerAttr,
    TensorType,
    i64,
)
from xdsl.ir import Block, Operation, SSAValue

from distir.backends.buffers import ResultBuffers
from distir.backends.groups import (
    ciphertext_descriptor,
    explain_ciphertexts,
    explain_layouts,
    tensor_descriptor,
)
from distir.backends.registry import Implementation, Invocation
from distir.errors import DeadlineExceeded, OpError
from distir.interpreters.checks import INT64_MAX, check_ciphertext
from distir.interpreters.kernels import LOCAL_KERNELS, constant_tensor
from distir.ir.dialect import AllReduceAddCiphertextOp, AllReduceOp, YieldOp
from distir.ir.elementwise import ELEMENTWISE_OPS

__all__ = [
    "CiphertextAllReduceImplementation",
    "HalvingDoublingAllReduceImplementation",
    "RecursiveDoublingAllReduceImplementation",
    "ResultBuffers",
    "RingAllReduceImplementation",
    "ring_contributions",
]

#: Bytes per message segment; None picks one eighth of a chunk, clamped to
#: [MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES]: small enough that combining one
#: segment overlaps the transfer of the next, large enough that the
#: per-message costs (about 100 us of Python and gloo posting) stay small.
SEGMENT_BYTES: int | None = None
MIN_SEGMENT_BYTES = 1 << 20
MAX_SEGMENT_BYTES = 4 << 20

#: Issue CPU sends from a helper thread (see `_SendThread`).
THREADED_SENDS = True

#: Elements per compute tile of a multi-op combine (bounds its temporaries;
#: smaller tiles did not run faster on a 2 MiB L2, the Python overhead ate it).
TILE_ELEMENTS = 1 << 17


###############################################################################
# Result buffers and scratch
###############################################################################

class _Scratch(threading.local):
    """Per-thread scratch tensors, never handed out, reused across calls."""

    def __init__(self) -> None:
        self.tensors: dict[tuple, torch.Tensor] = {}

    def get(self, tag: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        key = (tag, dtype, device)
        t = self.tensors.get(key)
        if t is None or t.numel() < numel:
            t = torch.empty(numel, dtype=dtype, device=device)
            self.tensors[key] = t
        return t[:numel]


###############################################################################
# Layout helpers
###############################################################################


def split_even(n: int, parts: int) -> list[int]:
    """Offsets of `parts` contiguous chunks of `n` elements whose sizes differ
    by at most one: chunk c is [offsets[c], offsets[c + 1])."""
    base, extra = divmod(n, parts)
    offsets = [0]
    for c in range(parts):
        offsets.append(offsets[-1] + base + (1 if c < extra else 0))
    return offsets


def segment_ranges(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(stop, a + size)) for a in range(start, stop, size)]


def _segment_elements(element_size: int, chunk_elements: int) -> int:
    if SEGMENT_BYTES is not None:
        return max(1, SEGMENT_BYTES // element_size)
    wanted = chunk_elements * element_size // 8
    return max(1, min(MAX_SEGMENT_BYTES, max(MIN_SEGMENT_BYTES, wanted)) // element_size)


###############################################################################
# Combines on flat element ranges
###############################################################################

# A bound combine writes lhs ⊕ rhs into dst for the flat elements
# [start, start + len(dst)); dst may be lhs or rhs.
BoundCombine = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], None]

# Single region ops computed in place with `out=`, with the torch function the
# region's own kernel uses (distir.interpreters.kernels), so results are equal.
IN_PLACE_OPS: dict[type[Operation], Callable[..., torch.Tensor]] = {
    arith.AddiOp: torch.add,
    arith.AddfOp: torch.add,
    arith.MuliOp: torch.mul,
    arith.MulfOp: torch.mul,
    arith.MaxSIOp: torch.maximum,
    arith.MinSIOp: torch.minimum,
    arith.MaximumfOp: torch.maximum,
    arith.MinimumfOp: torch.minimum,
    arith.MaxnumfOp: torch.fmax,
    arith.MinnumfOp: torch.fmin,
    arith.AndIOp: torch.bitwise_and,
    arith.OrIOp: torch.bitwise_or,
    arith.XOrIOp: torch.bitwise_xor,
}

# Native kinds, with the functions of the reference simulator's folds.
NATIVE_FOLDS: dict[str, Callable[..., torch.Tensor]] = {
    "sum": torch.add,
    "prod": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}



class FunctionCombine:
    """`fn(lhs, rhs, out=dst)`, or `fn(rhs, lhs, ...)` when the region
    writes the operands the other way round."""

    def __init__(self, fn: Callable[..., torch.Tensor], swapped: bool = False):
        self.fn = fn
        self.swapped = swapped

    def bind(self, extras: Sequence[torch.Tensor], like: torch.Tensor) -> BoundCombine:
        fn, swapped = self.fn, self.swapped

        def combine(dst, lhs, rhs, start):
            if swapped:
                fn(rhs, lhs, out=dst)
            else:
                fn(lhs, rhs, out=dst)

        return combine


def _conditional_subtract(v: torch.Tensor, m: torch.Tensor, tmp: torch.Tensor) -> None:
    """v = v - m where v >= m, in place, without a comparison mask: the
    arithmetic shift of v - m is all ones exactly where v < m (as in
    `lower-ciphertext-add`'s region and TorchRNSBackend)."""
    v.sub_(m)
    torch.bitwise_right_shift(v, 63, out=tmp)
    tmp.bitwise_and_(m)
    v.add_(tmp)


class ModuliPieces:
    """The modulus of every element of a flattened `[..., L, N]` tensor.

    Either per row (every row of N elements shares one modulus: the moduli
    of `dist.all_reduce_add_ciphertext`, or a broadcast extra whose last
    stride is 0), or per element (any other extra, made contiguous once).
    `pieces(a, b)` cuts the flat range [a, b) into views that broadcast
    against their moduli: partial rows with a 0-d modulus, whole rows as an
    [rows, N] block with an [rows, 1] column.
    """

    def __init__(self, rows: torch.Tensor | None, row_length: int, flat: torch.Tensor | None):
        self.rows = rows
        self.row_length = row_length
        self.flat = flat
        self.shifted: dict[int, torch.Tensor] = {}

    @classmethod
    def per_row(cls, moduli: torch.Tensor, shape: Sequence[int]) -> ModuliPieces:
        n_rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
        limbs = moduli.numel()
        rows = moduli.reshape(-1).repeat(n_rows // limbs if limbs else 0)
        return cls(rows.contiguous(), shape[-1] if shape else 1, None)

    @classmethod
    def from_extra(cls, extra: torch.Tensor) -> ModuliPieces:
        if extra.dim() >= 1 and (extra.shape[-1] <= 1 or extra.stride(-1) == 0):
            rows = extra[..., 0].reshape(-1).contiguous()
            return cls(rows, extra.shape[-1], None)
        return cls(None, 1, extra.contiguous().reshape(-1))

    def scaled(self, shift: int) -> ModuliPieces:
        """The same layout with every modulus multiplied by 2^shift."""
        if shift == 0:
            return self
        found = self.shifted.get(shift)
        if found is None:
            rows = None if self.rows is None else self.rows << shift
            flat = None if self.flat is None else self.flat << shift
            found = self.shifted[shift] = ModuliPieces(rows, self.row_length, flat)
        return found

    def pieces(self, view: torch.Tensor, a: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(data view, moduli) pairs covering `view`, the flat elements
        [a, a + len(view))."""
        b = a + view.numel()
        if self.flat is not None:
            return [(view, self.flat[a:b])]
        n, rows = self.row_length, self.rows
        assert rows is not None
        out: list[tuple[torch.Tensor, torch.Tensor]] = []
        pos = a
        first_full = -(-a // n) * n
        if first_full > a:  # a partial first row
            end = min(b, first_full)
            out.append((view[pos - a : end - a], rows[a // n]))
            pos = end
        last_full = (b // n) * n
        if last_full > pos:
            block = view[pos - a : last_full - a].view(-1, n)
            out.append((block, rows[pos // n : last_full // n].view(-1, 1)))
            pos = last_full
        if b > pos:
            out.append((view[pos - a : b - a], rows[pos // n]))
        return out


_SCRATCH = _Scratch()


def _reduce_bounded(v: torch.Tensor, moduli: ModuliPieces, a: int, bound: int) -> None:
    """Reduce v (flat elements [a, ...)), whose values lie in
    [0, bound·(q−1)], to [0, q) in place: conditional subtractions of
    2q then q (bounds up to 4, `_subtract_if_at_least`), else one
    `torch.remainder`."""
    if bound <= 1:
        return
    rounds = (bound - 1).bit_length()
    for piece, q in moduli.pieces(v, a):
        if rounds > 2:
            torch.remainder(piece, q, out=piece)
            continue
        tmp = _SCRATCH.get("mask", piece.numel(), piece.dtype, piece.device).view(piece.shape)
        for k in reversed(range(rounds)):
            _subtract_if_at_least(piece, q << k if k else q, tmp)


def _subtract_if_at_least(v: torch.Tensor, m: torch.Tensor, tmp: torch.Tensor) -> None:
    """v = v − m where v ≥ m, for 0 ≤ v < 2m (m < 2^63), in three passes:
    v − m is negative exactly when v < m, and masking its sign bit off then
    makes it 2^63 + v − m > v, so the minimum picks v; otherwise v − m ≤ v
    is picked. (Subtract-and-mask, the region's form, needs four.)"""
    torch.sub(v, m, out=tmp)
    tmp.bitwise_and_(INT64_MAX)
    torch.minimum(v, tmp, out=v)


class ModularAddCombine:
    """`(lhs + rhs) mod q` for reduced operands: the region of
    `lower-ciphertext-add`, run in place and tile by tile. Bit-exact with
    the region on every int64 input, since it performs the same operations."""

    def bind(self, extras: Sequence[torch.Tensor], like: torch.Tensor) -> BoundCombine:
        moduli = ModuliPieces.from_extra(extras[0])
        tile = TILE_ELEMENTS

        def combine(dst, lhs, rhs, start):
            for a in range(0, dst.numel(), tile):
                b = min(dst.numel(), a + tile)
                d = dst[a:b]
                torch.add(lhs[a:b], rhs[a:b], out=d)
                for piece, q in moduli.pieces(d, start + a):
                    tmp = _SCRATCH.get("mask", piece.numel(), piece.dtype, piece.device)
                    _conditional_subtract(piece, q, tmp.view(piece.shape))

        return combine


class LazyModularAdd:
    """Adds limbs and reduces them only when told, on cache-sized tiles."""

    def __init__(self, moduli: ModuliPieces):
        self.moduli = moduli

    def step_combine(self, reduce_bound: int) -> BoundCombine:
        moduli = self.moduli

        def combine(dst, lhs, rhs, start):
            if reduce_bound <= 1:
                torch.add(lhs, rhs, out=dst)
                return
            for a in range(0, dst.numel(), TILE_ELEMENTS):
                b = min(dst.numel(), a + TILE_ELEMENTS)
                d = dst[a:b]
                torch.add(lhs[a:b], rhs[a:b], out=d)
                _reduce_bounded(d, moduli, start + a, reduce_bound)

        return combine


class RegionCombine:
    """An elementwise combine region evaluated on flat ranges.

    Built once per op from its IR: each op becomes the kernel the region
    compiler would use (distir.interpreters.kernels), splat constants become
    0-d tensors that broadcast, other constants and the extra operands are
    sliced like the operands. Values live in slots: the block arguments, the
    sliced constants, the 0-d constants, then one per op. Each tile's result
    is copied into place.
    """

    def __init__(self, block: Block):
        n_args = len(block.args)
        slots: dict[SSAValue, int] = {arg: i for i, arg in enumerate(block.args)}
        sliced: list[torch.Tensor] = []
        fixed: list[torch.Tensor] = []
        pending: list[tuple[Operation, Callable]] = []
        result: SSAValue | None = None
        for op in block.ops:
            if isinstance(op, YieldOp):
                result = op.arguments[0]
                break
            if isinstance(op, tensor.DimOp) or _is_index_constant(op):
                continue  # only sizes a tensor.splat, which broadcasts instead
            if isinstance(op, arith.ConstantOp):
                value = constant_tensor(op.value, op.result.type)
                if _is_splat(op) or value.dim() == 0:
                    fixed.append(value.reshape(-1)[0].clone())
                    slots[op.result] = -len(fixed)  # renumbered below
                else:
                    sliced.append(value.contiguous().reshape(-1))
                    slots[op.result] = n_args + len(sliced) - 1
                continue
            if isinstance(op, tensor.SplatOp):
                pending.append((op, lambda v, *sizes: (v,)))
            else:
                pending.append((op, LOCAL_KERNELS[type(op)](op)))
        assert result is not None, "an elementwise region ends in dist.yield"
        first_fixed = n_args + len(sliced)
        for value, slot in list(slots.items()):
            if slot < 0:
                slots[value] = first_fixed - 1 - slot
        next_slot = first_fixed + len(fixed)
        self.steps: list[tuple[Callable, tuple[int, ...], int]] = []
        for op, kernel in pending:
            operands = op.operands[:1] if isinstance(op, tensor.SplatOp) else op.operands
            self.steps.append((kernel, tuple(slots[v] for v in operands), next_slot))
            slots[op.results[0]] = next_slot
            next_slot += 1
        self.n_args = n_args
        self.sliced = sliced
        self.fixed = fixed
        self.n_slots = next_slot
        self.result = slots[result]

    def bind(self, extras: Sequence[torch.Tensor], like: torch.Tensor) -> BoundCombine:
        # Extras have the op's shape; slice them like the operands.
        flat = [e.contiguous().reshape(-1) for e in extras] + self.sliced
        steps, result, fixed = self.steps, self.result, self.fixed
        first_fixed = self.n_args + len(self.sliced)
        n_slots = self.n_slots

        def combine(dst, lhs, rhs, start):
            for a in range(0, dst.numel(), TILE_ELEMENTS):
                b = min(dst.numel(), a + TILE_ELEMENTS)
                env: list[Any] = [lhs[a:b], rhs[a:b]]
                env += [f[start + a : start + b] for f in flat]
                env += fixed
                env += [None] * (n_slots - first_fixed - len(fixed))
                for kernel, operands, slot in steps:
                    env[slot] = kernel(*[env[i] for i in operands])[0]
                dst[a:b].copy_(env[result])

        return combine


def _is_splat(op: arith.ConstantOp) -> bool:
    value = op.value
    return isinstance(value, DenseIntOrFPElementsAttr) and value.is_splat()


def _is_index_constant(op: Operation) -> bool:
    return isinstance(op, arith.ConstantOp) and isinstance(op.result.type, IndexType)


def _is_constant(value: SSAValue, number: int) -> bool:
    owner = value.owner
    if isinstance(owner, tensor.SplatOp):
        owner = owner.operands[0].owner
    if not isinstance(owner, arith.ConstantOp):
        return False
    attr = owner.value
    if isinstance(attr, IntegerAttr):
        return attr.value.data == number
    return (
        isinstance(attr, DenseIntOrFPElementsAttr)
        and attr.is_splat()
        and attr.get_values()[0] == number
    )


def _operands_are(op: Operation, a: SSAValue, b: SSAValue) -> bool:
    return tuple(op.operands) in ((a, b), (b, a))


def _owner(value: SSAValue, op_type: type[Operation]) -> Operation | None:
    owner = value.owner
    return owner if isinstance(owner, op_type) else None


def is_modular_add_region(block: Block) -> bool:
    """Whether the block is `lower-ciphertext-add`'s combine on i64: sum =
    lhs + rhs; d = sum − q; (d + ((d >> 63) & q)), with q the first extra."""
    if len(block.args) != 3 or not isinstance(block.last_op, YieldOp):
        return False
    t = block.args[0].type
    if not isinstance(t, TensorType) or t.element_type != i64:
        return False
    lhs, rhs, q = block.args
    if len(block.last_op.arguments) != 1:
        return False
    final = _owner(block.last_op.arguments[0], arith.AddiOp)
    if final is None:
        return False
    for d, masked in (tuple(final.operands), tuple(reversed(final.operands))):
        sub = _owner(d, arith.SubiOp)
        mask = _owner(masked, arith.AndIOp)
        if sub is None or mask is None or tuple(sub.operands)[1] is not q:
            continue
        total = _owner(sub.operands[0], arith.AddiOp)
        if total is None or not _operands_are(total, lhs, rhs):
            continue
        for shifted, other in (tuple(mask.operands), tuple(reversed(mask.operands))):
            shift = _owner(shifted, arith.ShRSIOp)
            if (
                other is q
                and shift is not None
                and shift.operands[0] is d
                and _is_constant(shift.operands[1], 63)
            ):
                return True
    return False


def single_op_combine(block: Block) -> FunctionCombine | None:
    """The in-place form of a region that is one recognised op on (lhs, rhs)."""
    ops = list(block.ops)
    if len(ops) != 2 or len(block.args) < 2 or not isinstance(ops[1], YieldOp):
        return None
    op, terminator = ops
    fn = IN_PLACE_OPS.get(type(op))
    if fn is None or list(terminator.arguments) != [op.results[0]]:
        return None
    lhs, rhs = block.args[0], block.args[1]
    if tuple(op.operands) == (lhs, rhs):
        return FunctionCombine(fn)
    if tuple(op.operands) == (rhs, lhs):
        return FunctionCombine(fn, swapped=True)
    return None


def is_elementwise_region(block: Block) -> bool:
    """Whether every output element depends only on the same element of the
    operands (see the module docstring); the extras must have the op's shape."""
    shape = _shape_of(block.args[0].type) if block.args else None
    if shape is None or any(_shape_of(arg.type) != shape for arg in block.args[2:]):
        return False
    for op in block.ops:
        if isinstance(op, YieldOp):
            return len(op.arguments) == 1
        if isinstance(op, tensor.DimOp) or _is_index_constant(op):
            if not _only_sizes(op.results[0]):
                return False
        elif isinstance(op, arith.ConstantOp):
            t = op.result.type
            if isinstance(t, TensorType):
                if _shape_of(t) != shape and not _is_splat(op):
                    return False
            elif not all(
                isinstance(u.operation, tensor.SplatOp) and u.index == 0 for u in op.result.uses
            ):
                return False
        elif isinstance(op, tensor.SplatOp):
            if _shape_of(op.results[0].type) != shape:
                return False
        elif not isinstance(op, ELEMENTWISE_OPS) or any(
            _shape_of(v.type) != shape for v in (*op.operands, *op.results)
        ):
            return False
    return False


def _only_sizes(value: SSAValue) -> bool:
    """Used only to size a `tensor.splat` (directly or through `tensor.dim`)."""
    return all(
        (isinstance(u.operation, tensor.SplatOp) and u.index >= 1)
        or (isinstance(u.operation, tensor.DimOp) and u.index == 1)
        for u in value.uses
    )


def _shape_of(t: Any) -> tuple[int, ...] | None:
    return tuple(t.get_shape()) if isinstance(t, TensorType) else None


###############################################################################
# Point-to-point plumbing
###############################################################################


class _SendThread:
    """Posts gloo sends from a helper thread.

    gloo writes a message to its socket inside `isend`, in the calling
    thread, until the socket buffer is full; on loopback that write also does
    the receiver's TCP work. Posted from the rank's own thread it would
    serialise with the combine; from here it overlaps it (c10d calls and
    torch kernels release the GIL). One thread and one queue keep the
    messages in order; the rank's thread completes the returned works.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="distir-ring-send", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            t, peer, group, posted = self._queue.get()
            if t is None:  # a fence: everything before it is posted
                posted.set()
                continue
            try:
                posted.append(dist.isend(t, dst=peer, group=group))
            except BaseException as e:  # reported by the rank's thread
                posted.append(e)

    def send(self, t: torch.Tensor, peer: int, group: Any, posted: list) -> None:
        self._queue.put((t, peer, group, posted))

    def fence(self) -> threading.Event:
        done = threading.Event()
        self._queue.put((None, None, None, done))
        return done


_send_thread: _SendThread | None = None
_send_thread_lock = threading.Lock()


def _shared_send_thread() -> _SendThread:
    global _send_thread
    with _send_thread_lock:
        if _send_thread is None:
            _send_thread = _SendThread()
        return _send_thread


class _Exchange:
    """The messages of one execution: every wait goes through the group's
    deadline (`resources.complete`). CPU sends are posted by the shared send
    thread when `THREADED_SENDS` is set."""

    def __init__(self, resources: Any, invocation: Invocation):
        self.resources = resources
        self.invocation = invocation
        self.group = resources.group
        self.sends: list[Any] = []
        self.threaded: list[Any] | None = None

    def send(self, t: torch.Tensor, peer: int) -> None:
        if not t.numel():
            return
        if THREADED_SENDS and t.device.type == "cpu":
            if self.threaded is None:
                self.threaded = []
            _shared_send_thread().send(t, peer, self.group, self.threaded)
        else:
            self.sends.append(dist.isend(t, dst=peer, group=self.group))

    def recv(self, t: torch.Tensor, peer: int) -> Any:
        return dist.irecv(t, src=peer, group=self.group) if t.numel() else None

    def wait(self, work: Any) -> None:
        if work is not None:
            self.resources.complete(work, self.invocation)

    def finish(self) -> None:
        if self.threaded is not None:
            deadline = self.invocation.options.get("deadline_s") or self.resources.deadline_s
            if not _shared_send_thread().fence().wait(timeout=deadline):
                raise DeadlineExceeded(
                    self.invocation.description,
                    f"sends were not posted within the {deadline:g} s deadline",
                )
            self.sends += self.threaded
            self.threaded = None
        sends, self.sends = self.sends, []
        for work in sends:
            if isinstance(work, BaseException):
                raise work
            self.wait(work)


###############################################################################
# Algorithms on flat tensors
###############################################################################

# combine_for_step(s) -> the bound combine used at reduce-scatter step s.
StepCombines = Callable[[int], BoundCombine]


def ring_all_reduce(
    x: torch.Tensor,
    out: torch.Tensor,
    combine_for_step: StepCombines,
    resources: Any,
    invocation: Invocation,
) -> None:
    """out = reduction of every rank's flat `x`: ring reduce-scatter, then
    ring all-gather, segment by segment (combine order: local ⊕ received)."""
    size, rank = resources.size, resources.rank
    n = x.numel()
    offsets = split_even(n, size)
    seg = _segment_elements(x.element_size(), offsets[1])
    nxt = resources.global_rank((rank + 1) % size)
    prv = resources.global_rank((rank - 1) % size)
    widest = max(offsets[c + 1] - offsets[c] for c in range(size))
    buffers = (
        _SCRATCH.get("ring0", widest, x.dtype, x.device),
        _SCRATCH.get("ring1", widest, x.dtype, x.device),
    )
    ex = _Exchange(resources, invocation)

    def segments(c: int) -> list[tuple[int, int]]:
        return segment_ranges(offsets[c], offsets[c + 1], seg)

    def post_combine_recvs(c: int, buf: torch.Tensor) -> list:
        base = offsets[c]
        return [(ex.recv(buf[a - base : b - base], prv), a, b, buf[a - base : b - base])
                for a, b in segments(c)]  # fmt: skip

    def post_gather_recvs(c: int) -> list:
        return [(ex.recv(out[a:b], prv), a, b) for a, b in segments(c)]

    for a, b in segments(rank):
        ex.send(x[a:b], nxt)
    pending = post_combine_recvs((rank - 1) % size, buffers[0])
    gathering: list = []
    for step in range(size - 1):
        if step + 1 < size - 1:
            upcoming = post_combine_recvs((rank - step - 2) % size, buffers[(step + 1) % 2])
        else:
            upcoming = []
            gathering = post_gather_recvs(rank)  # never written before the all-gather
        combine = combine_for_step(step)
        for work, a, b, received in pending:
            ex.wait(work)
            combine(out[a:b], x[a:b], received, a)
            ex.send(out[a:b], nxt)
        pending = upcoming
    for step in range(size - 1):
        last = step + 1 == size - 1
        upcoming = [] if last else post_gather_recvs((rank - step - 1) % size)
        for work, a, b in gathering:
            ex.wait(work)
            if not last:
                ex.send(out[a:b], nxt)
        gathering = upcoming
    ex.finish()


def _virtual_layout(size: int, rank: int) -> tuple[int, int, int | None]:
    """(p2, virtual rank or -1, partner for the pair fold) for a group of
    `size`: the largest power of two p2 <= size; ranks 2i and 2i+1 for
    i < size − p2 fold into virtual rank i, the rest shift down."""
    p2 = 1 << (size.bit_length() - 1)
    extra = size - p2
    if rank < 2 * extra:
        return p2, (rank // 2 if rank % 2 == 0 else -1), (rank + 1 if rank % 2 == 0 else rank - 1)
    return p2, rank - extra, None


def _real_rank(virtual: int, size: int, p2: int) -> int:
    extra = size - p2
    return 2 * virtual if virtual < extra else virtual + extra


def halving_doubling_all_reduce(
    x: torch.Tensor,
    out: torch.Tensor,
    combine: BoundCombine,
    resources: Any,
    invocation: Invocation,
) -> None:
    """out = x_0 ⊕ … ⊕ x_{P−1} in rank order: recursive halving with
    distance doubling (each round combines two adjacent rank ranges), then
    recursive doubling of the pieces back; pairs fold first when P is not a
    power of two."""
    size, rank = resources.size, resources.rank
    n = x.numel()
    seg = _segment_elements(x.element_size(), n // 2)
    p2, virtual, pair = _virtual_layout(size, rank)
    ex = _Exchange(resources, invocation)
    if pair is not None:
        peer = resources.global_rank(pair)
        if virtual < 0:  # the upper rank of a pair: contribute, then receive
            for a in range(0, n, seg):
                ex.send(x[a : a + seg], peer)
            ex.finish()
            ex.wait(ex.recv(out, peer))
            return
        received = _SCRATCH.get("pair", n, x.dtype, x.device)
        _segmented_exchange(ex, None, peer, received, peer, 0, n, seg, out, x, combine, False)
        own = out
    else:
        own = x

    lo, hi, distance = 0, n, 1
    given: list[tuple[int, int, int]] = []
    buffer = _SCRATCH.get("halve", n - n // 2, x.dtype, x.device)
    while distance < p2:
        partner_v = virtual ^ distance
        partner = resources.global_rank(_real_rank(partner_v, size, p2))
        mid = lo + (hi - lo) // 2
        if virtual & distance:
            keep, give = (mid, hi), (lo, mid)
        else:
            keep, give = (lo, mid), (mid, hi)
        upper = virtual > partner_v  # the partner's ranks come first
        _segmented_exchange(
            ex, own[give[0] : give[1]], partner, buffer[: keep[1] - keep[0]], partner,
            keep[0], keep[1], seg, out, own, combine, upper,
        )  # fmt: skip
        ex.finish()
        own = out
        given.append((give[0], give[1], partner))
        lo, hi = keep
        distance <<= 1
    for give_lo, give_hi, partner in reversed(given):
        ex.send(out[lo:hi], partner)
        ex.wait(ex.recv(out[give_lo:give_hi], partner))
        ex.finish()
        lo, hi = min(lo, give_lo), max(hi, give_hi)
    if pair is not None:
        ex.send(out, resources.global_rank(pair))
        ex.finish()


def _segmented_exchange(
    ex: _Exchange,
    outgoing: torch.Tensor | None,
    send_peer: int,
    incoming: torch.Tensor,
    recv_peer: int,
    lo: int,
    hi: int,
    seg: int,
    out: torch.Tensor,
    own: torch.Tensor,
    combine: BoundCombine,
    received_first: bool,
) -> None:
    """Send `outgoing`, receive [lo, hi) into `incoming` segment by segment,
    and combine each segment into out[lo:hi] as soon as it arrives: own ⊕
    received, or received ⊕ own when `received_first`."""
    ranges = segment_ranges(lo, hi, seg)
    works = [ex.recv(incoming[a - lo : b - lo], recv_peer) for a, b in ranges]
    if outgoing is not None:
        for a in range(0, outgoing.numel(), seg):
            ex.send(outgoing[a : a + seg], send_peer)
    for work, (a, b) in zip(works, ranges):
        ex.wait(work)
        received = incoming[a - lo : b - lo]
        if received_first:
            combine(out[a:b], received, own[a:b], a)
        else:
            combine(out[a:b], own[a:b], received, a)


def recursive_doubling_all_reduce(
    x: torch.Tensor,
    combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    resources: Any,
    invocation: Invocation,
) -> torch.Tensor:
    """The rank-order reduction of whole tensors (shape kept): log2(P) rounds
    of exchanging the current value with the partner at distance 1, 2, 4, …
    and combining lower ⊕ upper; pairs fold first when P is not a power of
    two."""
    size, rank = resources.size, resources.rank
    p2, virtual, pair = _virtual_layout(size, rank)
    ex = _Exchange(resources, invocation)
    received = torch.empty_like(x)
    if pair is not None:
        peer = resources.global_rank(pair)
        if virtual < 0:
            ex.send(x, peer)
            ex.finish()
            ex.wait(ex.recv(received, peer))
            return received
        ex.wait(ex.recv(received, peer))
        current = _owned(combine(x, received), x, received)
    else:
        current = x
    distance = 1
    while distance < p2:
        partner_v = virtual ^ distance
        partner = resources.global_rank(_real_rank(partner_v, size, p2))
        ex.send(current, partner)
        ex.wait(ex.recv(received, partner))
        ex.finish()
        if virtual > partner_v:
            current = _owned(combine(received, current), x, received)
        else:
            current = _owned(combine(current, received), x, received)
        distance <<= 1
    if pair is not None:
        ex.send(current, resources.global_rank(pair))
        ex.finish()
    return current


def _owned(t: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
    """`t` contiguous and sharing no memory with `others` (a region may
    yield one of its operands, or a broadcast view)."""
    ptr = t.untyped_storage().data_ptr()
    if not t.is_contiguous() or any(ptr == o.untyped_storage().data_ptr() for o in others):
        return t.contiguous().clone() if t.is_contiguous() else t.contiguous()
    return t


###############################################################################
# Implementations
###############################################################################


class _FlatAllReduce(Implementation):
    """Shared plumbing: agree on the layout (when the runtime asks, e.g. for
    dynamic shapes), flatten, take a result buffer, handle P = 1 and N = 0,
    and build the combine for an op once."""

    operation_types = (AllReduceOp,)

    def __init__(self) -> None:
        self.results = ResultBuffers()
        self._combines: dict[int, tuple[Invocation, Any]] = {}

    def combine_for(self, invocation: Invocation) -> Any:
        entry = self._combines.get(id(invocation))
        if entry is None or entry[0] is not invocation:
            entry = (invocation, self.build_combine(invocation.op))
            self._combines[id(invocation)] = entry
        return entry[1]

    def build_combine(self, op: AllReduceOp) -> Any:
        if op.kind is not None:
            return FunctionCombine(NATIVE_FOLDS[op.kind.data])
        block = op.combine.block
        if is_modular_add_region(block):
            return ModularAddCombine()
        found = single_op_combine(block)
        return found if found is not None else RegionCombine(block)

    def elementwise(self, op: Operation) -> bool:
        if not isinstance(op, AllReduceOp):
            return False
        return op.kind is not None or is_elementwise_region(op.combine.block)

    def execute(self, invocation, inputs, resources, *, in_place):
        x, *extras = inputs
        resources.agree(invocation, lambda: tensor_descriptor(x), None, x.device, explain_layouts("input layouts"))
        flat = x.contiguous().reshape(-1)
        out = self.results.empty(flat.numel(), x.dtype, x.device)
        if resources.size == 1 or flat.numel() == 0:
            out.copy_(flat)
            return (out.view(x.shape),)
        combine = self.combine_for(invocation).bind(extras, x)
        self.run(flat, out, combine, resources, invocation)
        return (out.view(x.shape),)

    def run(self, flat, out, combine, resources, invocation) -> None:
        raise NotImplementedError


class RingAllReduceImplementation(_FlatAllReduce):
    """Ring reduce-scatter + all-gather for commutative elementwise combines
    and native kinds."""

    name = "ring"

    def matches(self, op) -> bool:
        return self.elementwise(op) and (op.kind is not None or op.commutative is not None)

    def run(self, flat, out, combine, resources, invocation) -> None:
        ring_all_reduce(flat, out, lambda step: combine, resources, invocation)


class HalvingDoublingAllReduceImplementation(_FlatAllReduce):
    """Recursive halving + doubling that keeps rank order, for elementwise
    combines (commutative or not) and native kinds."""

    name = "halving-doubling"

    def matches(self, op) -> bool:
        return self.elementwise(op)

    def run(self, flat, out, combine, resources, invocation) -> None:
        halving_doubling_all_reduce(flat, out, combine, resources, invocation)


class RecursiveDoublingAllReduceImplementation(Implementation):
    """Whole-tensor recursive doubling that keeps rank order: the algorithm
    for combines that are not elementwise (O(N) memory, N·log2(P) traffic)."""

    name = "recursive-doubling"
    operation_types = (AllReduceOp,)

    def execute(self, invocation, inputs, resources, *, in_place):
        x, *extras = inputs
        resources.agree(invocation, lambda: tensor_descriptor(x), None, x.device, explain_layouts("input layouts"))
        x = x.contiguous()
        kind = invocation.properties["kind"]
        if resources.size == 1 or x.numel() == 0:
            return (torch.empty_like(x).copy_(x),)
        if kind is not None:
            fold = NATIVE_FOLDS[kind]

            def combine(a, b):
                return fold(a, b)
        else:
            region = invocation.regions[0]

            def combine(a, b):
                return region(a, b, *extras)[0]

        return (recursive_doubling_all_reduce(x, combine, resources, invocation),)


class CiphertextAllReduceImplementation(Implementation):
    """`dist.all_reduce_add_ciphertext` as a ring with lazy modular reduction,
    its schedule picked at run time from the group size P and the largest
    modulus q_max (`lazy_reduction_schedule`):

    * `deferred-ring` when P·(q_max−1) ≤ 2^63−1: limbs are added without
      reduction through the reduce-scatter and the owned 1/P chunk is reduced
      once, tile by tile, before the all-gather;
    * `lazy-ring` otherwise: a segment is reduced only before its next
      addition could pass 2^63−1; with q_max near 2^62 that is a modular
      ring, one reduction after every addition.

    (A native int64 sum followed by one reduction of the whole result was
    measured too: at P=4 on two cores it took 1.6x gloo's sum against 1.06x
    for the deferred ring, as it reduces all the data, out of cache.)
    Limbs are checked to be reduced, and the ranks agree on it, before any
    limb is sent.
    """

    name = "ciphertext-auto"
    operation_types = (AllReduceAddCiphertextOp,)
    priority = 1

    def __init__(self) -> None:
        self.results = ResultBuffers()
        self.last_strategy: str | None = None

    def execute(self, invocation, inputs, resources, *, in_place):
        ct, moduli = inputs
        q_max, error = 0, None
        try:
            q_max = check_ciphertext(invocation, ct, moduli)
        except OpError as e:
            error = e
        # Every rank learns whether every rank accepted its limbs (and whether
        # layouts and moduli agree) before any limb is sent.
        descriptor = [0] * (1 + len(tensor_descriptor(ct)))
        if error is None:
            descriptor = ciphertext_descriptor(ct, moduli)
        resources.agree(invocation, descriptor, error, ct.device, explain_ciphertexts)
        flat = ct.contiguous().reshape(-1)
        out = self.results.empty(flat.numel(), ct.dtype, ct.device)
        size = resources.size
        if size == 1 or flat.numel() == 0:
            out.copy_(flat)
            return (out.view(ct.shape),)
        moduli_pieces = ModuliPieces.per_row(moduli.to(ct.device), ct.shape)
        self.last_strategy = ciphertext_strategy(size, q_max)
        lazy = LazyModularAdd(moduli_pieces)
        combines = [lazy.step_combine(b) for b in lazy_reduction_schedule(size, q_max)]
        ring_all_reduce(flat, out, combines.__getitem__, resources, invocation)
        return (out.view(ct.shape),)


def ciphertext_strategy(size: int, q_max: int) -> str:
    """`deferred-ring` when P·(q_max−1) ≤ 2^63−1, else `lazy-ring` (see
    `CiphertextAllReduceImplementation`)."""
    return "deferred-ring" if size * (q_max - 1) <= INT64_MAX else "lazy-ring"


def lazy_reduction_schedule(size: int, q_max: int) -> list[int]:
    """For each reduce-scatter step, the bound b (values ≤ b·(q_max−1)) to
    reduce from after its addition, or 1 for no reduction."""
    headroom = INT64_MAX // max(1, q_max - 1)
    schedule: list[int] = []
    incoming = 1
    for step in range(size - 1):
        bound = incoming + 1
        last = step == size - 2
        if last or bound + 1 > headroom:
            schedule.append(bound)
            incoming = 1
        else:
            schedule.append(1)
            incoming = bound
    return schedule


def ring_contributions() -> list[Implementation]:
    """This module's implementations, in contribution order."""
    return [
        RingAllReduceImplementation(),
        HalvingDoublingAllReduceImplementation(),
        RecursiveDoublingAllReduceImplementation(),
        CiphertextAllReduceImplementation(),
    ]
