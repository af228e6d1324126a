"""One collective without writing a program: `distir.all_reduce(x, ...)`.

    y = distir.all_reduce(x, "sum")                                  # native
    y = distir.all_reduce(x, combine=abs_max, commutative=True)      # custom

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
from collections.abc import Callable
from typing import Any

import torch

from distir.errors import DistirError
from distir.runtime.program import Program, compile

#: torch dtype -> IR element type of what `all_reduce` accepts
_ELEMENTS: dict[torch.dtype, str] = {
    torch.bool: "i1",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float16: "f16",
    torch.float32: "f32",
    torch.float64: "f64",
}

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
    shape: tuple[int, ...],
    deadline: float,
) -> Program:
    """The one-op program `build(x)` of `distir.<op>` for a tensor of `dtype`
    and `shape`, compiled on first use and cached under `(op, params, ...)`:
    `params` must name everything `build` depends on."""
    from distir.ir import builder

    # The op is located at the caller's line (errors found later point
    # there), so the call site is part of what a cached program is.
    builder.located_at_callers_of(__file__)
    site = builder.call_site()
    key = (op, params, dtype, shape, deadline, str(site))
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
    module = builder.build_program(build, [builder.tensor_type(element, list(shape))])
    program = compile(module, deadline=deadline)
    with _lock:
        _cache[key] = program
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return program


def _run(
    op: str,
    x: torch.Tensor,
    params: tuple,
    build: Callable[[Any], Any],
    group: Any,
    deadline: float,
) -> torch.Tensor:
    """Check what every eager collective needs, then run `build`'s program."""
    if not isinstance(x, torch.Tensor):
        raise DistirError(f"distir.{op} takes a torch.Tensor, got {type(x).__name__}")
    import torch.distributed as dist

    if not dist.is_initialized():
        raise DistirError(
            f"distir.{op} needs an initialised process group: inside distir.launch "
            "it is; under torchrun call torch.distributed.init_process_group('gloo') first"
        )
    program = _program(op, params, build, x.dtype, tuple(x.shape), deadline)
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
    from distir.ir import builder

    def build(v: Any) -> Any:
        if combine is None:
            return builder.all_reduce(v, kind)
        return builder.all_reduce(v, combine=combine, commutative=commutative)

    return _run("all_reduce", x, (kind, combine, commutative), build, group, deadline)
