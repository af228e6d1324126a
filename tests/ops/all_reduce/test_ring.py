"""The point-to-point all-reduce algorithms (ring, halving-doubling,
recursive-doubling, ciphertext-auto) give the reference simulator's results
on real gloo ranks, for P in {2, 3, 4}.

One `launch` per group size runs every case (spawning ranks costs seconds);
each case is then checked against `Program.simulate` on the same inputs.
Tiny segment and tile sizes make small tensors cross many segment, tile and
row boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import pytest
import torch

import distir
from distir.errors import CompileError, DistirError
from distir.ir.modular import lazy_reduction_schedule
from distir.ops.all_reduce.torch import base as algorithm_base
from distir.ops.all_reduce.torch import combines
from distir.ops.all_reduce.torch.ciphertext import ciphertext_schedule

pytestmark = pytest.mark.multirank

INT64_MAX = (1 << 63) - 1

WRAP_ADD = """
func.func @main(%x: {t}) -> {t} {{
  %y = dist.all_reduce %x{group} commutative : {t} combine(%a, %b) {{
    %s = arith.addi %a, %b : {t}
    %m = arith.constant dense<4294967295> : {t}
    %r = arith.andi %s, %m : {t}
    dist.yield %r : {t}
  }}
  func.return %y : {t}
}}
"""

SATURATING_MAX = """
func.func @main(%x: {t}, %cap: {t}) -> {t} {{
  %y = dist.all_reduce %x, %cap commutative : {t}, {t} combine(%a, %b, %c) {{
    %m = arith.maximumf %a, %b : {t}
    %s = arith.minimumf %m, %c : {t}
    dist.yield %s : {t}
  }}
  func.return %y : {t}
}}
"""

# Associative, not commutative: the first non-zero value in rank order.
FIRST_NONZERO = """
func.func @main(%x: {t}) -> {t} {{
  %y = dist.all_reduce %x : {t} combine(%a, %b) {{
    %zero = arith.constant dense<0> : {t}
    %c63 = arith.constant dense<63> : {t}
    %ones = arith.constant dense<-1> : {t}
    %neg = arith.subi %zero, %a : {t}
    %either = arith.ori %a, %neg : {t}
    %nonzero = arith.shrsi %either, %c63 : {t}
    %zero_mask = arith.xori %nonzero, %ones : {t}
    %b_if_zero = arith.andi %b, %zero_mask : {t}
    %r = arith.ori %a, %b_if_zero : {t}
    dist.yield %r : {t}
  }}
  func.return %y : {t}
}}
"""

# Not elementwise and not commutative: the product of 2x2 integer matrices.
MATRIX_PRODUCT = """
func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce %x : tensor<4xi64> combine(%a, %b) {
    %i0 = arith.constant 0 : index
    %i1 = arith.constant 1 : index
    %i2 = arith.constant 2 : index
    %i3 = arith.constant 3 : index
    %a0 = tensor.extract %a[%i0] : tensor<4xi64>
    %a1 = tensor.extract %a[%i1] : tensor<4xi64>
    %a2 = tensor.extract %a[%i2] : tensor<4xi64>
    %a3 = tensor.extract %a[%i3] : tensor<4xi64>
    %b0 = tensor.extract %b[%i0] : tensor<4xi64>
    %b1 = tensor.extract %b[%i1] : tensor<4xi64>
    %b2 = tensor.extract %b[%i2] : tensor<4xi64>
    %b3 = tensor.extract %b[%i3] : tensor<4xi64>
    %p00 = arith.muli %a0, %b0 : i64
    %p01 = arith.muli %a1, %b2 : i64
    %p10 = arith.muli %a0, %b1 : i64
    %p11 = arith.muli %a1, %b3 : i64
    %p20 = arith.muli %a2, %b0 : i64
    %p21 = arith.muli %a3, %b2 : i64
    %p30 = arith.muli %a2, %b1 : i64
    %p31 = arith.muli %a3, %b3 : i64
    %r0 = arith.addi %p00, %p01 : i64
    %r1 = arith.addi %p10, %p11 : i64
    %r2 = arith.addi %p20, %p21 : i64
    %r3 = arith.addi %p30, %p31 : i64
    %r = tensor.from_elements %r0, %r1, %r2, %r3 : tensor<4xi64>
    dist.yield %r : tensor<4xi64>
  }
  func.return %y : tensor<4xi64>
}
"""

NATIVE = """
func.func @main(%x: {t}) -> {t} {{
  %y = dist.all_reduce {kind} %x : {t}
  func.return %y : {t}
}}
"""

CIPHERTEXT = """
func.func @main(%ct: {t}, %q: tensor<{limbs}xi64>) -> {t} {{
  %y = dist.all_reduce_add_ciphertext %ct, %q{group} : {t}, tensor<{limbs}xi64>
  func.return %y : {t}
}}
"""

SELECT = "select-all-reduce-algorithm"
LOWER = "lower-ciphertext-add"


def tensor_type(shape, element: str) -> str:
    dims = "x".join("?" if d is None else str(d) for d in shape)
    return f"tensor<{dims}x{element}>" if shape else f"tensor<{element}>"


@dataclass
class Case:
    name: str
    text: str
    inputs: list  # per rank
    pipeline: str = ""
    implementations: dict | None = None
    segment_bytes: int | None = None
    tile_elements: int | None = None
    expect_implementation: str | None = None
    exact: bool = True
    groups: str = ""
    extra: dict = field(default_factory=dict)


def ints(gen, shape, low=0, high=1 << 40):
    return torch.randint(low, high, shape, generator=gen, dtype=torch.int64)


def reduced_limbs(gen, batch, moduli, n):
    q = torch.tensor(moduli)
    raw = torch.randint(0, 1 << 62, (*batch, len(moduli), n), generator=gen)
    return raw % q.view(-1, 1)


# Moduli: ~2^20 and ~2^60 defer the whole reduction for P <= 4; q_max - 1 =
# INT64_MAX // 3 reduces every other step at P = 4; near 2^62 reduces after
# every addition (the modular ring).
MODULI = {
    "small": [97, 1048573, 65521],
    "deferred": [(1 << 60) - 93, (1 << 59) - 55, (1 << 60) - 173],
    "hybrid": [INT64_MAX // 3 + 1, (1 << 60) - 93, 1000003],
    "modular": [(1 << 62) - 57, (1 << 62) - 87, (1 << 61) - 1],
}


def cases_for(size: int) -> list[Case]:
    gen = torch.Generator().manual_seed(1000 + size)
    cases: list[Case] = []

    def per_rank(make):
        return [make(r) for r in range(size)]

    # Generic commutative region -> ring, over sizes that do not divide P.
    for shape in [(0,), (1,), (size - 1,), (7,), (1000,), (3, 37)]:
        t = tensor_type(shape, "i64")
        inputs = per_rank(lambda r, shape=shape: [ints(gen, shape)])
        for seg in (None, 40):
            cases.append(Case(f"wrap-add {shape} seg={seg}", WRAP_ADD.format(t=t, group=""),
                              inputs, SELECT, segment_bytes=seg, tile_elements=3 if seg else None,
                              expect_implementation="ring"))  # fmt: skip
    t = tensor_type((1000,), "i64")
    inputs = per_rank(lambda r: [ints(gen, (1000,))])
    for algorithm in ("halving-doubling", "recursive-doubling", "gather-fold"):
        cases.append(Case(f"wrap-add forced {algorithm}", WRAP_ADD.format(t=t, group=""), inputs,
                          f"{SELECT}{{commutative={algorithm}}}", segment_bytes=64,
                          expect_implementation=algorithm))  # fmt: skip

    # Non-contiguous inputs: a transpose and a stride-0 broadcast.
    t = tensor_type((3, 37), "i64")
    transposed = per_rank(lambda r: [ints(gen, (37, 3)).T])
    broadcast = per_rank(lambda r: [ints(gen, (37,)).expand(3, 37)])
    for label, inputs in (("transposed", transposed), ("broadcast", broadcast)):
        for algorithm in ("ring", "halving-doubling", "recursive-doubling"):
            cases.append(Case(f"wrap-add {label} input {algorithm}", WRAP_ADD.format(t=t, group=""),
                              inputs, f"{SELECT}{{commutative={algorithm}}}", segment_bytes=48,
                              expect_implementation=algorithm))  # fmt: skip

    # A float combine with an extra operand (examples/custom_combine.mlir).
    t = tensor_type((129,), "f64")
    inputs = per_rank(lambda r: [torch.randn(129, generator=gen, dtype=torch.float64),
                                 torch.full((129,), 0.5, dtype=torch.float64)])  # fmt: skip
    for algorithm in ("ring", "halving-doubling"):
        cases.append(Case(f"saturating max {algorithm}", SATURATING_MAX.format(t=t), inputs,
                          f"{SELECT}{{commutative={algorithm}}}", segment_bytes=80,
                          expect_implementation=algorithm))  # fmt: skip

    # Non-commutative elementwise -> halving-doubling keeps the rank order.
    for shape in [(0,), (1,), (5,), (999,)]:
        t = tensor_type(shape, "i64")
        inputs = per_rank(lambda r, shape=shape: [ints(gen, shape, 0, 3)])
        cases.append(Case(f"first non-zero {shape}", FIRST_NONZERO.format(t=t), inputs, SELECT,
                          segment_bytes=56, tile_elements=4,
                          expect_implementation="halving-doubling"))  # fmt: skip
    t = tensor_type((999,), "i64")
    inputs = per_rank(lambda r: [ints(gen, (999,), 0, 3)])
    cases.append(Case("first non-zero forced recursive-doubling", FIRST_NONZERO.format(t=t), inputs,
                      f"{SELECT}{{ordered=recursive-doubling}}",
                      expect_implementation="recursive-doubling"))  # fmt: skip

    # Not elementwise -> recursive doubling on whole tensors.
    inputs = per_rank(lambda r: [ints(gen, (4,), -3, 4)])
    cases.append(Case("2x2 matrix product", MATRIX_PRODUCT, inputs, SELECT,
                      expect_implementation="recursive-doubling"))  # fmt: skip

    # Native kinds through every algorithm.
    for kind, element, make in (
        ("sum", "i64", lambda r: [ints(gen, (301,))]),
        ("max", "f32", lambda r: [torch.randn(301, generator=gen)]),
        ("bxor", "i64", lambda r: [ints(gen, (301,))]),
    ):
        t = tensor_type((301,), element)
        inputs = per_rank(make)
        for algorithm in ("ring", "halving-doubling", "recursive-doubling"):
            cases.append(Case(f"native {kind} {algorithm}", NATIVE.format(t=t, kind=kind), inputs,
                              implementations={"dist.all_reduce": algorithm}, segment_bytes=96,
                              expect_implementation=algorithm))  # fmt: skip
    t = tensor_type((5000,), "f32")
    inputs = per_rank(lambda r: [torch.randn(5000, generator=gen)])
    cases.append(Case("native float sum ring", NATIVE.format(t=t, kind="sum"), inputs,
                      implementations={"dist.all_reduce": "ring"}, segment_bytes=400,
                      exact=False))  # fmt: skip

    # Ciphertext sums: chosen automatically, every headroom regime.
    for regime, moduli in MODULI.items():
        for batch, n in (((2,), 16), ((1,), 5), ((3,), 1), ((0,), 4)):
            shape = (*batch, len(moduli), n)
            t = tensor_type(shape, "i64")
            inputs = per_rank(lambda r, batch=batch, moduli=moduli, n=n: [
                reduced_limbs(gen, batch, moduli, n), torch.tensor(moduli)])  # fmt: skip
            cases.append(Case(f"ciphertext {regime} {shape}",
                              CIPHERTEXT.format(t=t, limbs=len(moduli), group=""), inputs,
                              segment_bytes=24, tile_elements=5,
                              expect_implementation="ciphertext-auto"))  # fmt: skip
        # The lowered form: the ring recognises the modular-add region.
        shape = (2, len(moduli), 16)
        inputs = per_rank(lambda r, moduli=moduli: [
            reduced_limbs(gen, (2,), moduli, 16), torch.tensor(moduli)])  # fmt: skip
        for algorithm in ("ring", "halving-doubling"):
            cases.append(Case(f"lowered ciphertext {regime} {algorithm}",
                              CIPHERTEXT.format(t=tensor_type(shape, "i64"), limbs=3, group=""),
                              inputs, f"{LOWER},{SELECT}{{commutative={algorithm}}}",
                              segment_bytes=40, expect_implementation=algorithm))  # fmt: skip
    inputs = per_rank(lambda r: [reduced_limbs(gen, (2,), MODULI["modular"], 9),
                                 torch.tensor(MODULI["modular"])])  # fmt: skip
    dynamic = tensor_type((None, 3, None), "i64")
    cases.append(Case("lowered dynamic ciphertext ring",
                      CIPHERTEXT.format(t=dynamic, limbs=3, group=""), inputs,
                      f"{LOWER},{SELECT}", segment_bytes=32,
                      expect_implementation="ring"))  # fmt: skip

    # Subgroups, including groups of one (P = 1).
    parts = {2: "[[0], [1]]", 3: "[[0, 2], [1]]", 4: "[[0, 2], [1, 3]]"}[size]
    groups = f"dist.group @part {parts}\n"
    t = tensor_type((77,), "i64")
    inputs = per_rank(lambda r: [ints(gen, (77,))])
    # A declared group makes the size known: the cost model would pick
    # recursive doubling for 77 elements; ask for the ring to test it.
    cases.append(Case("wrap-add on subgroups", WRAP_ADD.format(t=t, group=" group @part"),
                      inputs, SELECT + "{commutative=ring}", segment_bytes=64, groups=groups,
                      expect_implementation="ring"))  # fmt: skip
    moduli = MODULI["modular"]
    inputs = per_rank(lambda r: [reduced_limbs(gen, (1,), moduli, 11), torch.tensor(moduli)])
    cases.append(Case("ciphertext on subgroups",
                      CIPHERTEXT.format(t=tensor_type((1, 3, 11), "i64"), limbs=3,
                                        group=" group @part"),
                      inputs, segment_bytes=32, groups=groups,
                      expect_implementation="ciphertext-auto"))  # fmt: skip
    return cases


def _configure(case: Case) -> None:
    algorithm_base.SEGMENT_BYTES = case.segment_bytes or DEFAULT_SEGMENT_BYTES
    combines.TILE_ELEMENTS = case.tile_elements or DEFAULT_TILE_ELEMENTS


DEFAULT_SEGMENT_BYTES = algorithm_base.SEGMENT_BYTES
DEFAULT_TILE_ELEMENTS = combines.TILE_ELEMENTS


def run_cases(context, cases: list[Case]) -> dict:
    """Runs on every rank: each case, then the buffer-reuse and error checks."""
    outcomes = []
    for case in cases:
        _configure(case)
        try:
            program = distir.compile(case.groups + case.text, case.pipeline,
                                     implementations=case.implementations)  # fmt: skip
            result = program.run(*case.inputs[context.rank])
            plan = [name for _, name in program.plan_summary()]
            outcomes.append(("ok", result, plan))
        except Exception as e:  # reported by the test, naming the case
            outcomes.append(("error", f"{type(e).__name__}: {e}", []))
    _configure(Case("defaults", "", []))
    return {"cases": outcomes, "reuse": check_result_reuse(context), "error": check_bad_limbs(context)}


def check_result_reuse(context) -> dict:
    """A dropped result's buffer is reused; a held one never is."""
    # Results of at least POOLED_MIN_BYTES come from the pool.
    text = WRAP_ADD.format(t="tensor<16384xi64>", group="")
    program = distir.compile(text, SELECT)
    x = torch.full((16384,), context.rank + 1, dtype=torch.int64)
    expected = context.world_size * (context.world_size + 1) // 2
    first = program.run(x)
    first_pointer = first.data_ptr()
    held = first.clone()
    view = first[10:20]
    del first
    second = program.run(x)  # `view` still shares the first buffer
    second_pointer = second.data_ptr()
    del second, view
    third = program.run(x)  # nothing holds the first buffer now
    return {
        "held_kept": second_pointer != first_pointer and bool(torch.equal(held, third)),
        "dropped_reused": third.data_ptr() in (first_pointer, second_pointer),
        "values": bool((third == expected).all()),
    }


