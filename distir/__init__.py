"""distir: a compiler and runtime for distributed tensor communication.

    import distir
    program = distir.compile("examples/all_reduce.mlir", pipeline="canonicalize")
    results = distir.simulate(program, [[x0], [x1]])      # reference, one process
    distir.launch(worker, nproc=4)                         # real gloo ranks
    y = distir.all_reduce(x, "sum")                        # one collective, on a rank
    y = distir.all_gather(x, axis=0)                       # also broadcast, reduce_scatter,
    y = distir.shift(x, 1, rotate=True)                    # reduce, gather, scatter, all_to_all
    h = distir.pvary(x); y = distir.psum(h @ w)            # Megatron's f and g
    distir.recover()                 # after a lost rank: agree on who is left, go on
    distir.grow(state)               # members: admit waiting joiners, send them state
    distir.join(state)               # a replacement: join the running job, get state

Attributes load lazily, so that `distir-opt` and other IR-only tools do not
import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distir.runtime.eager import (
        all_gather,
        all_reduce,
        all_to_all,
        broadcast,
        gather,
        psum,
        pvary,
        reduce,
        reduce_scatter,
        scatter,
        shift,
    )
    from distir.runtime.elastic import grow, join, join_requests
    from distir.runtime.elastic_shards import Shard, ShardedState
    from distir.runtime.launch import launch
    from distir.runtime.membership import Membership, membership, recover
    from distir.runtime.program import Program, compile, simulate

__all__ = [
    "Membership",
    "Program",
    "Shard",
    "ShardedState",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "compile",
    "gather",
    "grow",
    "join",
    "join_requests",
    "launch",
    "membership",
    "psum",
    "pvary",
    "recover",
    "reduce",
    "reduce_scatter",
    "scatter",
    "shift",
    "simulate",
]


def __getattr__(name: str) -> Any:
    if name in ("Program", "compile", "simulate"):
        from distir.runtime import program

        return getattr(program, name)
    if name in (
        "all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce", "gather", "scatter",
        "shift", "pvary", "psum", "all_to_all",
    ):  # fmt: skip
        from distir.runtime import eager

        return getattr(eager, name)
    if name in ("Membership", "membership", "recover"):
        from distir.runtime import membership

        return getattr(membership, name)
    if name in ("grow", "join", "join_requests"):
        from distir.runtime import elastic

        return getattr(elastic, name)
    if name in ("Shard", "ShardedState"):
        from distir.runtime import elastic_shards

        return getattr(elastic_shards, name)
    if name == "launch":
        from distir.runtime.launch import launch

        return launch
    if name == "errors":
        import distir.errors as errors

        return errors
    raise AttributeError(f"module 'distir' has no attribute {name!r}")
