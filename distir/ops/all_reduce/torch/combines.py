"""Combines the all-reduce algorithms apply to flat element ranges.

A combine is built once per op (`build_combine`) from what the op is: a
native kind, the modular addition `lower-ciphertext-add` recorded
(`known_combine = "modular-add"`, held to its region by the verifier), one
binary op on (lhs, rhs), or any elementwise region, evaluated tile by tile
through the kernels the plan compiled for it (the region's one compiled
form, `ir.region_program`, is not compiled again here). `bind(extras, like)` then
gives the function an algorithm calls as `combine(dst, lhs, rhs, start)`:
write lhs ⊕ rhs into dst for the flat elements [start, start + len(dst));
dst may be lhs or rhs. `bind(extras, like, axis)` numbers the elements of
`like.movedim(axis, 0)` instead (the reduce-scatter's layout, where every
rank's part is one contiguous run): extras read element by element follow.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from xdsl.dialects import arith
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr
from xdsl.ir import Operation

from distir.core.block_compiler import CompiledBlock
from distir.core.kernels import BINARY_TORCH_OPS, NATIVE_FOLDS, broadcast_view
from distir.he.rns import subtract_and_mask_
from distir.ir.analysis import single_op
from distir.ir.modular import INT64_MAX
from distir.ir.region_program import Role
from distir.ops.all_reduce.ir import MODULAR_ADD, known_combine

BoundCombine = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], None]

#: Elements per compute tile of a multi-op combine (bounds its temporaries;
#: smaller tiles did not run faster on a 2 MiB L2, the Python overhead ate it).
TILE_ELEMENTS = 1 << 17


class Scratch(threading.local):
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


SCRATCH = Scratch()


class FunctionCombine:
    """`fn(lhs, rhs, out=dst)`, or `fn(rhs, lhs, ...)` when the region
    writes the operands the other way round."""

    def __init__(self, fn: Callable[..., torch.Tensor], swapped: bool = False):
        self.fn = fn
        self.swapped = swapped

    def bind(
        self, extras: Sequence[torch.Tensor], like: torch.Tensor, axis: int = 0
    ) -> BoundCombine:
        fn, swapped = self.fn, self.swapped

        def combine(dst, lhs, rhs, start):
            if swapped:
                fn(rhs, lhs, out=dst)
            else:
                fn(lhs, rhs, out=dst)

        return combine


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


def reduce_bounded(v: torch.Tensor, moduli: ModuliPieces, a: int, bound: int) -> None:
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
        tmp = SCRATCH.get("mask", piece.numel(), piece.dtype, piece.device).view(piece.shape)
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
    the region on every int64 input, since it performs the same operations.
    The moduli are the op's first extra: `[L]` (broadcast inside the region)
    or already of the operands' shape."""

    def bind(
        self, extras: Sequence[torch.Tensor], like: torch.Tensor, axis: int = 0
    ) -> BoundCombine:
        q = extras[0]
        per_limb = q.dim() == 1 and tuple(q.shape) != tuple(like.shape)
        if axis:
            # Rows are no longer [..., L, N] runs: one modulus per element.
            full = q.to(like.device).view(-1, 1).expand(like.shape) if per_limb else q
            moduli = ModuliPieces(None, 1, full.movedim(axis, 0).contiguous().reshape(-1))
        elif per_limb:
            moduli = ModuliPieces.per_row(q.to(like.device), like.shape)
        else:
            moduli = ModuliPieces.from_extra(q)

        def reduce(d: torch.Tensor, start: int) -> None:
            for piece, qs in moduli.pieces(d, start):
                tmp = SCRATCH.get("mask", piece.numel(), piece.dtype, piece.device)
                subtract_and_mask_(piece, qs, tmp.view(piece.shape))

        return lambda dst, lhs, rhs, start: add_then(dst, lhs, rhs, start, reduce)


def add_then(
    dst: torch.Tensor, lhs: torch.Tensor, rhs: torch.Tensor, start: int,
    reduce: Callable[[torch.Tensor, int], None],
) -> None:
    """dst = lhs + rhs, then `reduce(tile, its first flat element)`, one
    cache-sized tile at a time."""
    for a in range(0, dst.numel(), TILE_ELEMENTS):
        b = min(dst.numel(), a + TILE_ELEMENTS)
        d = dst[a:b]
        torch.add(lhs[a:b], rhs[a:b], out=d)
        reduce(d, start + a)


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
            add_then(dst, lhs, rhs, start,
                     lambda d, a: reduce_bounded(d, moduli, a, reduce_bound))

        return combine