def check_bad_limbs(context) -> str:
    """Unreduced limbs on rank 0 only: every rank raises before any limb is
    sent (it poisons the group, so it runs last)."""
    program = distir.compile(CIPHERTEXT.format(t="tensor<2x8xi64>", limbs=2, group=""))
    q = torch.tensor([17, 19])
    ct = torch.full((2, 8), 3, dtype=torch.int64)
    if context.rank == 0:
        ct[1, 5] = 19
    try:
        program.run(ct, q)
    except DistirError as e:
        return str(e)
    return "no error"


@cache
def results(size: int) -> dict:
    return distir.launch(run_cases, size, cases_for(size), pass_context=True, timeout=110)


SIZES = (2, 3, 4)
CASE_IDS = [(size, index, case.name) for size in SIZES for index, case in enumerate(cases_for(size))]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("size", "index", "name"), CASE_IDS, ids=[f"P{s}-{n}" for s, _, n in CASE_IDS])
def test_matches_the_reference_simulator(size, index, name):
    case = cases_for(size)[index]
    # The program as written, not lowered: a pass that changed the result
    # would otherwise change the expectation with it.
    expected = distir.simulate(distir.compile(case.groups + case.text), case.inputs)
    for rank, outcome in enumerate(results(size)):
        status, value, plan = outcome["cases"][index]
        assert status == "ok", f"rank {rank}: {value}"
        if case.expect_implementation is not None:
            assert plan == [case.expect_implementation]
        want = expected[rank]
        assert value.shape == want.shape and value.dtype == want.dtype
        if case.exact:
            assert torch.equal(value, want), f"rank {rank} differs from the simulator"
        else:
            torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size", SIZES)
