"""The builder helpers of the all-reduces."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.ir import SSAValue

from distir.ir.attributes import ReductionKind
from distir.ir.building import (
    Body,
    GroupRef,
    Value,
    located,
    native_kind,
)
from distir.ops.all_reduce.ciphertext import AllReduceAddCiphertextOp
from distir.ops.all_reduce.ir import AllReduceOp
from distir.ops.wave.build import make_combine_region


@located
def all_reduce(
    x: Value,
    kind: ReductionKind | str | None = None,
    *,
    combine: Body | None = None,
    extras: Sequence[Value] = (),
    commutative: bool = False,
    group: GroupRef = None,
) -> SSAValue:
    """Native (`kind`: "sum", "max", ...) or generic (`combine` callback on
    `(lhs, rhs, *extras)`) all-reduce."""
    if (kind is None) == (combine is None):
        raise ValueError("all_reduce needs exactly one of `kind` and `combine`")
    if kind is not None:
        return AllReduceOp(
            x, kind=native_kind(kind, "or pass combine= for your own"), group=group
        ).result
    assert combine is not None
    x_type = SSAValue.get(x).type
    region = make_combine_region([x_type, x_type, *(SSAValue.get(e).type for e in extras)], combine)
    return AllReduceOp(
        x, combine=region, extras=extras, commutative=commutative, group=group
    ).result


@located
def all_reduce_add_ciphertext(
    ciphertext: Value,
    moduli: Value,
    *,
    modulus_basis: str = "Q",
    max_modulus_bits: int | None = None,
    group: GroupRef = None,
) -> SSAValue:
    """The per-limb modular sum of RNS ciphertexts `[..., L, N]` with moduli `[L]`."""
    return AllReduceAddCiphertextOp(
        ciphertext,
        moduli,
        modulus_basis=modulus_basis,
        max_modulus_bits=max_modulus_bits,
        group=group,
    ).result
