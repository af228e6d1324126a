"""Pieces of dist syntax that xDSL's declarative format cannot spell.

Every dist op declares its syntax as an `assembly_format` string; the custom
directives here fill the gaps, each one written once and used by every op
whose syntax has that piece (as shard's `DynamicIndexList` serves every shard
op with an index list):

- `GroupRef`: the optional `group @g` of every op that runs on a process group;
- `StaticOrDynamicRank`: a group rank written as a literal or an index operand
  (`root 0` / `root %r`, `to 1` / `to %peer`, `from 0` / `from %peer`);
- `SharedType`: one type written once for two values that must have it (a
  broadcast's input and result);
- `OptionalEnum`: an optional bare enum keyword (`sum` in `dist.all_reduce sum`);
- `CombineRegion`: `combine(%lhs, %rhs, %extra...) {...}`, a region whose
  entry block arguments are named but not typed (their types are operand
  types);
- `RankLists`: nested lists of ranks, `[[0, 1], [2, 3]]`;
- `MeshLayout`: a layout with `*` for replicated dims, `[0, *]`.

Parse errors point at the offending token and say what was expected there.
"""

from __future__ import annotations

from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    IndexType,
    IntegerAttr,
    SymbolRefAttr,
    i64,
)
from xdsl.ir import Attribute
from xdsl.irdl import IRDLOperation
from xdsl.irdl.declarative_assembly_format import (
    AttributeVariable,
    CustomDirective,
    OptionalOperandVariable,
    ParsingState,
    PrintingState,
    RegionVariable,
    TypeDirective,
    UniqueBaseAttributeVariable,
    irdl_custom_directive,
)
from xdsl.parser import Parser
from xdsl.printer import Printer

#: How a replicated (unsharded) dim is stored in a layout property.
REPLICATED = -1


def _parse_rank(parser: Parser, what: str) -> int:
    """A non-negative integer literal, with an error that says what was expected."""
    return parser.expect(
        lambda: parser.parse_optional_integer(allow_boolean=False, allow_negative=False),
        f"expected {what}",
    )


def _operand_types(state: ParsingState, directive: TypeDirective) -> tuple[Attribute, ...]:
    """The types already parsed for the operand a `ref(type($x))` names."""
    index = directive.inner.index  # type: ignore[attr-defined]
    return tuple(state.operand_types[index] or ())


@irdl_custom_directive
class GroupRef(CustomDirective):
    """`group @g`, or nothing for the default (world) group:
    `custom<GroupRef>($group)`."""

    group: AttributeVariable

    def parse(self, parser: Parser, state: ParsingState) -> None:
        if parser.parse_optional_keyword("group") is None:
            return
        start = parser.pos
        group = parser.parse_attribute()
        if not isinstance(group, SymbolRefAttr):
            parser.raise_error("expected a group symbol such as @tp after `group`", start)
        self.group.set(state, group)

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        group = self.group.get(op)
        if group is None:
            return
        state.print_whitespace(printer)
        printer.print_string("group ")
        printer.print_attribute(group)


@irdl_custom_directive
class StaticOrDynamicRank(CustomDirective):
    """A group rank that is a literal (`0`, stored in the i64 property) or an
    index operand (`%r`): `custom<StaticOrDynamicRank>($root_value, $root)`.
    Exactly one of the two is set; the op's verifier checks that for IR
    built in other ways."""

    dynamic: OptionalOperandVariable
    static: AttributeVariable

    def parse(self, parser: Parser, state: ParsingState) -> None:
        operand = parser.parse_optional_unresolved_operand()
        self.dynamic.set(state, operand)
        if operand is not None:
            self.dynamic.set_types(state, (IndexType(),))
        else:
            # A literal out of the i64 range raises while the parser still
            # points at the op, which reports it there.
            value = parser.expect(
                lambda: parser.parse_optional_integer(allow_boolean=False),
                "expected a group rank: an integer or an index value such as %r",
            )
            self.static.set(state, IntegerAttr(value, i64))

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        static, dynamic = self.static.get(op), self.dynamic.get(op)
        if (static is None) == (dynamic is None):
            raise ValueError(
                f"'{op.name}' needs exactly one of `{self.static.name}` and "
                f"`{self.dynamic.name}` to print in custom syntax"
            )
        state.print_whitespace(printer)
        if isinstance(static, IntegerAttr):
            printer.print_string(str(static.value.data))
        else:
            printer.print_operand(dynamic)


@irdl_custom_directive
class SharedType(CustomDirective):
    """One type written for two values: `custom<SharedType>(type($input),
    type($result))` prints the first value's type and parses one type into
    both. The op's verifier still checks the two agree (for IR built in
    other ways), with its own message."""

    first: TypeDirective
    second: TypeDirective

    def parse(self, parser: Parser, state: ParsingState) -> None:
        shared = parser.parse_type()
        self.first.set(state, (shared,))
        self.second.set(state, (shared,))

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        (first,), (second,) = self.first.get(op), self.second.get(op)
        if first != second:
            raise ValueError(
                f"'{op.name}' types {first} and {second} differ; the custom syntax "
                "writes one type for both"
            )
        state.print_whitespace(printer)
        printer.print_attribute(first)