def test_results_reuse_only_buffers_nobody_holds(size):
    for rank, outcome in enumerate(results(size)):
        assert outcome["reuse"] == {"held_kept": True, "dropped_reused": True, "values": True}, rank


@pytest.mark.parametrize("size", SIZES)
def test_unreduced_limbs_on_one_rank_stop_every_rank(size):
    first, *others = results(size)
    assert "not reduced" in first["error"] and "q[1] = 19" in first["error"]
    for outcome in others:
        assert "rank(s) [0]" in outcome["error"] and "rejected" in outcome["error"]


# Planning: which algorithms can run which ops (no ranks needed).


def test_the_ring_refuses_a_combine_that_is_not_commutative():
    with pytest.raises(CompileError, match="no implementation named 'ring'"):
        distir.compile(FIRST_NONZERO.format(t="tensor<8xi64>"),
                       implementations={"dist.all_reduce": "ring"})  # fmt: skip


def test_chunked_algorithms_refuse_a_combine_that_is_not_elementwise():
    for algorithm in ("ring", "halving-doubling"):
        with pytest.raises(CompileError, match=f"no implementation named '{algorithm}'"):
            distir.compile(MATRIX_PRODUCT, implementations={"dist.all_reduce": algorithm})


def test_the_ciphertext_ring_is_the_default_for_ciphertext_sums():
    program = distir.compile(CIPHERTEXT.format(t="tensor<2x3x8xi64>", limbs=3, group=""))
    assert [name for _, name in program.plan_summary()] == ["ciphertext-auto"]