class RegionCombine:
    """An elementwise combine region evaluated on flat ranges.

    Made from the region as the plan compiled it (`invocation.regions[0]`:
    the region's one compiled form, `ir.region_program`, with a kernel per
    step): the kernels are reused, splat constants become 0-d tensors that
    broadcast, other constants, the extra operands and their broadcasts
    (`linalg.broadcast` of an extra, made once per call) are sliced like
    the operands, sizes are skipped. Values live in slots: the block
    arguments, the sliced values, the 0-d constants, then one per op. Each
    tile's result is copied into place.
    """

    def __init__(self, region: CompiledBlock):
        program = region.program
        assert program is not None, "a combine region as the plan compiled it"
        n_args = program.n_args
        slots: dict[int, int] = {i: i for i in range(n_args)}
        #: a constant's flat values, or (extra index, broadcast op)
        sliced: list[torch.Tensor | tuple[int, Operation]] = []
        fixed: list[torch.Tensor] = []
        pending: list[tuple[Callable, tuple[int, ...], int]] = []
        for step, compiled in zip(program.steps, region.steps, strict=True):
            op = step.op
            if step.role is Role.SIZE:
                continue  # sizes and broadcast targets: not evaluated per tile
            if step.role is Role.BROADCAST:
                assert step.broadcast is not None
                sliced.append((step.broadcast[0], op))
                slots[step.results[0]] = n_args + len(sliced) - 1
                continue
            if step.role is Role.CONSTANT:
                (value,) = compiled.kernel()
                if _is_splat(op) or value.dim() == 0:
                    fixed.append(value.reshape(-1)[0].clone())
                    slots[step.results[0]] = -len(fixed)  # renumbered below
                else:
                    sliced.append(value.contiguous().reshape(-1))
                    slots[step.results[0]] = n_args + len(sliced) - 1
                continue
            if step.role is Role.SPLAT:
                pending.append((lambda v, *sizes: (v,), step.operands[:1], step.results[0]))
            else:
                pending.append((compiled.kernel, step.operands, step.results[0]))
        result = program.result
        assert result is not None, "an elementwise region ends in dist.yield"
        first_fixed = n_args + len(sliced)
        for value, slot in list(slots.items()):
            if slot < 0:
                slots[value] = first_fixed - 1 - slot
        next_slot = first_fixed + len(fixed)
        self.steps: list[tuple[Callable, tuple[int, ...], int]] = []
        for kernel, operands, out in pending:
            self.steps.append((kernel, tuple(slots[v] for v in operands), next_slot))
            slots[out] = next_slot
            next_slot += 1
        self.n_args = n_args
        self.sliced = sliced
        self.fixed = fixed
        self.n_slots = next_slot
        self.result = slots[result]

    def bind(
        self, extras: Sequence[torch.Tensor], like: torch.Tensor, axis: int = 0
    ) -> BoundCombine:
        def laid_out(t: torch.Tensor) -> torch.Tensor:
            return (t.movedim(axis, 0) if axis else t).contiguous().reshape(-1)

        def flat(source: torch.Tensor | tuple[int, Operation]) -> torch.Tensor:
            if isinstance(source, torch.Tensor):
                return laid_out(source.view(like.shape)) if axis else source
            index, op = source
            dims = tuple(op.dimensions.get_values())  # type: ignore[attr-defined]
            return laid_out(broadcast_view(extras[index], like.shape, dims))

        # Extras of the op's shape are sliced like the operands; others are
        # read only through their broadcasts.
        shaped = [laid_out(e) if tuple(e.shape) == tuple(like.shape) else e for e in extras]
        full = shaped + [flat(s) for s in self.sliced]
        sliceable = [tuple(e.shape) == tuple(like.shape) for e in extras] + [True] * len(
            self.sliced
        )
        steps, result, fixed = self.steps, self.result, self.fixed
        first_fixed = self.n_args + len(self.sliced)
        n_slots = self.n_slots

        def combine(dst, lhs, rhs, start):
            for a in range(0, dst.numel(), TILE_ELEMENTS):
                b = min(dst.numel(), a + TILE_ELEMENTS)
                env: list[Any] = [lhs[a:b], rhs[a:b]]
                env += [
                    f[start + a : start + b] if ok else f for f, ok in zip(full, sliceable)
                ]
                env += fixed
                env += [None] * (n_slots - first_fixed - len(fixed))
                for kernel, operands, slot in steps:
                    env[slot] = kernel(*[env[i] for i in operands])[0]
                dst[a:b].copy_(env[result])

        return combine


def _is_splat(op: arith.ConstantOp) -> bool:
    value = op.value
    return isinstance(value, DenseIntOrFPElementsAttr) and value.is_splat()


def build_combine(op: Operation, regions: Sequence[Callable] = ()) -> Any:
    """The combine of an elementwise all-reduce (or reduce-scatter: the same
    kind, region and recorded known combine), from what the op is; a region
    runs as the plan compiled it (`regions`, the invocation's)."""
    if not op.is_generic:  # type: ignore[attr-defined]
        return FunctionCombine(NATIVE_FOLDS[op.kind.data])  # type: ignore[attr-defined]
    if known_combine(op) == MODULAR_ADD:
        return ModularAddCombine()
    found = single_op(op.regions[0].block)
    if found is not None and found[0] in BINARY_TORCH_OPS:
        return FunctionCombine(BINARY_TORCH_OPS[found[0]], swapped=found[1])
    (region,) = regions
    assert isinstance(region, CompiledBlock)
    return RegionCombine(region)
