"""What must hold of an op's inputs before any rank enters its payload.

Checks here look only at local data, so a mistake visible on one rank is
reported there, naming the op. A collective's *precondition* also lists the
values every rank of its group must agree on (a root, counts, moduli, the
layout of a dynamically shaped operand, a combine's extra operands): ranks
exchange a digest of them, with an "accepted" flag, before the payload, so a
disagreement is an error naming the op on every rank instead of a hang or
silent garbage. The Torch backend and the reference interpreter evaluate the
same preconditions (each op's is in its semantics record), so the reference
rejects what the runtime rejects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from distir.core.dtypes import fits_shape
from distir.core.invocation import Invocation
from distir.errors import CollectiveMismatchError, OpError
from distir.ir.modular import MAX_MODULUS_EXCLUSIVE


def fail(invocation: Invocation, message: str) -> OpError:
    return OpError(invocation.description, message)


# Local checks -----------------------------------------------------------------


#: how an error names the rank in each property an op may name one in
RANK_PROPERTIES = {"root": "root", "dest": "destination", "source": "source"}


def check_group_rank(invocation: Invocation, name: str, rank: int, size: int) -> int:
    """`rank`, after checking that the rank named by property `name` (a root
    or a peer, see RANK_PROPERTIES) is a rank of the group at run time. The
    IR's half of the rule is `GroupMemberOp.verify_static_rank`."""
    if not 0 <= rank < size:
        raise fail(invocation, f"{RANK_PROPERTIES[name]} {rank} is outside the group (size {size})")
    return rank


def named_rank(invocation: Invocation, name: str, dynamic: list[torch.Tensor], size: int) -> int:
    """The rank in property `name` or, when the IR leaves it dynamic, the
    next index operand of `dynamic` (consumed), checked by check_group_rank."""
    rank = invocation.properties.get(name)
    return check_group_rank(invocation, name, int(dynamic.pop(0)) if rank is None else rank, size)


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
    if not fits_shape(declared, value.shape):
        shown = "x".join("?" if d is None else str(d) for d in declared)
        raise fail(
            invocation,
            f"result #{index} has shape {list(value.shape)}, but its type declares "
            f"tensor<{shown}x...>",
        )


# Ciphertext validity: its one home. An RNS ciphertext is int64 limbs of shape
# [..., L, N] with limb l reduced modulo q_l (0 <= limb < q_l), and the moduli
# an int64 tensor of shape [L] with every 2 <= q_l < 2^62 (so that the sum of
# two reduced limbs cannot overflow int64). The op checks here, the RNS
# arithmetic (`distir.he.rns`) and the SEAL interop all ask these functions.


def moduli_problem(moduli: torch.Tensor) -> str | None:
    """Why `moduli` is not a valid RNS basis, or None."""
    if moduli.dtype != torch.int64:
        return f"moduli must have dtype torch.int64, got {moduli.dtype}"
    if moduli.dim() != 1:
        return f"moduli must have rank 1 (shape [L]), got shape {list(moduli.shape)}"
    if moduli.numel() and bool(((moduli < 2) | (moduli >= MAX_MODULUS_EXCLUSIVE)).any()):
        bad = (moduli < 2) | (moduli >= MAX_MODULUS_EXCLUSIVE)
        index = int(bad.nonzero()[0, 0])
        value = int(moduli[index])
        return (
            f"modulus q[{index}] = {value} is outside [2, 2^62): every modulus q_{index} = "
            f"{value} must satisfy 2 <= q < 2**62 (= {MAX_MODULUS_EXCLUSIVE}) so that a + b "
            "cannot overflow int64"
        )
    return None


def limb_layout_problem(
    limbs: torch.Tensor, moduli: torch.Tensor, what: str = "ciphertext"
) -> str | None:
    """Why `limbs` cannot be limbs modulo `moduli` by dtype or shape, or None."""
    if limbs.dtype != torch.int64:
        return f"{what} limbs must have dtype torch.int64, got {limbs.dtype}"
    if limbs.dim() < 2 or limbs.shape[-2] != moduli.shape[0]:
        return (
            f"{what} must have shape [..., L, N] with L = {moduli.shape[0]} "
            f"(one limb per modulus, on dimension -2), got shape {list(limbs.shape)}"
        )
    return None


def unreduced_limb_problem(limbs: torch.Tensor, moduli: torch.Tensor) -> str | None:
    """Where a limb of `limbs` is not reduced modulo its modulus, or None
    (`limbs` and `moduli` valid by `limb_layout_problem` and `moduli_problem`)."""
    if not limbs.numel() or _limbs_in_range(limbs, moduli):
        return None
    # Slow path, only to say where: full-size masks locate the first bad limb.
    q_col = moduli.to(limbs.device).view(-1, 1)
    bad = (limbs < 0) | (limbs >= q_col)
    index = tuple(int(i) for i in bad.nonzero()[0].tolist())
    limb, value, modulus = index[-2], int(limbs[index]), int(moduli[index[-2]])
    return (
        f"limb value {value} at index {index} is not reduced modulo q[{limb}] = {modulus}: "
        f"limb {limb} must lie in [0, q_{limb}) (inputs must satisfy 0 <= limb < q)"
    )


