"""An oracle that shares no code with distir: what every rank must hold.

Each function takes every rank's inputs (plain tensors, rank order) and
returns every rank's expected results, computed from the definitions in
docs/reference/dialect.md with plain torch and Python, never with distir's kernels, passes,
checks or reference simulator. Spawned ranks import nothing from here.

Where the contract leaves a backend a choice, an expectation lists every
allowed value: `Expected.alternatives` holds tensors of the result's shape,
and an element is right when it equals the same element of any alternative.
Two such choices exist:

- native `sum`/`prod` of floats may add in any order and bracketing (gloo's
  ring does), so the alternatives are every full binary tree over the ranks
  (1, 3, 15 of them for P = 2, 3, 4), each rounded in the element type;
- native `min`/`max` may return either zero when the extreme is a zero of
  either sign (IEEE `minNum`/`maxNum` leave it open). NaN is never optional:
  a NaN on any rank makes the element NaN (the reference's float contract).

The generic combine folds in rank order with MLIR's arith semantics, which
define everything: `maximumf`/`minimumf` propagate NaN and order -0.0 < +0.0;
integer arithmetic wraps modulo 2^bits.

Integer results are computed with Python integers and wrapped to the element
type, so no torch integer kernel (and no missing one, e.g. for uint32) is
involved. `i1` follows torch's bool arithmetic: `sum` is or, `prod` is and.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
UNSIGNED_DTYPES = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)


@dataclass
class Expected:
    """One expected result: right when every element equals that element of
    at least one alternative (bit for bit; any NaN equals any NaN)."""

    alternatives: list[torch.Tensor]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.alternatives[0].shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.alternatives[0].dtype

    def mismatch(self, got: torch.Tensor) -> str | None:
        """None when `got` is right, else what is wrong (for the assertion)."""
        if not isinstance(got, torch.Tensor):
            return f"expected a tensor, got {type(got).__name__}: {got!r}"
        if got.dtype != self.dtype or tuple(got.shape) != self.shape:
            return f"expected {self.dtype}{list(self.shape)}, got {got.dtype}{list(got.shape)}"
        ok = torch.zeros(self.shape, dtype=torch.bool)
        for alternative in self.alternatives:
            ok |= same_elements(got, alternative)
        if bool(ok.all()):
            return None
        where = (~ok).nonzero()[0].tolist()
        index = tuple(where)
        wanted = sorted({_scalar(a[index]) for a in self.alternatives}, key=repr)
        return (
            f"element {where}: got {_scalar(got[index])!r}, expected one of {wanted} "
            f"({int((~ok).sum())} of {ok.numel()} elements wrong)"
        )


def exact(t: torch.Tensor) -> Expected:
    return Expected([t])


def _scalar(t: torch.Tensor) -> object:
    value = t.item()
    if isinstance(value, float) and value == 0.0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    return value


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A fresh stride-1 copy (a one-element view with stride 2 counts as
    contiguous to torch, and `view(dtype)` refuses it)."""
    out = torch.empty(t.shape, dtype=t.dtype)
    out.copy_(t)
    return out


