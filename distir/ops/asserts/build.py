"""The builder helpers of the assertions."""

from __future__ import annotations

from distir.ir.building import (
    GroupRef,
    Value,
    located,
)
from distir.ops.asserts.ir import AssertReducedOp, AssertUniformOp


@located
def assert_reduced(limbs: Value, moduli: Value, *, max_modulus_bits: int | None = None) -> None:
    """The local check that every limb is reduced modulo its modulus."""
    AssertReducedOp(limbs, moduli, max_modulus_bits)


@located
def assert_uniform(x: Value, *, group: GroupRef = None) -> None:
    """The collective check that every rank of the group passes the same `x`."""
    AssertUniformOp(x, group)
