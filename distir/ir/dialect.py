"""The `dist` dialect: collective communication over process groups.

Every operation runs SPMD: each rank of the op's group executes it on its own
operands. Ranks that appear in IR (a broadcast root, a counts index) are ranks
*of the op's group*, never global ranks. An op without a `group` runs on the
default (world) group; an op with `group @name` runs on the group declared by
the module-level `dist.group @name` op, in which every rank finds the
subgroup that contains it.

Sections: attributes, effects, module-level groups, rank queries, collectives,
the combine-region terminator, and the `Dist` dialect object at the bottom.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Iterable, Mapping, Sequence
from enum import auto
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DenseArrayBase,
    IndexType,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.dialects.utils import AbstractYieldOperation, EnumAttribute
from xdsl.ir import (
    Attribute,
    Block,
    Dialect,
    Operation,
    Region,
    SpacedOpaqueSyntaxAttribute,
    SSAValue,
)
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    lazy_traits_def,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.printer import Printer
from xdsl.traits import (
    EffectInstance,
    HasParent,
    IsolatedFromAbove,
    IsTerminator,
    MemoryEffect,
    MemoryEffectKind,
    Pure,
    SymbolOpInterface,
    SymbolTable,
)
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from distir.ir.facts import EveryRankEnters, OperandRole, UniformResults

###############################################################################
# Attributes
###############################################################################


class ReductionKind(StrEnum):
    """Reductions every backend offers natively."""

    SUM = auto()
    PROD = auto()
    MIN = auto()
    MAX = auto()
    BAND = auto()
    BOR = auto()
    BXOR = auto()


BITWISE_KINDS = frozenset({ReductionKind.BAND, ReductionKind.BOR, ReductionKind.BXOR})

#: Discardable attribute of a collective whose exactness a pass proved only
#: for groups of at most this many ranks; executors refuse larger groups.
ASSUMED_GROUP_SIZE = "assumed_max_group_size"


@irdl_attr_definition
class ReductionKindAttr(EnumAttribute[ReductionKind], SpacedOpaqueSyntaxAttribute):
    """A native reduction kind; printed bare (`sum`) inside dist ops, `#dist<kind sum>` generically."""

    name = "dist.kind"


###############################################################################
# Effects
###############################################################################


class CollectiveEffect(MemoryEffect):
    """Reads and writes the communicator.

    Two textually identical collectives are two rounds of communication and an
    unused collective still has to be entered by every rank, so `cse` must
    never merge them and `dce` must never delete them.
    """

    @classmethod
    def get_effects(cls, op: Operation) -> set[EffectInstance]:
        return {
            EffectInstance(MemoryEffectKind.READ),
            EffectInstance(MemoryEffectKind.WRITE),
        }


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


###############################################################################
# Shared parsing and printing helpers
###############################################################################


def _is_integer_tensor(t: Attribute) -> bool:
    return isinstance(t, TensorType) and isinstance(t.element_type, IntegerType)


def _add_group(props: dict[str, Attribute], group: SymbolRefAttr | str | None) -> None:
    """Sets the `group` property from a symbol or a name (None: the world)."""
    if group is not None:
        props["group"] = SymbolRefAttr(group) if isinstance(group, str) else group


def _print_group(printer: Printer, group: SymbolRefAttr | None) -> None:
    if group is not None:
        printer.print_string(" group ")
        printer.print_attribute(group)


def _print_signature(
    printer: Printer,
    op: Operation,
    operand_types: Sequence[Attribute],
    result_type: Attribute | None = None,
) -> None:
    """The common tail of dist ops: `[group @g] {attrs} : T, U [-> R]`."""
    group = op.properties.get("group")
    _print_group(printer, group if isinstance(group, SymbolRefAttr) else None)
    printer.print_op_attributes(op.attributes)
    printer.print_string(" : ")
    printer.print_list(operand_types, printer.print_attribute)
    if result_type is not None:
        printer.print_string(" -> ")
        printer.print_attribute(result_type)


def _parse_group(parser: Parser) -> SymbolRefAttr | None:
    if parser.parse_optional_keyword("group") is None:
        return None
    pos = parser.pos
    attr = parser.parse_attribute()
    if not isinstance(attr, SymbolRefAttr):
        parser.raise_error("expected a group symbol such as @tp after `group`", pos)
    return attr


def _parse_operand_list(parser: Parser) -> list[UnresolvedOperand]:
    operands = [parser.parse_unresolved_operand()]
    while parser.parse_optional_punctuation(",") is not None:
        operands.append(parser.parse_unresolved_operand())
    return operands


def _parse_type_list(parser: Parser) -> list[Attribute]:
    types = [parser.parse_type()]
    while parser.parse_optional_punctuation(",") is not None:
        types.append(parser.parse_type())
    return types


def _parse_axis(parser: Parser) -> IntegerAttr:
    parser.parse_keyword("axis")
    return IntegerAttr(parser.parse_integer(allow_boolean=False), i64)


###############################################################################
# Process groups
###############################################################################


@irdl_op_definition
class GroupOp(IRDLOperation):
    """Declares a process group at module level.

    `dist.group @tp [[0, 1], [2, 3]]` partitions (part of) the world into
    subgroups of *global* ranks; on each rank, `@tp` denotes the subgroup that
    contains it. A single list, `[[0, 3]]`, is an ordinary subgroup. Every rank
    creates the declared groups in module order (the manifest order), because
    torch.distributed requires all ranks to create groups in the same order.
    """

    name = "dist.group"

    sym_name = prop_def(StringAttr)
    subgroups = prop_def(ArrayAttr[DenseArrayBase])

    traits = traits_def(SymbolOpInterface(), HasParent(ModuleOp))

    def __init__(self, sym_name: str, subgroups: Sequence[Sequence[int]]):
        super().__init__(
            properties={
                "sym_name": StringAttr(sym_name),
                "subgroups": ArrayAttr(
                    [DenseArrayBase.from_list(i64, list(ranks)) for ranks in subgroups]
                ),
            }
        )

    @property
    def rank_lists(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(part.get_values()) for part in self.subgroups.data)

    @property
    def uniform_size(self) -> int | None:
        """The size every subgroup has, when all have the same size."""
        sizes = {len(part) for part in self.rank_lists}
        return sizes.pop() if len(sizes) == 1 else None

    def subgroup_of(self, global_rank: int) -> tuple[int, ...] | None:
        for part in self.rank_lists:
            if global_rank in part:
                return part
        return None

    def verify_(self) -> None:
        parts = self.rank_lists
        if not parts:
            raise VerifyException(f"group @{self.sym_name.data} declares no subgroup")
        seen: set[int] = set()
        for part in parts:
            if not part:
                raise VerifyException(
                    f"group @{self.sym_name.data} has an empty subgroup"
                )
            for rank in part:
                if rank < 0:
                    raise VerifyException(
                        f"group @{self.sym_name.data}: rank {rank} is negative"
                    )
                if rank in seen:
                    raise VerifyException(
                        f"group @{self.sym_name.data}: rank {rank} appears in "
                        "more than one place"
                    )
                seen.add(rank)
            if list(part) != sorted(part):
                # torch.distributed numbers a group's members in ascending
                # global order, whatever order they are listed in.
                raise VerifyException(
                    f"group @{self.sym_name.data}: subgroup {list(part)} must list its "
                    f"ranks in ascending order ({sorted(part)}), the order that numbers "
                    "them within the group"
                )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        printer.print_string(" [")
        printer.print_list(
            self.rank_lists,
            lambda part: printer.print_string(
                "[" + ", ".join(str(r) for r in part) + "]"
            ),
        )
        printer.print_string("]")
        printer.print_op_attributes(self.attributes)

    @classmethod
    def parse(cls, parser: Parser) -> GroupOp:
        name = parser.parse_symbol_name().data
        parts = parser.parse_comma_separated_list(
            parser.Delimiter.SQUARE,
            lambda: parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE, lambda: parser.parse_integer(False, False)
            ),
        )
        op = cls(name, parts)
        op.attributes.update(parser.parse_optional_attr_dict())
        return op


def lookup_group(op: Operation, group: SymbolRefAttr | None) -> GroupOp | None:
    """The `dist.group` declaration an op refers to (None for the world group)."""
    if group is None:
        return None
    found = SymbolTable.lookup_symbol(op, group)
    if not isinstance(found, GroupOp):
        raise VerifyException(
            f"'{op.name}' names group {group} but no `dist.group` of that name "
            "is declared at module level"
        )
    return found


class GroupMemberOp(IRDLOperation, ABC):
    """Base of every op that runs on a process group."""

    group = opt_prop_def(SymbolRefAttr)

    def group_declaration(self) -> GroupOp | None:
        return lookup_group(self, self.group)

    def static_group_size(self) -> int | None:
        """The group size when the IR proves it (declared, uniform subgroups)."""
        decl = self.group_declaration()
        return None if decl is None else decl.uniform_size

    def verify_group(self) -> None:
        # Only resolvable once the op sits inside a module.
        if self.group is not None and self.get_toplevel_object() is not self:
            top = self.get_toplevel_object()
            if isinstance(top, ModuleOp):
                lookup_group(self, self.group)


###############################################################################
# Rank queries
###############################################################################


class _RankQueryOp(GroupMemberOp, ABC):
    result = result_def(IndexType)

    traits = traits_def(Pure())

    def __init__(self, group: SymbolRefAttr | str | None = None):
        if isinstance(group, str):
            group = SymbolRefAttr(group)
        super().__init__(
            result_types=[IndexType()],
            properties={"group": group} if group is not None else {},
        )

    def verify_(self) -> None:
        self.verify_group()

    def print(self, printer: Printer) -> None:
        _print_signature(printer, self, [self.result.type])

    @classmethod
    def parse(cls, parser: Parser):
        group = _parse_group(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        type_pos = parser.pos
        result_type = parser.parse_type()
        if not isinstance(result_type, IndexType):
            parser.raise_error(f"'{cls.name}' returns index, not {result_type}", type_pos)
        op = cls(group)
        op.attributes.update(attrs)
        return op


@irdl_op_definition
class RankOp(_RankQueryOp):
    """This process's rank within the group, in [0, group_size)."""

    name = "dist.rank"


