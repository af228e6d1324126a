"""Parsing dist programs with source locations on every operation.

xDSL leaves an op's location unknown unless the text spells `loc(...)`. Errors
raised long after parsing (a verifier, a backend, a rank mismatch) must still
point at the source, so this parser records `file:line:col` of every op it
parses.

It also turns hostile input into located parse errors instead of crashes:

- bytes that are not UTF-8 are reported at the first bad byte;
- an op nested deeper than `MAX_NESTING_DEPTH` regions is rejected where it
  starts ("nesting deeper than 100 levels");
- anything else too deep for Python's stack (brackets of an attribute nested
  hundreds of levels) is reported where parsing stopped;
- an unterminated string literal is an error at once: xDSL 0.74's lexer
  matches strings with a regular expression that backtracks exponentially
  (`"` and 30 letters took minutes), so this parser lexes with a fixed one.

Locations cost O(log n) each: the line starts of the input are computed once
and searched by bisection, so parsing is linear in the size of the file.

`format_parse_error` renders a parse error for people: `file:line:col:
error: message`, then a window of the source line with carets under the
offending text, control characters replaced so that garbage input cannot
drive the terminal.
"""

from __future__ import annotations

import difflib
import re
import struct
import sys
import threading
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from xdsl.context import Context
from xdsl.dialects import arith, math
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import (
    AnyFloat,
    BFloat16Type,
    Builtin,
    DenseIntOrFPElementsAttr,
    FileLineColLoc,
    IntAttr,
    ModuleOp,
    StringAttr,
    UnknownLoc,
)
from xdsl.dialects.func import CallOp, Func, FuncOp
from xdsl.dialects.linalg import Linalg
from xdsl.dialects.math import Math
from xdsl.dialects.scf import Scf
from xdsl.dialects.tensor import Tensor
from xdsl.ir import Dialect, Operation, Region
from xdsl.parser import AttrParser, Parser
from xdsl.parser.generic_parser import ParserState
from xdsl.utils.exceptions import DiagnosticException, MultipleSpansParseError, ParseError
from xdsl.utils.lexer import Input, Span
from xdsl.utils.mlir_lexer import MLIRLexer, MLIRTokenKind

from distir.ir.attributes import REDUCTION_KINDS
from distir.ir.dialect import Dist
from distir.ir.shard import Shard
from distir.ir.tensor_arith import TENSOR_ARITH_OPS

MAX_NESTING_DEPTH = 100
"""Deepest nesting of regions an op of a program may sit in. Every
`{ ... }` region counts one level (a function body, each `scf.if` branch, a
combine region) except the body of a `builtin.module`, spelled out or
implicit: the ops of a function body are at level 1. Programs of this domain
nest a few levels; the limit keeps parsing, verifying and printing far from
Python's recursion limit."""

# Python frames the parser spends per region level (10 measured for `scf.if`
# in custom syntax, 12 in generic syntax), with room for attributes parsed at
# the deepest level.
_FRAMES_PER_LEVEL = 16
_FRAMES_SLACK = 400


class LineIndex:
    """The start position of every line of one text, so that the line and
    column of a position are found by bisection (O(log n)), not by counting
    newlines from the start of the text (O(n)) as xDSL's `Span` does."""

    def __init__(self, text: str):
        starts = [0]
        find = text.find
        newline = find("\n")
        while newline != -1:
            starts.append(newline + 1)
            newline = find("\n", newline + 1)
        self._starts = starts

    def line_and_column(self, position: int) -> tuple[int, int]:
        """One-based line and column (in code points) of `position`."""
        line = bisect_right(self._starts, position)
        return line, position - self._starts[line - 1] + 1


_CONTROLS_TO_REPLACEMENT = {
    c: "\N{REPLACEMENT CHARACTER}" for c in [*range(0x20), *range(0x7F, 0xA0)] if c not in (9, 10)
}


def printable(text: str) -> str:
    """`text` with control characters (but tabs and newlines) shown as
    U+FFFD, one for one, so that columns stay right and garbage in an input
    cannot drive the terminal that shows an error."""
    return text.translate(_CONTROLS_TO_REPLACEMENT)


