"""One invalid program per verifier rule of the dist dialect.

Each program breaks exactly one rule (xDSL checks traits in a random order, so
a program breaking two could report either), and the test asserts the rule's
message. Programs the custom syntax refuses to express are written in the
generic form.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import pytest
from xdsl.utils.exceptions import VerifyException

from distir.ir import AllReduceOp
from distir.ir.parsing import parse_module


def _func(args: str, body: str, results: str = "", groups: str = "") -> str:
    ret = f" -> ({results})" if results else ""
    return f"{groups}\nfunc.func @main({args}){ret} {{\n{body}\n}}\n"


def verify_error(text: str) -> str:
    module = parse_module(text)
    with pytest.raises(VerifyException) as info:
        module.verify()
    return str(info.value)


X4 = "%x: tensor<4xf32>"
I8 = "%x: tensor<8xi64>"
CT = "%ct: tensor<2x3x16xi64>, %q: tensor<3xi64>"
PAIRS = "dist.group @pairs [[0, 1], [2, 3]]"
TRAIN = "dist.mesh @train [2, 2] ranks [0, 1, 2, 3]"

# name -> (program, expected message substring)
INVALID: dict[str, tuple[str, str]] = {
    # dist.group
    "group_declares_no_subgroup": (
        "dist.group @g []",
        "group @g declares no subgroup",
    ),
    "group_has_empty_subgroup": (
        "dist.group @g [[0, 1], []]",
        "group @g has an empty subgroup",
    ),
    "group_rank_negative": (
        # The custom syntax only takes non-negative integers.
        '"dist.group"() <{sym_name = "g", subgroups = [array<i64: 0, -2>]}> : () -> ()',
        "group @g: rank -2 is negative",
    ),
    "group_rank_twice": (
        "dist.group @g [[0, 1], [1, 2]]",
        "group @g: rank 1 appears in more than one place",
    ),
    "group_ranks_not_ascending": (
        "dist.group @g [[2, 0], [1]]",
        "group @g: subgroup [2, 0] must list its ranks in ascending order ([0, 2]), the "
        "order that numbers them within the group",
    ),
    "group_not_declared": (
        _func(X4, "%y = dist.all_reduce sum %x group @missing : tensor<4xf32>\nfunc.return"),
        "'dist.all_reduce' names group @missing but no `dist.group` of that name is declared at module level",
    ),
    "psum_group_not_declared": (
        _func(X4, "%y = dist.psum %x group @missing : tensor<4xf32>\nfunc.return"),
        "'dist.psum' names group @missing but no `dist.group` of that name is declared at module level",
    ),
    "pvary_group_not_declared": (
        _func(X4, "%y = dist.pvary %x group @missing : tensor<4xf32>\nfunc.return"),
        "'dist.pvary' names group @missing but no `dist.group` of that name is declared at module level",
    ),
    "group_size_group_not_declared": (
        _func("", "%p = dist.group_size group @missing : index\nfunc.return"),
        "'dist.group_size' names group @missing but no `dist.group` of that name",
    ),
    "group_symbol_is_not_a_group": (
        _func(X4, "%r = dist.rank group @main : index\nfunc.return"),
        "'dist.rank' names group @main but no `dist.group` of that name",
    ),
    # dist.broadcast
    "broadcast_without_root": (
        _func(X4, '%y = "dist.broadcast"(%x) : (tensor<4xf32>) -> tensor<4xf32>\nfunc.return'),
        "'dist.broadcast' needs exactly one root: a static `root N` or an index operand `root %r`",
    ),
    "broadcast_with_two_roots": (
        _func(
            f"{X4}, %r: index",
            '%y = "dist.broadcast"(%x, %r) <{root = 0 : i64}> : (tensor<4xf32>, index) -> tensor<4xf32>\nfunc.return',
        ),
        "'dist.broadcast' needs exactly one root",
    ),
    "broadcast_result_type": (
        _func(
            X4,
            '%y = "dist.broadcast"(%x) <{root = 0 : i64}> : (tensor<4xf32>) -> tensor<4xf64>\nfunc.return',
        ),
        "'dist.broadcast' result type tensor<4xf64> must equal the input type tensor<4xf32>",
    ),
    "broadcast_negative_root": (
        _func(X4, "%y = dist.broadcast %x root -1 : tensor<4xf32>\nfunc.return"),
        "'dist.broadcast' root must be >= 0, got -1",
    ),
    "broadcast_root_outside_group": (
        _func(
            X4,
            "%y = dist.broadcast %x root 2 group @pairs : tensor<4xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.broadcast' root 2 is outside group @pairs of size 2",
    ),
    # dist.all_reduce
    "all_reduce_result_type": (
        _func(
            X4,
            '%y = "dist.all_reduce"(%x) <{kind = #dist<kind sum>}> ({\n}) : (tensor<4xf32>) -> tensor<8xf32>\nfunc.return',
        ),
        "'dist.all_reduce' result type tensor<8xf32> must equal the input type tensor<4xf32>",
    ),
    "all_reduce_kind_and_region": (
        _func(
            X4,
            '%y = "dist.all_reduce"(%x) <{kind = #dist<kind sum>}> ({\n'
            "^bb0(%a: tensor<4xf32>, %b: tensor<4xf32>):\n"
            "  %c = arith.addf %a, %b : tensor<4xf32>\n"
            "  dist.yield %c : tensor<4xf32>\n"
            "}) : (tensor<4xf32>) -> tensor<4xf32>\nfunc.return",
        ),
        "'dist.all_reduce' takes a reduction kind or a combine region, not both",
    ),
    "all_reduce_native_with_extras": (
        _func(
            f"{X4}, %e: tensor<4xf32>",
            '%y = "dist.all_reduce"(%x, %e) <{kind = #dist<kind sum>}> ({\n})'
            " : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\nfunc.return",
        ),
        "'dist.all_reduce' with a native kind takes no extra operands",
    ),
    "all_reduce_bitwise_on_floats": (
        _func(X4, "%y = dist.all_reduce bxor %x : tensor<4xf32>\nfunc.return"),
        "'dist.all_reduce' kind bxor needs an integer element type, got tensor<4xf32>",
    ),
    "all_reduce_no_kind_no_region": (
        _func(
            X4, '%y = "dist.all_reduce"(%x) ({\n}) : (tensor<4xf32>) -> tensor<4xf32>\nfunc.return'
        ),
        "'dist.all_reduce' needs a reduction kind or a single-block combine region",
    ),
    "all_reduce_combine_arity": (
        _func(
            X4,
            '%y = "dist.all_reduce"(%x) ({\n'
            "^bb0(%a: tensor<4xf32>, %b: tensor<4xf32>, %c: tensor<4xf32>):\n"
            "  dist.yield %a : tensor<4xf32>\n"
            "}) : (tensor<4xf32>) -> tensor<4xf32>\nfunc.return",
        ),
        "'dist.all_reduce' combine region must take 2 arguments (lhs, rhs, 0 extra), got 3",
    ),
    "all_reduce_commutative_marker_refuted": (
        _func(
            X4,
            "%y = dist.all_reduce %x commutative : tensor<4xf32> combine(%a, %b) {\n"
            "  %d = arith.subf %a, %b : tensor<4xf32>\n"
            "  dist.yield %d : tensor<4xf32>\n"
            "}\nfunc.return",
        ),
        "'dist.all_reduce' is marked commutative but its combine is not: combine(2, 5) = -3 "
        "while combine(5, 2) = 3",
    ),
    "all_reduce_combine_argument_type": (
        _func(
            f"{X4}, %m: tensor<4xi64>",
            '%y = "dist.all_reduce"(%x, %m) ({\n'
            "^bb0(%a: tensor<4xf32>, %b: tensor<4xf32>, %c: tensor<4xi32>):\n"
            "  dist.yield %a : tensor<4xf32>\n"
            "}) : (tensor<4xf32>, tensor<4xi64>) -> tensor<4xf32>\nfunc.return",
        ),
        "'dist.all_reduce' combine argument #2 has type tensor<4xi32>, expected tensor<4xi64>",
    ),
    "all_reduce_combine_not_ending_in_yield": (
        # linalg.yield is a terminator with no parent constraint, so only the
        # all-reduce's own rule rejects it.
        _func(
            X4,
            "%y = dist.all_reduce %x : tensor<4xf32> combine(%a, %b) {\n"
            "  linalg.yield %a : tensor<4xf32>\n"
            "}\nfunc.return",
        ),
        "'dist.all_reduce' combine region must end in `dist.yield`",
    ),
    "all_reduce_combine_yield_type": (
        _func(
            X4,
            "%y = dist.all_reduce %x : tensor<4xf32> combine(%a, %b) {\n"
            "  dist.yield %a, %b : tensor<4xf32>, tensor<4xf32>\n"
            "}\nfunc.return",
        ),
        "'dist.all_reduce' combine must yield one value of type tensor<4xf32>, "
        "got (tensor<4xf32>, tensor<4xf32>)",
    ),
    # dist.assert_reduced
    "assert_reduced_not_i64": (
        _func(
            "%ct: tensor<2x3x16xi32>, %q: tensor<3xi64>",
            "dist.assert_reduced %ct, %q : tensor<2x3x16xi32>, tensor<3xi64>\nfunc.return",
        ),
        "'dist.assert_reduced' limbs and moduli must be i64",
    ),
    "assert_reduced_ranks": (
        _func(
            "%ct: tensor<16xi64>, %q: tensor<3xi64>",
            "dist.assert_reduced %ct, %q : tensor<16xi64>, tensor<3xi64>\nfunc.return",
        ),
        "'dist.assert_reduced' takes limbs [..., L, N] and moduli [L]",
    ),
    # dist.assert_uniform
    "assert_uniform_unknown_group": (
        _func(
            "%q: tensor<3xi64>",
            "dist.assert_uniform %q group @nope : tensor<3xi64>\nfunc.return",
        ),
        "'dist.assert_uniform' names group @nope",
    ),
    # dist.all_reduce_add_ciphertext
    "ciphertext_limbs_not_i64": (
        _func(
            "%ct: tensor<2x3x16xi32>, %q: tensor<3xi64>",
            "%y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x16xi32>, tensor<3xi64>\nfunc.return",
        ),
        "'dist.all_reduce_add_ciphertext' limbs must be i64, got i32",
    ),
    "ciphertext_moduli_not_i64": (
        _func(
            "%ct: tensor<2x3x16xi64>, %q: tensor<3xi32>",
            "%y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x16xi64>, tensor<3xi32>\nfunc.return",
        ),
        "'dist.all_reduce_add_ciphertext' moduli must be i64, got i32",
    ),
    "ciphertext_rank_below_2": (
        _func(
            "%ct: tensor<16xi64>, %q: tensor<3xi64>",
            "%y = dist.all_reduce_add_ciphertext %ct, %q : tensor<16xi64>, tensor<3xi64>\nfunc.return",
        ),
        "'dist.all_reduce_add_ciphertext' ciphertext must have rank >= 2 ([..., L, N]), got tensor<16xi64>",
    ),
    "ciphertext_moduli_rank": (
        _func(
            "%ct: tensor<3x16xi64>, %q: tensor<3x1xi64>",
            "%y = dist.all_reduce_add_ciphertext %ct, %q : tensor<3x16xi64>, tensor<3x1xi64>\nfunc.return",
        ),
        "'dist.all_reduce_add_ciphertext' moduli must have rank 1 ([L]), got tensor<3x1xi64>",
    ),
    "ciphertext_moduli_count": (
        _func(
            "%ct: tensor<2x3x16xi64>, %q: tensor<4xi64>",
            "%y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x16xi64>, tensor<4xi64>\nfunc.return",
        ),
        "'dist.all_reduce_add_ciphertext' has 4 moduli for 3 limbs (dimension -2 of tensor<2x3x16xi64>)",
    ),
    "ciphertext_result_type": (
        _func(
            CT,
            '%y = "dist.all_reduce_add_ciphertext"(%ct, %q) <{modulus_basis = "Q"}>'
            " : (tensor<2x3x16xi64>, tensor<3xi64>) -> tensor<2x3x8xi64>\nfunc.return",
        ),
        "'dist.all_reduce_add_ciphertext' result type tensor<2x3x8xi64> must equal the "
        "ciphertext type tensor<2x3x16xi64>",
    ),
    "ciphertext_max_modulus_bits": (
        _func(
            CT,
            "%y = dist.all_reduce_add_ciphertext %ct, %q max_modulus_bits 63 : tensor<2x3x16xi64>, tensor<3xi64>\nfunc.return",
        ),
        "'dist.all_reduce_add_ciphertext' max_modulus_bits must be in [2, 62], got 63",
    ),
    # dist.all_gather
    "all_gather_axis_out_of_range": (
        _func(X4, "%y = dist.all_gather %x axis 1 : tensor<4xf32> -> tensor<4xf32>\nfunc.return"),
        "'dist.all_gather' axis 1 is out of range for tensor<4xf32> (rank 1)",
    ),
    "all_gather_element_type": (
        _func(X4, "%y = dist.all_gather %x axis 0 : tensor<4xf32> -> tensor<?xf64>\nfunc.return"),
        "'dist.all_gather' result element type f64 must equal the input element type f32",
    ),
    "all_gather_result_rank": (
        _func(X4, "%y = dist.all_gather %x axis 0 : tensor<4xf32> -> tensor<?x1xf32>\nfunc.return"),
        "'dist.all_gather' result tensor<?x1xf32> must have the rank of tensor<4xf32>",
    ),
    "all_gather_other_dimension": (
        _func(
            "%x: tensor<2x4xf32>",
            "%y = dist.all_gather %x axis 0 : tensor<2x4xf32> -> tensor<?x5xf32>\nfunc.return",
        ),
        "'dist.all_gather' result tensor<?x5xf32> differs from input tensor<2x4xf32> in "
        "dimension 1, which is not the axis 0",
    ),
    "all_gather_counts_not_integer": (
        _func(
            f"{X4}, %c: tensor<4xf32>",
            "%y = dist.all_gather %x counts(%c : tensor<4xf32>) axis 0 : tensor<4xf32> -> tensor<?xf32>\nfunc.return",
        ),
        "'dist.all_gather' counts must be a tensor of integers, got tensor<4xf32>",
    ),
    "all_gather_counts_rank": (
        _func(
            f"{X4}, %c: tensor<2x2xi64>",
            "%y = dist.all_gather %x counts(%c : tensor<2x2xi64>) axis 0 : tensor<4xf32> -> tensor<?xf32>\nfunc.return",
        ),
        "'dist.all_gather' counts must have rank 1, got tensor<2x2xi64>",
    ),
    "all_gather_counts_group_size": (
        _func(
            f"{X4}, %c: tensor<3xi64>",
            "%y = dist.all_gather %x counts(%c : tensor<3xi64>) axis 0 group @pairs : tensor<4xf32> -> tensor<?xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.all_gather' counts has 3 entries for a group of size 2",
    ),
    "all_gather_rows_for_group_size": (
        _func(
            X4,
            "%y = dist.all_gather %x axis 0 group @pairs : tensor<4xf32> -> tensor<12xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.all_gather' result has 12 rows on axis 0, expected 2 x 4",
    ),
    "all_gather_rows_not_a_multiple": (
        _func(X4, "%y = dist.all_gather %x axis 0 : tensor<4xf32> -> tensor<10xf32>\nfunc.return"),
        "'dist.all_gather' result rows (10) on axis 0 must be a multiple of the input rows (4)",
    ),
    "all_gather_rows_from_empty_input": (
        _func(
            "%x: tensor<0xf32>",
            "%y = dist.all_gather %x axis 0 : tensor<0xf32> -> tensor<3xf32>\nfunc.return",
        ),
        "'dist.all_gather' result rows (3) on axis 0 must be a multiple of the input rows (0)",
    ),
    # dist.reduce_scatter
    "reduce_scatter_axis_out_of_range": (
        _func(X4, "%y = dist.reduce_scatter sum %x axis 1 : tensor<4xf32> -> tensor<2xf32>\nfunc.return"),
        "'dist.reduce_scatter' axis 1 is out of range for tensor<4xf32> (rank 1)",
    ),
    "reduce_scatter_element_type": (
        _func(X4, "%y = dist.reduce_scatter sum %x axis 0 : tensor<4xf32> -> tensor<2xf64>\nfunc.return"),
        "'dist.reduce_scatter' result element type f64 must equal the input element type f32",
    ),
    "reduce_scatter_integer_kind": (
        _func(X4, "%y = dist.reduce_scatter band %x axis 0 : tensor<4xf32> -> tensor<2xf32>\nfunc.return"),
        "'dist.reduce_scatter' kind band needs an integer element type, got tensor<4xf32>",
    ),
    "reduce_scatter_rows_not_a_divisor": (
        _func(X4, "%y = dist.reduce_scatter sum %x axis 0 : tensor<4xf32> -> tensor<3xf32>\nfunc.return"),
        "'dist.reduce_scatter' result rows (3) on axis 0 must be the input rows (4) divided by "
        "the group size",
    ),
    "reduce_scatter_rows_from_empty_input": (
        _func(
            "%x: tensor<0xf32>",
            "%y = dist.reduce_scatter sum %x axis 0 : tensor<0xf32> -> tensor<3xf32>\nfunc.return",
        ),
        "'dist.reduce_scatter' result rows (3) on axis 0 must be the input rows (0) divided by "
        "the group size",
    ),
    "reduce_scatter_uneven_split": (
        _func(
            "%x: tensor<3xf32>",
            "%y = dist.reduce_scatter sum %x axis 0 group @pairs : tensor<3xf32> -> tensor<?xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.reduce_scatter' input has 3 rows on axis 0, which do not split evenly over a "
        "group of size 2",
    ),
    "reduce_scatter_rows_for_group_size": (
        _func(
            "%x: tensor<8xf32>",
            "%y = dist.reduce_scatter sum %x axis 0 group @pairs : tensor<8xf32> -> tensor<2xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.reduce_scatter' result has 2 rows on axis 0, expected 8 / 2 = 4",
    ),
    "reduce_scatter_counts_do_not_sum": (
        _func(
            X4,
            "%y = dist.reduce_scatter sum %x counts [3, 2] axis 0 group @pairs : tensor<4xf32> -> tensor<?xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.reduce_scatter' counts [3, 2] sum to 5, but the input has 4 rows on axis 0",
    ),
    "reduce_scatter_counts_for_group_size": (
        _func(
            X4,
            "%y = dist.reduce_scatter sum %x counts [1, 1, 2] axis 0 group @pairs : tensor<4xf32> -> tensor<?xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.reduce_scatter' counts [1, 1, 2] has 3 entries for a group of size 2",
    ),
    "reduce_scatter_negative_count": (
        _func(X4, "%y = dist.reduce_scatter sum %x counts [5, -1] axis 0 : tensor<4xf32> -> tensor<?xf32>\nfunc.return"),
        "'dist.reduce_scatter' counts [5, -1] has a negative count",
    ),
    "reduce_scatter_static_rows_of_uneven_parts": (
        _func(X4, "%y = dist.reduce_scatter sum %x counts [3, 1] axis 0 : tensor<4xf32> -> tensor<3xf32>\nfunc.return"),
        "'dist.reduce_scatter' result has 3 rows on axis 0, but the counts [3, 1] give ranks "
        "other parts (make that dimension ?)",
    ),
    "reduce_scatter_kind_and_region": (
        _func(
            X4,
            "%y = dist.reduce_scatter sum %x axis 0 : tensor<4xf32> -> tensor<?xf32> combine(%a, %b) {\n"
            "  dist.yield %a : tensor<4xf32>\n"
            "}\nfunc.return",
        ),
        "'dist.reduce_scatter' takes a reduction kind or a combine region, not both",
    ),
    "reduce_scatter_native_with_extras": (
        _func(
            f"{X4}, %m: tensor<4xf32>",
            "%y = dist.reduce_scatter sum %x, %m axis 0 : tensor<4xf32> -> tensor<?xf32>, tensor<4xf32>\n"
            "func.return",
        ),
        "'dist.reduce_scatter' with a native kind takes no extra operands",
    ),
    "reduce_scatter_commutative_marker_refuted": (
        _func(
            X4,
            "%y = dist.reduce_scatter %x axis 0 commutative : tensor<4xf32> -> tensor<?xf32> combine(%a, %b) {\n"
            "  %d = arith.subf %a, %b : tensor<4xf32>\n"
            "  dist.yield %d : tensor<4xf32>\n"
            "}\nfunc.return",
        ),
        "'dist.reduce_scatter' is marked commutative but its combine is not: combine(2, 5) = -3 "
        "while combine(5, 2) = 3 (a reordered fold, e.g. the ring's, would give another result)",
    ),
    "reduce_scatter_combine_yield_type": (
        _func(
            X4,
            "%y = dist.reduce_scatter %x axis 0 : tensor<4xf32> -> tensor<?xf32> combine(%a, %b) {\n"
            "  %d = arith.constant dense<1.0> : tensor<2xf32>\n"
            "  dist.yield %d : tensor<2xf32>\n"
            "}\nfunc.return",
        ),
        "'dist.reduce_scatter' combine must yield one value of type tensor<4xf32>, got "
        "(tensor<2xf32>)",
    ),
    # dist.gather and dist.scatter
    "gather_axis_out_of_range": (
        _func(X4, "%y = dist.gather %x axis 1 root 0 : tensor<4xf32> -> tensor<8xf32>\nfunc.return"),
        "'dist.gather' axis 1 is out of range for tensor<4xf32> (rank 1)",
    ),
    "scatter_axis_out_of_range": (
        _func(X4, "%y = dist.scatter %x axis 2 root 0 : tensor<4xf32> -> tensor<2xf32>\nfunc.return"),
        "'dist.scatter' axis 2 is out of range for tensor<4xf32> (rank 1)",
    ),
    "gather_root_outside_group": (
        _func(
            X4,
            "%y = dist.gather %x axis 0 root 2 group @pairs : tensor<4xf32> -> tensor<8xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.gather' root 2 is outside group @pairs of size 2",
    ),
    "scatter_negative_root": (
        _func(X4, "%y = dist.scatter %x axis 0 root -1 : tensor<4xf32> -> tensor<2xf32>\nfunc.return"),
        "'dist.scatter' root must be >= 0, got -1",
    ),
    "gather_rows_for_group_size": (
        _func(
            X4,
            "%y = dist.gather %x axis 0 root 0 group @pairs : tensor<4xf32> -> tensor<12xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.gather' parts of 4 rows on axis 0 make 8 rows over a group of size 2, not 12",
    ),
    "gather_rows_not_a_multiple": (
        _func(X4, "%y = dist.gather %x axis 0 root 0 : tensor<4xf32> -> tensor<6xf32>\nfunc.return"),
        "'dist.gather' 6 rows on axis 0 are not a whole number of parts of 4",
    ),
    "scatter_uneven_split": (
        _func(
            "%x: tensor<3xf32>",
            "%y = dist.scatter %x axis 0 root 0 group @pairs : tensor<3xf32> -> tensor<?xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.scatter' 3 rows on axis 0 do not split evenly over a group of size 2",
    ),
    "scatter_shape_disagrees": (
        _func(
            "%x: tensor<4x2xf32>",
            "%y = dist.scatter %x axis 0 root 0 : tensor<4x2xf32> -> tensor<2x3xf32>\nfunc.return",
        ),
        "'dist.scatter' result tensor<2x3xf32> differs from input tensor<4x2xf32> in dimension 1, "
        "which is not the axis 0",
    ),
    "gather_element_type": (
        _func(X4, "%y = dist.gather %x axis 0 root 0 : tensor<4xf32> -> tensor<8xf64>\nfunc.return"),
        "'dist.gather' result element type f64 must equal the input element type f32",
    ),
    "gather_counts_length": (
        _func(
            "%x: tensor<?xf32>, %c: tensor<3xi64>",
            "%y = dist.gather %x counts(%c : tensor<3xi64>) axis 0 root 0 group @pairs "
            ": tensor<?xf32> -> tensor<?xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.gather' counts has 3 entries for a group of size 2",
    ),
    "scatter_counts_type": (
        _func(
            "%x: tensor<?xf32>, %c: tensor<2xf32>",
            "%y = dist.scatter %x counts(%c : tensor<2xf32>) axis 0 root 0 "
            ": tensor<?xf32> -> tensor<?xf32>\nfunc.return",
        ),
        "'dist.scatter' counts must be a tensor of integers, got tensor<2xf32>",
    ),
    # dist.reduce
    "reduce_root_outside_group": (
        _func(X4, "%y = dist.reduce sum %x root 2 group @pairs : tensor<4xf32>\nfunc.return",
              groups=PAIRS),
        "'dist.reduce' root 2 is outside group @pairs of size 2",
    ),
    "reduce_negative_root": (
        _func(X4, "%y = dist.reduce sum %x root -1 : tensor<4xf32>\nfunc.return"),
        "'dist.reduce' root must be >= 0, got -1",
    ),
    "reduce_integer_kind": (
        _func(X4, "%y = dist.reduce bor %x root 0 : tensor<4xf32>\nfunc.return"),
        "'dist.reduce' kind bor needs an integer element type, got tensor<4xf32>",
    ),
    # dist.shift
    "shift_result_type": (
        _func(X4, "%y = \"dist.shift\"(%x) <{offset = 1 : i64}> : (tensor<4xf32>) -> tensor<4xf64>\nfunc.return"),
        "'dist.shift' result type tensor<4xf64> must equal the input type tensor<4xf32>",
    ),
    # dist.variable_all_to_all
    "all_to_all_axis_out_of_range": (
        _func(
            f"{X4}, %c: tensor<4xi64>",
            "%y, %r = dist.variable_all_to_all %x, %c axis 2 : tensor<4xf32>, tensor<4xi64> -> tensor<?xf32>\nfunc.return",
        ),
        "'dist.variable_all_to_all' axis 2 is out of range for tensor<4xf32> (rank 1)",
    ),
    "all_to_all_other_dimension": (
        _func(
            "%x: tensor<?x16xf32>, %c: tensor<4xi64>",
            "%y, %r = dist.variable_all_to_all %x, %c axis 0 : tensor<?x16xf32>, tensor<4xi64> -> tensor<?x8xf32>\nfunc.return",
        ),
        "'dist.variable_all_to_all' result tensor<?x8xf32> differs from input tensor<?x16xf32> "
        "in dimension 1, which is not the axis 0",
    ),
    "all_to_all_send_counts_not_integer": (
        _func(
            f"{X4}, %c: tensor<4xf32>",
            "%y, %r = dist.variable_all_to_all %x, %c axis 0 : tensor<4xf32>, tensor<4xf32> -> tensor<?xf32>\nfunc.return",
        ),
        "'dist.variable_all_to_all' send counts must be a tensor of integers, got tensor<4xf32>",
    ),
    "all_to_all_send_counts_rank": (
        _func(
            f"{X4}, %c: tensor<4x1xi64>",
            "%y, %r = dist.variable_all_to_all %x, %c axis 0 : tensor<4xf32>, tensor<4x1xi64> -> tensor<?xf32>\nfunc.return",
        ),
        "'dist.variable_all_to_all' send counts must have rank 1, got tensor<4x1xi64>",
    ),
    "all_to_all_recv_counts_type": (
        _func(
            f"{X4}, %c: tensor<4xi64>",
            '%y, %r = "dist.variable_all_to_all"(%x, %c) <{axis = 0 : i64}>'
            " : (tensor<4xf32>, tensor<4xi64>) -> (tensor<?xf32>, tensor<4xi32>)\nfunc.return",
        ),
        "'dist.variable_all_to_all' recv counts type tensor<4xi32> must equal the send "
        "counts type tensor<4xi64>",
    ),
    "all_to_all_send_counts_group_size": (
        _func(
            f"{X4}, %c: tensor<4xi64>",
            "%y, %r = dist.variable_all_to_all %x, %c axis 0 group @pairs : tensor<4xf32>, tensor<4xi64> -> tensor<?xf32>\nfunc.return",
            groups=PAIRS,
        ),
        "'dist.variable_all_to_all' send counts has 4 entries for a group of size 2",
    ),
    # dist.send / dist.recv / dist.sendrecv
    "send_without_destination": (
        _func(
            X4,
            '"dist.send"(%x) <{operandSegmentSizes = array<i32: 1, 0>}> : (tensor<4xf32>) -> ()\nfunc.return',
        ),
        "'dist.send' needs exactly one destination",
    ),
    "send_negative_destination": (
        _func(X4, "dist.send %x to -1 : tensor<4xf32>\nfunc.return"),
        "'dist.send' destination must be >= 0, got -1",
    ),
    "send_destination_outside_group": (
        _func(X4, "dist.send %x to 2 group @pairs : tensor<4xf32>\nfunc.return", groups=PAIRS),
        "'dist.send' destination 2 is outside group @pairs of size 2",
    ),
    "recv_without_source": (
        _func("", '%y = "dist.recv"() : () -> tensor<4xf32>\nfunc.return'),
        "'dist.recv' needs exactly one source",
    ),
    "recv_source_outside_group": (
        _func("", "%y = dist.recv from 3 group @pairs : tensor<4xf32>\nfunc.return", groups=PAIRS),
        "'dist.recv' source 3 is outside group @pairs of size 2",
    ),
    "sendrecv_two_destinations": (
        _func(
            f"{X4}, %d: index",
            '%y = "dist.sendrecv"(%x, %d) <{dest = 1 : i64, source = 0 : i64, '
            "operandSegmentSizes = array<i32: 1, 1, 0>}> : (tensor<4xf32>, index) -> tensor<4xf32>\n"
            "func.return",
        ),
        "'dist.sendrecv' needs exactly one destination",
    ),
    "sendrecv_without_source": (
        _func(
            X4,
            '%y = "dist.sendrecv"(%x) <{dest = 1 : i64, '
            "operandSegmentSizes = array<i32: 1, 0, 0>}> : (tensor<4xf32>) -> tensor<4xf32>\n"
            "func.return",
        ),
        "'dist.sendrecv' needs exactly one source",
    ),
    "sendrecv_negative_source": (
        _func(
            X4, "%y = dist.sendrecv %x to 1 from -3 : tensor<4xf32> -> tensor<4xf32>\nfunc.return"
        ),
        "'dist.sendrecv' source must be >= 0, got -3",
    ),
    # dist.wave
    "wave_holds_a_local_op": (
        _func(
            X4,
            "%y = dist.wave {\n"
            "  %z = arith.addf %x, %x : tensor<4xf32>\n"
            "  dist.yield %z : tensor<4xf32>\n"
            "} : tensor<4xf32>\nfunc.return",
        ),
        "'dist.wave' may hold only collectives and point-to-point ops, found 'arith.addf'",
    ),
    "wave_reads_its_own_result": (
        _func(
            X4,
            "%y = dist.wave {\n"
            "  %a = dist.all_reduce sum %x : tensor<4xf32>\n"
            "  %b = dist.broadcast %a root 0 : tensor<4xf32>\n"
            "  dist.yield %b : tensor<4xf32>\n"
            "} : tensor<4xf32>\nfunc.return",
        ),
        "'dist.broadcast' in a 'dist.wave' reads the result of another op of the same wave; "
        "results exist only after the wave",
    ),
    "wave_yield_types": (
        _func(
            X4,
            "%y = dist.wave {\n"
            "  %a = dist.all_reduce sum %x : tensor<4xf32>\n"
            "  dist.yield %a : tensor<4xf32>\n"
            "} : tensor<8xf32>\nfunc.return",
        ),
        "'dist.wave' must yield values of its result types (tensor<8xf32>)",
    ),
    # dist.mesh
    "mesh_without_axes": (
        "dist.mesh @m [] ranks []",
        "mesh @m must have at least one axis",
    ),
    "mesh_shape_not_positive": (
        "dist.mesh @m [2, 0] ranks []",
        "mesh @m shape [2, 0] must hold positive integers",
    ),
    "mesh_rank_negative": (
        "dist.mesh @m [2] ranks [0, -1]",
        "mesh @m ranks must be non-negative integers",
    ),
    "mesh_rank_count": (
        "dist.mesh @m [2, 2] ranks [0, 1, 2]",
        "mesh @m of shape [2, 2] needs 4 ranks, got 3",
    ),
    "mesh_ranks_repeat": (
        "dist.mesh @m [2] ranks [3, 3]",
        "mesh @m ranks must be distinct: rank 3 appears twice",
    ),
    # dist.transfer
    "transfer_mesh_not_declared": (
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @train [0, *] to @nowhere [0, *] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<2x8xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' names mesh @nowhere but no `dist.mesh` of that name is declared at module level",
    ),
    "transfer_global_shape_negative": (
        _func(
            "%x: tensor<2x8xf32>",
            '%y = "dist.transfer"(%x) <{source_mesh = @train, source_layout = array<i64: 0, -1>, '
            "source_partial = array<i64>, dest_mesh = @train, dest_layout = array<i64: 0, -1>, "
            "global_shape = array<i64: -4, 8>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' global shape [-4, 8] must hold non-negative integers",
    ),
    "transfer_input_rank": (
        _func(
            "%x: tensor<16xf32>",
            "%y = dist.transfer %x from @train [0, *] to @train [0, *] global [4, 8]"
            " : tensor<16xf32> -> tensor<2x8xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' input tensor<16xf32> must have the rank of the global shape (2)",
    ),
    "transfer_element_types": (
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @train [0, *] to @train [0, *] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<2x8xf64>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' input and result element types differ",
    ),
    "transfer_layout_length": (
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @train [0] to @train [0, *] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<2x8xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' source layout has 1 entries for a rank-2 tensor",
    ),
    "transfer_two_dims_on_one_axis": (
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @train [0, *] to @train [1, 1] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<2x8xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' destination layout shards two dims over one mesh axis: axis 1 shards "
        "dims 0 and 1",
    ),
    "transfer_axis_the_mesh_lacks": (
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @train [2, *] to @train [0, *] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<2x8xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' source layout names a mesh axis that mesh @train (rank 2) lacks: dim 0 "
        "is sharded over axis 2",
    ),
    "transfer_partial_axis_shards_a_dim": (
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @train [0, *] partial [0] to @train [0, *] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<2x8xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' source partial axis 0 must be a mesh axis of @train that shards no dim "
        "(it shards tensor dim 0)",
    ),
    "transfer_layout_axis_negative": (
        # `*` is the only negative entry the custom syntax takes.
        _func(
            "%x: tensor<2x8xf32>",
            '%y = "dist.transfer"(%x) <{source_mesh = @train, source_layout = array<i64: -2, -1>, '
            "dest_mesh = @train, dest_layout = array<i64: 0, -1>, "
            "global_shape = array<i64: 4, 8>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' source layout dim 0 names mesh axis -2; axes are >= 0",
    ),
    "transfer_partial_axis_negative": (
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @train [0, *] partial [-1] to @train [0, *] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<2x8xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' source partial axis -1 must be a mesh axis of @train that shards no dim "
        "(axes are >= 0)",
    ),
    "transfer_partial_axis_twice": (
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @train [0, *] partial [1, 1] to @train [0, *] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<2x8xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' source partial [1, 1] lists a mesh axis twice",
    ),
    "transfer_partial_axis_the_mesh_lacks": (
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @train [0, *] partial [5] to @train [0, *] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<2x8xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' source partial axis 5 must be a mesh axis of @train that shards no dim "
        "(@train has 2 axes)",
    ),
    "transfer_result_rank": (
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @train [0, *] to @train [0, *] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<16xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "'dist.transfer' result tensor<16xf32> must have the rank of the global shape (2)",
    ),
    "transfer_source_mesh_invalid": (
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @bad [0, *] to @train [0, *] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<2x8xf32>\nfunc.return",
            groups="dist.mesh @bad [2] ranks [0, 0]\n" + TRAIN,
        ),
        # The mesh's own verifier says so first, in module order.
        "mesh @bad ranks must be distinct: rank 0 appears twice",
    ),
    # dist.yield
    "yield_outside_all_reduce_or_wave": (
        _func(X4, "dist.yield %x : tensor<4xf32>"),
        "'dist.yield' expects parent op to be one of 'dist.all_reduce', 'dist.reduce_scatter', 'dist.wave'",
    ),
}


# The all-reduce's own IsolatedFromAbove trait reports a captured value with
# the fix in its message.
CAPTURE = _func(
    X4,
    "%y = dist.all_reduce %x : tensor<4xf32> combine(%a, %b) {\n"
    "  %c = arith.addf %a, %x : tensor<4xf32>\n"
    "  dist.yield %c : tensor<4xf32>\n"
    "}\nfunc.return",
)
CAPTURE_MESSAGE = (
    "'dist.all_reduce' combine region uses %x defined outside it; pass it as an "
    "extra operand instead"
)


def test_combine_capturing_an_outer_value_names_the_fix() -> None:
    assert CAPTURE_MESSAGE in verify_error(CAPTURE)


@pytest.mark.parametrize("name", INVALID)
def test_invalid_program_reports_its_rule(name: str) -> None:
    text, message = INVALID[name]
    assert message in verify_error(text)


# Raise sites no program can reach, each with the reason:
UNREACHABLE = {
    # Every op of a wave body that is not a `dist.yield` is rejected first by
    # "may hold only collectives ..." (a `linalg.yield` there says "found
    # 'linalg.yield'"), and an empty body by xDSL's empty-block check.
    "'dist.wave' body must end in `dist.yield`",
}

# The op modules, and the functions of `layouts` that the mesh and transfer
# verifiers delegate their rules to (each rule written once, there).
def _op_modules() -> list[str]:
    """The IR modules of the dialect: the shared ones and every family's
    (each module of `distir/ops/<family>/` but its semantics and Torch code)."""
    from distir.ops.table import FAMILIES

    modules = ["distir.ir.attributes", "distir.ir.collectives"]
    for family in FAMILIES:
        package = importlib.import_module(f"distir.ops.{family.name}")
        modules += [
            f"{package.__name__}.{info.name}"
            for info in pkgutil.iter_modules(package.__path__)
            if info.name not in ("semantics", "torch")
        ]
    return modules


OP_MODULES = _op_modules()
DELEGATED_RULES = (
    "check_shape",
    "Mesh.__post_init__",
    "check_layout",
)


def _longest_literal(call: ast.Call) -> str | None:
    message = call.args[0]
    parts = message.values if isinstance(message, ast.JoinedStr) else [message]
    literals = [p.value for p in parts if isinstance(p, ast.Constant) and p.value.strip()]
    return max(literals, key=len) if literals else None


def _raised_messages(tree: ast.AST, exception: str) -> list[str]:
    """The longest literal piece of each `raise exception(...)` message in
    `tree` (f-string values left out); a raise that only forwards another
    error's text has none and is skipped."""
    fragments = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Raise)
            and isinstance(node.exc, ast.Call)
            and getattr(node.exc.func, "id", None) == exception
            and (fragment := _longest_literal(node.exc)) is not None
        ):
            fragments.append(fragment)
    return fragments