def ciphertext_problem(
    limbs: torch.Tensor, moduli: torch.Tensor, what: str = "ciphertext"
) -> str | None:
    """Why (`limbs`, `moduli`) is not a valid, reduced RNS ciphertext, or None."""
    return (
        moduli_problem(moduli)
        or limb_layout_problem(limbs, moduli, what)
        or unreduced_limb_problem(limbs, moduli)
    )


def check_ciphertext(description: str, ciphertext: torch.Tensor, moduli: torch.Tensor) -> int:
    """Checks limbs are reduced and moduli valid (an `OpError` naming the op
    `description` otherwise); returns q_max."""
    problem = ciphertext_problem(ciphertext, moduli)
    if problem is not None:
        raise OpError(description, problem)
    return int(moduli.max()) if moduli.numel() else 0


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


# What ranks agree on ------------------------------------------------------------


def digest_of(*parts: bytes) -> int:
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return int.from_bytes(h.digest(), "little") >> 1  # 63 bits: fits an int64 row


def describe_layout(x: torch.Tensor, skip_axis: int | None = None) -> str:
    """`int64[4, *]`: dtype and shape, the axis whose size may differ masked."""
    dims = ["*" if d == skip_axis else str(s) for d, s in enumerate(x.shape)]
    return f"{str(x.dtype).replace('torch.', '')}[{', '.join(dims)}]"


def _describe_values(x: torch.Tensor, limit: int = 4) -> str:
    flat = x.detach().reshape(-1)
    shown = ", ".join(str(v) for v in flat[:limit].cpu().tolist())
    more = f", ... ({flat.numel()} values)" if flat.numel() > limit else ""
    return f"[{shown}{more}]" if x.dim() else shown


def tensor_digest(x: torch.Tensor) -> int:
    """A 63-bit digest of a tensor's dtype, shape and values."""
    data = x.detach().contiguous().cpu().reshape(-1)
    raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
    return digest_of(str(x.dtype).encode(), repr(tuple(x.shape)).encode(), raw)


@dataclass(frozen=True)
class Agreed:
    """One thing every rank of the group must agree on: what it is, how it
    reads in an error, and its digest."""

    what: str
    shown: str
    digest: int

    @classmethod
    def value(cls, what: str, value: Any) -> Agreed:
        shown = str(value)
        return cls(what, shown, digest_of(shown.encode()))

    @classmethod
    def tensor(cls, what: str, x: torch.Tensor) -> Agreed:
        return cls(what, _describe_values(x), tensor_digest(x))

    @classmethod
    def layout(cls, what: str, x: torch.Tensor, skip_axis: int | None = None) -> Agreed:
        return cls.value(what, describe_layout(x, skip_axis))


@dataclass
class Precondition:
    """The outcome of an op's local checks on one rank: its error (if the
    rank rejects its inputs), the values every rank must agree on, and what
    the checks decoded for the implementation to reuse (a root, counts)."""

    error: OpError | None = None
    agreed: list[Agreed] = field(default_factory=list)
    decoded: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    def digest(self) -> int:
        return digest_of(*(f"{a.what}:{a.digest}".encode() for a in self.agreed))

    def report(self) -> dict[str, Any]:
        """What a rank tells the others when the digests disagree."""
        return {
            "error": None if self.error is None else str(self.error),
            "agreed": [(a.what, a.shown, a.digest) for a in self.agreed],
        }


def disagreement(group: str, reports: Sequence[dict | None]) -> str:
    """Why the preconditions of one op differ between ranks, in words."""
    rejected = [r for r, rep in enumerate(reports) if rep is not None and rep["error"]]
    if rejected:
        return (
            f"rank(s) {rejected} of group {group} rejected their inputs for this "
            "collective (their own error says why), so no rank sends its payload"
        )
    known = [rep for rep in reports if rep is not None]
    if not known:
        return f"ranks of group {group} disagree on this collective's inputs"
    lines = []
    for index, (what, _shown, _digest) in enumerate(known[0]["agreed"]):
        items = [rep["agreed"][index] if index < len(rep["agreed"]) else None for rep in known]
        if len({item[2] if item else None for item in items}) > 1:
            shown = "; ".join(
                f"rank {r}: {rep['agreed'][index][1] if index < len(rep['agreed']) else '?'}"
                for r, rep in enumerate(reports)
                if rep is not None
            )
            lines.append(f"ranks pass different {what} ({shown})")
    return "; ".join(lines) or f"ranks of group {group} disagree on this collective's inputs"


def mismatch(description: str, group: str, reports: Sequence[dict | None]) -> Exception:
    return CollectiveMismatchError(description, disagreement(group, reports))


# Evaluating a precondition ---------------------------------------------------------

#: (invocation, inputs, group size, group rank) -> Precondition: each op's rule
#: lives in its semantics record (`distir.core.semantics`)
PreconditionRule = Callable[[Invocation, Sequence[torch.Tensor], int, int], Precondition]


def evaluate(
    rule: PreconditionRule, invocation: Invocation, inputs: Sequence[torch.Tensor],
    size: int, rank: int,
) -> Precondition:
    """Runs a rule; a local check that fails becomes the precondition's error
    (the rank still takes part in the exchange, so its peers learn of it)."""
    try:
        return rule(invocation, inputs, size, rank)
    except OpError as e:
        return Precondition(error=e)