def decode_source(data: bytes, name: str) -> str:
    """`data` as UTF-8 text; invalid UTF-8 is a parse error at the first bad
    byte, with the line shown (bad bytes as U+FFFD)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        shown = printable(data.decode("utf-8", "replace"))
        position = len(data[: e.start].decode("utf-8"))
        bad = " ".join(f"0x{byte:02x}" for byte in data[e.start : e.end])
        raise ParseError(
            Span(position, position + 1, Input(shown, name)),
            f"invalid UTF-8 ({e.reason}: {bad} at byte offset {e.start}); "
            "MLIR source must be UTF-8 text",
        ) from None


class LinearTimeLexer(MLIRLexer):
    """xDSL's MLIR lexer with a string-literal pattern that cannot backtrack.

    xDSL's `"(?:[^"\\\n\v\f]+|\\...)*"` nests `+` in `*`: on a string with no
    closing quote it tries every way to split the run of characters, twice
    the time per extra character. The possessive `*+` here matches the same
    strings, in linear time.
    """

    _unescaped_characters_regex = re.compile(r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*+"')


_headroom_lock = threading.Lock()
_headroom_users = 0
_saved_limit = 0


@contextmanager
def _recursion_headroom(frames: int) -> Iterator[None]:
    """Raise Python's recursion limit so that `frames` more fit on the stack,
    restoring it when the last user leaves (parses may run in threads)."""
    global _headroom_users, _saved_limit
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    with _headroom_lock:
        if _headroom_users == 0:
            _saved_limit = sys.getrecursionlimit()
        _headroom_users += 1
        if depth + frames > sys.getrecursionlimit():
            sys.setrecursionlimit(depth + frames)
    try:
        yield
    finally:
        with _headroom_lock:
            _headroom_users -= 1
            if _headroom_users == 0:
                sys.setrecursionlimit(_saved_limit)


def _splat_by_bits(self: DenseIntOrFPElementsAttr) -> bool:
    """Whether every element has the same bits. xDSL 0.74 compares values,
    so `dense<[0.0, -0.0]>` printed as the splat `dense<0.0>` (the sign of
    zero lost on a round trip through the printer: `1 / x` then changes
    sign); distir prints through xDSL's printer, so it mends the test there."""
    raw = self.data.data
    count = len(self)
    if count == 0:
        return True
    size = len(raw) // count
    return raw == raw[:size] * count


DenseIntOrFPElementsAttr.is_splat = _splat_by_bits  # type: ignore[method-assign]

#: struct formats of the float element types a bit pattern can name
_FLOAT_FORMATS = {16: "e", 32: "f", 64: "d"}


class _BitPattern(AttrParser._TensorLiteralElement):
    """A hexadecimal element of a dense literal. For a float element type
    MLIR reads it as the element's bit pattern (how it prints -inf, NaN and
    every value it cannot print exactly: `dense<0xFF800000> : tensor<2xf32>`
    is -inf), not as the integer's value (4.29e9, what xDSL reads)."""

    def to_type(self, parser: AttrParser, type):  # noqa: ANN001 - xDSL's signature
        if not isinstance(type, AnyFloat):
            return super().to_type(parser, type)
        width = type.bitwidth
        if self.is_negative:
            parser.raise_error(
                f"a hexadecimal {type} literal is a bit pattern and takes no sign",
                at_position=self.span,
            )
        if isinstance(type, BFloat16Type):  # the top half of an f32's bits
            if self.value >= 1 << 16:
                parser.raise_error(f"bit pattern {self.span.text} is wider than bf16", self.span)
            return struct.unpack("<f", struct.pack("<I", self.value << 16))[0]
        form = _FLOAT_FORMATS.get(width)
        if form is None:
            parser.raise_error(f"no bit patterns for {type} elements", at_position=self.span)
        if self.value >= 1 << width:
            parser.raise_error(
                f"bit pattern {self.span.text} is wider than {type} ({width} bits)",
                at_position=self.span,
            )
        unsigned = {16: "H", 32: "I", 64: "Q"}[width]
        return struct.unpack(f"<{form}", struct.pack(f"<{unsigned}", self.value))[0]