def _definitions(tree: ast.Module) -> dict[str, ast.AST]:
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[f"{node.name}.{item.name}"] = item
    return found


def verifier_rule_fragments() -> list[str]:
    """A literal piece of the message of every verifier rule of the dialect:
    the VerifyExceptions its op modules raise and the ValueErrors of the
    layout rules its verifiers delegate to."""
    fragments = []
    for name in OP_MODULES:
        module = importlib.import_module(name)
        fragments += _raised_messages(ast.parse(inspect.getsource(module)), "VerifyException")
    layouts = _definitions(
        ast.parse(inspect.getsource(importlib.import_module("distir.ir.layouts")))
    )
    for name in DELEGATED_RULES:
        fragments += _raised_messages(layouts[name], "ValueError")
    return fragments


def test_every_verifier_message_of_the_dialect_is_exercised() -> None:
    """A new rule without an invalid program here fails this."""
    fragments = verifier_rule_fragments()
    assert len(fragments) >= 55  # one raise per rule (the rank-range rule serves every op)
    messages = " | ".join([*(message for _, message in INVALID.values()), CAPTURE_MESSAGE])
    missing = [f for f in fragments if f not in messages and f not in UNREACHABLE]
    assert not missing, f"verifier rules without a test: {missing}"


def test_wave_body_not_ending_in_yield_is_rejected() -> None:
    text = _func(
        X4,
        "%y = dist.wave {\n"
        "  %a = dist.all_reduce sum %x : tensor<4xf32>\n"
        "  linalg.yield %a : tensor<4xf32>\n"
        "} : tensor<4xf32>\nfunc.return",
    )
    assert "'dist.wave' may hold only collectives and point-to-point ops, found 'linalg.yield'" in (
        verify_error(text)
    )


