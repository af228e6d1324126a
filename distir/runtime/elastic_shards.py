"""Sharded state for a growing job: a joiner receives its shard, not the whole.

State that is split across the members (FSDP-style parameter shards, an
optimizer state partitioned over ranks) is declared once per tensor: its
global shape, dtype, and the dim split over the members
(`torch.tensor_split` chunks in the membership's rank order; None: every
member holds it whole). `distir.grow(state)` and `distir.join(state)` take a
`ShardedState` as they take a list of whole tensors; when a membership
admits joiners, every member moves from its shard of the old layout (over
the members that were there before) to its shard of the new one (over every
member) by one distir program: a `dist.transfer` per tensor between the two
layouts on the new group, whose transfer map (`distir.ops.transfer.ir`)
sends each rank exactly the pieces its new shard needs, from the member that
holds them.

    layout = {"w": Shard((4096, 1024), torch.float32, dim=0),
              "step": Shard((1,), torch.int64, dim=None)}
    state = ShardedState(layout, shards=my_shards)     # a joiner: no shards
    m = distir.grow(state)          # state.shards: this rank's new shards

A lost member's shard is lost with it: after `recover` the application
restores the survivors' shards for the smaller membership (from its
checkpoint, say; `shard_shape` says which) before the next `grow`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from distir.core.dtypes import IR_ELEMENT_TYPES
from distir.errors import DistirError
from distir.ir.layouts import shard_range
from distir.transport.epochs import Membership

#: torch dtype -> IR element type of what a hand-over carries: every dtype
#: distir runs (the one table, `distir.ir.element_types`)
ELEMENTS: dict[torch.dtype, str] = IR_ELEMENT_TYPES

#: compiled hand-over programs kept (one per old/new membership shape and layout)
_CACHE_SIZE = 16
_cache: OrderedDict[tuple, Any] = OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True)
class Shard:
    """One tensor of a `ShardedState`: its global `shape` and `dtype`, and
    `dim`, the dim split over the members in rank order (None: every member
    holds the whole tensor)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    dim: int | None = 0


class ShardedState:
    """Per name, a `Shard` declaration (`layout`, the same on every member
    and joiner) and this rank's local shard (`shards`; a joiner passes
    none). `grow` and `join` replace `shards` with this rank's shards of the
    new membership (fresh tensors: a shard's shape changes with the
    membership size)."""

    def __init__(
        self, layout: Mapping[str, Shard], shards: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        self.layout: dict[str, Shard] = {}
        for name, spec in layout.items():
            where = f"ShardedState: tensor {name!r}"
            if not isinstance(spec, Shard):
                raise DistirError(f"{where}: declared by a {type(spec).__name__}, not a Shard")
            shape = tuple(spec.shape)
            if not shape or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in shape
            ):
                raise DistirError(
                    f"{where}: shape {list(shape)} must be one or more non-negative ints"
                )
            if spec.dtype not in ELEMENTS:
                raise DistirError(
                    f"{where}: dtype {spec.dtype} is not carried (carried: "
                    f"{', '.join(str(d) for d in ELEMENTS)})"
                )
            if spec.dim is not None and not 0 <= spec.dim < len(shape):
                raise DistirError(
                    f"{where}: dim {spec.dim} is not a dim of shape {list(shape)} "
                    "(None: held whole by every member)"
                )
            self.layout[name] = Shard(shape, spec.dtype, spec.dim)
        self.shards: dict[str, torch.Tensor] = dict(shards or {})

    def shard_shape(self, name: str, ranks: Sequence[int], rank: int) -> tuple[int, ...]:
        """The shape of `rank`'s shard of `name` when `ranks` are the members."""
        spec = self.layout[name]
        if spec.dim is None:
            return spec.shape
        sizes = list(spec.shape)
        sizes[spec.dim] = shard_range(spec.shape[spec.dim], len(ranks), list(ranks).index(rank))[1]
        return tuple(sizes)

    def described(self) -> str:
        """What a joiner and the members must agree on (`state_digest`)."""
        return ";".join(
            f"{name}={spec.shape}:{spec.dtype}:{spec.dim}" for name, spec in self.layout.items()
        )


