"""One collective without writing a program: `distir.all_reduce(x, ...)`,
`distir.broadcast`, `distir.all_gather`, `distir.reduce_scatter`,
`distir.reduce`, `distir.gather`, `distir.scatter`, `distir.shift` and
`distir.all_to_all`, and
Megatron's f and g, `distir.pvary` and `distir.psum`.

    y = distir.all_reduce(x, "sum")                                  # native
    y = distir.all_reduce(x, combine=abs_max, commutative=True)      # custom
    y = distir.all_gather(x, axis=1)                                 # the others

Each builds its one-op program through `_program` (the cache) and `_run`;
arguments the group decides (a root, a size to split) are checked before
anything runs, with the caller's line as location, so a bad call leaves the
group usable.

`combine(a, b)` builds the combine region with the builder's helpers
(`distir.ir.builder`: `arith`, `cmpf`, `select`, `math`, ...). The program
is compiled on first use and cached by its signature (the kind or the
combine function, `commutative`, the dtype and shape of `x`, the group), so
later calls with the same signature only run it. Pass the same function
object each time to hit the cache (a lambda written inline in a loop is a
new function every iteration, and compiles every time).

Runs on the current rank of `group` (default: the world), which must be
initialised: inside `distir.launch` it is; under `torchrun` call
`torch.distributed.init_process_group("gloo")` first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from distir.core.dtypes import IR_ELEMENT_TYPES
from distir.errors import DistirError, OpError
from distir.ir.attributes import ReductionKind
from distir.runtime.program import Program, compile

#: torch dtype -> IR element type of what the eager collectives accept: every
#: dtype a program runs (the one table, `distir.core.dtypes`); what the
#: backend cannot run (a native sum of uint16) is refused when the one-op
#: program is compiled, naming the op at the caller's line
_ELEMENTS: dict[torch.dtype, str] = IR_ELEMENT_TYPES

#: compiled programs kept, least recently used dropped first
CACHE_SIZE = 128

_cache: OrderedDict[tuple, Program] = OrderedDict()
_lock = threading.Lock()


def cached_programs() -> int:
    """How many eager programs are compiled and kept."""
    return len(_cache)


def _program(
    op: str,
    params: tuple,
    build: Callable[[Any], Any],
    dtype: torch.dtype,
    shape: tuple[int | None, ...],
    deadline: float,
    more: Sequence[Any] = (),
) -> Program:
    """The one-op program `build(x)` of `distir.<op>` for a tensor of `dtype`
    and `shape`, compiled on first use and cached under `(op, params, ...)`:
    `params` must name everything `build` depends on. `more`: the IR types
    of further arguments (`build(x, *more)`)."""
    from distir.ir import builder

    # The op is located at the caller's line (errors found later point
    # there), so the call site is part of what a cached program is.
    builder.located_at_callers_of(__file__)
    site = builder.call_site()
    key = (op, params, dtype, shape, deadline, str(site), tuple(map(str, more)))
    with _lock:
        program = _cache.get(key)
        if program is not None:
            _cache.move_to_end(key)
            return program
    element = _ELEMENTS.get(dtype)
    if element is None:
        raise DistirError(
            f"distir.{op} takes tensors of {', '.join(map(str, _ELEMENTS))}, got {dtype}"
        )
    module = builder.build_program(build, [builder.tensor_type(element, list(shape)), *more])
    program = compile(module, deadline=deadline)
    with _lock:
        _cache[key] = program
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return program


def _require(op: str, x: Any) -> None:
    """What every eager collective needs before its own checks: a tensor
    and an initialised process group."""
    if not isinstance(x, torch.Tensor):
        raise DistirError(f"distir.{op} takes a torch.Tensor, got {type(x).__name__}")
    import torch.distributed as dist

    if not dist.is_initialized():
        raise DistirError(
            f"distir.{op} needs an initialised process group: inside distir.launch "
            "it is; under torchrun call torch.distributed.init_process_group('gloo') first"
        )


def _run(
    op: str,
    x: torch.Tensor,
    params: tuple,
    build: Callable[[Any], Any],
    group: Any,
    deadline: float,
    dynamic_axis: int | None = None,
) -> torch.Tensor:
    """Run `build`'s one-op program on `x` (checked by `_require`); the
    program takes any size along `dynamic_axis` (ranks that differ there
    still run one program)."""
    shape: list[int | None] = list(x.shape)
    if dynamic_axis is not None:
        shape[dynamic_axis] = None
    program = _program(op, params, build, x.dtype, tuple(shape), deadline)
    return program.run(x, group=group)


def all_reduce(
    x: torch.Tensor,
    kind: str | None = None,
    *,
    combine: Callable[..., Any] | None = None,
    commutative: bool = False,
    group: Any = None,
    deadline: float = 60.0,
) -> torch.Tensor:
    """All-reduce `x` across the ranks of `group` (default: the world) and
    return the result (a new tensor; `x` is not modified).

    Args:
        x: this rank's tensor (CPU for gloo), the same dtype and shape on
            every rank.
        kind: a native reduction: "sum", "prod", "min", "max", "band",
            "bor", "bxor".
        combine: instead of `kind`, `combine(a, b)` building the combine
            region from builder helpers; it must be associative (rank order
            is kept unless `commutative`).
        commutative: the combine may be applied in any order (lets the ring
            algorithms run it).
        group: a torch.distributed process group (None: the world).
        deadline: seconds every collective of the run may take.

    Example (on every rank)::

        from distir.ir.builder import arith, cmpf, math, select

        def abs_max(a, b):  # a tie takes maximumf: commutative on every value
            bigger = cmpf("ogt", math("absf", a), math("absf", b))
            smaller = cmpf("olt", math("absf", a), math("absf", b))
            return select(bigger, a, select(smaller, b, arith("maximumf", a, b)))

        total = distir.all_reduce(torch.ones(4), "sum")
        largest = distir.all_reduce(x, combine=abs_max)
    """
    if (kind is None) == (combine is None):
        raise DistirError("distir.all_reduce needs exactly one of `kind` and `combine`")
    _require("all_reduce", x)
    from distir.ir import builder

    def build(v: Any) -> Any:
        if combine is None:
            return builder.all_reduce(v, kind)
        return builder.all_reduce(v, combine=combine, commutative=commutative)

    return _run("all_reduce", x, (kind, combine, commutative), build, group, deadline)


def _refuse(op: str, message: str) -> OpError:
    """The error for a bad eager call, located at the caller's line (as an
    error the compiled op raises would be)."""
    from distir.ir import builder

    builder.located_at_callers_of(__file__)
    site = builder.call_site()
    where = "<unknown location>"
    if site is not None:
        where = f"{site.filename.data}:{site.line.data}:{site.column.data}"
    return OpError(f"'dist.{op}' at {where}", message)


def _group_size(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


def _checked_axis(op: str, x: torch.Tensor, axis: int) -> int:
    """`axis` of `x` counted from the front, or a located error."""
    if not -x.dim() <= axis < x.dim():
        raise _refuse(op, f"axis {axis} is out of range for a tensor of {x.dim()} dims")
    return axis % x.dim()


def broadcast(
    x: torch.Tensor, root: int = 0, *, group: Any = None, deadline: float = 60.0
) -> torch.Tensor:
    """Return `x` of group rank `root` on every rank of `group` (default: the
    world), as a new tensor (`x` is not modified). Differentiable: the
    gradient of `x` is the sum of every rank's cotangent on the root, zeros
    elsewhere.

    Args:
        x: this rank's tensor (CPU for gloo), the same dtype and shape on
            every rank; only the root's values are used.
        root: the group rank whose `x` every rank gets.
        group: a torch.distributed process group (None: the world).
        deadline: seconds every collective of the run may take.

    Example (on every rank)::

        weights = distir.broadcast(weights, root=0)   # every rank: rank 0's
    """
    _require("broadcast", x)
    if not 0 <= root < _group_size(group):
        raise _refuse("broadcast", f"root {root} is outside the group (size {_group_size(group)})")
    from distir.ir import builder

    def build(v: Any) -> Any:
        return builder.broadcast(v, root)

    return _run("broadcast", x, (root,), build, group, deadline)


def all_gather(
    x: torch.Tensor,
    axis: int = 0,
    *,
    counts: Sequence[int] | None = None,
    group: Any = None,
    deadline: float = 60.0,
) -> torch.Tensor:
    """Concatenate every rank's `x` along `axis`, in group rank order, and
    return it on every rank of `group` (default: the world). Differentiable:
    the gradient of `x` is the sum over ranks of their cotangent's part r.

    Args:
        x: this rank's tensor (CPU for gloo), the same dtype and shape on
            every rank.
        axis: the axis to concatenate along (negative counts from the end).
        counts: for an uneven gather, how many rows along `axis` each group
            rank contributes (the same list on every rank; rank r's `x` has
            `counts[r]` there).
        group: a torch.distributed process group (None: the world).
        deadline: seconds every collective of the run may take.

    Example (on every rank, 3 ranks)::

        rows = distir.all_gather(torch.full((2, 4), rank))   # shape [6, 4]
        ragged = distir.all_gather(torch.ones(rank + 1), counts=[1, 2, 3])  # [6]
    """
    _require("all_gather", x)
    axis = _checked_axis("all_gather", x, axis)
    if counts is None:
        from distir.ir import builder

        def build(v: Any) -> Any:
            return builder.all_gather(v, axis=axis)

        return _run("all_gather", x, (axis,), build, group, deadline)
    return _uneven_all_gather(x, axis, tuple(counts), group, deadline)


def _uneven_all_gather(
    x: torch.Tensor, axis: int, counts: tuple[int, ...], group: Any, deadline: float
) -> torch.Tensor:
    import torch.distributed as dist

    size = _group_size(group)
    if len(counts) != size or any(not isinstance(c, int) or c < 0 for c in counts):
        raise _refuse(
            "all_gather", f"counts {list(counts)} is not {size} sizes >= 0 (one per group rank)"
        )
    mine = counts[dist.get_rank(group)]
    if x.shape[axis] != mine:
        raise _refuse(
            "all_gather",
            f"this rank's x has {x.shape[axis]} rows along axis {axis}, counts say {mine}",
        )
    from distir.ir import builder

    def build(v: Any) -> Any:
        return builder.all_gather(v, axis=axis, counts=builder.constant_tensor(list(counts)))

    return _run("all_gather", x, (axis, counts), build, group, deadline, dynamic_axis=axis)


def reduce_scatter(
    x: torch.Tensor,
    kind: str | None = None,
    axis: int = 0,
    *,
    counts: Sequence[int] | None = None,
    combine: Callable[..., Any] | None = None,
    commutative: bool = False,
    group: Any = None,
    deadline: float = 60.0,
) -> torch.Tensor:
    """Reduce every rank's `x` and return part r of the result, split along
    `axis`, on group rank r: equal parts, or `counts[r]` rows for rank r.
    The reduction is a native `kind` (default "sum") or, as for
    `all_reduce`, a `combine(a, b)` built from builder helpers.
    Differentiable for a sum (a combine recognised as one included): the
    gradient of `x` is every rank's cotangent, concatenated along `axis`.

    Args:
        x: this rank's tensor (CPU for gloo), the same dtype and shape on
            every rank; `x.shape[axis]` a multiple of the group size, or the
            sum of `counts`.
        kind: a native reduction: "sum", "prod", "min", "max", ...
        axis: the axis to split (negative counts from the end).
        counts: for an uneven split, the rows each group rank gets (the
            same list on every rank, summing to `x.shape[axis]`).
        combine: instead of `kind`, `combine(a, b)` building the combine
            region; it must be associative (rank order is kept unless
            `commutative`).
        commutative: the combine may be applied in any order.
        group: a torch.distributed process group (None: the world).
        deadline: seconds every collective of the run may take.

    Example (on every rank, 3 ranks)::

        part = distir.reduce_scatter(torch.ones(6, 4))   # shape [2, 4], all 3.0
        mine = distir.reduce_scatter(torch.ones(6), counts=[1, 2, 3])  # rank r: r + 1 rows
        largest = distir.reduce_scatter(x, combine=abs_max, counts=[1, 2, 3])
    """
    if kind is not None and combine is not None:
        raise DistirError("distir.reduce_scatter takes `kind` or `combine`, not both")
    _require("reduce_scatter", x)
    if combine is None:
        kind = kind or "sum"
        kinds = [k.value for k in ReductionKind]
        if kind not in kinds:
            raise _refuse(
                "reduce_scatter", f"no native reduction {kind!r}; they are {', '.join(kinds)}"
            )
    axis = _checked_axis("reduce_scatter", x, axis)
    size = _group_size(group)
    parts: tuple[int, ...] | None = None
    if counts is not None:
        parts = _checked_counts("reduce_scatter", counts, group)
        if sum(parts) != x.shape[axis]:
            raise _refuse(
                "reduce_scatter", f"counts {list(parts)} sum to {sum(parts)}, but x has "
                f"{x.shape[axis]} rows along axis {axis}",
            )  # fmt: skip
    elif x.shape[axis] % size:
        raise _refuse(
            "reduce_scatter",
            f"axis {axis} has {x.shape[axis]} elements, not a multiple of the group size {size}",
        )
    from distir.ir import builder

    def build(v: Any) -> Any:
        return builder.reduce_scatter(
            v,
            kind,
            axis=axis,
            counts=None if parts is None else list(parts),
            combine=combine,
            commutative=commutative,
        )

    params = (kind, axis, parts, combine, commutative)
    return _run("reduce_scatter", x, params, build, group, deadline)


def _checked_root(op: str, root: int, group: Any) -> None:
    size = _group_size(group)
    if not isinstance(root, int) or not 0 <= root < size:
        raise _refuse(op, f"root {root} is outside the group (size {size})")


def _checked_counts(op: str, counts: Sequence[int], group: Any) -> tuple[int, ...]:
    size = _group_size(group)
    if len(counts) != size or any(not isinstance(c, int) or c < 0 for c in counts):
        raise _refuse(op, f"counts {list(counts)} is not {size} sizes >= 0 (one per group rank)")
    return tuple(counts)


def reduce(
    x: torch.Tensor,
    kind: str = "sum",
    root: int = 0,
    *,
    group: Any = None,
    deadline: float = 60.0,
) -> torch.Tensor:
    """Reduce every rank's `x` with `kind` onto group rank `root`; the other
    ranks get zeros of `x`'s shape (a new tensor; `x` is not modified).
    Differentiable for "sum": the gradient of `x` on every rank is the
    root's cotangent.

    Args:
        x: this rank's tensor (CPU for gloo), the same dtype and shape on
            every rank.
        kind: a native reduction: "sum", "prod", "min", "max", ...
        root: the group rank that gets the reduction.
        group: a torch.distributed process group (None: the world).
        deadline: seconds every collective of the run may take.

    Example (on every rank, 3 ranks)::

        total = distir.reduce(torch.ones(4), "sum", root=0)  # rank 0: all 3.0
    """
    _require("reduce", x)
    kinds = [k.value for k in ReductionKind]
    if kind not in kinds:
        raise _refuse("reduce", f"no native reduction {kind!r}; they are {', '.join(kinds)}")
    _checked_root("reduce", root, group)
    from distir.ir import builder

    def build(v: Any) -> Any:
        return builder.reduce(v, kind, root)

    return _run("reduce", x, (kind, root), build, group, deadline)


def gather(
    x: torch.Tensor,
    root: int = 0,
    axis: int = 0,
    *,
    counts: Sequence[int] | None = None,
    group: Any = None,
    deadline: float = 60.0,
) -> torch.Tensor:
    """Concatenate every rank's `x` along `axis`, in group rank order, on
    group rank `root`; the other ranks get zeros of that shape.
    Differentiable: the gradient of rank r's `x` is part r of the root's
    cotangent.

    Args:
        x: this rank's tensor (CPU for gloo), the same dtype and shape on
            every rank (but along `axis` when `counts` is given).
        root: the group rank that gets the concatenation.
        axis: the axis to concatenate along (negative counts from the end).
        counts: for an uneven gather, how many rows along `axis` each group
            rank contributes (the same list on every rank).
        group: a torch.distributed process group (None: the world).
        deadline: seconds every collective of the run may take.

    Example (on every rank, 3 ranks)::

        rows = distir.gather(torch.full((2, 4), rank), root=0)  # rank 0: [6, 4]
    """
    _require("gather", x)
    _checked_root("gather", root, group)
    axis = _checked_axis("gather", x, axis)
    from distir.ir import builder

    if counts is None:

        def build(v: Any) -> Any:
            return builder.gather(v, root, axis=axis)

        return _run("gather", x, (root, axis), build, group, deadline)
    import torch.distributed as dist

    parts = _checked_counts("gather", counts, group)
    mine = parts[dist.get_rank(group)]
    if x.shape[axis] != mine:
        raise _refuse(
            "gather", f"this rank's x has {x.shape[axis]} rows along axis {axis}, counts say {mine}"
        )

    def build_uneven(v: Any) -> Any:
        return builder.gather(v, root, axis=axis, counts=builder.constant_tensor(list(parts)))

    return _run("gather", x, (root, axis, parts), build_uneven, group, deadline, dynamic_axis=axis)


def scatter(
    x: torch.Tensor,
    root: int = 0,
    axis: int = 0,
    *,
    counts: Sequence[int] | None = None,
    group: Any = None,
    deadline: float = 60.0,
) -> torch.Tensor:
    """Split group rank `root`'s `x` along `axis` into one part per rank
    (equal parts, or `counts[r]` rows for rank r) and return part r on rank
    r. Differentiable: the root's gradient is every rank's cotangent,
    concatenated; the other ranks' is zero.

    Args:
        x: this rank's tensor (CPU for gloo), the same dtype and shape on
            every rank; only the root's values are used.
        root: the group rank whose `x` is split.
        axis: the axis to split (negative counts from the end).
        counts: for an uneven scatter, the rows each group rank gets (the
            same list on every rank, summing to `x.shape[axis]`).
        group: a torch.distributed process group (None: the world).
        deadline: seconds every collective of the run may take.

    Example (on every rank, 3 ranks)::

        part = distir.scatter(torch.arange(6.0), root=0)  # rank r: [2r, 2r+1]
    """
    _require("scatter", x)
    _checked_root("scatter", root, group)
    axis = _checked_axis("scatter", x, axis)
    from distir.ir import builder

    if counts is None:
        size = _group_size(group)
        if x.shape[axis] % size:
            raise _refuse(
                "scatter",
                f"axis {axis} has {x.shape[axis]} elements, not a multiple of the group size "
                f"{size}",
            )

        def build(v: Any) -> Any:
            return builder.scatter(v, root, axis=axis)

        return _run("scatter", x, (root, axis), build, group, deadline)
    parts = _checked_counts("scatter", counts, group)
    if sum(parts) != x.shape[axis]:
        raise _refuse(
            "scatter", f"counts {list(parts)} sum to {sum(parts)}, but x has {x.shape[axis]} "
            f"rows along axis {axis}",
        )  # fmt: skip

    def build_uneven(v: Any) -> Any:
        return builder.scatter(v, root, axis=axis, counts=builder.constant_tensor(list(parts)))

    return _run("scatter", x, (root, axis, parts), build_uneven, group, deadline)


def shift(
    x: torch.Tensor,
    offset: int = 1,
    *,
    rotate: bool = False,
    group: Any = None,
    deadline: float = 60.0,
) -> torch.Tensor:
    """Return group rank `r - offset`'s `x` on rank r: a neighbour exchange.
    With `rotate` the ranks form a ring (modulo the group size); without it
    a rank with no such neighbour gets zeros. Differentiable: the gradient
    travels back by `-offset`.

    Args:
        x: this rank's tensor (CPU for gloo), the same dtype and shape on
            every rank.
        offset: how many ranks along the group each `x` moves.
        rotate: wrap around (ring attention, a ring pipeline) instead of
            open ends (pipeline stages, halos).
        group: a torch.distributed process group (None: the world).
        deadline: seconds every collective of the run may take.

    Example (on every rank, 3 ranks)::

        previous = distir.shift(torch.full((2,), rank), 1, rotate=True)  # rank 0: 2s
    """
    _require("shift", x)
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise _refuse("shift", f"offset must be an integer, got {offset!r}")
    from distir.ir import builder

    def build(v: Any) -> Any:
        return builder.shift(v, offset, rotate=rotate)

    return _run("shift", x, (offset, bool(rotate)), build, group, deadline)


def all_to_all(
    x: torch.Tensor,
    send_counts: Sequence[int] | None = None,
    axis: int = 0,
    *,
    return_counts: bool = False,
    group: Any = None,
    deadline: float = 60.0,
) -> torch.Tensor | tuple[torch.Tensor, list[int]]:
    """Split `x` along `axis` into one block per group rank, send block j to
    rank j, and return the blocks every rank sent here, concatenated in
    rank order. Blocks are equal, or rank r's are `send_counts` rows each
    (every rank its own list: a variable exchange, as MoE token routing).
    Differentiable: the gradient of `x` is the cotangent sent back by the
    reverse exchange (the receive counts as send counts).

    Args:
        x: this rank's tensor (CPU for gloo), the same dtype and shape on
            every rank but along `axis`.
        send_counts: the rows this rank sends each group rank, in rank
            order (summing to `x.shape[axis]`); None: equal blocks
            (`x.shape[axis]` a multiple of the group size).
        axis: the axis to split (negative counts from the end).
        return_counts: also return the rows received from each rank.
        group: a torch.distributed process group (None: the world).
        deadline: seconds every collective of the run may take.

    Example (on every rank, 3 ranks)::

        y = distir.all_to_all(torch.full((3, 2), rank))   # row j from rank j
        y, got = distir.all_to_all(x, send_counts=[1, 0, 2], return_counts=True)
    """
    _require("all_to_all", x)
    axis = _checked_axis("variable_all_to_all", x, axis)
    size = _group_size(group)
    from distir.ir import builder

    if send_counts is None:
        if x.shape[axis] % size:
            raise _refuse(
                "variable_all_to_all",
                f"axis {axis} has {x.shape[axis]} elements, not a multiple of the group size "
                f"{size}",
            )
        even = [x.shape[axis] // size] * size

        def build(v: Any) -> Any:
            return builder.variable_all_to_all(v, builder.constant_tensor(even), axis=axis)

        program = _program("all_to_all", (axis, size), build, x.dtype, tuple(x.shape), deadline)
        y, received = program.run(x, group=group)
    else:
        sent = _checked_counts("variable_all_to_all", send_counts, group)
        if sum(sent) != x.shape[axis]:
            raise _refuse(
                "variable_all_to_all", f"send counts {list(sent)} sum to {sum(sent)}, but x "
                f"has {x.shape[axis]} rows along axis {axis}",
            )  # fmt: skip

        def build_variable(v: Any, counts: Any) -> Any:
            return builder.variable_all_to_all(v, counts, axis=axis)

        shape: list[int | None] = list(x.shape)
        shape[axis] = None  # ranks send different rows
        program = _program(
            "all_to_all", (axis,), build_variable, x.dtype, tuple(shape), deadline,
            more=(builder.tensor_type("i64", [size]),),
        )  # fmt: skip
        y, received = program.run(x, torch.tensor(sent, dtype=torch.int64), group=group)
    if return_counts:
        return y, [int(c) for c in received.tolist()]
    return y


def pvary(x: torch.Tensor, *, group: Any = None, deadline: float = 60.0) -> torch.Tensor:
    """Megatron's `f`: `x` unchanged (a new tensor), for use where each rank
    of `group` (default: the world) goes on with its own computation.
    Differentiable: the gradient of `x` is the sum over the group's ranks
    of the result's cotangent, so a value every rank holds a copy of (a
    replicated activation or parameter) gets its whole gradient on every
    rank.

    Args:
        x: this rank's tensor (CPU for gloo), replicated over the group.
        group: a torch.distributed process group (None: the world).
        deadline: seconds every collective of the run may take.

    Example (on every rank)::

        h = distir.pvary(x)                 # x replicated
        y_mine = h @ w_columns_mine         # column-parallel
    """
    _require("pvary", x)
    from distir.ir import builder

    def build(v: Any) -> Any:
        return builder.pvary(v)

    return _run("pvary", x, (), build, group, deadline)


def psum(x: torch.Tensor, *, group: Any = None, deadline: float = 60.0) -> torch.Tensor:
    """Megatron's `g`: the sum of every rank's `x` over `group` (default: the
    world), one value replicated on every rank. Differentiable: the
    gradient of `x` is the result's cotangent, unchanged, which must be the
    same on every rank (it is when every rank computes the same loss from
    the result); ranks that pass different ones get a named error.

    Args:
        x: this rank's tensor (CPU for gloo), the same dtype and shape on
            every rank.
        group: a torch.distributed process group (None: the world).
        deadline: seconds every collective of the run may take.

    Example (on every rank)::

        y = distir.psum(torch.relu(h @ w1_mine) @ w2_mine)   # row-parallel
        loss = ((y - target) ** 2).mean()    # the same on every rank
    """
    _require("psum", x)
    from distir.ir import builder

    def build(v: Any) -> Any:
        return builder.psum(v)

    return _run("psum", x, (), build, group, deadline)