@irdl_custom_directive
class OptionalEnum(CustomDirective):
    """An optional enum property written as a bare keyword (`sum`), nothing
    when absent: `custom<OptionalEnum>($kind)`. A word that is not one of
    the enum's values is left for the next directive to reject."""

    attr: UniqueBaseAttributeVariable

    def parse(self, parser: Parser, state: ParsingState) -> None:
        enum = self.attr.unique_base.enum_type  # type: ignore[attr-defined]
        word = parser.parse_optional_keyword_in([member.value for member in enum])
        if word is not None:
            self.attr.set(state, self.attr.unique_base(enum(word)))  # type: ignore[call-arg]

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        attr = self.attr.get(op)
        if attr is None:
            return
        state.print_whitespace(printer)
        printer.print_string(str(attr.data))  # type: ignore[attr-defined]


@irdl_custom_directive
class CombineRegion(CustomDirective):
    """`combine(%lhs, %rhs, %extra...) { ... }`, or nothing (an empty region):
    `custom<CombineRegion>($combine, ref(type($input)), ref(type($extras)))`.

    The entry block's arguments are named without types: they are
    `(input, input, extra...)` as the op's type list gave them. MLIR's
    format language prints a region's entry block as `^bb0(%a: T, ...)`, which
    would repeat every type. Before the region, the directive also checks that
    the type list has one type per operand, while the parser still points at
    the op.
    """

    region: RegionVariable
    input_type: TypeDirective
    extras_type: TypeDirective

    def parse(self, parser: Parser, state: ParsingState) -> None:
        name = state.op_type.name
        input_types = _operand_types(state, self.input_type)
        extra_types = _operand_types(state, self.extras_type)
        extras_index = self.extras_type.inner.index  # type: ignore[attr-defined]
        operands = 1 + len(state.operands[extras_index] or ())
        if operands != len(input_types) + len(extra_types):
            parser.raise_error(
                f"'{name}' has {operands} operands but {len(input_types) + len(extra_types)} types"
            )
        if parser.parse_optional_keyword("combine") is None:
            self.region.set_empty(state)
            return
        args = parser.parse_comma_separated_list(
            parser.Delimiter.PAREN, lambda: parser.parse_argument(expect_type=False)
        )
        arg_types = [*input_types, *input_types, *extra_types]
        if len(args) != len(arg_types):
            parser.raise_error(
                f"'{name}' combine takes {len(arg_types)} arguments "
                f"(lhs, rhs, then one per extra operand), got {len(args)}"
            )
        region = parser.parse_region([a.resolve(t) for a, t in zip(args, arg_types)])
        self.region.set(state, region)

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        region = self.region.get(op)
        if not region.blocks:
            return
        state.print_whitespace(printer)
        printer.print_string("combine(")
        printer.print_list(region.block.args, printer.print_operand)
        printer.print_string(") ")
        printer.print_region(region, print_entry_block_args=False)


@irdl_custom_directive
class RankLists(CustomDirective):
    """Lists of non-negative ranks, `[[0, 1], [2, 3]]`, stored as an array of
    i64 dense arrays: `custom<RankLists>($subgroups)`."""

    lists: AttributeVariable

    def parse(self, parser: Parser, state: ParsingState) -> None:
        def ranks() -> list[int]:
            return parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE, lambda: _parse_rank(parser, "a global rank (>= 0)")
            )

        parts = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, ranks)
        self.lists.set(state, ArrayAttr([DenseArrayBase.from_list(i64, p) for p in parts]))

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        lists = self.lists.get(op)
        assert isinstance(lists, ArrayAttr)
        state.print_whitespace(printer)
        printer.print_string(
            "[" + ", ".join(f"[{', '.join(map(str, p.get_values()))}]" for p in lists) + "]"
        )


@irdl_custom_directive
class MeshLayout(CustomDirective):
    """Per tensor dim, the mesh axis that shards it or `*` (replicated):
    `[0, *]`, stored as i64 with `*` as `REPLICATED`:
    `custom<MeshLayout>($source_layout)`."""

    layout: AttributeVariable

    def parse(self, parser: Parser, state: ParsingState) -> None:
        def entry() -> int:
            if parser.parse_optional_punctuation("*") is not None:
                return REPLICATED
            return _parse_rank(parser, "a mesh axis (>= 0) or `*` (replicated)")

        dims = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, entry)
        self.layout.set(state, DenseArrayBase.from_list(i64, dims))

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        layout = self.layout.get(op)
        assert isinstance(layout, DenseArrayBase)
        state.print_whitespace(printer)
        dims = ("*" if d == REPLICATED else str(d) for d in layout.get_values())
        printer.print_string("[" + ", ".join(dims) + "]")