class LocatedParser(Parser):
    """A Parser that stamps `FileLineColLoc` on each op lacking a location,
    reports an op it cannot build as a located parse error, and rejects
    input nested too deeply (see the module docstring).

    Some ops only fail when their constructor runs (an integer that does not
    fit in i64, a type constraint checked while resolving operands); xDSL
    raises those as VerifyException with no location.

    `input` may be bytes (as `distir-opt` reads a file): they must be UTF-8.
    """

    line_offset: int = 0
    """Added to every line number: the lines before this chunk of a
    `--split-input-file` input."""

    def __init__(self, ctx: Context, input: str | bytes, name: str = "<unknown>"):
        text = decode_source(input, name) if isinstance(input, bytes) else input
        super().__init__(ctx, "", name)
        # Parser's constructor lexes with xDSL's lexer; start over with ours.
        self._resume_from(ParserState(LinearTimeLexer(Input(text, name))))
        self._lines = LineIndex(text)
        self._filename = StringAttr(name)
        self._region_depth = 0

    def _parse_tensor_literal_element(self) -> AttrParser._TensorLiteralElement:
        span = self._current_token.span
        word = re.match(r"-?\s*(inf|nan)\b", span.input.content[span.start : span.start + 8])
        if word:
            self.raise_error(
                f"MLIR has no '{word.group(0)}' literal: write a non-finite float as its bit "
                "pattern, as MLIR prints it (f32: 0x7F800000 is inf, 0xFF800000 -inf, "
                "0x7FC00000 NaN; f64: 0x7FF0000000000000 is inf)"
            )
        element = super()._parse_tensor_literal_element()
        text = element.span.text.lstrip("-").lower()
        if text.startswith("0x") and isinstance(element.value, int):
            return _BitPattern(element.is_negative, element.value, element.span)
        return element

    def parse_module(self, allow_implicit_module: bool = True) -> ModuleOp:
        if allow_implicit_module and self._current_token.kind == MLIRTokenKind.EOF:
            # Nothing but whitespace and comments: an empty module, as mlir-opt
            # reads it (xDSL calls it a parse error).
            return ModuleOp([])
        frames = _FRAMES_PER_LEVEL * (MAX_NESTING_DEPTH + 1) + _FRAMES_SLACK
        with _recursion_headroom(frames):
            try:
                return super().parse_module(allow_implicit_module)
            except RecursionError:
                # Raised deep in the stack; unwound by now, so reporting is safe.
                raise ParseError(
                    self._current_token.span,
                    "input nested too deeply to parse (brackets or attributes nested "
                    "hundreds of levels)",
                ) from None

    def parse_optional_region(
        self, arguments: Iterable[Parser.Argument] | None = None
    ) -> Region | None:
        # The op whose syntax is being parsed is the innermost on the dialect
        # stack; a builtin one with a region is a module, which is a container,
        # not a level (so printing, which spells the module out, keeps depth).
        opens = (
            self._current_token.kind == MLIRTokenKind.L_BRACE
            and self._parser_state.dialect_stack[-1] != "builtin"
        )
        self._region_depth += opens
        try:
            return super().parse_optional_region(arguments)
        finally:
            self._region_depth -= opens

    def parse_operation(self) -> Operation:
        start = self._current_token.span
        # Checked at ops, not at regions: an empty region one level deeper
        # (a native all-reduce's, in generic syntax) is harmless.
        if self._region_depth > MAX_NESTING_DEPTH:
            raise ParseError(
                start,
                f"nesting deeper than {MAX_NESTING_DEPTH} levels (ops inside regions "
                f"inside ops; distir accepts at most {MAX_NESTING_DEPTH})",
            )
        try:
            op = super().parse_operation()
        except ParseError as e:
            hinted = self._typo_hint(e, start)
            if hinted is not None:
                raise hinted from None
            raise
        except (DiagnosticException, ValueError) as e:
            raise ParseError(start, str(e)) from e
        if isinstance(op.location, UnknownLoc):
            line, column = self._lines.line_and_column(start.start)
            op.location = FileLineColLoc(
                self._filename, IntAttr(line + self.line_offset), IntAttr(column)
            )
        return op

    def _typo_hint(self, error: ParseError, start: Span) -> ParseError | None:
        """A parse error about a typo, restated with the valid names: an op
        name no dialect registers (with the caret on the name), or a word
        where a reduction kind goes."""
        text = error.span.input.content
        if not isinstance(text, str):
            return None
        unregistered = re.fullmatch(r"Operation (\S+) is not registered", error.msg)
        if unregistered is not None:
            name = unregistered.group(1)
            at = text.find(name, start.start)
            span = Span(at, at + len(name), error.span.input) if at >= 0 else error.span
            return ParseError(span, f"{error.msg}{unknown_op_hint(name, self.ctx)}")
        word = text[error.span.start : error.span.end]
        statement = text[start.start : error.span.start]
        if (
            error.msg == "operand expected"
            and word.isidentifier()
            and "dist.all_reduce" in statement
        ):
            kinds = [kind.value for kind in REDUCTION_KINDS]
            close = difflib.get_close_matches(word, kinds, n=1)
            guess = f"; did you mean '{close[0]}'?" if close else ""
            return ParseError(
                error.span,
                f"'{word}' is not a reduction kind (the kinds are {', '.join(kinds)}), nor an "
                f"operand{guess}",
            )
        return None


