"""`lower-ciphertext-add` turns the ciphertext all-reduce into a generic
all-reduce whose combine region is modular addition in visible arith IR."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pass_support import FILENAME, line_of, locations, op_names, ops_named, rerun, run
from strategies import examples
from xdsl.dialects import arith
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, IntegerAttr
from xdsl.ir import Block, Operation
from xdsl.utils.exceptions import VerifyException

from distir.ir.dialect import AllReduceOp, YieldOp
from distir.passes.lower_ciphertext_add import LowerCiphertextAddPass

PASS = "lower-ciphertext-add"

STATIC = """
dist.group @tp [[0, 1], [2, 3]]
func.func @main(%ct: tensor<2x4x8xi64>, %q: tensor<4xi64>) -> tensor<2x4x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q group @tp : tensor<2x4x8xi64>, tensor<4xi64>
  func.return %y : tensor<2x4x8xi64>
}
"""

DYNAMIC = """
func.func @main(%ct: tensor<?x?x8xi64>, %q: tensor<4xi64>) -> tensor<?x?x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<?x?x8xi64>, tensor<4xi64>
  func.return %y : tensor<?x?x8xi64>
}
"""


def lowered_all_reduce(module) -> AllReduceOp:
    (op,) = ops_named(module, "dist.all_reduce")
    assert isinstance(op, AllReduceOp)
    return op


# Structure -------------------------------------------------------------------


def test_the_printed_form_is_a_readable_generic_all_reduce():
    text = str(run(STATIC, PASS))
    assert "dist.all_reduce_add_ciphertext" not in text
    expected = [
        "dist.assert_reduced %ct, %q : tensor<2x4x8xi64>, tensor<4xi64>",
        '%y = dist.all_reduce %ct, %q group @tp commutative {known_combine = "modular-add"} : '
        "tensor<2x4x8xi64>, tensor<4xi64> combine(%lhs, %rhs, %q_limbs) {",
        "%empty = tensor.empty() : tensor<2x4x8xi64>",
        "%mod = linalg.broadcast ins(%q_limbs:tensor<4xi64>) outs(%empty:tensor<2x4x8xi64>) "
        "dimensions = [0, 2]",
        "%sum = arith.addi %lhs, %rhs : tensor<2x4x8xi64>",
        "%sum_minus_q = arith.subi %sum, %mod : tensor<2x4x8xi64>",
        "%c63 = arith.constant dense<63> : tensor<2x4x8xi64>",
        "%below_q = arith.shrsi %sum_minus_q, %c63 : tensor<2x4x8xi64>",
        "%add_back = arith.andi %below_q, %mod : tensor<2x4x8xi64>",
        "%reduced = arith.addi %sum_minus_q, %add_back : tensor<2x4x8xi64>",
        "dist.yield %reduced : tensor<2x4x8xi64>",
        "func.return %y : tensor<2x4x8xi64>",
    ]
    lines = [line.strip() for line in text.splitlines()]
    positions = [lines.index(line) for line in expected]
    assert positions == sorted(positions)


def test_the_combine_region_has_no_division_and_the_op_is_commutative():
    op = lowered_all_reduce(run(STATIC, PASS))
    assert op.kind is None and op.commutative is not None
    assert [o.name for o in op.combine_block.ops] == [
        "tensor.empty",
        "linalg.broadcast",
        "arith.addi",
        "arith.subi",
        "arith.constant",
        "arith.shrsi",
        "arith.andi",
        "arith.addi",
        "dist.yield",
    ]


def test_the_group_and_discardable_attributes_are_kept():
    text = STATIC.replace("group @tp :", 'group @tp {note = "keep"} :')
    op = lowered_all_reduce(run(text, PASS))
    assert str(op.group) == "@tp"
    assert str(op.attributes["note"]) == '"keep"'


def test_without_a_group_the_generic_op_runs_on_the_world():
    assert lowered_all_reduce(run(DYNAMIC, PASS)).group is None


@pytest.mark.parametrize(
    ("shape", "dimensions"),
    [("4x8", [1]), ("2x4x8", [0, 2]), ("3x2x4x8", [0, 1, 3])],
)
def test_moduli_are_broadcast_along_every_dimension_but_the_limb_one(shape, dimensions):
    text = f"""
func.func @main(%ct: tensor<{shape}xi64>, %q: tensor<4xi64>) -> tensor<{shape}xi64> {{
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<{shape}xi64>, tensor<4xi64>
  func.return %y : tensor<{shape}xi64>
}}
"""
    module = run(text, PASS)
    (bcast,) = ops_named(module, "linalg.broadcast")
    assert list(bcast.dimensions.get_values()) == dimensions
    op = lowered_all_reduce(module)
    # The extra operand is the [L] moduli themselves (cheap to agree on);
    # the region broadcasts them to the ciphertext's shape.
    assert op.extras[0] is op.parent_block().parent_op().body.block.args[1]
    assert bcast.parent_op() is op and bcast.operands[0] is op.combine_block.args[2]
    assert bcast.results[0].type == op.input.type


def test_dynamic_sizes_come_from_the_combined_operand():
    module = run(DYNAMIC, PASS)
    text = str(module)
    assert "%dim0 = tensor.dim %lhs, %c0 : tensor<?x?x8xi64>" in text
    assert "%dim1 = tensor.dim %lhs, %c1 : tensor<?x?x8xi64>" in text
    assert "tensor.empty(%dim0, %dim1) : tensor<?x?x8xi64>" in text
    # The limb dimension is dynamic, the moduli's length static: a cast
    # reconciles them for linalg.broadcast.
    assert "%q_cast = tensor.cast %q : tensor<4xi64> to tensor<?xi64>" in text
    # Inside the region, the shift amount is splat to the dynamic shape.
    op = lowered_all_reduce(module)
    assert "tensor.splat" in [o.name for o in op.combine_block.ops]


def test_dynamic_moduli_are_cast_to_the_static_limb_count():
    text = """