@pytest.mark.parametrize(
    ("size", "q_max", "schedule"),
    [
        (2, (1 << 60) - 93, [2]),
        (4, (1 << 60) - 93, [1, 1, 4]),
        (4, INT64_MAX // 3 + 1, [1, 3, 2]),
        (4, (1 << 62) - 57, [2, 2, 2]),
        (8, (1 << 61), [1, 1, 4, 1, 1, 4, 2]),
    ],
)
def test_lazy_reduction_reduces_only_before_an_overflow(size, q_max, schedule):
    assert lazy_reduction_schedule(size, q_max) == schedule
    headroom = INT64_MAX // (q_max - 1)
    incoming = 1
    for bound in lazy_reduction_schedule(size, q_max):
        assert incoming + 1 <= headroom
        incoming = 1 if bound > 1 else incoming + 1


@pytest.mark.parametrize(
    ("size", "q_max", "strategy"),
    [
        (2, (1 << 60) - 93, "deferred-ring"),
        (4, (1 << 60) - 93, "deferred-ring"),
        (4, INT64_MAX // 3 + 1, "lazy-ring"),
        (2, (1 << 62) - 57, "deferred-ring"),  # 2(q - 1) < 2^63 for every q < 2^62
        (3, (1 << 62) - 57, "lazy-ring"),
    ],
)
def test_the_ciphertext_strategy_follows_from_p_and_q_max(size, q_max, strategy):
    assert ciphertext_schedule(size, q_max, 64 << 20) == strategy
    small = "native-deferred" if strategy == "deferred-ring" else "lazy-ring"
    assert ciphertext_schedule(size, q_max, 4096) == small


def test_even_split_covers_every_element_once():
    for n in range(0, 40):
        for parts in range(1, 6):
            offsets = algorithm_base.split_even(n, parts)
            sizes = [b - a for a, b in zip(offsets, offsets[1:])]
            assert offsets[0] == 0 and offsets[-1] == n
            assert max(sizes) - min(sizes) <= 1


# Combines: which form each region runs as, and chunked evaluation.


def _generic_op(text: str, pipeline: str = ""):
    program = distir.compile(text, pipeline)
    return next(op for op in program.module.walk() if op.name == "dist.all_reduce"), program


@pytest.mark.parametrize("shape", [(2, 3, 16), (None, 3, None)])
def test_the_lowered_ciphertext_region_runs_as_an_in_place_modular_add(shape):
    text = CIPHERTEXT.format(t=tensor_type(shape, "i64"), limbs=3, group="")
    op, _ = _generic_op(text, LOWER)
    assert isinstance(combines.build_combine(op), combines.ModularAddCombine)


def test_a_one_op_region_runs_in_place_and_others_are_evaluated_by_chunks():
    one_op = NATIVE.format(t="tensor<8xi64>", kind="sum").replace(
        "dist.all_reduce sum %x : tensor<8xi64>",
        "dist.all_reduce %x commutative algorithm \"ring\" : tensor<8xi64> combine(%a, %b) {\n"
        "    %r = arith.maxsi %b, %a : tensor<8xi64>\n    dist.yield %r : tensor<8xi64>\n  }",
    )
    op, _ = _generic_op(one_op)
    combine = combines.build_combine(op)
    assert isinstance(combine, combines.FunctionCombine) and combine.swapped
    op, program = _generic_op(WRAP_ADD.format(t="tensor<8xi64>", group=""))
    regions = program.plan.invocations[op].regions
    assert isinstance(combines.build_combine(op, regions), combines.RegionCombine)


@pytest.mark.parametrize(
    ("text", "make_inputs"),
    [
        (WRAP_ADD.format(t="tensor<3x37xi64>", group=""),
         lambda g: [ints(g, (3, 37)), ints(g, (3, 37))]),
        (FIRST_NONZERO.format(t="tensor<3x37xi64>"),
         lambda g: [ints(g, (3, 37), 0, 3), ints(g, (3, 37), 0, 3)]),
        (SATURATING_MAX.format(t="tensor<111xf64>"),
         lambda g: [torch.randn(111, generator=g, dtype=torch.float64),
                    torch.randn(111, generator=g, dtype=torch.float64),
                    torch.linspace(-1, 1, 111, dtype=torch.float64)]),
        # A constant of the op's shape that is not a splat is sliced like the operands.
        ("func.func @main(%x: tensor<6xi64>) -> tensor<6xi64> {\n"
         "  %y = dist.all_reduce %x commutative : tensor<6xi64> combine(%a, %b) {\n"
         "    %s = arith.addi %a, %b : tensor<6xi64>\n"
         "    %w = arith.constant dense<[1, 2, 3, 4, 5, 6]> : tensor<6xi64>\n"
         "    %r = arith.muli %s, %w : tensor<6xi64>\n"
         "    dist.yield %r : tensor<6xi64>\n  }\n  func.return %y : tensor<6xi64>\n}\n",
         lambda g: [ints(g, (6,)), ints(g, (6,))]),
    ],  # fmt: skip
)
def test_chunked_region_evaluation_equals_the_compiled_region(text, make_inputs):
    from distir.core.block_compiler import BlockCompiler

    op, program = _generic_op(text)
    whole = BlockCompiler(program.module, None).compile_local_region(op.combine)
    lhs, rhs, *extras = make_inputs(torch.Generator().manual_seed(7))
    (expected,) = whole(lhs, rhs, *extras)
    bound = combines.RegionCombine(whole).bind(extras, lhs)
    flat_l, flat_r = lhs.reshape(-1), rhs.reshape(-1)
    out = torch.empty_like(flat_l)
    for step in (1, 4, 7, flat_l.numel()):  # chunk boundaries anywhere
        out.fill_(0)
        for a in range(0, flat_l.numel(), step):
            b = min(flat_l.numel(), a + step)
            bound(out[a:b], flat_l[a:b], flat_r[a:b], a)
        assert torch.equal(out.view(lhs.shape), expected)
