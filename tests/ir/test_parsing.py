"""The located parser on hostile and large input: bytes that are not UTF-8
and nesting too deep are located parse errors, never a crash; the deepest
accepted program verifies and prints; locations are right and cost O(log n),
so parsing time grows linearly with the file."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest
from xdsl.dialects.builtin import FileLineColLoc
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError
from xdsl.utils.lexer import Input, Span

import distir
from distir.errors import CompileError
from distir.ir.parsing import MAX_NESTING_DEPTH, LineIndex, parse_file, parse_module

VALID = """\
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = dist.all_reduce sum %x : tensor<4xf32>
  func.return %y : tensor<4xf32>
}
"""


def nested(levels: int) -> str:
    """A program whose deepest op (an all-reduce) sits `levels` regions deep:
    the function body is level 1, each `scf.if` adds one. The condition is a
    constant, so every rank takes the same branches."""
    ifs = levels - 1
    lines = [
        "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {",
        "  %c = arith.constant true",
    ]
    lines += ["  " * (i + 1) + "scf.if %c {" for i in range(ifs)]
    lines.append("  " * (ifs + 1) + "%y = dist.all_reduce sum %x : tensor<4xf32>")
    lines += ["  " * (i + 1) + "}" for i in reversed(range(ifs))]
    lines += ["  func.return %x : tensor<4xf32>", "}"]
    return "\n".join(lines) + "\n"


def generic_text(module) -> str:
    from io import StringIO

    out = StringIO()
    Printer(stream=out, print_generic_format=True).print_op(module)
    return out.getvalue()


# Bytes that are not UTF-8 ----------------------------------------------------


def test_invalid_utf8_is_a_parse_error_at_the_first_bad_byte() -> None:
    data = VALID.encode().replace(b"%y = ", b"%y = \xff\xfe ")
    with pytest.raises(ParseError) as info:
        parse_module(data, "bad.mlir")
    assert str(info.value.span.get_location()) == "bad.mlir:2:8"
    offset = data.index(b"\xff")
    assert f"invalid UTF-8 (invalid start byte: 0xff at byte offset {offset})" in info.value.msg


def test_truncated_utf8_at_the_end_is_a_parse_error() -> None:
    data = VALID.encode() + "// café".encode()[:-1]  # the é cut in half
    with pytest.raises(ParseError) as info:
        parse_module(data, "cut.mlir")
    assert "unexpected end of data: 0xc3" in info.value.msg
    assert info.value.span.get_location().line == 5


def test_valid_utf8_bytes_parse_like_text() -> None:
    data = VALID.replace("func.return", "// ünïcode\n  func.return").encode()
    assert str(parse_module(data)) == str(parse_module(data.decode()))


def test_parse_file_of_binary_garbage_is_a_parse_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.mlir"
    path.write_bytes(bytes(random.Random(0).randrange(256) for _ in range(4096)))
    with pytest.raises(ParseError):
        parse_file(path)


def test_control_characters_of_garbage_are_not_shown_raw() -> None:
    """The line an error shows must not carry terminal escapes."""
    data = b"\x1b[2J\x1b]0;owned\x07 \xff"
    with pytest.raises(ParseError) as info:
        parse_module(data, "esc.mlir")
    shown = info.value.span.input.content
    assert "\x1b" not in shown and "\x07" not in shown
    assert len(shown) == len(data.decode("utf-8", "replace"))  # columns unchanged


def test_an_unterminated_string_is_an_error_at_once() -> None:
    """xDSL's string pattern backtracked exponentially: 28 letters after a
    quote took about 13 s, each one more 2x longer, so 30 letters about
    50 s, far above a bound that a loaded machine cannot reach by chance
    (linear parsing takes milliseconds)."""
    text = 'func.func @main() {\n  "func.return"() {a = "' + "a" * 30 + "\n}\n"
    start = time.perf_counter()
    with pytest.raises(ParseError, match="closing string literal"):
        parse_module(text)
    assert time.perf_counter() - start < 10.0


def test_strings_with_escapes_still_parse() -> None:
    text = 'func.func @main() {\n  "func.return"() {a = "q\\"\\n\\22\\\\"} : () -> ()\n}\n'
    (op,) = [op for op in parse_module(text).walk() if op.name == "func.return"]
    assert op.attributes["a"].data == 'q"\n"\\'


# Nesting ------------------------------------------------------------------------


def test_the_deepest_accepted_program_parses_verifies_prints_and_reparses() -> None:
    """At Python's default recursion limit (pytest runs at 1000)."""
    limit = sys.getrecursionlimit()
    module = parse_module(nested(MAX_NESTING_DEPTH))
    module.verify()
    printed = str(module)  # spells `builtin.module {` out: not a level
    generic = generic_text(module)  # gives the all-reduce an empty region
    assert str(parse_module(printed)) == printed
    assert str(parse_module(generic)) == printed
    parse_module(generic).verify()
    assert sys.getrecursionlimit() == limit  # the parser's headroom is given back


