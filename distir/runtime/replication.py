"""Megatron's `f` and `g` without writing a program: `distir.pvary(x)` and
`distir.psum(x)`, the eager forms of `dist.pvary` and `dist.psum`
(`distir.ir.replication` states their meaning and transposes).

    h = distir.pvary(layer_norm(x))          # f: identity, gradient summed
    y = distir.psum(torch.relu(h @ w1) @ w2) # g: sum, gradient passed on

Each runs a one-op program through the eager cache (`runtime.eager`), so
its backward is that program's backward: pvary's a sum all-reduce, psum's
the identity after checking that every rank passes the same cotangent (the
result is one replicated value; a loss every rank computes alike from it
gives every rank the same cotangent).
"""

from __future__ import annotations

from typing import Any

import torch

from distir.runtime.eager import _require, _run


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