def unknown_op_hint(name: str, ctx: Context) -> str:
    """`; did you mean 'dist.all_reduce'?` for an op name no loaded dialect
    has, or the dialects a program may use when its dialect is not one."""
    known = [op.name for op in ctx.loaded_ops] + [
        op.name for d in ctx.loaded_dialects for op in d.operations
    ]
    close = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.75)
    if close:
        return f"; did you mean '{close[0]}'?"
    dialect = name.split(".")[0]
    loaded = [d.name for d in ctx.loaded_dialects]
    if dialect not in loaded:
        return f" (a dist program may use the dialects {', '.join(loaded)})"
    return ""


EXCERPT_WIDTH = 120
"""Longest piece of a source line an error shows (a hostile input may be
one line of megabytes)."""


def source_excerpt(span: Span) -> list[str]:
    """The first line of `span` and carets under it: cut to a window of
    `EXCERPT_WIDTH` characters around the span when longer, with control
    characters shown as U+FFFD."""
    content = span.input.content
    if isinstance(content, bytes):
        content = content.decode("utf-8", "replace")
    start = min(span.start, len(content))
    line_start = content.rfind("\n", 0, start) + 1
    line_end = content.find("\n", start)
    line_end = len(content) if line_end < 0 else line_end
    line = content[line_start:line_end]
    column, stop = start - line_start, max(start + 1, min(span.end, line_end)) - line_start
    prefix = suffix = ""
    if len(line) > EXCERPT_WIDTH:
        left = max(0, min(column - EXCERPT_WIDTH // 2, len(line) - EXCERPT_WIDTH))
        right = left + EXCERPT_WIDTH
        prefix, suffix = ("..." if left else ""), ("..." if right < len(line) else "")
        line, column, stop = line[left:right], column - left, min(stop, right) - left
    carets = " " * (len(prefix) + column) + "^" * max(1, stop - column)
    return [printable(prefix + line + suffix).rstrip("\r"), carets]


def format_parse_error(e: ParseError) -> str:
    """`file:line:col: error: message`, then the source line with carets
    under the offending text (and, for errors about two places, the other)."""
    message = "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c):02x}" for c in e.msg)
    lines = [f"{e.span.get_location()}: error: {message}", *source_excerpt(e.span)]
    if isinstance(e, MultipleSpansParseError):
        if e.ref_text is not None:
            lines.append(e.ref_text.rstrip("\n"))
        for span, note in e.refs:
            lines.append(
                f"{span.get_location()}: note: {note}" if note else f"{span.get_location()}:"
            )
            lines += source_excerpt(span)
    return "\n".join(lines)


#: xDSL's `arith` with the comparisons, select and casts typed on tensors
#: as MLIR types them (see `tensor_arith`)
ARITH = Dialect(
    "arith",
    [TENSOR_ARITH_OPS.get(op, op) for op in Arith.operations],
    list(Arith.attributes),
)


#: Ops the dialects above register that distir has no kernel for (pairs of
#: results, bit counts, integer powers), declared here once: `distir-opt`
#: rejects them when it verifies (`unsupported_op`), the block compiler when
#: `distir.compile` plans, both saying NO_KERNEL. The kernel table
#: (`distir.core.kernels.LOCAL_KERNELS`, which needs torch, so
#: distir-opt cannot read it) covers exactly the other arith and math ops: a
#: test holds the two together.
NO_KERNEL_OPS: frozenset[type[Operation]] = frozenset({
    arith.AddUIExtendedOp, arith.MulSIExtendedOp, arith.MulUIExtendedOp,
    arith.CeilDivSIOp, arith.CeilDivUIOp, arith.FloorDivSIOp,
    math.CountLeadingZerosOp, math.CountTrailingZerosOp, math.CtPopOp, math.IPowIOp,
})  # fmt: skip

#: what both say of an op in NO_KERNEL_OPS, after its name
NO_KERNEL = "has no kernel in distir: no program can run it"


def unsupported_op(root: Operation) -> Operation | None:
    """The first op under `root` that distir cannot run (`NO_KERNEL_OPS`)."""
    return next((op for op in root.walk() if type(op) in NO_KERNEL_OPS), None)


def make_context(*, allow_unregistered: bool = False) -> Context:
    """A context with every dialect a dist program may use."""
    ctx = Context(allow_unregistered=allow_unregistered)
    for dialect in (Builtin, Func, ARITH, Math, Tensor, Scf, Linalg, Dist, Shard):
        ctx.load_dialect(dialect)
    return ctx


def parse_module(
    text: str | bytes, filename: str = "<string>", ctx: Context | None = None
) -> ModuleOp:
    """Parse and return a module (top-level ops are wrapped in one).

    Raises `ParseError` for bad input, including bytes that are not UTF-8 and
    nesting deeper than `MAX_NESTING_DEPTH`."""
    return LocatedParser(ctx or make_context(), text, filename).parse_module()


def parse_file(path: str | Path, ctx: Context | None = None) -> ModuleOp:
    """Parse the module in file `path` (which must hold UTF-8 text)."""
    path = Path(path)
    return parse_module(path.read_bytes(), str(path), ctx)


def format_location(op: Operation) -> str:
    """`file:line:col` of an op, or `<unknown location>`."""
    loc = op.location
    if isinstance(loc, FileLineColLoc):
        return f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"
    return "<unknown location>"


def describe_op(op: Operation) -> str:
    """`'dist.broadcast' at prog.mlir:4:8`: how errors name an op."""
    return f"'{op.name}' at {format_location(op)}"


def function_named(module: ModuleOp, name: str) -> FuncOp | None:
    """The module's top-level `func.func @name`, or None."""
    return next(
        (op for op in module.ops if isinstance(op, FuncOp) and op.sym_name.data == name), None
    )


def reachable_functions(module: ModuleOp, entry: str) -> list[FuncOp]:
    """The entry function and every function it calls, transitively (what
    a run of `@entry` can execute)."""
    functions = {op.sym_name.data: op for op in module.ops if isinstance(op, FuncOp)}
    if entry not in functions:
        return []
    order, todo = [entry], [entry]
    while todo:
        for op in functions[todo.pop()].walk():
            if isinstance(op, CallOp):
                callee = op.callee.root_reference.data
                if callee in functions and callee not in order:
                    order.append(callee)
                    todo.append(callee)
    return [functions[name] for name in order]


def find_verify_failure(root: Operation) -> tuple[Operation, Exception] | None:
    """The innermost op whose verification fails, with its error.

    Ops are visited children first, so when an op's subtree fails but none of
    its descendants does, the op itself broke a rule (a verifier, a trait, or
    a structural check such as a missing terminator in its region).
    """
    for op in root.walk(region_first=True):
        try:
            op.verify()
        except (DiagnosticException, ValueError) as e:
            return op, e
    return None
