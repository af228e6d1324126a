"""Collectives: every rank of the group executes them, in the same order.

broadcast, the ciphertext all-reduce and its local `assert_reduced` check,
all_gather, variable_all_to_all, the `wave` that submits several at once,
and `yield`, which ends a combine region or a wave; `all_reduce` has its
own module (`all_reduce.py`), with the facts about its combine.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from xdsl.dialects import arith, tensor
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    I64,
    IndexType,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
    i64,
)
from xdsl.dialects.utils import AbstractYieldOperation
from xdsl.ir import Attribute, Operation, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_result_def,
)
from xdsl.traits import IsTerminator, OpTrait, Pure
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import (
    CollectiveEffect,
    RaisesEffect,
)
from distir.ir.facts import (
    AgreementRidesWithPayload,
    EveryRankEnters,
    LocalCheck,
    OperandRole,
    UniformResults,
)
from distir.ir.groups import GroupMemberOp, GroupName, RankOp, group_property
from distir.ir.p2p import PeerOp
from distir.ir.syntax import (
    GroupRef,
    SharedType,
    StaticOrDynamicRank,
)
from distir.ir.transpose import Cotangents, NoDerivative, Transposable, Transposer


class CollectiveOp(GroupMemberOp, ABC):
    """A collective: every rank of the group must execute it, in the same order."""

    traits = traits_def(CollectiveEffect(), EveryRankEnters())


def is_integer_tensor(t: Attribute) -> bool:
    return isinstance(t, TensorType) and isinstance(t.element_type, IntegerType)


def verify_same_type(op: IRDLOperation, what: str, got: Attribute, expected: Attribute) -> None:
    if got != expected:
        raise VerifyException(
            f"'{op.name}' result type {got} must equal the {what} type {expected}"
        )


###############################################################################
# Broadcast
###############################################################################


@irdl_op_definition
class BroadcastOp(CollectiveOp, Transposable):
    """`y` on every rank equals `x` of group rank `root`.

    The root is a static attribute (`root 0`) or an index operand (`root %r`)
    whose value must agree across ranks. Non-root ranks' `x` only supplies
    the shape and dtype of the message.
    """

    name = "dist.broadcast"

    traits = traits_def(CollectiveEffect(), EveryRankEnters(), UniformResults())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "root_value": OperandRole.ROOT,
    }

    input = operand_def(TensorType)
    root_value = opt_operand_def(IndexType)
    root = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input `root` custom<StaticOrDynamicRank>($root_value, $root) custom<GroupRef>($group) "
        "attr-dict `:` custom<SharedType>(type($input), type($result))"
    )
    custom_directives = (StaticOrDynamicRank, GroupRef, SharedType)

    def __init__(
        self,
        input: SSAValue | Operation,
        root: int | SSAValue | Operation,
        group: GroupName = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {}
        operands = [input, self.rank_operands(root, "root", props)]
        group_property(props, group)
        super().__init__(operands=operands, result_types=[input.type], properties=props)

    def verify_(self) -> None:
        self.verify_group()
        if (self.root is None) == (self.root_value is None):
            raise VerifyException(
                "'dist.broadcast' needs exactly one root: a static `root N` or an "
                "index operand `root %r`"
            )
        verify_same_type(self, "input", self.result.type, self.input.type)
        if self.root is not None:
            self.verify_static_rank("root", self.root.value.data)

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """The summed cotangent, kept on the root (zeros elsewhere): a sum
        `dist.reduce` to a static root (the sum reaches the root only), an
        all-reduce kept on the root for a dynamic one."""
        (ct,) = cotangents
        assert ct is not None
        if self.root is not None:
            return [t.reduce_sum(ct, self.root.value.data, self.group), None]
        total = t.all_reduce_sum(ct, self.group)
        root = t.index(self.root.value.data) if self.root is not None else t.primal(self.root_value)  # type: ignore[arg-type]
        return [t.on_rank(self.group, root, total), None]


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


###############################################################################
# Gathers and all-to-all
###############################################################################


def verify_axis(op: IRDLOperation, axis: int, t: TensorType) -> None:
    rank = t.get_num_dims()
    if not 0 <= axis < rank:
        raise VerifyException(f"'{op.name}' axis {axis} is out of range for {t} (rank {rank})")


def _verify_counts_type(op: IRDLOperation, what: str, t: Attribute) -> None:
    if not is_integer_tensor(t):
        raise VerifyException(f"'{op.name}' {what} must be a tensor of integers, got {t}")
    assert isinstance(t, TensorType)
    if t.get_num_dims() != 1:
        raise VerifyException(f"'{op.name}' {what} must have rank 1, got {t}")


def verify_same_except_axis(op: IRDLOperation, axis: int, a: TensorType, b: TensorType) -> None:
    if a.element_type != b.element_type:
        raise VerifyException(
            f"'{op.name}' result element type {b.element_type} must equal the "
            f"input element type {a.element_type}"
        )
    if a.get_num_dims() != b.get_num_dims():
        raise VerifyException(f"'{op.name}' result {b} must have the rank of {a}")
    for d, (x, y) in enumerate(zip(a.get_shape(), b.get_shape())):
        if d != axis and x >= 0 and y >= 0 and x != y:
            raise VerifyException(
                f"'{op.name}' result {b} differs from input {a} in dimension {d}, "
                f"which is not the axis {axis}"
            )


@irdl_op_definition
class AllGatherOp(CollectiveOp, Transposable):
    """Concatenation along `axis` of every rank's `x`, in rank order.

    Even form: every rank contributes the same shape. Uneven form
    (`counts(%c : tensor<Pxi64>)`): rank r contributes `counts[r]` rows along
    the axis, and `counts` must be the same on every rank.
    """

    name = "dist.all_gather"

    traits = traits_def(CollectiveEffect(), EveryRankEnters(), UniformResults())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "counts": OperandRole.GATHER_COUNTS,
    }

    input = operand_def(TensorType)
    counts = opt_operand_def(TensorType)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input (`counts` `(` $counts^ `:` type($counts) `)`)? `axis` $axis "
        "custom<GroupRef>($group) attr-dict `:` type($input) `->` type($result)"
    )
    custom_directives = (GroupRef,)

    def __init__(
        self,
        input: SSAValue | Operation,
        result_type: TensorType,
        *,
        axis: int = 0,
        counts: SSAValue | Operation | None = None,
        group: GroupName = None,
    ):
        props: dict[str, Attribute] = {"axis": IntegerAttr(axis, i64)}
        group_property(props, group)
        super().__init__(
            operands=[SSAValue.get(input), [] if counts is None else [SSAValue.get(counts)]],
            result_types=[result_type],
            properties=props,
        )

    def verify_(self) -> None:
        self.verify_group()
        t_in, t_out = self.input.type, self.result.type
        assert isinstance(t_in, TensorType) and isinstance(t_out, TensorType)
        axis = self.axis.value.data
        verify_axis(self, axis, t_in)
        verify_same_except_axis(self, axis, t_in, t_out)
        size = self.static_group_size()
        if self.counts is not None:
            _verify_counts_type(self, "counts", self.counts.type)
            assert isinstance(self.counts.type, TensorType)
            n = self.counts.type.get_shape()[0]
            if size is not None and n >= 0 and n != size:
                raise VerifyException(
                    f"'dist.all_gather' counts has {n} entries for a group of size {size}"
                )
            return
        rows_in, rows_out = t_in.get_shape()[axis], t_out.get_shape()[axis]
        if rows_in < 0 or rows_out < 0:
            return
        if size is not None and rows_out != size * rows_in:
            raise VerifyException(
                f"'dist.all_gather' result has {rows_out} rows on axis {axis}, "
                f"expected {size} x {rows_in}"
            )
        if rows_in == 0 and rows_out != 0 or rows_in and rows_out % rows_in:
            raise VerifyException(
                f"'dist.all_gather' result rows ({rows_out}) on axis {axis} "
                f"must be a multiple of the input rows ({rows_in})"
            )

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """Even: the sum reduce-scatter of the cotangent (this rank's part of
        the sum, N·(P-1)/P bytes per rank). Uneven: the summed cotangent,
        then this rank's slice of it (after the counts of the lower ranks)."""
        (ct,) = cotangents
        assert ct is not None
        x = self.input
        axis = self.axis.value.data
        if self.counts is None:
            return [t.reduce_scatter_sum(ct, x.type, axis, self.group), None]
        total = t.all_reduce_sum(ct, self.group)
        me = t.emit(RankOp(self.group)).results[0]
        sizes = t.shape_of(x, primal=True)
        offset = self._rows_before(t, me)
        offsets: list[SSAValue | int] = [0] * len(sizes)
        offsets[axis] = offset
        sliced = tensor.ExtractSliceOp(total, offsets, sizes, [1] * len(sizes), x.type)
        return [t.emit(sliced).results[0], None]

    def _rows_before(self, t: Transposer, me: SSAValue) -> SSAValue:
        """Σ_{j < rank} counts[j], unrolled over the counts' static length."""
        counts_type = self.counts.type  # type: ignore[union-attr]
        assert isinstance(counts_type, TensorType)
        (n,) = counts_type.get_shape()
        if n == DYNAMIC_INDEX:
            raise NoDerivative(
                "the backward of an uneven all-gather needs counts of static length (tensor<Pxi64>)"
            )
        counts = t.primal(self.counts)  # type: ignore[arg-type]
        element = counts_type.element_type
        total = t.emit(arith.ConstantOp(IntegerAttr(0, element))).results[0]  # type: ignore[arg-type]
        zero = total
        for j in range(n):
            count = t.emit(tensor.ExtractOp(counts, [t.index(j)], element)).results[0]
            lower = t.emit(arith.CmpiOp(t.index(j), me, "ult")).results[0]
            kept = t.emit(arith.SelectOp(lower, count, zero)).results[0]
            total = t.binary(arith.AddiOp, total, kept)
        return t.emit(arith.IndexCastOp(total, IndexType())).results[0]