def misfit(state: ShardedState, m: Membership, me: int) -> tuple[int, str] | None:
    """The first of this rank's shards that does not fit the layout over
    `m`'s members, as (its index in the layout, what this rank holds), or None."""
    for i, name in enumerate(state.layout):
        want = state.shard_shape(name, m.ranks, me)
        x = state.shards.get(name)
        if not isinstance(x, torch.Tensor):
            return i, "nothing" if x is None else f"a {type(x).__name__}"
        if tuple(x.shape) != want or x.dtype != state.layout[name].dtype:
            return i, f"{list(x.shape)} {x.dtype}"
    return None


def misfit_reason(state: ShardedState, m: Membership, rank: int, index: int) -> str:
    """The same words on every member for rank `rank`'s misfit of tensor `index`."""
    name = list(state.layout)[index]
    spec = state.layout[name]
    want = list(state.shard_shape(name, m.ranks, rank))
    split = "held whole" if spec.dim is None else f"dim {spec.dim} split over them"
    return (
        f"rank {rank}'s shard of {name!r} is not the {want} {spec.dtype} that the layout "
        f"({list(spec.shape)}, {split}) gives it over the members {list(m.ranks)}; "
        "nothing moved (restore every member's shard for the current membership first)"
    )


def _program(specs: tuple[Shard, ...], before: tuple[int, ...], after: tuple[int, ...]) -> Any:
    """The hand-over program: for every tensor a `dist.transfer` from its
    layout over the group ranks `before` to its layout over the group ranks
    `after`; compiled once per (specs, before, after)."""
    from distir.ir import builder
    from distir.runtime.program import compile

    key = (specs, before, after)
    with _lock:
        program = _cache.get(key)
        if program is not None:
            _cache.move_to_end(key)
            return program

    def dims(spec: Shard) -> list[int | None]:
        return [0 if d == spec.dim else None for d in range(len(spec.shape))]

    def body(*shards: Any) -> Any:
        return [
            builder.transfer(
                x,
                source_mesh="before",
                source_layout=dims(spec),
                dest_mesh="after",
                dest_layout=dims(spec),
                global_shape=spec.shape,
            )
            for x, spec in zip(shards, specs)
        ]

    types = [builder.tensor_type(ELEMENTS[s.dtype], [None] * len(s.shape)) for s in specs]
    meshes = {"before": ((len(before),), before), "after": ((len(after),), after)}
    module = builder.build_program(body, types, meshes=meshes)
    program = compile(module)
    with _lock:
        _cache[key] = program
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return program


def transfer(
    specs: Sequence[Shard],
    shards: Sequence[torch.Tensor | None],
    m: Membership,
    after: Sequence[int],
    *,
    deadline: float,
) -> tuple[torch.Tensor, ...]:
    """Moves every tensor of `specs` from its layout over the members that
    were there before `m` (their `shards`; None on the others) to its
    layout over the group ranks `after` of `m`, by one distir program of
    `dist.transfer`s on `m`'s group. Returns this rank's shards (empty
    tensors on a rank outside `after`)."""
    before = tuple(i for i, r in enumerate(m.ranks) if r not in m.joined)
    program = _program(tuple(specs), before, tuple(after))
    inputs = [
        x if m.rank in before and x is not None else torch.empty((0,) * len(s.shape), dtype=s.dtype)
        for s, x in zip(specs, shards)
    ]
    out = program.run(*inputs, group=m.group, deadline=deadline)
    return out if isinstance(out, tuple) else (out,)


def prepare(specs: Sequence[Shard], world: int, me: int, *, whole: bool) -> None:
    """Compiles, ahead of its admission, the program a joiner on rank `me`
    most likely runs: the one of a membership of every rank of the `world`
    that admits it alone (to every member, or, `whole`, to it only)."""
    before = tuple(r for r in range(world) if r != me)
    _program(tuple(specs), before, (me,) if whole else tuple(range(world)))


def hand_over(state: ShardedState, m: Membership, *, deadline: float) -> None:
    """Every member of `m` ends with its shards of the layout over `m`'s
    members, moved from the shards of the members that were there before
    (`m.joined` admitted): one distir program of `dist.transfer`s on `m`'s
    group. Does nothing when `m` admitted nobody."""
    if not m.joined or not state.layout:
        return
    specs = tuple(state.layout.values())
    shards = [state.shards.get(name) for name in state.layout]
    outs = transfer(specs, shards, m, range(m.size), deadline=deadline)
    state.shards = dict(zip(state.layout, outs))