func.func @main(%ct: tensor<4x8xi64>, %q: tensor<?xi64>) -> tensor<4x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<4x8xi64>, tensor<?xi64>
  func.return %y : tensor<4x8xi64>
}
"""
    assert "tensor.cast %q : tensor<?xi64> to tensor<4xi64>" in str(run(text, PASS))


@pytest.mark.parametrize("program", [STATIC, DYNAMIC], ids=["static", "dynamic"])
def test_every_new_op_keeps_the_source_location(program):
    module = run(program, PASS)
    line = line_of(program, "dist.all_reduce_add_ciphertext")
    new_ops = [
        op
        for op in module.walk()
        if op.name not in ("builtin.module", "dist.group", "func.func", "func.return")
    ]
    assert len(new_ops) > 5
    assert locations(new_ops) == {f"{FILENAME}:{line}:3"}


@pytest.mark.parametrize("program", [STATIC, DYNAMIC], ids=["static", "dynamic"])
def test_running_twice_changes_nothing_and_the_output_round_trips(program):
    once = run(program, PASS)
    assert str(rerun(once, PASS)) == str(once)
    assert str(rerun(once, "")) == str(once)


@pytest.mark.parametrize("program", [STATIC, DYNAMIC], ids=["static", "dynamic"])
def test_the_recorded_combine_survives_cleanup_passes(program):
    op = lowered_all_reduce(run(program, f"{PASS},canonicalize,cse"))
    assert op.attributes["known_combine"].data == "modular-add"


#: edits of the lowered region, each a different combine
REGION_EDITS = [
    ("arith.constant dense<63>", "arith.constant dense<62>"),
    ("arith.andi %below_q, %mod", "arith.ori %below_q, %mod"),
    ("arith.subi %sum, %mod", "arith.subi %mod, %sum"),
    ("arith.addi %lhs, %rhs", "arith.muli %lhs, %rhs"),
    ("arith.addi %sum_minus_q, %add_back", "arith.subi %sum_minus_q, %add_back"),
    ("dist.yield %reduced", "dist.yield %sum"),
]


@pytest.mark.parametrize(("old", "new"), REGION_EDITS)
def test_a_region_that_is_not_the_recorded_combine_is_rejected(old, new):
    text = str(run(STATIC, PASS))
    assert old in text
    with pytest.raises(
        VerifyException,
        match='records known_combine "modular-add" but its combine region is not that combine',
    ):
        run(text.replace(old, new), "")


def test_an_unknown_recorded_combine_is_rejected_naming_the_known_ones():
    text = str(run(STATIC, PASS)).replace('"modular-add"', '"modular-mul"')
    with pytest.raises(VerifyException, match="the known combines are 'modular-add'"):
        run(text, "")


def test_every_ciphertext_all_reduce_is_lowered_and_other_ops_are_kept():
    text = """
