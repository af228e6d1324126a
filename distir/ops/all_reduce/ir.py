"""`dist.all_reduce`: its definition and every fact about its combine.

The op (native kind or combine region), its verifier and its transpose
rule, and what passes, the planner and the Torch backend read about it:

- which algorithms compute a combine exactly (`ALGORITHM_NEEDS`: the names
  and what each needs of the region, the only home of both), which of them
  is cheapest (`CostModel`, `choose_algorithm`) and which one an op runs
  when it records none (`AllReduceOp.default_algorithm`);
- the combines a pass builds and a backend recognises by name
  (`known_combine = "modular-add"`): the builder is the only description of
  the region, the verifier compares an op's region with what it builds.

The cost model lives here, not with the general region analyses, because
it prices exactly these algorithms: rounds, bytes sent and bytes combined
of each, for a group size and a message size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from xdsl.dialects import arith, tensor
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    IndexType,
    IntegerAttr,
    StringAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.dialects.linalg.ops import BroadcastOp
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import IsolatedFromAbove
from xdsl.utils.exceptions import VerifyException

from distir.ir import tensor_arith
from distir.ir.analysis import (
    is_elementwise_region,
    native_kind,
    non_commutative_witness,
    static_bytes,
)
from distir.ir.attributes import CollectiveEffect, ReductionKind, ReductionKindAttr
from distir.ir.collectives import CollectiveOp, is_integer_tensor, verify_same_type
from distir.ir.facts import ChoosesAlgorithm, EveryRankEnters, OperandRole, UniformResults
from distir.ir.syntax import CombineRegion, GroupRef, OptionalEnum, SharedType
from distir.ir.transpose import Cotangents, NoDerivative, Transposable, Transposer
from distir.ops.groups.ir import GroupName, RankOp, group_property
from distir.ops.wave.ir import YieldOp

###############################################################################
# Algorithms
###############################################################################

RING = "ring"
HALVING_DOUBLING = "halving-doubling"
RECURSIVE_DOUBLING = "recursive-doubling"
GATHER_FOLD = "gather-fold"


@dataclass(frozen=True)
class CostModel:
    """Seconds to run an algorithm: `alpha` per message round, `beta` per
    byte on the wire, `gamma` per byte combined, per rank.

    The defaults were set against the combine rows of `distir-bench` (gloo
    over loopback, the 2-core machine CI runs on; benchmarks/README.md):
    in 8 of the 10 (P, size) cells at P = 2 and 4 they pick the fastest
    measured algorithm, and the other two are within 1.21x of it.
    `distir-bench` also prints a least-squares fit of the three constants
    from the same rows, to re-tune them on another machine."""

    alpha: float = 2.5e-4
    beta: float = 6.0e-10
    gamma: float = 4.0e-10
    #: gather-fold holds P copies of the message: not above this many bytes
    gather_fold_max_bytes: int = 1 << 20

    def seconds(self, algorithm: str, size: int, nbytes: int) -> float:
        p = size
        if p <= 1:
            return 0.0
        log_p = math.ceil(math.log2(p))
        pow2 = p & (p - 1) == 0
        fold = 0 if pow2 else 1  # non-powers of two fold pairs first (and back)
        share = nbytes * (p - 1) / p
        if algorithm == RING:
            rounds, wire, combined = 2 * (p - 1), 2 * share, share
        elif algorithm == HALVING_DOUBLING:
            rounds = 2 * (log_p + fold)
            wire, combined = 2 * share + 2 * fold * nbytes, share + fold * nbytes
        elif algorithm == RECURSIVE_DOUBLING:
            rounds = log_p + 2 * fold
            wire, combined = nbytes * (log_p + 2 * fold), nbytes * (log_p + fold)
        elif algorithm == GATHER_FOLD:
            rounds, wire, combined = p - 1, nbytes * (p - 1), nbytes * (p - 1)
        else:
            raise ValueError(f"no cost model for algorithm {algorithm!r}")
        return self.alpha * rounds + self.beta * wire + self.gamma * combined


DEFAULT_COST_MODEL = CostModel()


#: every algorithm of a generic all-reduce, in order of preference, with what
#: it needs of the combine to compute its result exactly as defined:
#: (elementwise, commutative). Chunking needs an elementwise region, the
#: ring's rotated fold order a commutative one; recursive doubling and
#: gather-fold keep rank order on whole tensors. The backends' `matches()`
#: and the selection pass both read this table.
ALGORITHM_NEEDS: dict[str, tuple[bool, bool]] = {
    RING: (True, True),
    HALVING_DOUBLING: (True, False),
    RECURSIVE_DOUBLING: (False, False),
    GATHER_FOLD: (False, False),
}


def candidate_algorithms(elementwise: bool, commutative: bool) -> tuple[str, ...]:
    """The algorithms (`ALGORITHM_NEEDS`) that compute exactly a combine
    that is elementwise and/or commutative as given, in order of preference."""
    return tuple(
        name
        for name, (needs_elementwise, needs_commutative) in ALGORITHM_NEEDS.items()
        if (elementwise or not needs_elementwise) and (commutative or not needs_commutative)
    )


def algorithm_applies(algorithm: str, op: Operation) -> bool:
    """Whether `algorithm` computes the `dist.all_reduce` `op` exactly: a
    native kind is elementwise and commutative, a combine region is what
    its region and `commutative` marker say."""
    native = not op.is_generic  # type: ignore[attr-defined]
    commutative = native or op.properties.get("commutative") is not None
    return algorithm in candidate_algorithms(elementwise_combine(op), commutative)


def choose_algorithm(
    elementwise: bool,
    commutative: bool,
    size: int | None,
    nbytes: int | None,
    model: CostModel = DEFAULT_COST_MODEL,
) -> str:
    """The cheapest exact algorithm. With the group size or the message size
    unknown (a dynamic shape, the world's size at compile time) the choice
    assumes a large message on many ranks: the bandwidth-optimal one."""
    candidates = candidate_algorithms(elementwise, commutative)
    if size is None or nbytes is None:
        return candidates[0]
    assert size is not None and nbytes is not None
    allowed = [
        a for a in candidates if a != GATHER_FOLD or nbytes * size <= model.gather_fold_max_bytes
    ]
    return min(allowed, key=lambda a: (model.seconds(a, size, nbytes), allowed.index(a)))


def elementwise_combine(op: Operation) -> bool:
    """Whether a `dist.all_reduce` may be combined chunk by chunk: native,
    a recorded known combine, or an elementwise region."""
    if not op.is_generic:  # type: ignore[attr-defined]
        return True
    return known_combine(op) is not None or is_elementwise_region(op.regions[0].block)


def default_algorithm(
    op: Operation, size: int | None, model: CostModel = DEFAULT_COST_MODEL
) -> str:
    """The algorithm of a generic `dist.all_reduce` that records none: what
    `select-all-reduce-algorithm` would record, for group size `size`."""
    commutative = op.properties.get("commutative") is not None
    return choose_algorithm(
        elementwise_combine(op), commutative, size, static_bytes(op.operands[0].type), model
    )


###############################################################################
# Known combines
###############################################################################
#
# A pass that builds a combine region a backend can run faster than the region
# itself records it on the generic `dist.all_reduce` as the discardable
# attribute `known_combine = "<name>"`. The backend then runs its own code for
# that name, so the verifier holds the region to it: the region must be
# structurally equivalent to what the builder here makes for the op's types
# (`known_combine_error`).
#
# - `modular-add`: `lower-ciphertext-add`'s per-limb modular addition of RNS
#   limbs, `s = lhs + rhs; d = s - q; d + ((d >> 63) & q)`.

#: Discardable attribute by which a pass records what a combine region is.
KNOWN_COMBINE = "known_combine"
MODULAR_ADD = "modular-add"


def dynamic_sizes(value: SSAValue) -> tuple[list[Operation], list[SSAValue]]:
    """`tensor.dim` ops reading the dynamic dimensions of `value`, and the sizes."""
    t = value.type
    assert isinstance(t, TensorType)
    ops: list[Operation] = []
    sizes: list[SSAValue] = []
    for dim, size in enumerate(t.get_shape()):
        if size == DYNAMIC_INDEX:
            index = arith.ConstantOp(IntegerAttr(dim, IndexType()))
            size_op = tensor.DimOp(value, index)
            index.result.name_hint = f"c{dim}"
            size_op.result.name_hint = f"dim{dim}"
            ops += [index, size_op]
            sizes.append(size_op.result)
    return ops, sizes


def broadcast_moduli(
    ciphertext: SSAValue, moduli: SSAValue, sizes: list[SSAValue] | None = None
) -> tuple[list[Operation], SSAValue]:
    """Ops that broadcast `moduli : tensor<Lxi64>` to the ciphertext's type
    `tensor<...xLxNxi64>` along every dimension but the limb one (-2), and the
    broadcast value.

    arith ops on tensors never broadcast, so a combine region or a remainder
    that works limb-wise needs the moduli in the ciphertext's own shape.
    Dynamic sizes of the target are `sizes`, or read off the ciphertext with
    `tensor.dim`; when the moduli's length and the ciphertext's limb dimension
    disagree only in being static or dynamic, a `tensor.cast` reconciles them
    (linalg.broadcast wants identical mapped sizes).
    """
    ct_type = ciphertext.type
    mod_type = moduli.type
    assert isinstance(ct_type, TensorType) and isinstance(mod_type, TensorType)
    shape = ct_type.get_shape()
    limb_dim = len(shape) - 2
    hint = moduli.name_hint or "moduli"
    ops: list[Operation] = []

    if mod_type.get_shape()[0] != shape[limb_dim]:
        cast = tensor.CastOp(moduli, TensorType(mod_type.element_type, [shape[limb_dim]]))
        cast.dest.name_hint = f"{hint}_cast"
        ops.append(cast)
        moduli = cast.dest

    if sizes is None:
        size_ops, sizes = dynamic_sizes(ciphertext)
        ops += size_ops
    empty = tensor.EmptyOp(sizes, ct_type)
    broadcast = BroadcastOp(
        moduli,
        empty.tensor,
        DenseArrayBase.from_list(i64, [d for d in range(len(shape)) if d != limb_dim]),
    )
    empty.tensor.name_hint = "empty"
    ops += [empty, broadcast]
    result = broadcast.result[0]
    result.name_hint = f"{hint}_bcast"
    return ops, result


def modular_add_region(ciphertext_type: TensorType, moduli_type: TensorType) -> Region:
    """The combine region `(lhs, rhs, q) -> (lhs + rhs) mod q` for reduced
    operands, on tensors of `ciphertext_type`, with moduli `[L]` broadcast
    inside it (`lower-ciphertext-add` documents why it is exact)."""
    t = ciphertext_type
    block = Block(arg_types=[t, t, moduli_type])
    lhs, rhs, limbs = block.args
    lhs.name_hint, rhs.name_hint, limbs.name_hint = "lhs", "rhs", "q_limbs"
    size_ops, sizes = dynamic_sizes(lhs)
    block.add_ops(size_ops)
    prelude, q = broadcast_moduli(lhs, limbs, sizes)
    block.add_ops(prelude)
    q.name_hint = "mod"

    def named(op: Operation, hint: str) -> Operation:
        op.results[0].name_hint = hint
        block.add_op(op)
        return op

    total = named(arith.AddiOp(lhs, rhs), "sum")
    minus_q = named(arith.SubiOp(total, q), "sum_minus_q")
    shift = named(_splat(block, lhs, 63, sizes), "c63")
    below_q = named(arith.ShRSIOp(minus_q, shift), "below_q")
    add_back = named(arith.AndIOp(below_q, q), "add_back")
    reduced = named(arith.AddiOp(minus_q, add_back), "reduced")
    block.add_op(YieldOp(reduced.results[0]))
    return Region(block)


def _splat(block: Block, like: SSAValue, value: int, sizes: list[SSAValue]) -> Operation:
    """A tensor of `like`'s type filled with `value`: a dense constant when
    the shape is static, else a `tensor.splat` of the dynamic `sizes`."""
    t = like.type
    assert isinstance(t, TensorType)
    if not sizes:
        return arith.ConstantOp(DenseIntOrFPElementsAttr.from_list(t, [value]))
    scalar = arith.ConstantOp(IntegerAttr(value, t.element_type))
    scalar.result.name_hint = f"c{value}_scalar"
    block.add_op(scalar)
    return tensor.SplatOp(scalar, sizes, t)


def known_combine(op: Operation) -> str | None:
    """The combine a pass recorded on a generic all-reduce (verified)."""
    attr = op.attributes.get(KNOWN_COMBINE)
    return attr.data if isinstance(attr, StringAttr) else None


def _is_modular_add_region(block: Block) -> bool:
    """Whether the block is what `modular_add_region` builds for its argument
    types (i64 limbs, one moduli extra)."""
    if len(block.args) != 3 or block.last_op is None:
        return False
    ct_type, _, moduli_type = (a.type for a in block.args)
    if not isinstance(ct_type, TensorType) or ct_type.element_type != i64:
        return False
    if not isinstance(moduli_type, TensorType) or moduli_type.get_num_dims() != 1:
        return False
    expected = modular_add_region(ct_type, moduli_type).block
    # Structural equivalence compares ops, operands and properties, not
    # result types: a `tensor.empty` of another shape must not pass.
    return expected.is_structurally_equivalent(block) and all(
        [r.type for r in a.results] == [r.type for r in b.results]
        for a, b in zip(expected.walk(), block.walk())
    )


#: what each known combine's region must be
KNOWN_COMBINES: dict[str, Callable[[Block], bool]] = {MODULAR_ADD: _is_modular_add_region}


def known_combine_error(op: Operation) -> str | None:
    """Why an op's recorded `known_combine` does not hold, or None: backends
    run the recorded combine instead of the region, so the two must agree."""
    if KNOWN_COMBINE not in op.attributes:
        return None
    name = known_combine(op)
    check = KNOWN_COMBINES.get(name or "")
    if check is None:
        return (
            f"'{op.name}' records known_combine {op.attributes[KNOWN_COMBINE]}, but the "
            f"known combines are {', '.join(repr(k) for k in KNOWN_COMBINES)}"
        )
    if not op.regions or not op.regions[0].blocks or not check(op.regions[0].block):
        return (
            f"'{op.name}' records known_combine \"{name}\" but its combine region is "
            f"not that combine"
        )
    return None


def verify_combine(op: Operation, value_type: Attribute) -> None:
    """The rules of a combine region on `value_type` operands, shared by the
    generic all-reduce and the generic reduce-scatter: one block taking
    (lhs, rhs, extra...) and yielding one value of `value_type`, a
    `commutative` marker that holds, and a recorded known combine that is
    the region."""
    combine, extras = op.regions[0], op.extras  # type: ignore[attr-defined]
    if len(combine.blocks) != 1:
        raise VerifyException(
            f"'{op.name}' needs a reduction kind or a single-block combine region"
        )
    block = combine.block
    expected = [value_type, value_type, *(e.type for e in extras)]
    got = [a.type for a in block.args]
    if len(got) != len(expected):
        raise VerifyException(
            f"'{op.name}' combine region must take {len(expected)} "
            f"arguments (lhs, rhs, {len(extras)} extra), got {len(got)}"
        )
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            raise VerifyException(
                f"'{op.name}' combine argument #{i} has type {g}, expected {e}"
            )
    last = block.last_op
    if not isinstance(last, YieldOp):
        raise VerifyException(f"'{op.name}' combine region must end in `dist.yield`")
    yielded = [v.type for v in last.arguments]
    if yielded != [value_type]:
        raise VerifyException(
            f"'{op.name}' combine must yield one value of type "
            f"{value_type}, got ({', '.join(str(t) for t in yielded)})"
        )
    if op.properties.get("commutative") is not None:
        witness = non_commutative_witness(block)
        if witness is not None:
            a, b, forward, backward = witness
            raise VerifyException(
                f"'{op.name}' is marked commutative but its combine is not: "
                f"combine({a}, {b}) = {forward} while combine({b}, {a}) = {backward} "
                f"(a reordered fold, e.g. the ring's, would give another result)"
            )
    # Backends run a recorded combine instead of the region: hold the
    # region to it.
    error = known_combine_error(op)
    if error is not None:
        raise VerifyException(error)


###############################################################################
# The op
###############################################################################


class CombineIsolatedFromAbove(IsolatedFromAbove):
    """xDSL's IsolatedFromAbove (which cse and canonicalize respect), with a
    message that says how to fix a combine region reading an outer value."""

    def verify(self, op: Operation) -> None:
        for region in op.regions:
            for inner in region.walk():
                for value in inner.operands:
                    if not op.is_ancestor(value.owner) or value.owner is op:
                        name = f"%{value.name_hint}" if value.name_hint else "a value"
                        raise VerifyException(
                            f"'{op.name}' combine region uses {name} defined outside it; "
                            "pass it as an extra operand instead"
                        )


@irdl_op_definition
class AllReduceOp(CollectiveOp, ChoosesAlgorithm, Transposable):
    """`y = x_0 ⊕ x_1 ⊕ … ⊕ x_{P-1}` on every rank, folded in rank order.

    Native form: `dist.all_reduce sum %x : T` with a reduction kind the
    backends provide natively. Generic form: a single-block `combine` region
    whose block takes `(lhs, rhs, extra...)` and yields the combined value;
    `extra` operands reach the region as trailing block arguments (this is how
    RNS moduli reach a lowered ciphertext combine). The combine must be
    associative; `commutative` allows any reduction order. `algorithm`
    records a backend algorithm chosen by a pass.
    """

    name = "dist.all_reduce"

    input = operand_def(TensorType)
    extras = var_operand_def(TensorType)
    kind = opt_prop_def(ReductionKindAttr)
    commutative = opt_prop_def(UnitAttr)
    algorithm = opt_prop_def(StringAttr)
    result = result_def(TensorType)
    combine = region_def()

    # The combine region is a function of its block arguments only: values
    # from outside travel as extra operands, and cse must not hoist into it.
    traits = traits_def(
        CollectiveEffect(), EveryRankEnters(), UniformResults(), CombineIsolatedFromAbove()
    )
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "extras": OperandRole.UNIFORM,
    }

    assembly_format = (
        "custom<OptionalEnum>($kind) $input (`,` $extras^)? custom<GroupRef>($group) "
        "(`commutative` $commutative^)? (`algorithm` $algorithm^)? attr-dict "
        "`:` custom<SharedType>(type($input), type($result)) (`,` type($extras)^)? "
        "custom<CombineRegion>($combine, ref(type($input)), ref(type($extras)))"
    )
    custom_directives = (OptionalEnum, GroupRef, SharedType, CombineRegion)

    def __init__(
        self,
        input: SSAValue | Operation,
        *,
        kind: ReductionKind | None = None,
        combine: Region | None = None,
        extras: Sequence[SSAValue | Operation] = (),
        commutative: bool = False,
        algorithm: str | None = None,
        group: GroupName = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {}
        if kind is not None:
            props["kind"] = ReductionKindAttr(kind)
        if commutative:
            props["commutative"] = UnitAttr()
        if algorithm is not None:
            props["algorithm"] = StringAttr(algorithm)
        group_property(props, group)
        super().__init__(
            operands=[input, [SSAValue.get(e) for e in extras]],
            result_types=[input.type],
            properties=props,
            regions=[combine if combine is not None else Region()],
        )

    @property
    def combine_block(self) -> Block:
        return self.combine.block

    @property
    def is_generic(self) -> bool:
        """True for the generic form (a combine region), False for a native kind."""
        return self.kind is None

    def computed_kind(self) -> ReductionKind | None:
        """The native kind this all-reduce computes: its own, or that of a
        combine region that is one recognised commutative op on (lhs, rhs)
        (`analysis.native_kind`); None for any other combine."""
        if not self.is_generic:
            return self.kind.data  # type: ignore[union-attr]
        if len(self.combine.blocks) != 1:
            return None
        return native_kind(self.combine.block)

    @property
    def elementwise(self) -> bool:
        """Whether it may be combined chunk by chunk (`elementwise_combine`)."""
        return elementwise_combine(self)

    def recorded_algorithm(self) -> str | None:
        return self.algorithm.data if self.algorithm is not None else None

    def default_algorithm(self, size: int | None) -> str | None:
        """A generic all-reduce's cheapest exact algorithm for group size
        `size` (`default_algorithm`); a native one runs the backend's
        native collective (None)."""
        return default_algorithm(self, size) if self.is_generic else None

    def verify_(self) -> None:
        self.verify_group()
        verify_same_type(self, "input", self.result.type, self.input.type)
        if not self.is_generic:
            self._verify_native(self.kind)
        else:
            self._verify_generic()

    def _verify_native(self, kind: ReductionKindAttr) -> None:
        if self.combine.blocks:
            raise VerifyException(
                "'dist.all_reduce' takes a reduction kind or a combine region, not both"
            )
        if self.extras:
            raise VerifyException("'dist.all_reduce' with a native kind takes no extra operands")
        if kind.facts.integer_only and not is_integer_tensor(self.input.type):
            raise VerifyException(
                f"'dist.all_reduce' kind {kind.data} needs an integer element type, "
                f"got {self.input.type}"
            )

    def _verify_generic(self) -> None:
        verify_combine(self, self.result.type)

    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """A sum (native, or a combine recognised as one) transposes to the
        sum of the cotangent; max and min to `_extremum`; nothing else is
        known to be linear."""
        (ct,) = cotangents
        assert ct is not None
        kind = self.computed_kind()
        if kind is ReductionKind.SUM:
            return [t.all_reduce_sum(ct, self.group)]
        if not self.is_generic and kind in (ReductionKind.MAX, ReductionKind.MIN):
            return [_extremum(t, self, ct)]
        what = (
            f"the native {self.kind.data.value} reduction"  # type: ignore[union-attr]
            if not self.is_generic
            else "its combine (only a combine recognised as a sum is known to be linear)"
        )
        raise NoDerivative(f"{what} has no derivative")


def sum_all_reduce(value: SSAValue, group: GroupName) -> AllReduceOp:
    """The native sum all-reduce of `value` (what every linear collective's
    transpose reduces its cotangent with)."""
    return AllReduceOp(value, kind=ReductionKind.SUM, group=group)


def _extremum(t: Transposer, op: AllReduceOp, ct: SSAValue) -> SSAValue:
    """y = max_r x_r (or min): the summed cotangent goes, element by element,
    to the lowest rank whose x equals y (where y is NaN: whose x is NaN), and
    zeros to every other rank. That rank is found by a min all-reduce of
    (this rank where it holds y, else INT64_MAX): every rank agrees on it, so
    ties give the whole gradient to one rank, never a share to each."""
    x, y = t.primal(op.operands[0]), t.primal(op.results[0])
    me = t.emit(RankOp(op.group)).results[0]
    me64 = t.emit(arith.IndexCastOp(me, i64)).results[0]
    nobody = t.emit(arith.ConstantOp(IntegerAttr(2**63 - 1, i64))).results[0]
    x_type = x.type
    if isinstance(x_type, TensorType):
        dynamic = [d for d in t.shape_of(op.operands[0], primal=True) if isinstance(d, SSAValue)]
        ranks = TensorType(i64, x_type.get_shape())
        me64 = t.emit(tensor.SplatOp(me64, dynamic, ranks)).results[0]
        nobody = t.emit(tensor.SplatOp(nobody, dynamic, ranks)).results[0]

    def pick(condition: SSAValue, a: SSAValue, b: SSAValue) -> SSAValue:
        return t.emit(tensor_arith.SelectOp(condition, a, b)).results[0]

    def compare(a: SSAValue, b: SSAValue, predicate: str) -> SSAValue:
        return t.emit(tensor_arith.CmpfOp(a, b, predicate)).results[0]

    holds = pick(compare(x, y, "oeq"), me64, nobody)
    nan_holder = pick(compare(x, x, "uno"), me64, nobody)
    holds = pick(compare(y, y, "uno"), nan_holder, holds)
    lowest = t.emit(AllReduceOp(holds, kind=ReductionKind.MIN, group=op.group)).results[0]
    chosen = t.emit(tensor_arith.CmpiOp(lowest, me64, "eq")).results[0]
    total = t.all_reduce_sum(ct, op.group)
    return pick(chosen, total, t.zeros_like(ct, primal=False))