@irdl_op_definition
class VariableAllToAllOp(CollectiveOp, Transposable):
    """Exchange of variable-size row blocks along `axis`.

    Rank r splits its `x` along the axis into P blocks of `send_counts[j]`
    rows (in rank order) and sends block j to rank j. `y` concatenates, in
    rank order, the blocks every peer sent to r; `recv_counts[j]` is the
    number of rows received from j. Zero counts are legal, and every rank
    takes part even when it sends and receives nothing.
    """

    name = "dist.variable_all_to_all"

    traits = traits_def(CollectiveEffect(), EveryRankEnters(), AgreementRidesWithPayload())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "send_counts": OperandRole.SEND_COUNTS,
    }

    input = operand_def(TensorType)
    send_counts = operand_def(TensorType)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)
    recv_counts = result_def(TensorType)

    assembly_format = (
        "$input `,` $send_counts `axis` $axis custom<GroupRef>($group) attr-dict `:` "
        "type($input) `,` custom<SharedType>(type($send_counts), type($recv_counts)) "
        "`->` type($result)"
    )
    custom_directives = (GroupRef, SharedType)

    def __init__(
        self,
        input: SSAValue | Operation,
        send_counts: SSAValue | Operation,
        result_type: TensorType,
        *,
        axis: int = 0,
        group: GroupName = None,
    ):
        send_counts = SSAValue.get(send_counts)
        props: dict[str, Attribute] = {"axis": IntegerAttr(axis, i64)}
        group_property(props, group)
        super().__init__(
            operands=[SSAValue.get(input), send_counts],
            result_types=[result_type, send_counts.type],
            properties=props,
        )

    def verify_(self) -> None:
        self.verify_group()
        t_in, t_out = self.input.type, self.result.type
        assert isinstance(t_in, TensorType) and isinstance(t_out, TensorType)
        axis = self.axis.value.data
        verify_axis(self, axis, t_in)
        verify_same_except_axis(self, axis, t_in, t_out)
        _verify_counts_type(self, "send counts", self.send_counts.type)
        if self.recv_counts.type != self.send_counts.type:
            raise VerifyException(
                f"'dist.variable_all_to_all' recv counts type {self.recv_counts.type}"
                f" must equal the send counts type {self.send_counts.type}"
            )
        size = self.static_group_size()
        assert isinstance(self.send_counts.type, TensorType)
        n = self.send_counts.type.get_shape()[0]
        if size is not None and n >= 0 and n != size:
            raise VerifyException(
                f"'dist.variable_all_to_all' send counts has {n} entries for a group of size {size}"
            )

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """The reverse exchange: the cotangent sent back with the counts swapped."""
        ct = t.or_zeros(cotangents[0], self.result)
        back = VariableAllToAllOp(
            ct,
            t.primal(self.recv_counts),
            self.input.type,
            axis=self.axis.value.data,
            group=self.group,
        )  # type: ignore[arg-type]
        return [t.emit(back).results[0], None]


