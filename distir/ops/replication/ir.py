"""`dist.pvary` and `dist.psum`: replication, as autodiff sees it.

A value is *replicated* over a group when it is one value that every rank
of the group holds a copy of (a bias every tensor-parallel rank keeps, the
output of the row-parallel layer's sum); it is *varying* when each rank's
copy is that rank's own (its shard of a weight, its partial product).
Gradients are those of the sum over ranks of every rank's objective, in
which a replicated value counts once (see `passes/vjp.py`). The two ops
turn one kind into the other, as JAX's `pvary` and `psum` do in
`shard_map`, and are Megatron-LM's `f` and `g`:

- `dist.pvary x` (f): identity forward; `x` is replicated and the result
  varying, so x's gradient is the *sum* over ranks of the result's
  cotangent (its transpose is a psum);
- `dist.psum x` (g): the sum of every rank's `x` forward, a replicated
  result, so x's gradient is the result's one cotangent, unchanged (its
  transpose is a pvary: the identity).

`dist.all_reduce sum` stays what it was: a sum whose result is varying
(psum then pvary), whose transpose is therefore another sum.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    result_def,
    traits_def,
)

from distir.ir.attributes import CollectiveEffect
from distir.ir.collectives import CollectiveOp
from distir.ir.facts import EveryRankEnters, OperandRole, UniformResults
from distir.ir.syntax import GroupRef
from distir.ir.transpose import Cotangents, Transposable, Transposer
from distir.ops.groups.ir import GroupName, group_property


class _ReplicationOp(CollectiveOp, Transposable):
    """One tensor in, one of the same type out, on a group."""

    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    result = result_def(T)

    assembly_format = "$input custom<GroupRef>($group) attr-dict `:` type($input)"
    custom_directives = (GroupRef,)

    def __init__(self, input: SSAValue | Operation, group: GroupName = None):
        value = SSAValue.get(input)
        props: dict[str, Attribute] = {}
        group_property(props, group)
        super().__init__(operands=[value], result_types=[value.type], properties=props)

    def verify_(self) -> None:
        self.verify_group()


@irdl_op_definition
class PvaryOp(_ReplicationOp):
    """Megatron's `f`: `y = x` on every rank, `x` replicated over the group
    and `y` varying; the gradient of `x` is the sum over the group's ranks
    of the cotangent of `y`.

    `%y = dist.pvary %x : tensor<4xf32>`. It moves nothing forward, and
    counts as a collective (every rank enters it, in order) because its
    backward is one. Its input must be replicated: every rank passes the
    same value (checked with the run's agreement, as `dist.assert_uniform`
    is), since a per-rank value's gradient is its own cotangent, not the
    sum this op sends back.
    """

    name = "dist.pvary"

    traits = traits_def(CollectiveEffect(), EveryRankEnters())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.UNIFORM}
    SUMS_COTANGENT: ClassVar[bool] = True

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """psum: the sum over ranks of the cotangent (a native sum all-reduce)."""
        (ct,) = cotangents
        assert ct is not None
        return [t.all_reduce_sum(ct, self.group)]


@irdl_op_definition
class PsumOp(_ReplicationOp):
    """Megatron's `g`: `y = x_0 + x_1 + … + x_{P-1}` (summed as the sum
    all-reduce does), `y` replicated over the group; the gradient of every
    rank's `x` is the cotangent of `y`, unchanged.

    `%y = dist.psum %x group @tp : tensor<4xf32>`.
    """

    name = "dist.psum"

    traits = traits_def(CollectiveEffect(), EveryRankEnters(), UniformResults())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.PAYLOAD}
    REPLICATED_RESULT: ClassVar[bool] = True

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """pvary: the replicated result's one cotangent, on every rank."""
        (ct,) = cotangents
        return [ct]