def test_one_level_more_is_a_located_parse_error() -> None:
    text = nested(MAX_NESTING_DEPTH + 1)
    with pytest.raises(ParseError) as info:
        parse_module(text, "deep.mlir")
    assert info.value.msg.startswith(f"nesting deeper than {MAX_NESTING_DEPTH} levels")
    deepest = next(n for n, line in enumerate(text.splitlines(), 1) if "all_reduce" in line)
    assert info.value.span.get_location().line == deepest


def test_a_deep_scf_if_chain_no_longer_overflows_the_stack() -> None:
    """150 nested `scf.if` raised RecursionError with ~1,000 frames."""
    with pytest.raises(ParseError, match="nesting deeper than 100 levels"):
        parse_module(nested(150))


def test_compile_reports_too_deep_nesting_as_a_compile_error() -> None:
    with pytest.raises(CompileError, match="nesting deeper than 100 levels"):
        distir.compile(nested(MAX_NESTING_DEPTH + 1))


def test_compile_accepts_the_deepest_program() -> None:
    program = distir.compile(nested(MAX_NESTING_DEPTH))
    assert "dist.all_reduce" in str(program.module)


@pytest.mark.parametrize(
    "deep",
    [
        "[" * 5000 + "]" * 5000,  # an array attribute
        "tensor<" * 3000 + "f32" + ">" * 3000,  # a type
        "(" * 5000,  # unbalanced: the parser gives up where it stopped
    ],
    ids=["array", "type", "unbalanced-parentheses"],
)
def test_attributes_nested_too_deep_are_a_parse_error(deep: str) -> None:
    """Raised RecursionError; now a parse error where the parser stopped."""
    text = f'func.func @main() {{\n  "func.return"() {{a = {deep}}} : () -> ()\n}}\n'
    with pytest.raises(ParseError) as info:
        parse_module(text)
    assert info.value.span.get_location().line == 2
    assert "nested too deeply" in info.value.msg


# Locations ----------------------------------------------------------------------


def test_line_index_agrees_with_counting_newlines() -> None:
    rng = random.Random(1)
    text = "".join(rng.choice("ab\n\n  é") for _ in range(3000))
    index = LineIndex(text)
    for position in [0, len(text), *rng.sample(range(len(text)), 300)]:
        expected = Span(position, position, Input(text, "x")).get_location()
        assert index.line_and_column(position) == (expected.line, expected.col)


def test_every_op_is_located_where_it_starts() -> None:
    text = (
        VALID
        + "\n// a comment\nfunc.func @other() {\n    %r = dist.rank : index\n  func.return\n}\n"
    )
    module = parse_module(text, "prog.mlir")
    located = {
        op.name: (op.location.line.data, op.location.column.data)
        for op in module.walk()
        if isinstance(op.location, FileLineColLoc)
    }
    assert located["dist.all_reduce"] == (2, 3)
    assert located["dist.rank"] == (8, 5)
    assert all(isinstance(op.location, FileLineColLoc) for op in module.walk() if op is not module)


def _flat_program(ops: int) -> str:
    """`ops` chained all-reduces, each line followed by a long comment: the
    old parser counted every newline before each op, O(bytes) per op."""
    comment = "  // " + "x" * 2000 + "\n"
    lines = ["func.func @main(%v0: tensor<4xf32>) -> tensor<4xf32> {\n"]
    for i in range(ops):
        lines.append(f"  %v{i + 1} = dist.all_reduce sum %v{i} : tensor<4xf32>\n{comment}")
    lines.append(f"  func.return %v{ops} : tensor<4xf32>\n}}\n")
    return "".join(lines)


def _parse_seconds(*texts: str) -> list[float]:
    """The best of three CPU times (not wall time: other processes on the
    machine do not count) to parse each text, measured in turns."""
    best = [float("inf")] * len(texts)
    for _ in range(3):
        for i, text in enumerate(texts):
            start = time.process_time()
            parse_module(text)
            best[i] = min(best[i], time.process_time() - start)
    return best


def test_parsing_time_grows_linearly_with_the_file() -> None:
    """4x the ops (and bytes) takes about 4x the time; the quadratic parser
    took over 10x (0.4 s and 5.6 s here)."""
    small, large = _parse_seconds(_flat_program(500), _flat_program(2000))
    ratio = large / small
    assert ratio < 8, f"4x the input took {ratio:.1f}x the time"