@irdl_op_definition
class GroupSizeOp(_RankQueryOp):
    """The number of ranks in the group."""

    name = "dist.group_size"

    traits = traits_def(Pure(), UniformResults())


###############################################################################
# Collectives
###############################################################################


class CollectiveOp(GroupMemberOp, ABC):
    """A collective: every rank of the group must execute it, in the same order."""

    traits = traits_def(CollectiveEffect(), EveryRankEnters())


@irdl_op_definition
class BroadcastOp(CollectiveOp):
    """`y` on every rank equals `x` of group rank `root`.

    The root is a static attribute (`root 0`) or an index operand (`root %r`)
    whose value must agree across ranks. Non-root ranks' `x` only supplies
    the shape and dtype of the message.
    """

    name = "dist.broadcast"

    traits = traits_def(CollectiveEffect(), EveryRankEnters(), UniformResults())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.PAYLOAD, "root_value": OperandRole.ROOT}

    input = operand_def(TensorType)
    root_value = opt_operand_def(IndexType)
    root = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    def __init__(
        self,
        input: SSAValue | Operation,
        root: int | SSAValue | Operation,
        group: SymbolRefAttr | str | None = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {}
        operands: list[SSAValue | Sequence[SSAValue]] = [input]
        if isinstance(root, int):
            props["root"] = IntegerAttr(root, i64)
            operands.append([])
        else:
            operands.append([SSAValue.get(root)])
        _add_group(props, group)
        super().__init__(
            operands=operands, result_types=[input.type], properties=props
        )

    def verify_(self) -> None:
        self.verify_group()
        if (self.root is None) == (self.root_value is None):
            raise VerifyException(
                "'dist.broadcast' needs exactly one root: a static `root N` or an "
                "index operand `root %r`"
            )
        if self.input.type != self.result.type:
            raise VerifyException(
                f"'dist.broadcast' result type {self.result.type} must equal the "
                f"input type {self.input.type}"
            )
        if self.root is not None:
            root = self.root.value.data
            if root < 0:
                raise VerifyException(
                    f"'dist.broadcast' root must be >= 0, got {root}"
                )
            size = self.static_group_size()
            if size is not None and root >= size:
                raise VerifyException(
                    f"'dist.broadcast' root {root} is outside group "
                    f"{self.group} of size {size}"
                )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        printer.print_string(" root ")
        if self.root is not None:
            printer.print_string(str(self.root.value.data))
        else:
            assert self.root_value is not None
            printer.print_operand(self.root_value)
        _print_signature(printer, self, [self.input.type])

    @classmethod
    def parse(cls, parser: Parser) -> BroadcastOp:
        x = parser.parse_unresolved_operand()
        parser.parse_keyword("root")
        root_operand = parser.parse_optional_unresolved_operand()
        root_static = None
        if root_operand is None:
            root_static = parser.parse_integer(allow_boolean=False)
        group = _parse_group(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        t = parser.parse_type()
        root: int | SSAValue = (
            root_static
            if root_static is not None
            else parser.resolve_operand(root_operand, IndexType())  # type: ignore[arg-type]
        )
        op = cls(parser.resolve_operand(x, t), root, group)
        op.attributes.update(attrs)
        return op


@irdl_op_definition
class AllReduceOp(CollectiveOp):
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
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.PAYLOAD, "extras": OperandRole.UNIFORM}

    def __init__(
        self,
        input: SSAValue | Operation,
        *,
        kind: ReductionKind | None = None,
        combine: Region | None = None,
        extras: Sequence[SSAValue | Operation] = (),
        commutative: bool = False,
        algorithm: str | None = None,
        group: SymbolRefAttr | str | None = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {}
        if kind is not None:
            props["kind"] = ReductionKindAttr(kind)
        if commutative:
            props["commutative"] = UnitAttr()
        if algorithm is not None:
            props["algorithm"] = StringAttr(algorithm)
        _add_group(props, group)
        super().__init__(
            operands=[input, [SSAValue.get(e) for e in extras]],
            result_types=[input.type],
            properties=props,
            regions=[combine if combine is not None else Region()],
        )

    @property
    def is_generic(self) -> bool:
        return self.kind is None

    @property
    def combine_block(self) -> Block:
        return self.combine.block

    def verify_(self) -> None:
        self.verify_group()
        if self.result.type != self.input.type:
            raise VerifyException(
                f"'dist.all_reduce' result type {self.result.type} must equal the "
                f"input type {self.input.type}"
            )
        if self.kind is not None:
            self._verify_native()
        else:
            self._verify_generic()

    def _verify_native(self) -> None:
        if self.combine.blocks:
            raise VerifyException(
                "'dist.all_reduce' takes a reduction kind or a combine region, not both"
            )
        if self.extras:
            raise VerifyException(
                "'dist.all_reduce' with a native kind takes no extra operands"
            )
        kind = self.kind.data  # type: ignore[union-attr]
        assert isinstance(self.input.type, TensorType)
        if kind in BITWISE_KINDS and not _is_integer_tensor(self.input.type):
            raise VerifyException(
                f"'dist.all_reduce' kind {kind} needs an integer element type, "
                f"got {self.input.type}"
            )

    def _verify_generic(self) -> None:
        if len(self.combine.blocks) != 1:
            raise VerifyException(
                "'dist.all_reduce' needs a reduction kind or a single-block combine "
                "region"
            )
        block = self.combine.block
        expected = [self.input.type, self.input.type, *(e.type for e in self.extras)]
        got = [a.type for a in block.args]
        if len(got) != len(expected):
            raise VerifyException(
                f"'dist.all_reduce' combine region must take {len(expected)} "
                f"arguments (lhs, rhs, {len(self.extras)} extra), got {len(got)}"
            )
        for i, (g, e) in enumerate(zip(got, expected)):
            if g != e:
                raise VerifyException(
                    f"'dist.all_reduce' combine argument #{i} has type {g}, "
                    f"expected {e}"
                )
        last = block.last_op
        if not isinstance(last, YieldOp):
            raise VerifyException(
                "'dist.all_reduce' combine region must end in `dist.yield`"
            )
        yielded = [v.type for v in last.arguments]
        if yielded != [self.result.type]:
            raise VerifyException(
                "'dist.all_reduce' combine must yield one value of type "
                f"{self.result.type}, got ({', '.join(str(t) for t in yielded)})"
            )

    def print(self, printer: Printer) -> None:
        if self.kind is not None:
            printer.print_string(f" {self.kind.data} ")
            printer.print_operand(self.input)
        else:
            printer.print_string(" ")
            printer.print_list([self.input, *self.extras], printer.print_operand)
        _print_group(printer, self.group)
        if self.commutative is not None:
            printer.print_string(" commutative")
        if self.algorithm is not None:
            printer.print_string(" algorithm ")
            printer.print_string_literal(self.algorithm.data)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_list(
            [self.input.type, *(e.type for e in self.extras)], printer.print_attribute
        )
        if self.kind is None and self.combine.blocks:
            printer.print_string(" combine(")
            printer.print_list(self.combine.block.args, printer.print_operand)
            printer.print_string(") ")
            printer.print_region(self.combine, print_entry_block_args=False)

    @classmethod
    def parse(cls, parser: Parser) -> AllReduceOp:
        kind_name = parser.parse_optional_keyword_in([k.value for k in ReductionKind])
        operands = _parse_operand_list(parser)
        group = _parse_group(parser)
        commutative = parser.parse_optional_keyword("commutative") is not None
        algorithm = None
        if parser.parse_optional_keyword("algorithm") is not None:
            algorithm = parser.parse_str_literal()
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        types = _parse_type_list(parser)
        if len(types) != len(operands):
            parser.raise_error(
                f"'dist.all_reduce' has {len(operands)} operands but "
                f"{len(types)} types"
            )
        values = [parser.resolve_operand(o, t) for o, t in zip(operands, types)]
        region = None
        if kind_name is None:
            parser.parse_keyword("combine")
            args = parser.parse_comma_separated_list(
                parser.Delimiter.PAREN,
                lambda: parser.parse_argument(expect_type=False),
            )
            arg_types = [types[0], *types]
            if len(args) != len(arg_types):
                parser.raise_error(
                    f"'dist.all_reduce' combine takes {len(arg_types)} arguments "
                    f"(lhs, rhs, then one per extra operand), got {len(args)}"
                )
            region = parser.parse_region(
                [a.resolve(t) for a, t in zip(args, arg_types)]
            )
        op = cls(
            values[0],
            kind=ReductionKind(kind_name) if kind_name is not None else None,
            combine=region,
            extras=values[1:],
            commutative=commutative,
            algorithm=algorithm,
            group=group,
        )
        op.attributes.update(attrs)
        return op


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
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.LIMBS, "moduli": OperandRole.MODULI}

    input = operand_def(TensorType)
    moduli = operand_def(TensorType)
    modulus_basis = prop_def(StringAttr, default_value=StringAttr("Q"))
    max_modulus_bits = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    def __init__(
        self,
        input: SSAValue | Operation,
        moduli: SSAValue | Operation,
        *,
        modulus_basis: str = "Q",
        max_modulus_bits: int | None = None,
        group: SymbolRefAttr | str | None = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {"modulus_basis": StringAttr(modulus_basis)}
        if max_modulus_bits is not None:
            props["max_modulus_bits"] = IntegerAttr(max_modulus_bits, i64)
        _add_group(props, group)
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
                "'dist.all_reduce_add_ciphertext' limbs must be i64, got "
                f"{ct.element_type}"
            )
        if mod.element_type != i64:
            raise VerifyException(
                "'dist.all_reduce_add_ciphertext' moduli must be i64, got "
                f"{mod.element_type}"
            )
        if ct.get_num_dims() < 2:
            raise VerifyException(
                "'dist.all_reduce_add_ciphertext' ciphertext must have rank >= 2 "
                f"([..., L, N]), got {ct}"
            )
        if mod.get_num_dims() != 1:
            raise VerifyException(
                f"'dist.all_reduce_add_ciphertext' moduli must have rank 1 ([L]), "
                f"got {mod}"
            )
        limbs, n_moduli = ct.get_shape()[-2], mod.get_shape()[0]
        if limbs >= 0 and n_moduli >= 0 and limbs != n_moduli:
            raise VerifyException(
                f"'dist.all_reduce_add_ciphertext' has {n_moduli} moduli for "
                f"{limbs} limbs (dimension -2 of {ct})"
            )
        if self.result.type != ct:
            raise VerifyException(
                f"'dist.all_reduce_add_ciphertext' result type {self.result.type} "
                f"must equal the ciphertext type {ct}"
            )
        if self.max_modulus_bits is not None:
            bits = self.max_modulus_bits.value.data
            if not 2 <= bits <= 62:
                raise VerifyException(
                    "'dist.all_reduce_add_ciphertext' max_modulus_bits must be in "
                    f"[2, 62], got {bits}"
                )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_list([self.input, self.moduli], printer.print_operand)
        if self.modulus_basis.data != "Q":
            printer.print_string(" basis ")
            printer.print_string_literal(self.modulus_basis.data)
        if self.max_modulus_bits is not None:
            printer.print_string(f" max_modulus_bits {self.max_modulus_bits.value.data}")
        _print_signature(printer, self, [self.input.type, self.moduli.type])

    @classmethod
    def parse(cls, parser: Parser) -> AllReduceAddCiphertextOp:
        ct = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        mod = parser.parse_unresolved_operand()
        basis = "Q"
        if parser.parse_optional_keyword("basis") is not None:
            basis = parser.parse_str_literal()
        bits = None
        if parser.parse_optional_keyword("max_modulus_bits") is not None:
            bits = parser.parse_integer(allow_boolean=False)
        group = _parse_group(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        ct_t = parser.parse_type()
        parser.parse_punctuation(",")
        mod_t = parser.parse_type()
        op = cls(
            parser.resolve_operand(ct, ct_t),
            parser.resolve_operand(mod, mod_t),
            modulus_basis=basis,
            max_modulus_bits=bits,
            group=group,
        )
        op.attributes.update(attrs)
        return op


class RaisesEffect(MemoryEffect):
    """An op that may raise: never deleted, merged or moved by cse and dce."""

    @classmethod
    def get_effects(cls, op: Operation) -> set[EffectInstance]:
        return {EffectInstance(MemoryEffectKind.WRITE)}


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

    traits = traits_def(RaisesEffect())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.LIMBS, "moduli": OperandRole.MODULI}

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
            raise VerifyException(
                "'dist.assert_reduced' takes limbs [..., L, N] and moduli [L]"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_list([self.input, self.moduli], printer.print_operand)
        if self.max_modulus_bits is not None:
            printer.print_string(f" max_modulus_bits {self.max_modulus_bits.value.data}")
        _print_signature(printer, self, [self.input.type, self.moduli.type])

    @classmethod
    def parse(cls, parser: Parser) -> AssertReducedOp:
        ct = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        mod = parser.parse_unresolved_operand()
        bits = None
        if parser.parse_optional_keyword("max_modulus_bits") is not None:
            bits = parser.parse_integer(allow_boolean=False)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        ct_t = parser.parse_type()
        parser.parse_punctuation(",")
        mod_t = parser.parse_type()
        op = cls(parser.resolve_operand(ct, ct_t), parser.resolve_operand(mod, mod_t), bits)
        op.attributes.update(attrs)
        return op


def _verify_axis(op: IRDLOperation, axis: int, t: TensorType) -> None:
    rank = t.get_num_dims()
    if not 0 <= axis < rank:
        raise VerifyException(
            f"'{op.name}' axis {axis} is out of range for {t} (rank {rank})"
        )


def _verify_counts_type(op: IRDLOperation, what: str, t: Attribute) -> None:
    if not _is_integer_tensor(t):
        raise VerifyException(
            f"'{op.name}' {what} must be a tensor of integers, got {t}"
        )
    assert isinstance(t, TensorType)
    if t.get_num_dims() != 1:
        raise VerifyException(f"'{op.name}' {what} must have rank 1, got {t}")


def _verify_same_except_axis(
    op: IRDLOperation, axis: int, a: TensorType, b: TensorType
) -> None:
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
class AllGatherOp(CollectiveOp):
    """Concatenation along `axis` of every rank's `x`, in rank order.

    Even form: every rank contributes the same shape. Uneven form
    (`counts(%c : tensor<Pxi64>)`): rank r contributes `counts[r]` rows along
    the axis, and `counts` must be the same on every rank.
    """

    name = "dist.all_gather"

    traits = traits_def(CollectiveEffect(), EveryRankEnters(), UniformResults())
    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.PAYLOAD, "counts": OperandRole.GATHER_COUNTS}

    input = operand_def(TensorType)
    counts = opt_operand_def(TensorType)
    axis = prop_def(IntegerAttr[I64], default_value=IntegerAttr(0, i64))
    result = result_def(TensorType)

    def __init__(
        self,
        input: SSAValue | Operation,
        result_type: TensorType,
        *,
        axis: int = 0,
        counts: SSAValue | Operation | None = None,
        group: SymbolRefAttr | str | None = None,
    ):
        props: dict[str, Attribute] = {"axis": IntegerAttr(axis, i64)}
        _add_group(props, group)
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
        _verify_axis(self, axis, t_in)
        _verify_same_except_axis(self, axis, t_in, t_out)
        size = self.static_group_size()
        if self.counts is not None:
            _verify_counts_type(self, "counts", self.counts.type)
            assert isinstance(self.counts.type, TensorType)
            n = self.counts.type.get_shape()[0]
            if size is not None and n >= 0 and n != size:
                raise VerifyException(
                    f"'dist.all_gather' counts has {n} entries for a group of "
                    f"size {size}"
                )
        else:
            rows_in, rows_out = t_in.get_shape()[axis], t_out.get_shape()[axis]
            if rows_in >= 0 and rows_out >= 0:
                if size is not None and rows_out != size * rows_in:
                    raise VerifyException(
                        f"'dist.all_gather' result has {rows_out} rows on axis "
                        f"{axis}, expected {size} x {rows_in}"
                    )
                if rows_in == 0 and rows_out != 0 or rows_in and rows_out % rows_in:
                    raise VerifyException(
                        f"'dist.all_gather' result rows ({rows_out}) on axis {axis} "
                        f"must be a multiple of the input rows ({rows_in})"
                    )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        if self.counts is not None:
            printer.print_string(" counts(")
            printer.print_operand(self.counts)
            printer.print_string(" : ")
            printer.print_attribute(self.counts.type)
            printer.print_string(")")
        printer.print_string(f" axis {self.axis.value.data}")
        _print_signature(printer, self, [self.input.type], self.result.type)

    @classmethod
    def parse(cls, parser: Parser) -> AllGatherOp:
        x = parser.parse_unresolved_operand()
        counts = None
        if parser.parse_optional_keyword("counts") is not None:
            parser.parse_punctuation("(")
            c = parser.parse_unresolved_operand()
            parser.parse_punctuation(":")
            counts = parser.resolve_operand(c, parser.parse_type())
            parser.parse_punctuation(")")
        axis = _parse_axis(parser).value.data
        group = _parse_group(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        t_in = parser.parse_type()
        parser.parse_punctuation("->")
        type_pos = parser.pos
        t_out = parser.parse_type()
        if not isinstance(t_out, TensorType):
            parser.raise_error(f"'dist.all_gather' result must be a tensor, got {t_out}", type_pos)
        op = cls(
            parser.resolve_operand(x, t_in), t_out, axis=axis, counts=counts, group=group
        )
        op.attributes.update(attrs)
        return op


@irdl_op_definition
class VariableAllToAllOp(CollectiveOp):
    """Exchange of variable-size row blocks along `axis`.

    Rank r splits its `x` along the axis into P blocks of `send_counts[j]`
    rows (in rank order) and sends block j to rank j. `y` concatenates, in
    rank order, the blocks every peer sent to r; `recv_counts[j]` is the
    number of rows received from j. Zero counts are legal, and every rank
    takes part even when it sends and receives nothing.
    """

    name = "dist.variable_all_to_all"

    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.PAYLOAD, "send_counts": OperandRole.SEND_COUNTS}

    input = operand_def(TensorType)
    send_counts = operand_def(TensorType)
    axis = prop_def(IntegerAttr[I64], default_value=IntegerAttr(0, i64))
    result = result_def(TensorType)
    recv_counts = result_def(TensorType)

    def __init__(
        self,
        input: SSAValue | Operation,
        send_counts: SSAValue | Operation,
        result_type: TensorType,
        *,
        axis: int = 0,
        group: SymbolRefAttr | str | None = None,
    ):
        send_counts = SSAValue.get(send_counts)
        props: dict[str, Attribute] = {"axis": IntegerAttr(axis, i64)}
        _add_group(props, group)
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
        _verify_axis(self, axis, t_in)
        _verify_same_except_axis(self, axis, t_in, t_out)
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
                f"'dist.variable_all_to_all' send counts has {n} entries for a "
                f"group of size {size}"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_list([self.input, self.send_counts], printer.print_operand)
        printer.print_string(f" axis {self.axis.value.data}")
        _print_signature(printer, self, [self.input.type, self.send_counts.type], self.result.type)

    @classmethod
    def parse(cls, parser: Parser) -> VariableAllToAllOp:
        x = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        counts = parser.parse_unresolved_operand()
        axis = _parse_axis(parser).value.data
        group = _parse_group(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        t_in = parser.parse_type()
        parser.parse_punctuation(",")
        t_counts = parser.parse_type()
        parser.parse_punctuation("->")
        type_pos = parser.pos
        t_out = parser.parse_type()
        if not isinstance(t_out, TensorType):
            parser.raise_error(
                f"'dist.variable_all_to_all' result must be a tensor, got {t_out}", type_pos
            )
        op = cls(
            parser.resolve_operand(x, t_in),
            parser.resolve_operand(counts, t_counts),
            t_out,
            axis=axis,
            group=group,
        )
        op.attributes.update(attrs)
        return op


###############################################################################
# Point-to-point
###############################################################################


class PeerOp(GroupMemberOp, ABC):
    """A point-to-point op: only the two ranks involved take part.

    Unlike collectives, point-to-point ops may sit under rank-dependent
    control flow (rank 0 sends, rank 1 receives). Peers are ranks of the
    op's group: a static attribute or an index operand. Every message carries
    a small header (dtype and shape), checked by the receiver, so a mismatch
    is an error naming the op instead of garbage.
    """

    traits = traits_def(CollectiveEffect())

    @staticmethod
    def _peer_props(peer: int | SSAValue | Operation, name: str, props: dict) -> list:
        if isinstance(peer, int):
            props[name] = IntegerAttr(peer, i64)
            return []
        return [SSAValue.get(peer)]

    def _verify_static_peer(self, attr: IntegerAttr | None, what: str) -> None:
        if attr is None:
            return
        peer = attr.value.data
        if peer < 0:
            raise VerifyException(f"'{self.name}' {what} must be >= 0, got {peer}")
        size = self.static_group_size()
        if size is not None and peer >= size:
            raise VerifyException(
                f"'{self.name}' {what} {peer} is outside group {self.group} of size {size}"
            )


def _print_peer(printer: Printer, keyword: str, attr: IntegerAttr | None, value) -> None:
    printer.print_string(f" {keyword} ")
    if attr is not None:
        printer.print_string(str(attr.value.data))
    else:
        printer.print_operand(value)


def _parse_peer(parser: Parser, keyword: str):
    parser.parse_keyword(keyword)
    operand = parser.parse_optional_unresolved_operand()
    if operand is not None:
        return operand
    return parser.parse_integer(allow_boolean=False)


def _resolve_peer(parser: Parser, peer) -> int | SSAValue:
    return peer if isinstance(peer, int) else parser.resolve_operand(peer, IndexType())


@irdl_op_definition
class SendOp(PeerOp):
    """Sends `x` to group rank `to`, which must run a matching `dist.recv`
    (or `dist.sendrecv`)."""

    name = "dist.send"

    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.PAYLOAD, "dest_value": OperandRole.PEER}

    input = operand_def(TensorType)
    dest_value = opt_operand_def(IndexType)
    dest = opt_prop_def(IntegerAttr[I64])

    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def __init__(self, input, dest, group: SymbolRefAttr | str | None = None):
        props: dict[str, Attribute] = {}
        dynamic = self._peer_props(dest, "dest", props)
        _add_group(props, group)
        super().__init__(operands=[SSAValue.get(input), dynamic], properties=props)

    def verify_(self) -> None:
        self.verify_group()
        if (self.dest is None) == (self.dest_value is None):
            raise VerifyException("'dist.send' needs exactly one destination")
        self._verify_static_peer(self.dest, "destination")

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        _print_peer(printer, "to", self.dest, self.dest_value)
        _print_signature(printer, self, [self.input.type])

    @classmethod
    def parse(cls, parser: Parser) -> SendOp:
        x = parser.parse_unresolved_operand()
        dest = _parse_peer(parser, "to")
        group = _parse_group(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        t = parser.parse_type()
        op = cls(parser.resolve_operand(x, t), _resolve_peer(parser, dest), group)
        op.attributes.update(attrs)
        return op


@irdl_op_definition
class RecvOp(PeerOp):
    """Receives a tensor of the result type from group rank `from`."""

    name = "dist.recv"

    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"source_value": OperandRole.PEER}

    source_value = opt_operand_def(IndexType)
    source = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    def __init__(self, source, result_type: TensorType, group: SymbolRefAttr | str | None = None):
        props: dict[str, Attribute] = {}
        dynamic = self._peer_props(source, "source", props)
        _add_group(props, group)
        super().__init__(operands=[dynamic], result_types=[result_type], properties=props)

    def verify_(self) -> None:
        self.verify_group()
        if (self.source is None) == (self.source_value is None):
            raise VerifyException("'dist.recv' needs exactly one source")
        self._verify_static_peer(self.source, "source")

    def print(self, printer: Printer) -> None:
        _print_peer(printer, "from", self.source, self.source_value)
        _print_signature(printer, self, [self.result.type])

    @classmethod
    def parse(cls, parser: Parser) -> RecvOp:
        source = _parse_peer(parser, "from")
        group = _parse_group(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        type_pos = parser.pos
        t = parser.parse_type()
        if not isinstance(t, TensorType):
            parser.raise_error(f"'dist.recv' receives a tensor, not {t}", type_pos)
        op = cls(_resolve_peer(parser, source), t, group)
        op.attributes.update(attrs)
        return op


@irdl_op_definition
class SendRecvOp(PeerOp):
    """Sends `x` to `to` and receives the result from `from`, as one paired
    exchange that cannot deadlock (a ring shift is one `dist.sendrecv` on
    every rank)."""

    name = "dist.sendrecv"

    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {
        "input": OperandRole.PAYLOAD,
        "dest_value": OperandRole.PEER,
        "source_value": OperandRole.PEER,
    }

    input = operand_def(TensorType)
    dest_value = opt_operand_def(IndexType)
    source_value = opt_operand_def(IndexType)
    dest = opt_prop_def(IntegerAttr[I64])
    source = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def __init__(self, input, dest, source, result_type: TensorType | None = None,
                 group: SymbolRefAttr | str | None = None):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {}
        dest_operands = self._peer_props(dest, "dest", props)
        source_operands = self._peer_props(source, "source", props)
        _add_group(props, group)
        super().__init__(
            operands=[input, dest_operands, source_operands],
            result_types=[result_type or input.type],
            properties=props,
        )

    def verify_(self) -> None:
        self.verify_group()
        if (self.dest is None) == (self.dest_value is None):
            raise VerifyException("'dist.sendrecv' needs exactly one destination")
        if (self.source is None) == (self.source_value is None):
            raise VerifyException("'dist.sendrecv' needs exactly one source")
        self._verify_static_peer(self.dest, "destination")
        self._verify_static_peer(self.source, "source")

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        _print_peer(printer, "to", self.dest, self.dest_value)
        _print_peer(printer, "from", self.source, self.source_value)
        _print_signature(printer, self, [self.input.type], self.result.type)

    @classmethod
    def parse(cls, parser: Parser) -> SendRecvOp:
        x = parser.parse_unresolved_operand()
        dest = _parse_peer(parser, "to")
        source = _parse_peer(parser, "from")
        group = _parse_group(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        t = parser.parse_type()
        parser.parse_punctuation("->")
        type_pos = parser.pos
        result_type = parser.parse_type()
        if not isinstance(result_type, TensorType):
            parser.raise_error(f"'dist.sendrecv' receives a tensor, not {result_type}", type_pos)
        op = cls(
            parser.resolve_operand(x, t),
            _resolve_peer(parser, dest),
            _resolve_peer(parser, source),
            result_type,
            group,
        )
        op.attributes.update(attrs)
        return op


###############################################################################
# Waves
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

    def __init__(self, body: Region, result_types: Sequence[Attribute]):
        super().__init__(result_types=[list(result_types)], regions=[body])

    def verify_(self) -> None:
        block = self.body.block
        inner = set()
        for op in block.ops:
            if isinstance(op, YieldOp):
                continue
            if not isinstance(op, CollectiveOp | PeerOp) or isinstance(op, WaveOp):
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

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False)
        printer.print_op_attributes(self.attributes)
        if self.outputs:
            printer.print_string(" : ")
            printer.print_list([r.type for r in self.outputs], printer.print_attribute)

    @classmethod
    def parse(cls, parser: Parser) -> WaveOp:
        region = parser.parse_region()
        attrs = parser.parse_optional_attr_dict()
        types: list[Attribute] = []
        if parser.parse_optional_punctuation(":") is not None:
            types = _parse_type_list(parser)
        op = cls(region, types)
        op.attributes.update(attrs)
        return op


###############################################################################
# Meshes and mesh-to-mesh transfers
###############################################################################


@irdl_op_definition
class MeshOp(IRDLOperation):
    """Declares a mesh: an n-D grid of global ranks, in row-major order.

    `dist.mesh @train [2, 2] ranks [0, 1, 2, 3]`
    """

    name = "dist.mesh"

    sym_name = prop_def(StringAttr)
    shape = prop_def(DenseArrayBase)
    ranks = prop_def(DenseArrayBase)

    traits = traits_def(SymbolOpInterface(), HasParent(ModuleOp))

    def __init__(self, sym_name: str, shape: Sequence[int], ranks: Sequence[int]):
        super().__init__(
            properties={
                "sym_name": StringAttr(sym_name),
                "shape": DenseArrayBase.from_list(i64, list(shape)),
                "ranks": DenseArrayBase.from_list(i64, list(ranks)),
            }
        )

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(self.shape.get_values())

    @property
    def rank_list(self) -> tuple[int, ...]:
        return tuple(self.ranks.get_values())

    def verify_(self) -> None:
        shape, ranks = self.mesh_shape, self.rank_list
        if not shape or any(d < 1 for d in shape):
            raise VerifyException(f"mesh @{self.sym_name.data} needs a shape of positive sizes")
        count = 1
        for d in shape:
            count *= d
        if count != len(ranks):
            raise VerifyException(
                f"mesh @{self.sym_name.data} of shape {list(shape)} needs {count} ranks, "
                f"got {len(ranks)}"
            )
        if len(set(ranks)) != len(ranks) or any(r < 0 for r in ranks):
            raise VerifyException(
                f"mesh @{self.sym_name.data} ranks must be distinct and >= 0"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        printer.print_string(f" {list(self.mesh_shape)} ranks {list(self.rank_list)}")
        printer.print_op_attributes(self.attributes)

    @classmethod
    def parse(cls, parser: Parser) -> MeshOp:
        name = parser.parse_symbol_name().data
        shape = parser.parse_comma_separated_list(
            parser.Delimiter.SQUARE, lambda: parser.parse_integer(False, False)
        )
        parser.parse_keyword("ranks")
        ranks = parser.parse_comma_separated_list(
            parser.Delimiter.SQUARE, lambda: parser.parse_integer(False, False)
        )
        op = cls(name, shape, ranks)
        op.attributes.update(parser.parse_optional_attr_dict())
        return op


REPLICATED = -1


def _print_layout(printer: Printer, dims: Sequence[int]) -> None:
    printer.print_string("[" + ", ".join("*" if d == REPLICATED else str(d) for d in dims) + "]")


def _parse_layout(parser: Parser) -> list[int]:
    def entry() -> int:
        if parser.parse_optional_punctuation("*") is not None:
            return REPLICATED
        return parser.parse_integer(allow_boolean=False, allow_negative=False)

    return parser.parse_comma_separated_list(parser.Delimiter.SQUARE, entry)


@irdl_op_definition
class TransferOp(IRDLOperation):
    """Moves a logically global tensor from one mesh layout to another.

    The global tensor has shape `global`. On the source mesh each tensor
    dimension is sharded over a mesh axis (`0`, `1`, ...) or replicated
    (`*`), in `torch.tensor_split` chunks; with `partial [a]` the source
    values are partial sums over mesh axis a. Every rank of either mesh
    runs the op: a source rank passes its local shard as `x` (others pass an
    empty tensor), and a destination rank gets its local shard of the
    destination layout (others get an empty tensor). Partial sources are
    summed on arrival, in source-rank order; replicated sources are read
    once, spread over the replicas.
    """

    name = "dist.transfer"

    OPERAND_ROLES: ClassVar[Mapping[str, OperandRole]] = {"input": OperandRole.SHARD}

    input = operand_def(TensorType)
    source_mesh = prop_def(SymbolRefAttr)
    source_layout = prop_def(DenseArrayBase)
    source_partial = prop_def(DenseArrayBase)
    dest_mesh = prop_def(SymbolRefAttr)
    dest_layout = prop_def(DenseArrayBase)
    global_shape = prop_def(DenseArrayBase)
    result = result_def(TensorType)

    traits = traits_def(CollectiveEffect(), EveryRankEnters())

    def __init__(
        self,
        input,
        *,
        source_mesh: str,
        source_layout: Sequence[int | None],
        dest_mesh: str,
        dest_layout: Sequence[int | None],
        global_shape: Sequence[int],
        source_partial: Sequence[int] = (),
        result_type: TensorType | None = None,
    ):
        input = SSAValue.get(input)

        def layout(dims: Sequence[int | None]) -> DenseArrayBase:
            return DenseArrayBase.from_list(i64, [REPLICATED if d is None else d for d in dims])

        super().__init__(
            operands=[input],
            result_types=[result_type or input.type],
            properties={
                "source_mesh": SymbolRefAttr(source_mesh),
                "source_layout": layout(source_layout),
                "source_partial": DenseArrayBase.from_list(i64, list(source_partial)),
                "dest_mesh": SymbolRefAttr(dest_mesh),
                "dest_layout": layout(dest_layout),
                "global_shape": DenseArrayBase.from_list(i64, list(global_shape)),
            },
        )

    def layouts(self) -> tuple[tuple[int | None, ...], tuple[int, ...], tuple[int | None, ...]]:
        """(source dims, source partial axes, destination dims), None = replicated."""

        def dims(attr: DenseArrayBase) -> tuple[int | None, ...]:
            return tuple(None if d == REPLICATED else d for d in attr.get_values())

        return dims(self.source_layout), tuple(self.source_partial.get_values()), dims(
            self.dest_layout
        )

    def transfer_spec(self):
        """(source Mesh, source Layout, destination Mesh, destination Layout,
        global shape) as `distir.ir.layouts` values."""
        from distir.ir.layouts import Layout, Mesh

        src_op, dst_op = self.meshes()
        src_dims, partial, dst_dims = self.layouts()
        return (
            Mesh(src_op.sym_name.data, src_op.mesh_shape, src_op.rank_list),
            Layout(src_dims, partial),
            Mesh(dst_op.sym_name.data, dst_op.mesh_shape, dst_op.rank_list),
            Layout(dst_dims),
            tuple(self.global_shape.get_values()),
        )

    def meshes(self) -> tuple[MeshOp, MeshOp]:
        found = []
        for ref in (self.source_mesh, self.dest_mesh):
            mesh = SymbolTable.lookup_symbol(self, ref)
            if not isinstance(mesh, MeshOp):
                raise VerifyException(
                    f"'dist.transfer' names mesh {ref} but no `dist.mesh` of that name is "
                    "declared at module level"
                )
            found.append(mesh)
        return found[0], found[1]

    def verify_(self) -> None:
        t_in, t_out = self.input.type, self.result.type
        assert isinstance(t_in, TensorType) and isinstance(t_out, TensorType)
        rank = len(self.global_shape.get_values())
        if any(d < 0 for d in self.global_shape.get_values()):
            raise VerifyException("'dist.transfer' global shape must be non-negative")
        for what, t in (("input", t_in), ("result", t_out)):
            if t.get_num_dims() != rank:
                raise VerifyException(
                    f"'dist.transfer' {what} {t} must have the rank of the global shape ({rank})"
                )
        if t_in.element_type != t_out.element_type:
            raise VerifyException("'dist.transfer' input and result element types differ")
        src, partial, dst = self.layouts()
        for what, dims in (("source", src), ("destination", dst)):
            if len(dims) != rank:
                raise VerifyException(
                    f"'dist.transfer' {what} layout has {len(dims)} entries for a rank-{rank} "
                    "tensor"
                )
        top = self.get_toplevel_object()
        if isinstance(top, ModuleOp):
            src_mesh, dst_mesh = self.meshes()
            for what, dims, mesh in (("source", src, src_mesh), ("destination", dst, dst_mesh)):
                axes = [d for d in dims if d is not None]
                if len(set(axes)) != len(axes):
                    raise VerifyException(
                        f"'dist.transfer' {what} layout shards two dims over one mesh axis"
                    )
                if any(a >= len(mesh.mesh_shape) for a in axes):
                    raise VerifyException(
                        f"'dist.transfer' {what} layout names a mesh axis that mesh "
                        f"@{mesh.sym_name.data} (rank {len(mesh.mesh_shape)}) lacks"
                    )
            for a in partial:
                if a < 0 or a >= len(src_mesh.mesh_shape) or a in src:
                    raise VerifyException(
                        f"'dist.transfer' partial axis {a} must be a mesh axis of "
                        f"@{src_mesh.sym_name.data} that shards no dim"
                    )

    def print(self, printer: Printer) -> None:
        src, partial, dst = self.layouts()
        printer.print_string(" ")
        printer.print_operand(self.input)
        printer.print_string(" from ")
        printer.print_attribute(self.source_mesh)
        printer.print_string(" ")
        _print_layout(printer, [REPLICATED if d is None else d for d in src])
        if partial:
            printer.print_string(f" partial {list(partial)}")
        printer.print_string(" to ")
        printer.print_attribute(self.dest_mesh)
        printer.print_string(" ")
        _print_layout(printer, [REPLICATED if d is None else d for d in dst])
        printer.print_string(f" global {list(self.global_shape.get_values())}")
        _print_signature(printer, self, [self.input.type], self.result.type)

    @classmethod
    def parse(cls, parser: Parser) -> TransferOp:
        x = parser.parse_unresolved_operand()
        parser.parse_keyword("from")
        mesh_pos = parser.pos
        src_mesh = parser.parse_attribute()
        src = _parse_layout(parser)
        partial: list[int] = []
        if parser.parse_optional_keyword("partial") is not None:
            partial = parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE, lambda: parser.parse_integer(False, False)
            )
        parser.parse_keyword("to")
        dst_mesh = parser.parse_attribute()
        dst = _parse_layout(parser)
        parser.parse_keyword("global")
        shape = parser.parse_comma_separated_list(
            parser.Delimiter.SQUARE, lambda: parser.parse_integer(False, False)
        )
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        t_in = parser.parse_type()
        parser.parse_punctuation("->")
        type_pos = parser.pos
        t_out = parser.parse_type()
        if not isinstance(src_mesh, SymbolRefAttr) or not isinstance(dst_mesh, SymbolRefAttr):
            parser.raise_error("'dist.transfer' meshes are symbols such as @train", mesh_pos)
        if not isinstance(t_out, TensorType):
            parser.raise_error(f"'dist.transfer' result must be a tensor, got {t_out}", type_pos)
        op = cls(
            parser.resolve_operand(x, t_in),
            source_mesh=src_mesh.root_reference.data,
            source_layout=[None if d == REPLICATED else d for d in src],
            dest_mesh=dst_mesh.root_reference.data,
            dest_layout=[None if d == REPLICATED else d for d in dst],
            global_shape=shape,
            source_partial=partial,
            result_type=t_out,
        )
        op.attributes.update(attrs)
        return op


###############################################################################
# Combine-region terminator
###############################################################################


@irdl_op_definition
class YieldOp(AbstractYieldOperation[Attribute]):
    """Terminates a combine region, returning the combined value."""

    name = "dist.yield"

    traits = lazy_traits_def(
        lambda: (IsTerminator(), HasParent(AllReduceOp, WaveOp), Pure())
    )


###############################################################################
# Dialect
###############################################################################

COLLECTIVE_OPS: tuple[type[CollectiveOp], ...] = (
    BroadcastOp,
    AllReduceOp,
    AllReduceAddCiphertextOp,
    AllGatherOp,
    VariableAllToAllOp,
)

PEER_OPS: tuple[type[PeerOp], ...] = (SendOp, RecvOp, SendRecvOp)

Dist = Dialect(
    "dist",
    [
        GroupOp,
        MeshOp,
        RankOp,
        GroupSizeOp,
        *COLLECTIVE_OPS,
        *PEER_OPS,
        WaveOp,
        TransferOp,
        AssertReducedOp,
        YieldOp,
    ],
    [ReductionKindAttr],
)


def group_declarations(module: ModuleOp) -> list[GroupOp]:
    """The module's group declarations in manifest order."""
    return [op for op in module.ops if isinstance(op, GroupOp)]


def iter_collectives(ops: Iterable[Operation]) -> Iterable[CollectiveOp]:
    for op in ops:
        for nested in op.walk():
            if isinstance(nested, CollectiveOp):
                yield nested
