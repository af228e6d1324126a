"""`defer-modular-reduction`: a native int64 sum, then one remainder.

When the facts prove that the plain sum of every rank's limbs cannot overflow
int64, `dist.all_reduce_add_ciphertext %ct, %q` becomes

    dist.assert_reduced %ct, %q : T, tensor<Lxi64>
    dist.assert_uniform %q : tensor<Lxi64>
    %s = dist.all_reduce sum %ct : T
    %r = arith.remui %s, %q_bcast : T

with `%q_bcast` the moduli broadcast to the ciphertext's shape. The two
asserts keep the op's checks: limbs reduced on each rank, moduli equal on
every rank (without the second, ranks with different moduli would each
reduce the same sum their own way, silently; constant moduli need no
check, since ranks agree on the program). The backend's
native collective does the communication and the reduction is deferred to one
remainder at the end. Inputs are reduced (`0 <= limb <= q_l - 1`), so with P
ranks the sum of limb l is at most `P * (q_l - 1) <= P * (q_max - 1)`, and
every partial sum, in any order, is non-negative and no larger. The rewrite is
therefore exact if and only if `P * (q_max - 1) <= 2^63 - 1`.

Facts, all read from the IR or given as options:
- the group size P: `op.static_group_size()` (a declared `dist.group` whose
  subgroups all have the same size); otherwise the option `max-group-size`,
  an upper bound on the size of the world or group the op runs on.
- q_max: the largest of constant moduli (`arith.constant dense<[...]>`
  feeding the op); otherwise the op's `max_modulus_bits b`, which declares
  every modulus below `2^b`, so `q_max - 1 <= 2^b - 2`.

An op whose facts are missing or too weak is left alone. With the option
`remarks=true` the pass prints one line per ciphertext all-reduce to stderr,
saying what it did and why:

    remark: prog.mlir:3:8: 'dist.all_reduce_add_ciphertext' kept: group size unknown (...)

Order: run this pass *before* `lower-ciphertext-add`, which rewrites every
`dist.all_reduce_add_ciphertext` (whatever the facts) into a generic
all-reduce that this pass does not look at.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, IntegerAttr, ModuleOp, i64
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    RewritePattern,
    op_type_rewrite_pattern,
)

from distir.ir.dialect import (
    ASSUMED_GROUP_SIZE,
    AllReduceAddCiphertextOp,
    AllReduceOp,
    AssertReducedOp,
    AssertUniformOp,
    ReductionKind,
)
from distir.ir.modular import int64_sum_is_exact
from distir.ir.parsing import format_location
from distir.ops.all_reduce.ir import broadcast_moduli
from distir.passes._rewrite_utils import rewrite_once, with_location
from distir.passes.options import check_options, option


def constant_moduli(op: AllReduceAddCiphertextOp) -> tuple[int, ...] | None:
    """The moduli's values when an `arith.constant` defines them."""
    owner = op.moduli.owner
    if isinstance(owner, arith.ConstantOp) and isinstance(owner.value, DenseIntOrFPElementsAttr):
        values = owner.value.get_values()
        if values and all(isinstance(v, int) for v in values):
            return tuple(int(v) for v in values)
    return None


@dataclass(frozen=True)
class Decision:
    """Whether an op may be rewritten, the sentence that says why, and the
    assumptions the rewrite rests on that the IR alone does not guarantee
    (checked again at run time)."""

    rewrite: bool
    reason: str
    assumed_group_size: int | None = None
    assumed_modulus_bits: int | None = None


