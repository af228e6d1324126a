"""The assertion ops: `assert_reduced` (a local check, no communication) and
`assert_uniform` (every rank of the group passes the same value)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    IntegerAttr,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    traits_def,
)
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import (
    CollectiveEffect,
    RaisesEffect,
)
from distir.ir.collectives import CollectiveOp
from distir.ir.facts import (
    EveryRankEnters,
    LocalCheck,
    OperandRole,
)
from distir.ir.syntax import (
    GroupRef,
)
from distir.ir.transpose import Cotangents, Transposable, Transposer
from distir.ops.groups.ir import GroupName, group_property


@irdl_op_definition
class AssertReducedOp(IRDLOperation):
    """Fails, naming this op, unless every limb is reduced: `2 <= q_l < 2^62`
    and `0 <= x[..., l, :] < q_l`. Lowerings of the ciphertext all-reduce
    emit it, so a lowered program rejects bad limbs as the op itself does
    instead of summing them into a silently wrong result. With
    `max_modulus_bits b` it also checks the bound a pass relied on: every
    `q_l < 2^b`."""

    name = "dist.assert_reduced"

    input = operand_def(TensorType)
    moduli = operand_def(TensorType)
    max_modulus_bits = opt_prop_def(IntegerAttr[I64])

    traits = traits_def(RaisesEffect(), LocalCheck())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.LIMBS,
        "moduli": OperandRole.MODULI,
    }

    assembly_format = (
        "$input `,` $moduli (`max_modulus_bits` $max_modulus_bits^)? attr-dict "
        "`:` type($input) `,` type($moduli)"
    )

    def __init__(
        self,
        input: SSAValue | Operation,
        moduli: SSAValue | Operation,
        max_modulus_bits: int | None = None,
    ):
        props = {}
        if max_modulus_bits is not None:
            props["max_modulus_bits"] = IntegerAttr(max_modulus_bits, i64)
        super().__init__(operands=[SSAValue.get(input), SSAValue.get(moduli)], properties=props)

    def verify_(self) -> None:
        ct, mod = self.input.type, self.moduli.type
        assert isinstance(ct, TensorType) and isinstance(mod, TensorType)
        if ct.element_type != i64 or mod.element_type != i64:
            raise VerifyException("'dist.assert_reduced' limbs and moduli must be i64")
        if ct.get_num_dims() < 2 or mod.get_num_dims() != 1:
            raise VerifyException("'dist.assert_reduced' takes limbs [..., L, N] and moduli [L]")


@irdl_op_definition
class AssertUniformOp(CollectiveOp, Transposable):
    """Fails on every rank of the group, naming this op, unless every rank
    passes the same value of `x` (same dtype, shape and elements). Lowerings
    that turn an operand a collective had to agree on into a local one emit
    it (`defer-modular-reduction` keeps the moduli agreed this way), so no
    lowering loses a check the original op had. Ranks compare a digest of
    `x`, at the start of the run when `x` is an entry argument."""

    name = "dist.assert_uniform"

    input = operand_def(TensorType)

    traits = traits_def(CollectiveEffect(), EveryRankEnters())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.UNIFORM}

    assembly_format = "$input custom<GroupRef>($group) attr-dict `:` type($input)"
    custom_directives = (GroupRef,)

    def __init__(self, input: SSAValue | Operation, group: GroupName = None):
        props: dict[str, Attribute] = {}
        group_property(props, group)
        super().__init__(operands=[SSAValue.get(input)], properties=props)

    def verify_(self) -> None:
        self.verify_group()

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        return [None]  # a check: no result, no gradient


def uniform_check(value: SSAValue, group: GroupName) -> AssertUniformOp:
    """The check that `value` is equal on every rank of `group` (what the
    vjp pass emits for the cotangent of a replicated result)."""
    return AssertUniformOp(value, group)
