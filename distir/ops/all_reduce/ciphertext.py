"""The ciphertext all-reduce op: the per-limb modular sum of RNS ciphertexts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    IntegerAttr,
    StringAttr,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import (
    CollectiveEffect,
)
from distir.ir.collectives import CollectiveOp, verify_same_type
from distir.ir.facts import (
    EveryRankEnters,
    OperandRole,
    UniformResults,
)
from distir.ir.syntax import (
    GroupRef,
    SharedType,
)
from distir.ops.groups.ir import GroupName, group_property

###############################################################################
# The ciphertext all-reduce
###############################################################################


@irdl_op_definition
class AllReduceAddCiphertextOp(CollectiveOp):
    """Homomorphic sum of RNS ciphertexts: `y[..., l, :] = (Σ_r x_r[..., l, :]) mod q_l`.

    `x` has shape `[..., L, N]` with i64 limbs (L RNS limbs of N
    coefficients), `moduli` has shape `[L]`; inputs must already be reduced
    (`0 <= limb < q_l`). `modulus_basis` names the RNS basis the limbs live in
    (SEAL's and OpenFHE's "Q" by default). `max_modulus_bits`, when given,
    declares that every modulus is below `2^max_modulus_bits`, a fact passes
    may use to prove that deferred reduction is exact.
    """

    name = "dist.all_reduce_add_ciphertext"

    traits = traits_def(CollectiveEffect(), EveryRankEnters(), UniformResults())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.LIMBS,
        "moduli": OperandRole.MODULI,
    }

    input = operand_def(TensorType)
    moduli = operand_def(TensorType)
    modulus_basis = prop_def(StringAttr, default_value=StringAttr("Q"))
    max_modulus_bits = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input `,` $moduli (`basis` $modulus_basis^)? "
        "(`max_modulus_bits` $max_modulus_bits^)? custom<GroupRef>($group) attr-dict "
        "`:` custom<SharedType>(type($input), type($result)) `,` type($moduli)"
    )
    custom_directives = (GroupRef, SharedType)

    def __init__(
        self,
        input: SSAValue | Operation,
        moduli: SSAValue | Operation,
        *,
        modulus_basis: str = "Q",
        max_modulus_bits: int | None = None,
        group: GroupName = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {}
        # The default basis is left implicit, as the parser leaves it.
        if modulus_basis != "Q":
            props["modulus_basis"] = StringAttr(modulus_basis)
        if max_modulus_bits is not None:
            props["max_modulus_bits"] = IntegerAttr(max_modulus_bits, i64)
        group_property(props, group)
        super().__init__(
            operands=[input, SSAValue.get(moduli)],
            result_types=[input.type],
            properties=props,
        )

    def verify_(self) -> None:
        self.verify_group()
        ct, mod = self.input.type, self.moduli.type
        assert isinstance(ct, TensorType) and isinstance(mod, TensorType)
        if ct.element_type != i64:
            raise VerifyException(
                f"'dist.all_reduce_add_ciphertext' limbs must be i64, got {ct.element_type}"
            )
        if mod.element_type != i64:
            raise VerifyException(
                f"'dist.all_reduce_add_ciphertext' moduli must be i64, got {mod.element_type}"
            )
        if ct.get_num_dims() < 2:
            raise VerifyException(
                "'dist.all_reduce_add_ciphertext' ciphertext must have rank >= 2 "
                f"([..., L, N]), got {ct}"
            )
        if mod.get_num_dims() != 1:
            raise VerifyException(
                f"'dist.all_reduce_add_ciphertext' moduli must have rank 1 ([L]), got {mod}"
            )
        limbs, n_moduli = ct.get_shape()[-2], mod.get_shape()[0]
        if limbs >= 0 and n_moduli >= 0 and limbs != n_moduli:
            raise VerifyException(
                f"'dist.all_reduce_add_ciphertext' has {n_moduli} moduli for "
                f"{limbs} limbs (dimension -2 of {ct})"
            )
        verify_same_type(self, "ciphertext", self.result.type, ct)
        if self.max_modulus_bits is not None:
            bits = self.max_modulus_bits.value.data
            if not 2 <= bits <= 62:
                raise VerifyException(
                    "'dist.all_reduce_add_ciphertext' max_modulus_bits must be in "
                    f"[2, 62], got {bits}"
                )