def decide(op: AllReduceAddCiphertextOp, max_group_size: int | None) -> Decision:
    """Check `P * (q_max - 1) <= 2^63 - 1` from the facts available for `op`."""
    problems: list[str] = []

    group_size = op.static_group_size()
    if group_size is not None:
        size_source = f"P={group_size} from group {op.group}"
    elif max_group_size is not None:
        group_size = max_group_size
        size_source = f"P<={group_size} from max-group-size"
    else:
        problems.append(
            f"group size unknown: {op.group} has subgroups of different sizes (pass max-group-size)"
            if op.group is not None
            else "group size unknown (declare the group or pass max-group-size)"
        )
        size_source = ""

    q_max_minus_1: int | None = None
    constants = constant_moduli(op)
    if constants is not None:
        if min(constants) < 1:
            problems.append(f"constant moduli include {min(constants)}, not a positive modulus")
        else:
            q_max_minus_1 = max(constants) - 1
            moduli_source = f"q_max={max(constants)} from constant moduli"
    elif op.max_modulus_bits is not None:
        bits = op.max_modulus_bits.value.data
        q_max_minus_1 = 2**bits - 2
        moduli_source = f"q_max<=2^{bits}-1 from max_modulus_bits {bits}"
    else:
        problems.append("moduli unknown (constant moduli or max_modulus_bits needed)")

    if problems:
        return Decision(False, "; ".join(problems))
    assert group_size is not None and q_max_minus_1 is not None
    bound = group_size * q_max_minus_1
    facts = f"{size_source}, {moduli_source}"
    if not int64_sum_is_exact(group_size, q_max_minus_1 + 1):
        return Decision(False, f"P*(q_max-1) = {bound} exceeds 2^63-1 ({facts})")
    return Decision(
        True,
        f"P*(q_max-1) = {bound} <= 2^63-1 ({facts})",
        assumed_group_size=None if op.static_group_size() is not None else group_size,
        assumed_modulus_bits=None if constants is not None else op.max_modulus_bits.value.data,
    )


def remark(op: AllReduceAddCiphertextOp, verdict: str, reason: str) -> None:
    print(
        f"remark: {format_location(op)}: '{op.name}' {verdict}: {reason}",
        file=sys.stderr,
    )


@dataclass
class DeferredReduction(RewritePattern):
    """`dist.all_reduce_add_ciphertext` -> native `sum` + `arith.remui`, when
    exact."""

    max_group_size: int | None = None
    remarks: bool = False

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AllReduceAddCiphertextOp, rewriter: PatternRewriter) -> None:
        decision = decide(op, self.max_group_size)
        if not decision.rewrite:
            if self.remarks:
                remark(op, "kept", decision.reason)
            return
        total = AllReduceOp(op.input, kind=ReductionKind.SUM, group=op.group)
        total.attributes.update(op.attributes)
        if decision.assumed_group_size is not None:
            # Checked when the program binds to a group: a larger one would overflow.
            total.attributes[ASSUMED_GROUP_SIZE] = IntegerAttr(decision.assumed_group_size, i64)
        total.result.name_hint = "sum"
        # The op rejected unreduced limbs (and the bound checks the declared
        # moduli) and moduli that differ between ranks: so does the rewrite.
        check = AssertReducedOp(op.input, op.moduli, decision.assumed_modulus_bits)
        # (Constant moduli are equal everywhere: ranks agree on the program.)
        agreed = [] if constant_moduli(op) is not None else [AssertUniformOp(op.moduli, op.group)]
        prelude, moduli = broadcast_moduli(op.input, op.moduli)
        reduced = arith.RemUIOp(total.result, moduli)
        with_location([check, *agreed, *prelude, total, reduced], op.location)
        if self.remarks:
            remark(op, "deferred to a native sum and one remainder", decision.reason)
        rewriter.insert([check, *agreed, *prelude])
        rewriter.replace(op, [total, reduced], [reduced.result])


@dataclass(frozen=True)
class DeferModularReductionPass(ModulePass):
    """Replace ciphertext all-reduces whose int64 sum provably cannot
    overflow with a native sum all-reduce and one remainder."""

    name = "defer-modular-reduction"

    max_group_size: int | None = option(None, minimum=1)
    """Upper bound on the group size, used where the IR does not prove one."""

    remarks: bool = False
    """Print one line per op to stderr: rewritten or kept, and why."""

    def __post_init__(self) -> None:
        check_options(self)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        rewrite_once(op, DeferredReduction(self.max_group_size, self.remarks))