###############################################################################
# Waves and the region terminator
###############################################################################


@irdl_op_definition
class WaveOp(IRDLOperation):
    """Submits every collective of its body, in order, before awaiting any.

    The body holds collectives and point-to-point ops only, each reading
    values defined before the wave (none reads another's result), and ends
    in `dist.yield`; the wave's results are the yielded values, available
    once every op of the wave completed. Ranks with nothing to send still
    submit the whole wave (zero-size payloads), so peers never wait on them.
    """

    name = "dist.wave"

    outputs = var_result_def(TensorType)
    body = region_def("single_block")

    traits = traits_def(CollectiveEffect(), EveryRankEnters())

    assembly_format = "$body attr-dict (`:` type($outputs)^)?"

    def __init__(self, body: Region, result_types: Sequence[Attribute]):
        super().__init__(result_types=[list(result_types)], regions=[body])

    def verify_(self) -> None:
        block = self.body.block
        inner = set()
        for op in block.ops:
            if isinstance(op, YieldOp):
                continue
            if not isinstance(op, CollectiveOp | PeerOp):
                raise VerifyException(
                    f"'dist.wave' may hold only collectives and point-to-point ops, "
                    f"found '{op.name}'"
                )
            for value in op.operands:
                if value in inner:
                    raise VerifyException(
                        f"'{op.name}' in a 'dist.wave' reads the result of another op "
                        "of the same wave; results exist only after the wave"
                    )
            inner.update(op.results)
        last = block.last_op
        if not isinstance(last, YieldOp):
            raise VerifyException("'dist.wave' body must end in `dist.yield`")
        if [v.type for v in last.arguments] != [r.type for r in self.outputs]:
            raise VerifyException(
                "'dist.wave' must yield values of its result types "
                f"({', '.join(str(r.type) for r in self.outputs)})"
            )


@dataclass(frozen=True)
class HasParentNamed(OpTrait):
    """xDSL's `HasParent`, by op name: the all-reduce is defined in a module
    that imports this one (for `CollectiveOp` and `YieldOp`), so its class
    cannot be named here without an import cycle."""

    names: tuple[str, ...]

    def verify(self, op: Operation) -> None:
        parent = op.parent_op()
        if parent is None or parent.name in self.names:  # detached: not checked
            return
        names = ", ".join(f"'{name}'" for name in self.names)
        raise VerifyException(f"'{op.name}' expects parent op to be one of {names}")


@irdl_op_definition
class YieldOp(AbstractYieldOperation[Attribute]):
    """Terminates a combine region (the combined value) or a wave (its results)."""

    name = "dist.yield"

    traits = traits_def(IsTerminator(), HasParentNamed(("dist.all_reduce", "dist.reduce_scatter", "dist.wave")), Pure())
