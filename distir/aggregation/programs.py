"""The distir programs of the threshold protocol, compiled once per shape.

Every exchange of :mod:`distir.aggregation.threshold` is one of these, run
with :meth:`distir.Program.run` on the caller's group: every collective is
bounded by the deadline and a failed or late rank ends as distir's named
error on every rank (``DeadlineExceeded``, ``CollectiveFailed``,
``Poisoned``), with nothing returned.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

import distir

__all__ = [
    "agree_max",
    "exchange",
    "gather_and_sum",
    "gather_committed",
    "gather_limbs",
    "gather_rows",
]


def _ty(shape: tuple[int, ...]) -> str:
    return "tensor<" + "x".join(str(d) for d in shape) + "xi64>"


@lru_cache(maxsize=32)
def _compiled(text: str, deadline_s: float) -> Any:
    return distir.compile(text, "", deadline=deadline_s)


def agree_max(words: Tensor, *, group: Any, deadline_s: float) -> Tensor:
    """The element-wise maximum of every rank's ``words`` (int64 ``[k]``):
    status codes, and agreement on values (``[v, -v]`` comes back unchanged
    only where every rank passed ``v``)."""
    ty = _ty(tuple(words.shape))
    text = f"""func.func @main(%x: {ty}) -> {ty} {{
  %m = dist.all_reduce max %x : {ty}
  func.return %m : {ty}
}}
"""
    return _compiled(text, deadline_s).run(words, group=group)


def gather_rows(
    rows: Tensor, *, group: Any, deadline_s: float, uniform: Tensor | None = None
) -> Tensor:
    """Every rank's ``rows`` (int64 ``[k]``) concatenated in rank order; with
    ``uniform``, a ``dist.assert_uniform`` first checks that every rank
    passed the same tensor there."""
    ty = _ty(tuple(rows.shape))
    if uniform is None:
        text = f"""func.func @main(%x: {ty}) -> tensor<?xi64> {{
  %g = dist.all_gather %x axis 0 : {ty} -> tensor<?xi64>
  func.return %g : tensor<?xi64>
}}
"""
        return _compiled(text, deadline_s).run(rows, group=group)
    uty = _ty(tuple(uniform.shape))
    text = f"""func.func @main(%x: {ty}, %u: {uty}) -> tensor<?xi64> {{
  dist.assert_uniform %u : {uty}
  %g = dist.all_gather %x axis 0 : {ty} -> tensor<?xi64>
  func.return %g : tensor<?xi64>
}}
"""
    return _compiled(text, deadline_s).run(rows, uniform, group=group)


def gather_and_sum(
    rows: Tensor, limbs: Tensor, moduli: Tensor, *, group: Any, deadline_s: float
) -> tuple[Tensor, Tensor]:
    """``(every rank's rows in rank order, sum_i limbs_i mod q)``: the gather
    runs first (commitments before the sum they commit to)."""
    ty, lty, qty = _ty(tuple(rows.shape)), _ty(tuple(limbs.shape)), _ty(tuple(moduli.shape))
    text = f"""func.func @main(%x: {ty}, %c: {lty}, %q: {qty}) -> (tensor<?xi64>, {lty}) {{
  %g = dist.all_gather %x axis 0 : {ty} -> tensor<?xi64>
  %s = dist.all_reduce_add_ciphertext %c, %q max_modulus_bits 60 : {lty}, {qty}
  func.return %g, %s : tensor<?xi64>, {lty}
}}
"""
    return _compiled(text, deadline_s).run(rows, limbs, moduli, group=group)


def gather_committed(
    rows: Tensor, limbs: Tensor, *, group: Any, deadline_s: float
) -> tuple[Tensor, Tensor]:
    """``(every rank's rows, every rank's limbs)``, each concatenated in rank
    order along axis 0: the commitments (``rows``) travel first, so a
    rank's commitment is sent before any rank's ciphertexts."""
    ty, lty = _ty(tuple(rows.shape)), _ty(tuple(limbs.shape))
    gty = "tensor<?x" + "x".join(str(d) for d in limbs.shape[1:]) + "xi64>"
    text = f"""func.func @main(%x: {ty}, %c: {lty}) -> (tensor<?xi64>, {gty}) {{
  %g = dist.all_gather %x axis 0 : {ty} -> tensor<?xi64>
  %a = dist.all_gather %c axis 0 : {lty} -> {gty}
  func.return %g, %a : tensor<?xi64>, {gty}
}}
"""
    return _compiled(text, deadline_s).run(rows, limbs, group=group)


def gather_limbs(limbs: Tensor, *, group: Any, deadline_s: float) -> Tensor:
    """Every rank's ``limbs`` concatenated in rank order along axis 0 (the
    slices of ciphertexts after :func:`gather_committed`'s first)."""
    lty = _ty(tuple(limbs.shape))
    gty = "tensor<?x" + "x".join(str(d) for d in limbs.shape[1:]) + "xi64>"
    text = f"""func.func @main(%c: {lty}) -> {gty} {{
  %a = dist.all_gather %c axis 0 : {lty} -> {gty}
  func.return %a : {gty}
}}
"""
    return _compiled(text, deadline_s).run(limbs, group=group)


def exchange(words: Tensor, counts: Tensor, *, group: Any, deadline_s: float) -> Tensor:
    """Point to point: ``counts[j]`` consecutive words of ``words`` (int64
    ``[sum(counts)]``) go to rank ``j``; returns what every rank sent this
    one, in rank order (one ``dist.variable_all_to_all``)."""
    cty = _ty(tuple(counts.shape))
    text = f"""func.func @main(%x: tensor<?xi64>, %c: {cty}) -> tensor<?xi64> {{
  %y, %rc = dist.variable_all_to_all %x, %c axis 0 : tensor<?xi64>, {cty} -> tensor<?xi64>
  func.return %y : tensor<?xi64>
}}
"""
    return _compiled(text, deadline_s).run(words, counts, group=group)


def words(data: bytes) -> Tensor:
    """``data`` (a multiple of 8 bytes, possibly none) as int64 words."""
    if not data:  # torch.frombuffer refuses an empty buffer
        return torch.zeros(0, dtype=torch.int64)
    return torch.frombuffer(bytearray(data), dtype=torch.int64).clone()