func.func @main(%ct: tensor<4x8xi64>, %q: tensor<4xi64>) -> tensor<4x8xi64> {
  %r = dist.rank : index
  %a = dist.all_reduce_add_ciphertext %ct, %q : tensor<4x8xi64>, tensor<4xi64>
  %b = dist.all_reduce_add_ciphertext %a, %q max_modulus_bits 40 : tensor<4x8xi64>, tensor<4xi64>
  func.return %b : tensor<4x8xi64>
}
"""
    module = run(text, PASS)
    names = op_names(module)
    assert "dist.all_reduce_add_ciphertext" not in names
    assert names.count("dist.all_reduce") == 2
    assert "dist.rank" in names  # unused, but a lowering pass must not DCE it


def test_the_pass_is_a_frozen_dataclass_registered_by_name():
    from distir.passes import get_all_passes

    assert get_all_passes()[PASS]() is LowerCiphertextAddPass
    assert LowerCiphertextAddPass.name == PASS


# Semantics: interpret the lowered region on Python ints --------------------------

MASK64 = (1 << 64) - 1


def _i64(x: int) -> int:
    """Wrap to a signed 64-bit value (arith's two's-complement semantics)."""
    x &= MASK64
    return x - (1 << 64) if x >> 63 else x


def _u64(x: int) -> int:
    return x & MASK64


def _constant(op: arith.ConstantOp) -> int:
    value = op.value
    if isinstance(value, DenseIntOrFPElementsAttr):
        (v,) = set(value.get_values())  # a splat: the region works element-wise
        return int(v)
    assert isinstance(value, IntegerAttr)
    return value.value.data


_ELEMENTWISE = {
    "arith.addi": lambda a, b: _i64(a + b),
    "arith.subi": lambda a, b: _i64(a - b),
    "arith.muli": lambda a, b: _i64(a * b),
    "arith.andi": lambda a, b: a & b,
    "arith.ori": lambda a, b: a | b,
    "arith.xori": lambda a, b: a ^ b,
    "arith.shrsi": lambda a, b: a >> b,
    "arith.shrui": lambda a, b: _i64(_u64(a) >> b),
    "arith.minui": lambda a, b: a if _u64(a) <= _u64(b) else b,
    "arith.maxui": lambda a, b: a if _u64(a) >= _u64(b) else b,
    "arith.remui": lambda a, b: _i64(_u64(a) % _u64(b)),
}


def evaluate_combine(block: Block, lhs: int, rhs: int, q: int) -> int:
    """Run the combine block element-wise on one element of each operand."""
    env: dict[object, int] = dict(zip(block.args, (lhs, rhs, q), strict=True))
    for op in block.ops:
        if isinstance(op, YieldOp):
            (result,) = op.arguments
            return env[result]
        args = [env.get(v, 0) for v in op.operands]
        value = _evaluate_op(op, args)
        env[op.results[0]] = value
    raise AssertionError("combine block has no dist.yield")


def _evaluate_op(op: Operation, args: list[int]) -> int:
    if op.name in _ELEMENTWISE:
        return _ELEMENTWISE[op.name](*args)
    if isinstance(op, arith.ConstantOp):
        return _constant(op)
    if op.name == "arith.cmpi":
        assert op.predicate.value.data == 9, "only uge is modelled"
        return int(_u64(args[0]) >= _u64(args[1]))
    if op.name == "arith.extui":
        return args[0]
    if op.name in ("tensor.splat", "linalg.broadcast"):
        return args[0]
    if op.name == "tensor.empty":
        return 0
    if op.name == "tensor.dim":
        return 0  # sizes do not matter element-wise
    raise AssertionError(f"no model for {op.name} in the combine region")


@pytest.fixture(scope="module", params=["static", "dynamic"])
def combine_block(request) -> Block:
    program = STATIC if request.param == "static" else DYNAMIC
    return lowered_all_reduce(run(program, PASS)).combine_block


def fold_in_rank_order(block: Block, limbs: list[int], q: int) -> int:
    acc = limbs[0]
    for limb in limbs[1:]:
        acc = evaluate_combine(block, acc, limb, q)
    return acc


PRIMES_NEAR_2_62 = [2**62 - k for k in (57, 87, 117, 143, 153, 167)]
LARGEST_MODULUS = 2**62 - 1

moduli = st.one_of(
    st.just(2),
    st.sampled_from(PRIMES_NEAR_2_62),
    st.just(LARGEST_MODULUS),
    st.integers(2, 1000),
    st.integers(2, LARGEST_MODULUS),
)


@st.composite
def ranks_of_reduced_limbs(draw):
    q = draw(moduli)
    limb = st.one_of(st.just(0), st.just(q - 1), st.integers(0, q - 1))
    limbs = draw(st.lists(limb, min_size=1, max_size=16))
    return q, limbs


@settings(max_examples=examples(3), deadline=None)
@given(ranks_of_reduced_limbs())
def test_folding_the_lowered_region_is_the_modular_sum(combine_block, case):
    q, limbs = case
    assert fold_in_rank_order(combine_block, limbs, q) == sum(limbs) % q


@settings(max_examples=examples(2), deadline=None)
@given(ranks_of_reduced_limbs())
def test_the_lowered_region_may_fold_in_any_order(combine_block, case):
    q, limbs = case
    expected = sum(limbs) % q
    assert fold_in_rank_order(combine_block, limbs[::-1], q) == expected
    assert fold_in_rank_order(combine_block, sorted(limbs), q) == expected
    a, b, c = (limbs * 3)[:3]
    left = evaluate_combine(combine_block, evaluate_combine(combine_block, a, b, q), c, q)
    right = evaluate_combine(combine_block, a, evaluate_combine(combine_block, b, c, q), q)
    assert left == right == (a + b + c) % q


@pytest.mark.parametrize("q", [2, 3, 5, 16, 17])
def test_the_lowered_region_adds_every_pair_of_small_reduced_limbs(combine_block, q):
    for a, b in itertools.product(range(q), repeat=2):
        assert evaluate_combine(combine_block, a, b, q) == (a + b) % q


@pytest.mark.parametrize("q", [*PRIMES_NEAR_2_62, LARGEST_MODULUS, 2**62])
def test_the_largest_limbs_do_not_overflow(combine_block, q):
    # s = 2q - 2 is the largest intermediate: below 2^63 for q <= 2^62.
    assert evaluate_combine(combine_block, q - 1, q - 1, q) == q - 2
    assert evaluate_combine(combine_block, q - 1, 1, q) == 0
    assert evaluate_combine(combine_block, q - 1, 0, q) == q - 1