def test_valid_neighbours_of_the_invalid_programs_verify() -> None:
    """Controls: the boundaries of the rules above are legal."""
    ok = [
        _func(
            X4,
            "%y = dist.broadcast %x root 1 group @pairs : tensor<4xf32>\nfunc.return",
            groups=PAIRS,
        ),
        _func(I8, "%y = dist.all_reduce bxor %x : tensor<8xi64>\nfunc.return"),
        _func(
            CT,
            "%y = dist.all_reduce_add_ciphertext %ct, %q max_modulus_bits 62 : tensor<2x3x16xi64>, tensor<3xi64>\nfunc.return",
        ),
        _func(
            CT,
            "%y = dist.all_reduce_add_ciphertext %ct, %q max_modulus_bits 2 : tensor<2x3x16xi64>, tensor<3xi64>\nfunc.return",
        ),
        _func(
            X4,
            "%y = dist.all_gather %x axis 0 group @pairs : tensor<4xf32> -> tensor<8xf32>\nfunc.return",
            groups=PAIRS,
        ),
        _func(
            "%x: tensor<0xf32>",
            "%y = dist.all_gather %x axis 0 : tensor<0xf32> -> tensor<0xf32>\nfunc.return",
        ),
        _func(
            f"{X4}, %c: tensor<2xi32>",
            "%y, %r = dist.variable_all_to_all %x, %c axis 0 group @pairs : tensor<4xf32>, tensor<2xi32> -> tensor<?xf32>\nfunc.return",
            groups=PAIRS,
        ),
        _func(
            "%x: tensor<2x8xf32>",
            "%y = dist.transfer %x from @train [0, *] partial [1] to @train [1, 0] global [4, 8]"
            " : tensor<2x8xf32> -> tensor<2x4xf32>\nfunc.return",
            groups=TRAIN,
        ),
        "dist.group @g [[0]]",
        "dist.mesh @m [1] ranks [7]",
    ]
    for text in ok:
        parse_module(text).verify()


def test_generic_all_reduce_built_without_region_block() -> None:
    """The Python constructor with neither `kind` nor `combine` gives an op
    that the verifier rejects (rather than crashing)."""
    from xdsl.dialects.builtin import TensorType, f32
    from xdsl.ir import Block

    block = Block(arg_types=[TensorType(f32, [4])])
    op = AllReduceOp(block.args[0])
    block.add_op(op)
    with pytest.raises(VerifyException, match="needs a reduction kind or a single-block"):
        op.verify()


def test_a_detached_transfer_checks_what_needs_no_mesh() -> None:
    """Outside a module the meshes cannot be looked up, but the layouts'
    own rules still hold."""
    from xdsl.dialects.builtin import TensorType, f32
    from xdsl.ir import Block

    from distir.ir import TransferOp

    block = Block(arg_types=[TensorType(f32, [2, 8])])
    op = TransferOp(
        block.args[0],
        source_mesh="a",
        source_layout=[0, 0],
        dest_mesh="b",
        dest_layout=[None, None],
        global_shape=[4, 8],
    )
    block.add_op(op)
    with pytest.raises(VerifyException, match="shards two dims over one mesh axis"):
        op.verify()
