"""Checks every backend runs before a rank enters a collective.

They look only at local data, so a mistake visible on one rank is reported
there, naming the op, instead of desynchronising the group.
"""

from __future__ import annotations

import torch

from distir.errors import OpError
from distir.interpreters.invocation import Invocation

INT64_MAX = (1 << 63) - 1


def fail(invocation: Invocation, message: str) -> OpError:
    return OpError(invocation.description, message)


def check_root(invocation: Invocation, root: int, size: int) -> None:
    if not 0 <= root < size:
        raise fail(invocation, f"root {root} is outside the group (size {size})")


def check_peer(invocation: Invocation, what: str, peer: int, size: int) -> None:
    if not 0 <= peer < size:
        raise fail(invocation, f"{what} {peer} is outside the group (size {size})")


def check_counts(
    invocation: Invocation, what: str, counts: torch.Tensor, size: int
) -> list[int]:
    """Counts as Python ints, after checking rank-1, length P and >= 0."""
    if counts.dtype.is_floating_point or counts.dim() != 1:
        raise fail(invocation, f"{what} must be a rank-1 integer tensor, got {counts.dtype} "
                   f"of shape {list(counts.shape)}")
    if counts.numel() != size:
        raise fail(invocation, f"{what} has {counts.numel()} entries for a group of size {size}")
    values = [int(c) for c in counts.tolist()]
    negative = [i for i, c in enumerate(values) if c < 0]
    if negative:
        raise fail(invocation, f"{what}[{negative[0]}] = {values[negative[0]]} is negative")
    return values


def check_axis_rows(
    invocation: Invocation, x: torch.Tensor, axis: int, expected: int, what: str
) -> None:
    if x.dim() <= axis:
        raise fail(invocation, f"input of rank {x.dim()} has no axis {axis}")
    if x.shape[axis] != expected:
        raise fail(
            invocation,
            f"input has {x.shape[axis]} rows on axis {axis} but {what} says {expected}",
        )


def check_result_shape(invocation: Invocation, index: int, value: torch.Tensor) -> None:
    """Results must have the static dims their IR type declares."""
    declared = invocation.result_shapes[index]
    if len(declared) != value.dim() or any(
        d is not None and d != s for d, s in zip(declared, value.shape)
    ):
        shown = "x".join("?" if d is None else str(d) for d in declared)
        raise fail(
            invocation,
            f"result #{index} has shape {list(value.shape)}, but its type declares "
            f"tensor<{shown}x...>",
        )


def check_ciphertext(
    invocation: Invocation, ciphertext: torch.Tensor, moduli: torch.Tensor
) -> int:
    """Checks limbs are reduced and moduli valid; returns q_max."""
    if ciphertext.dtype != torch.int64 or moduli.dtype != torch.int64:
        raise fail(invocation, f"limbs and moduli must be int64, got {ciphertext.dtype} "
                   f"and {moduli.dtype}")
    if moduli.dim() != 1 or ciphertext.dim() < 2 or ciphertext.shape[-2] != moduli.shape[0]:
        raise fail(invocation, f"{moduli.numel()} moduli do not match ciphertext shape "
                   f"{list(ciphertext.shape)} (limbs on dimension -2)")
    q = moduli.tolist()
    for limb, qi in enumerate(q):
        if not 2 <= qi < (1 << 62):
            raise fail(invocation, f"modulus q[{limb}] = {qi} is outside [2, 2^62)")
    if ciphertext.numel() and not _limbs_in_range(ciphertext, moduli):
        # Slow path, only to say where: full-size masks locate the first bad limb.
        q_col = moduli.view(-1, 1)
        bad = (ciphertext < 0) | (ciphertext >= q_col)
        index = tuple(int(i) for i in bad.nonzero()[0].tolist())
        limb = index[-2]
        raise fail(
            invocation,
            f"limb value {int(ciphertext[index])} at index {list(index)} is not reduced "
            f"modulo q[{limb}] = {q[limb]} (inputs must satisfy 0 <= limb < q)",
        )
    return max(q)


def _limbs_in_range(ciphertext: torch.Tensor, moduli: torch.Tensor) -> bool:
    """One streaming pass: a min and max per row of N coefficients."""
    rows = ciphertext.reshape(-1, ciphertext.shape[-1])
    if rows.shape[0] <= 256 and rows.is_contiguous():
        # A global min-max per row reads memory about twice as fast as
        # aminmax along a dimension.
        bounds = [torch.aminmax(row) for row in rows]
        low = torch.stack([b.min for b in bounds])
        high = torch.stack([b.max for b in bounds])
    else:
        low, high = torch.aminmax(rows, dim=1)
    q_rows = moduli.to(ciphertext.device).repeat(rows.shape[0] // moduli.numel())
    return not bool(((low < 0) | (high >= q_rows)).any())


def deferred_sum_is_exact(group_size: int, q_max: int) -> bool:
    """P·(q_max − 1) ≤ 2^63 − 1: an int64 sum of reduced limbs cannot overflow."""
    return group_size * (q_max - 1) <= INT64_MAX


def check_group_assumption(invocation: Invocation, size: int) -> None:
    """A pass proved this op exact only up to some group size: hold it to that."""
    limit = invocation.properties.get("assumed_max_group_size")
    if limit is not None and size > limit:
        raise fail(
            invocation,
            f"this reduction was proved exact for groups of at most {limit} ranks "
            f"(defer-modular-reduction{{max-group-size={limit}}}) but the group has {size}; "
            "its int64 sum could overflow. Recompile with a larger max-group-size or "
            "without defer-modular-reduction",
        )
