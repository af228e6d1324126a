"""`defer-modular-reduction` replaces a ciphertext all-reduce by a native int64
sum and one remainder exactly when `P * (q_max - 1) <= 2^63 - 1` is proved."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pass_support import FILENAME, line_of, locations, op_names, ops_named, rerun, run
from strategies import examples
from xdsl.dialects.builtin import ModuleOp

from distir.ir.dialect import AllReduceAddCiphertextOp, AllReduceOp, ReductionKind
from distir.ir.modular import INT64_MAX
from distir.ir.parsing import parse_module
from distir.passes import parse_pipeline
from distir.passes.defer_modular_reduction import (
    DeferModularReductionPass,
    decide,
)

PASS = "defer-modular-reduction"
KIND = "dist.all_reduce_add_ciphertext"


def program(
    *,
    groups: str = "",
    group: str = "",
    moduli: list[int] | None = None,
    bits: int | None = None,
    shape: str = "4x8",
    limbs: int = 4,
) -> str:
    """A one-op program: constant moduli when `moduli` is given, else an
    argument; `max_modulus_bits` when `bits` is given."""
    t, m = f"tensor<{shape}xi64>", f"tensor<{limbs}xi64>"
    decl = f"dist.group @g {groups}\n" if groups else ""
    args = f"%ct: {t}" if moduli is not None else f"%ct: {t}, %q: {m}"
    const = f"  %q = arith.constant dense<{moduli}> : {m}\n" if moduli is not None else ""
    attrs = (f" max_modulus_bits {bits}" if bits is not None else "") + (
        " group @g" if group else ""
    )
    return (
        f"{decl}func.func @main({args}) -> {t} {{\n{const}"
        f"  %y = {KIND} %ct, %q{attrs} : {t}, {m}\n"
        f"  func.return %y : {t}\n}}\n"
    )


def deferred(module: ModuleOp) -> bool:
    names = op_names(module)
    if KIND in names:
        assert "arith.remui" not in names
        return False
    (native,) = ops_named(module, "dist.all_reduce")
    assert isinstance(native, AllReduceOp) and native.kind is not None
    assert native.kind.data == ReductionKind.SUM
    return True


def pass_spec(max_group_size: int | None = None, remarks: bool = False) -> str:
    options = []
    if max_group_size is not None:
        options.append(f"max-group-size={max_group_size}")
    if remarks:
        options.append("remarks=true")
    return PASS + ("{" + " ".join(options) + "}" if options else "")


# The rewrite ------------------------------------------------------------------


def test_the_rewrite_is_a_native_sum_then_one_remainder():
    text = program(groups="[[0, 1], [2, 3]]", group="@g", bits=40)
    out = str(run(text, PASS))
    expected = [
        "%empty = tensor.empty() : tensor<4x8xi64>",
        "%q_bcast = linalg.broadcast ins(%q:tensor<4xi64>) outs(%empty:tensor<4x8xi64>) "
        "dimensions = [1]",
        "%sum = dist.all_reduce sum %ct group @g : tensor<4x8xi64>",
        "%y = arith.remui %sum, %q_bcast : tensor<4x8xi64>",
        "func.return %y : tensor<4x8xi64>",
    ]
    lines = [line.strip() for line in out.splitlines()]
    positions = [lines.index(line) for line in expected]
    assert positions == sorted(positions)
    assert KIND not in out


def test_new_ops_keep_the_source_location_and_attributes():
    text = program(groups="[[0, 1]]", group="@g", bits=40, shape="?x4x?")
    text = text.replace("group @g :", 'group @g {note = "keep"} :')
    module = run(text, PASS)
    line = line_of(text, KIND)
    new_ops = [
        op
        for op in module.walk()
        if op.name not in ("builtin.module", "dist.group", "func.func", "func.return")
    ]
    assert {"tensor.dim", "tensor.empty", "linalg.broadcast", "arith.remui"} <= {
        op.name for op in new_ops
    }
    assert locations(new_ops) == {f"{FILENAME}:{line}:3"}
    (native,) = ops_named(module, "dist.all_reduce")
    assert str(native.attributes["note"]) == '"keep"'


def test_running_twice_changes_nothing():
    once = run(program(groups="[[0, 1]]", group="@g", bits=40), PASS)
    assert str(rerun(once, PASS)) == str(once)


def test_it_must_run_before_lower_ciphertext_add():
    text = program(groups="[[0, 1]]", group="@g", bits=40)
    first = run(text, f"{PASS},lower-ciphertext-add")
    assert "arith.remui" in op_names(first)
    assert not any(op.combine.blocks for op in ops_named(first, "dist.all_reduce"))
    after = run(text, f"lower-ciphertext-add,{PASS}")
    assert "arith.remui" not in op_names(after)


# The bound, exactly at the boundary ---------------------------------------------


# 7 and 73 divide 2^63 - 1, so for them the bound is met with equality.
@pytest.mark.parametrize("group_size", [2, 3, 5, 7, 8, 73])
def test_constant_moduli_exactly_at_the_bound_are_deferred_and_one_past_is_not(group_size):
    ranks = list(range(group_size))
    groups = f"[{ranks}]"
    q_max = INT64_MAX // group_size + 1  # P * (q_max - 1) <= 2^63 - 1, tightly
    assert group_size * (q_max - 1) <= INT64_MAX < group_size * q_max
    assert (group_size * (q_max - 1) == INT64_MAX) == (group_size in (7, 73))
    at = program(groups=groups, group="@g", moduli=[3, q_max, 5, 7])
    past = program(groups=groups, group="@g", moduli=[3, q_max + 1, 5, 7])
    assert deferred(run(at, PASS))
    assert not deferred(run(past, PASS))


def test_two_ranks_and_moduli_up_to_two_to_the_62_are_deferred():
    groups = "[[0, 1], [2, 3]]"
    assert (INT64_MAX // 2) + 1 == 2**62
    assert deferred(run(program(groups=groups, group="@g", moduli=[2**62] * 4), PASS))
    assert not deferred(run(program(groups=groups, group="@g", moduli=[2**62 + 1, 3, 3, 3]), PASS))


@pytest.mark.parametrize(
    ("bits", "largest_group"),
    [(62, 2), (61, 4), (60, 8), (40, 8388608), (2, 2**62 - 1)],
)
def test_max_modulus_bits_bound_q_minus_one_by_two_to_the_b_minus_two(bits, largest_group):
    assert largest_group * (2**bits - 2) <= INT64_MAX < (largest_group + 1) * (2**bits - 2)
    text = program(bits=bits)
    assert deferred(run(text, pass_spec(max_group_size=largest_group)))
    assert not deferred(run(text, pass_spec(max_group_size=largest_group + 1)))


def test_max_modulus_bits_with_a_declared_group():
    at = program(groups="[[0, 1, 2, 3, 4, 5, 6, 7]]", group="@g", bits=60)
    past = program(groups="[[0, 1, 2, 3, 4, 5, 6, 7, 8]]", group="@g", bits=60)
    assert deferred(run(at, PASS))
    assert not deferred(run(past, PASS))


def test_constant_moduli_take_precedence_over_max_modulus_bits():
    # The constants are the moduli; the declared bound is only a bound.
    text = program(groups="[[0, 1, 2]]", group="@g", moduli=[17, 19, 23, 29], bits=62)
    assert deferred(run(text, PASS))


def test_a_splat_constant_modulus_is_a_constant_too():
    text = program(groups="[[0, 1]]", group="@g", moduli=[2**62] * 4).replace(
        f"dense<{[2**62] * 4}>", f"dense<{2**62}>"
    )
    assert f"dense<{2**62}>" in text
    assert deferred(run(text, PASS))


# Where the facts come from --------------------------------------------------------


def test_the_declared_group_size_wins_over_the_option():
    at = program(groups="[[0, 1], [2, 3]]", group="@g", bits=62)
    assert deferred(run(at, pass_spec(max_group_size=1000)))
    past = program(groups="[[0, 1, 2], [3, 4, 5]]", group="@g", bits=62)
    assert not deferred(run(past, pass_spec(max_group_size=2)))


def test_the_world_group_needs_the_option():
    text = program(bits=40)
    assert not deferred(run(text, PASS))
    assert deferred(run(text, pass_spec(max_group_size=8)))


def test_a_group_with_subgroups_of_different_sizes_needs_the_option():
    text = program(groups="[[0, 1], [2, 3, 4]]", group="@g", bits=40)
    assert not deferred(run(text, PASS))
    assert deferred(run(text, pass_spec(max_group_size=3)))


def test_unknown_moduli_keep_the_op():
    assert not deferred(run(program(groups="[[0, 1]]", group="@g"), PASS))


def test_non_positive_constant_moduli_keep_the_op():
    text = program(groups="[[0, 1]]", group="@g", moduli=[0, 3, 5, 7])
    assert not deferred(run(text, PASS))


def test_the_option_parses_from_a_pipeline_and_must_be_positive():
    (p,) = parse_pipeline("defer-modular-reduction{max-group-size=8 remarks=true}").passes
    assert p == DeferModularReductionPass(max_group_size=8, remarks=True)
    with pytest.raises(ValueError, match="max-group-size. must be an integer >= 1"):
        DeferModularReductionPass(max_group_size=0)


# Remarks ----------------------------------------------------------------------


def test_remarks_say_why_each_op_was_kept_or_rewritten(capsys):
    text = (
        "dist.group @pair [[0, 1]]\n"
        "func.func @main(%ct: tensor<4x8xi64>, %q: tensor<4xi64>) -> tensor<4x8xi64> {\n"
        "  %a = dist.all_reduce_add_ciphertext %ct, %q : tensor<4x8xi64>, tensor<4xi64>\n"
        "  %b = dist.all_reduce_add_ciphertext %a, %q group @pair : tensor<4x8xi64>, tensor<4xi64>\n"
        "  %c = dist.all_reduce_add_ciphertext %b, %q max_modulus_bits 62 group @pair : tensor<4x8xi64>, tensor<4xi64>\n"
        "  %d = dist.all_reduce_add_ciphertext %c, %q max_modulus_bits 62 : tensor<4x8xi64>, tensor<4xi64>\n"
        "  func.return %d : tensor<4x8xi64>\n"
        "}\n"
    )
    run(text, pass_spec(remarks=True, max_group_size=3))
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"remark: {FILENAME}:3:3: '{KIND}' kept: moduli unknown (constant moduli or "
        "max_modulus_bits needed)",
        f"remark: {FILENAME}:4:3: '{KIND}' kept: moduli unknown (constant moduli or "
        "max_modulus_bits needed)",
        f"remark: {FILENAME}:5:3: '{KIND}' deferred to a native sum and one remainder: "
        "P*(q_max-1) = 9223372036854775804 <= 2^63-1 (P=2 from group @pair, "
        "q_max<=2^62-1 from max_modulus_bits 62)",
        f"remark: {FILENAME}:6:3: '{KIND}' kept: P*(q_max-1) = 13835058055282163706 "
        "exceeds 2^63-1 (P<=3 from max-group-size, q_max<=2^62-1 from max_modulus_bits 62)",
    ]


def test_a_remark_names_every_missing_fact(capsys):
    run(program(), pass_spec(remarks=True))
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"remark: {FILENAME}:2:3: '{KIND}' kept: group size unknown (declare the group "
        "or pass max-group-size); moduli unknown (constant moduli or max_modulus_bits "
        "needed)"
    )


def test_a_remark_for_a_group_of_uneven_subgroups(capsys):
    run(program(groups="[[0], [1, 2]]", group="@g", bits=8), pass_spec(remarks=True))
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(
        "kept: group size unknown: @g has subgroups of different sizes (pass max-group-size)"
    )


def test_a_remark_for_a_constant_modulus_at_the_bound(capsys):
    text = program(groups="[[0, 1]]", group="@g", moduli=[2**62 + 1, 3, 5, 7])
    run(text, pass_spec(remarks=True))
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"remark: {FILENAME}:4:3: '{KIND}' kept: P*(q_max-1) = 9223372036854775808 "
        "exceeds 2^63-1 (P=2 from group @g, q_max=4611686018427387905 from constant moduli)"
    )


def test_no_remarks_unless_asked(capsys):
    run(program(), PASS)
    run(program(bits=40), pass_spec(max_group_size=2))
    assert capsys.readouterr().err == ""


# Why the bound is the right one ---------------------------------------------------


def _wrap_i64(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


def native_sum_then_remui(limbs: list[int], q: int) -> int:
    """What the rewritten program computes: an int64 (wrapping) sum of the
    ranks' limbs, then an unsigned remainder."""
    total = 0
    for limb in limbs:
        total = _wrap_i64(total + limb)
    return (total & ((1 << 64) - 1)) % q


def _decide(group_size: int, q_max: int):
    text = program(groups=f"[{list(range(group_size))}]", group="@g", moduli=[q_max])
    text = text.replace("4x8xi64", "1x8xi64").replace("tensor<4xi64>", "tensor<1xi64>")
    (op,) = ops_named(parse_module(text, FILENAME), KIND)
    assert isinstance(op, AllReduceAddCiphertextOp)
    return decide(op, None)


@settings(max_examples=examples(0.6), deadline=None)
@given(st.integers(1, 64), st.integers(2, 2**63 - 1))
def test_deferred_exactly_when_the_worst_case_sum_is_exact(group_size, q_max):
    worst = [q_max - 1] * group_size  # every rank holds the largest reduced limb
    exact = native_sum_then_remui(worst, q_max) == sum(worst) % q_max
    no_overflow = sum(worst) <= INT64_MAX
    assert _decide(group_size, q_max).rewrite == no_overflow
    if no_overflow:
        assert exact