def same_elements(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element-wise bit equality (NaN equals NaN whatever its payload)."""
    if a.dtype in FLOAT_DTYPES:
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        bits = _dense(a).view(width) == _dense(b).view(width)
        return bits | (torch.isnan(a) & torch.isnan(b))
    if a.dtype in UNSIGNED_DTYPES[1:]:
        # Few torch kernels exist for uint16/32/64: compare as Python integers.
        flat = [x == y for x, y in zip(a.reshape(-1).tolist(), b.reshape(-1).tolist())]
        return torch.tensor(flat, dtype=torch.bool).reshape(a.shape)
    return a == b


# -- integers as Python integers --------------------------------------------


def int_bits(dtype: torch.dtype) -> int:
    return 1 if dtype == torch.bool else torch.iinfo(dtype).bits


def wrap(value: int, dtype: torch.dtype) -> int:
    """`value` modulo 2^bits, as the element type reads it."""
    if dtype == torch.bool:
        return int(bool(value))
    bits = int_bits(dtype)
    value %= 1 << bits
    if dtype not in UNSIGNED_DTYPES and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def to_ints(t: torch.Tensor) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


def from_ints(values: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    if like.dtype == torch.bool:
        return torch.tensor([bool(v) for v in values], dtype=torch.bool).reshape(like.shape)
    return torch.tensor(list(values), dtype=like.dtype).reshape(like.shape)


def _int_fold(op: Callable[[int, int], int], xs: Sequence[torch.Tensor]) -> torch.Tensor:
    dtype = xs[0].dtype
    columns = zip(*(to_ints(x) for x in xs))
    out = [functools.reduce(lambda a, b: wrap(op(a, b), dtype), column) for column in columns]
    return from_ints(out, xs[0])


# -- floats -----------------------------------------------------------------


def float_trees(op: Callable, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`op` over every full binary tree of the ranks' values (any order, any
    bracketing), each step rounded in the element type."""

    @functools.cache
    def trees(ranks: frozenset[int]) -> tuple[torch.Tensor, ...]:
        if len(ranks) == 1:
            return (xs[next(iter(ranks))],)
        out = []
        members = sorted(ranks)
        first, rest = members[0], members[1:]
        # Split so that `first` is always on the left: each unordered split once.
        for k in range(len(rest)):
            for chosen in itertools.combinations(rest, k):
                left = frozenset((first, *chosen))
                right = ranks - left
                if not right:
                    continue
                for a in trees(left):
                    for b in trees(right):
                        out.append(op(a, b))
        return tuple(out)

    return list(trees(frozenset(range(len(xs)))))


def _flip_zero_signs(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t == 0, -t, t)


def _ieee_max(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """MLIR `arith.maximumf`: NaN if either is NaN; -0.0 < +0.0."""
    out = torch.where(a > b, a, b)
    both_zero = (a == 0) & (b == 0)
    positive = torch.where(torch.signbit(a), b, a)  # +0 if either is +0
    out = torch.where(both_zero, positive, out)
    return torch.where(torch.isnan(a) | torch.isnan(b), torch.full_like(a, math.nan), out)


def _ieee_min(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """MLIR `arith.minimumf`: NaN if either is NaN; -0.0 < +0.0."""
    out = torch.where(a < b, a, b)
    both_zero = (a == 0) & (b == 0)
    negative = torch.where(torch.signbit(a), a, b)  # -0 if either is -0
    out = torch.where(both_zero, negative, out)
    return torch.where(torch.isnan(a) | torch.isnan(b), torch.full_like(a, math.nan), out)


# -- the op families ----------------------------------------------------------


def rank(world_size: int) -> list[list[Expected]]:
    return [[exact(torch.tensor(r, dtype=torch.int64))] for r in range(world_size)]


def group_size(world_size: int) -> list[list[Expected]]:
    return [[exact(torch.tensor(world_size, dtype=torch.int64))] for _ in range(world_size)]


def broadcast(xs: Sequence[torch.Tensor], root: int) -> list[list[Expected]]:
    return [[exact(xs[root].clone())] for _ in xs]


NATIVE_INT_OPS: dict[str, Callable[[int, int], int]] = {
    "sum": lambda a, b: a + b,
    "prod": lambda a, b: a * b,
    "min": min,
    "max": max,
    "band": lambda a, b: a & b,
    "bor": lambda a, b: a | b,
    "bxor": lambda a, b: a ^ b,
}

_BOOL_OPS: dict[str, Callable[[int, int], int]] = {
    "sum": lambda a, b: a | b,
    "prod": lambda a, b: a & b,
    "min": min,
    "max": max,
    "band": lambda a, b: a & b,
    "bor": lambda a, b: a | b,
    "bxor": lambda a, b: a ^ b,
}


def native_all_reduce(kind: str, xs: Sequence[torch.Tensor]) -> list[list[Expected]]:
    """The native kinds (`sum`, `prod`, `min`, `max`, `band`, `bor`, `bxor`)."""
    dtype = xs[0].dtype
    if dtype in FLOAT_DTYPES:
        if kind in ("sum", "prod"):
            op = torch.add if kind == "sum" else torch.mul
            alternatives = float_trees(op, xs)
        elif kind in ("max", "min"):
            strict = functools.reduce(_ieee_max if kind == "max" else _ieee_min, xs)
            alternatives = [strict, _flip_zero_signs(strict)]
        else:
            raise ValueError(f"{kind} has no float meaning")
        expected = Expected(alternatives)
    else:
        ops = _BOOL_OPS if dtype == torch.bool else NATIVE_INT_OPS
        expected = exact(_int_fold(ops[kind], xs))
    return [[expected] for _ in xs]


#: The combines the generic all-reduce is tested with: `arith` op name ->
#: (its meaning on two tensors of one element type, commutative?). `first`
#: and `last` (the region yields lhs / rhs) are associative and not
#: commutative, so they expose any fold that is not in rank order.
def _int_combine(op: Callable[[int, int], int], unsigned: bool = False) -> Callable:
    def combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        dtype = a.dtype
        bits = int_bits(dtype)

        def view(v: int) -> int:
            return v % (1 << bits) if unsigned else wrap(v, dtype)

        out = [wrap(op(view(x), view(y)), dtype) for x, y in zip(to_ints(a), to_ints(b))]
        return from_ints(out, a)

    return combine


GENERIC_COMBINES: dict[str, tuple[Callable, bool]] = {
    "addi": (_int_combine(lambda a, b: a + b), True),
    "muli": (_int_combine(lambda a, b: a * b), True),
    "maxsi": (_int_combine(max), True),
    "minsi": (_int_combine(min), True),
    "maxui": (_int_combine(max, unsigned=True), True),
    "minui": (_int_combine(min, unsigned=True), True),
    "andi": (_int_combine(lambda a, b: a & b), True),
    "ori": (_int_combine(lambda a, b: a | b), True),
    "xori": (_int_combine(lambda a, b: a ^ b), True),
    "addf": (torch.add, True),
    "mulf": (torch.mul, True),
    "maximumf": (_ieee_max, True),
    "minimumf": (_ieee_min, True),
    "first": (lambda a, b: a, False),
    "last": (lambda a, b: b, False),
}


def generic_all_reduce(
    combine: str, xs: Sequence[torch.Tensor], commutative: bool
) -> list[list[Expected]]:
    """x_0 ⊕ x_1 ⊕ … ⊕ x_{P-1} folded in rank order. A `commutative` marker
    lets a backend reorder, so a float `addf`/`mulf` may then round as any
    tree does; every other combine here is exact under reordering."""
    fn, _ = GENERIC_COMBINES[combine]
    if commutative and combine in ("addf", "mulf"):
        expected = Expected(float_trees(fn, xs))
    elif combine in ("addf", "mulf"):
        # Associativity is the user's promise; a non-commutative float add
        # may still be re-bracketed (ring, halving-doubling) but not reordered.
        expected = Expected(_ordered_trees(fn, xs))
    else:
        expected = exact(functools.reduce(fn, xs))
    return [[expected] for _ in xs]


def _ordered_trees(op: Callable, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`op` over every bracketing of x_0 … x_{P-1} in rank order."""

    @functools.cache
    def trees(lo: int, hi: int) -> tuple[torch.Tensor, ...]:
        if hi - lo == 1:
            return (xs[lo],)
        return tuple(
            op(a, b) for mid in range(lo + 1, hi) for a in trees(lo, mid) for b in trees(mid, hi)
        )

    return list(trees(0, len(xs)))


def ciphertext_sum(cts: Sequence[torch.Tensor], moduli: Sequence[int]) -> list[list[Expected]]:
    """y[..., l, :] = (Σ_r ct_r[..., l, :]) mod q_l, in Python integers."""
    shape = cts[0].shape
    limbs = shape[-2]
    flat = [to_ints(c) for c in cts]
    per_limb = shape[-1]
    out = []
    for i in range(len(flat[0])):
        limb = (i // per_limb) % limbs
        out.append(sum(f[i] for f in flat) % moduli[limb])
    expected = exact(torch.tensor(out, dtype=torch.int64).reshape(shape))
    return [[expected] for _ in cts]


def all_gather(xs: Sequence[torch.Tensor], axis: int) -> list[list[Expected]]:
    """Concatenation along `axis` in rank order, built by slice assignment."""
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = torch.zeros(shape, dtype=xs[0].dtype)
    offset = 0
    for x in xs:
        index = [slice(None)] * len(shape)
        index[axis] = slice(offset, offset + x.shape[axis])
        out[tuple(index)] = x
        offset += x.shape[axis]
    return [[exact(out)] for _ in xs]


def reduce_scatter(
    kind: str, xs: Sequence[torch.Tensor], axis: int, counts: Sequence[int] | None = None
) -> list[list[Expected]]:
    """Rank r's part (rows [r·n/P, (r+1)·n/P) of `axis`, or the rows the
    counts give it) of every alternative the native all-reduce of `xs` may
    give, by plain indexing."""
    (total,) = native_all_reduce(kind, xs)[0]
    return scattered(total, len(xs), axis, counts)


def scattered(
    total: Expected, world: int, axis: int, counts: Sequence[int] | None = None
) -> list[list[Expected]]:
    """Every rank's part of every alternative of `total` along `axis`: even
    parts, or `counts[r]` rows for rank r after those of the ranks before."""
    rows = total.shape[axis]
    sizes = list(counts) if counts is not None else [rows // world] * world
    results, start = [], 0
    for r in range(world):
        index = [slice(None)] * len(total.shape)
        index[axis] = slice(start, start + sizes[r])
        results.append([Expected([a[tuple(index)].clone() for a in total.alternatives])])
        start += sizes[r]
    return results


def gather(xs: Sequence[torch.Tensor], axis: int, root: int) -> list[list[Expected]]:
    """On the root, the concatenation along `axis` in rank order (built by
    slice assignment); zeros of its shape on every other rank."""
    (whole,) = all_gather(xs, axis)[0]
    (out,) = whole.alternatives
    return [[exact(out if r == root else torch.zeros_like(out))] for r in range(len(xs))]


def scatter(
    xs: Sequence[torch.Tensor], axis: int, root: int, counts: Sequence[int] | None = None
) -> list[list[Expected]]:
    """Rank r's rows of the root's `x`: rows [r·n/P, (r+1)·n/P) along `axis`,
    or after the counts of the lower ranks, by plain indexing."""
    x, world = xs[root], len(xs)
    if counts is None:
        counts = [x.shape[axis] // world] * world
    results, offset = [], 0
    for c in counts:
        index = [slice(None)] * x.dim()
        index[axis] = slice(offset, offset + c)
        results.append([exact(x[tuple(index)].clone())])
        offset += c
    return results


def reduce(kind: str, xs: Sequence[torch.Tensor], root: int) -> list[list[Expected]]:
    """On the root, every alternative the native all-reduce of `xs` may give;
    zeros of its shape on every other rank."""
    (total,) = native_all_reduce(kind, xs)[0]
    return [[total if r == root else exact(torch.zeros_like(xs[0]))] for r in range(len(xs))]


def shift(xs: Sequence[torch.Tensor], offset: int, rotate: bool) -> list[list[Expected]]:
    """Rank r gets rank (r - offset)'s input: modulo P with `rotate`, zeros
    when that rank does not exist without it."""
    world, results = len(xs), []
    for r in range(world):
        source = r - offset
        if rotate:
            source %= world
        inside = 0 <= source < world
        results.append([exact(xs[source].clone() if inside else torch.zeros_like(xs[r]))])
    return results


def variable_all_to_all(
    xs: Sequence[torch.Tensor], send_counts: Sequence[Sequence[int]], axis: int
) -> list[list[Expected]]:
    """Rank r receives, from each sender s in rank order, the rows of s's
    input that s's counts assign to r; and the counts themselves."""
    world = len(xs)
    out = []
    for r in range(world):
        blocks = []
        for s in range(world):
            start = sum(send_counts[s][:r])
            index = [slice(None)] * xs[s].dim()
            index[axis] = slice(start, start + send_counts[s][r])
            blocks.append(xs[s][tuple(index)])
        received = all_gather(blocks, axis)[0][0] if blocks else None
        counts = torch.tensor([send_counts[s][r] for s in range(world)], dtype=torch.int64)
        out.append([received, exact(counts)])
    return out


def ring_shift(xs: Sequence[torch.Tensor]) -> list[list[Expected]]:
    """`sendrecv` to rank r+1 from rank r-1: rank r holds x_{r-1}."""
    world = len(xs)
    return [[exact(xs[(r - 1) % world].clone())] for r in range(world)]


def send_to_last(xs: Sequence[torch.Tensor]) -> list[list[Expected]]:
    """Rank 0 sends to the last rank, which returns what it received; every
    other rank returns its own input."""
    world = len(xs)
    return [[exact((xs[0] if r == world - 1 else xs[r]).clone())] for r in range(world)]


def transfer_sharded_to_replicated(
    shards: Sequence[torch.Tensor], axis: int
) -> list[list[Expected]]:
    """A tensor sharded along `axis` over a 1-d mesh of every rank, replicated."""
    return all_gather(shards, axis)


def transfer_replicated_to_sharded(
    full: torch.Tensor, world_size: int, axis: int
) -> list[list[Expected]]:
    """Rank r keeps block r of `axis` (the size divides evenly)."""
    block = full.shape[axis] // world_size
    return [[exact(full.narrow(axis, r * block, block).clone())] for r in range(world_size)]


def transfer_partial_to_replicated(parts: Sequence[torch.Tensor]) -> list[list[Expected]]:
    """Partial sums over the mesh axis: every rank holds their sum (exact for
    integer values; floats may be added in any order)."""
    return native_all_reduce("sum", parts)


def first_mismatch(
    expected: Sequence[Sequence[Expected]], results: Sequence[Sequence[torch.Tensor]]
) -> str | None:
    """None when every rank's results are as expected, else the first wrong one."""
    for rank, (want, got) in enumerate(zip(expected, results)):
        if len(want) != len(got):
            return f"rank {rank}: {len(got)} results, expected {len(want)}"
        for i, (w, g) in enumerate(zip(want, got)):
            why = w.mismatch(g)
            if why is not None:
                return f"rank {rank} result #{i}: {why}"
    return None


def mesh_shard(
    whole: torch.Tensor,
    mesh_shape: Sequence[int],
    mesh_ranks: Sequence[int],
    dims: Sequence[int | None],
    rank: int,
) -> torch.Tensor:
    """The block of `whole` that `rank` holds when tensor dim d is sharded
    over mesh axis dims[d] (None: held whole): `torch.tensor_split` into
    that axis's size, the chunk at the rank's row-major mesh coordinate."""
    index = list(mesh_ranks).index(rank)
    coord = []
    for size in reversed(mesh_shape):
        coord.append(index % size)
        index //= size
    coord.reverse()
    out = whole
    for d, axis in enumerate(dims):
        if axis is not None:
            out = out.tensor_split(mesh_shape[axis], dim=d)[coord[axis]]
    return out
