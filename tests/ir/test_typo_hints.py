"""Any misspelt op name is a parse error with the caret on the name, and a
one-letter slip of a dist op is answered with the op meant."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples
from xdsl.utils.exceptions import ParseError

from distir.ir.dialect import Dist
from distir.ir.parsing import format_parse_error, make_context, parse_module

DIST_OPS = sorted(op.name for op in Dist.operations)
REGISTERED = {op.name for d in make_context().loaded_dialects for op in d.operations}
LETTERS = "abcdefghijklmnopqrstuvwxyz_"


@st.composite
def slips(draw) -> tuple[str, str]:
    """(a dist op name, the name with one letter of its op part dropped,
    doubled or replaced)."""
    name = draw(st.sampled_from(DIST_OPS))
    dialect, op = name.split(".", 1)
    i = draw(st.integers(0, len(op) - 1))
    kind = draw(st.sampled_from(["drop", "double", "replace"]))
    if kind == "drop":
        op = op[:i] + op[i + 1 :]
    elif kind == "double":
        op = op[:i] + op[i] + op[i:]
    else:
        op = op[:i] + draw(st.sampled_from(LETTERS)) + op[i + 1 :]
    return name, f"{dialect}.{op}"


@settings(max_examples=examples(0.6), deadline=None)
@given(slip=slips())
def test_a_one_letter_slip_is_a_located_error_with_a_hint(slip) -> None:
    meant, typed = slip
    if typed in REGISTERED or not typed.split(".", 1)[1]:
        return  # the slip spelt another op
    text = f"func.func @main() {{\n  {typed}\n  func.return\n}}\n"
    with pytest.raises(ParseError) as info:
        parse_module(text)
    rendered = format_parse_error(info.value)
    first, source, carets = rendered.splitlines()[:3]
    assert first.startswith(
        f"<string>:2:3: error: Operation {typed} is not registered; did you mean '"
    )
    assert carets == "  " + "^" * len(typed)
    if len(meant) > 8:  # short names have closer neighbours
        assert "did you mean 'dist." in first
