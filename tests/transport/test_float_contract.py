"""The float contract (README, "Float contract"), on generated values.

Every reduction of floats, natively and through a generic region, by every
algorithm and after every pass, gives what the contract says on values that
include NaN, ±Inf, ±0.0, subnormals and the extremes:

- max/min (`maximumf`/`minimumf`, native `max`/`min`): IEEE 754-2019
  maximum/minimum: NaN if any operand is NaN, -0.0 below +0.0; exact, the
  same bits whatever the order;
- `maxnumf`/`minnumf`: NaN operands are ignored (NaN only if all are),
  zeros ordered the same way; exact;
- sum/prod (`addf`/`mulf`, native `sum`/`prod`): the IEEE sum or product in
  some association order: NaN exactly when the inputs force it; otherwise,
  where no order can overflow or underflow, within (P-1) units of rounding
  of the exact value; the sign of a product is always exact.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples
from xdsl.dialects import arith

import distir
from distir.core import kernels
from distir.ops.all_reduce.torch import native
from distir.runtime.launch import launch
from tests.transport.float_cases import CONTRACT, run_variants, variants

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}
#: unit roundoff of each dtype
UNIT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24,
        torch.float64: 2.0**-53}  # fmt: skip

NAN = float("nan")
INF = float("inf")


def special_values(dtype: torch.dtype) -> list[float]:
    info = torch.finfo(dtype)
    return [NAN, -NAN, INF, -INF, 0.0, -0.0, info.max, -info.max, info.tiny, -info.tiny,
            info.smallest_normal / 2, -info.smallest_normal / 2, info.eps, 1.0, -1.0]  # fmt: skip


def element(dtype: torch.dtype) -> st.SearchStrategy[float]:
    width = 64 if dtype == torch.float64 else 32
    return st.one_of(st.sampled_from(special_values(dtype)), st.floats(width=width))


@st.composite
def columns(draw, p: int, dtype: torch.dtype) -> list[list[float]]:
    """A few columns: one value per rank each."""
    n = draw(st.integers(1, 6))
    return [draw(st.lists(element(dtype), min_size=p, max_size=p)) for _ in range(n)]


def generated_inputs(p: int, examples: int) -> dict[str, list[torch.Tensor]]:
    """dtype name -> one input per rank, whose columns are `examples`
    hypothesis draws (the reductions are elementwise, so a launch runs
    every draw at once), after the issue's own example and every pair of
    special values."""
    per_dtype = {}
    for name, dtype in DTYPES.items():
        found: list[list[float]] = [[1.0, NAN, 1.0][:p], [NAN, 1.0, 1.0][:p]]
        specials = special_values(dtype)
        found += [[a, b, *[1.0] * (p - 2)] for a in specials for b in specials]

        @settings(max_examples=examples, deadline=None, database=None)
        @given(columns(p, dtype))
        def collect(drawn):
            found.extend(drawn)  # noqa: B023 (collect runs before the loop moves on)

        collect()
        per_dtype[name] = [
            torch.tensor([column[r] for column in found], dtype=torch.float64).to(dtype)
            for r in range(p)
        ]
    return per_dtype


# One element of the contract, in Python, independent of the kernels -----------


def _key(v: float) -> tuple[float, bool]:
    return (v, not math.copysign(1.0, v) < 0)  # -0.0 before +0.0


def ieee_extreme(values: list[float], largest: bool, ignore_nan: bool) -> float:
    if ignore_nan:
        values = [v for v in values if not math.isnan(v)] or [NAN]
    if any(math.isnan(v) for v in values):
        return NAN
    return (max if largest else min)(values, key=_key)


def same_bits(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def sum_error(values: list[float], got: float, dtype: torch.dtype) -> str | None:
    """Why `got` is not a sum of `values` in some order, or None."""
    if any(math.isnan(v) for v in values) or (INF in values and -INF in values):
        return None if math.isnan(got) else "NaN expected"
    finite = [v for v in values if math.isfinite(v)]
    magnitude = sum(abs(Fraction(v)) for v in finite)
    limit = Fraction(torch.finfo(dtype).max) * (1 - 2 * len(values) * Fraction(UNIT[dtype]))
    if magnitude > limit:
        return None  # some order may overflow: no promise beyond the NaN rule
    if INF in values or -INF in values:
        return None if got in values and math.isinf(got) else "the infinity expected"
    if not math.isfinite(got):
        return f"finite expected, got {got}"
    exact = sum(Fraction(v) for v in finite)
    bound = (len(values) - 1) * Fraction(UNIT[dtype]) * magnitude * Fraction(101, 100)
    return None if abs(Fraction(got) - exact) <= bound else f"off by {float(Fraction(got) - exact)}"


def prod_error(values: list[float], got: float, dtype: torch.dtype) -> str | None:
    zero, infinite = any(v == 0 for v in values), any(math.isinf(v) for v in values)
    if any(math.isnan(v) for v in values) or (zero and infinite):
        return None if math.isnan(got) else "NaN expected"
    info = torch.finfo(dtype)
    rest = [abs(v) for v in values if math.isfinite(v) and v != 0]
    partials = [math.prod(rest[i] for i in range(len(rest)) if mask >> i & 1)
                for mask in range(1, 1 << len(rest))]  # fmt: skip
    # No order overflows or underflows on the way.
    in_range = all(info.smallest_normal <= p <= info.max * (1 - 4 * UNIT[dtype]) for p in partials)
    if math.isnan(got):
        # An order that overflows before meeting the zero, or underflows to
        # zero before meeting the infinity, makes 0 × ∞.
        return None if not in_range and (zero or infinite) else "a number expected"
    negative = sum(math.copysign(1.0, v) < 0 for v in values) % 2 == 1
    if (math.copysign(1.0, got) < 0) != negative:
        return "wrong sign"
    if zero:
        return None if got == 0 else "zero expected"
    if infinite:
        return None if math.isinf(got) else "infinity expected"
    if not in_range:
        return None  # some order may overflow or underflow
    exact = math.prod(Fraction(v) for v in values)
    bound = abs(exact) * (len(values) - 1) * Fraction(UNIT[dtype]) * Fraction(101, 100)
    return None if abs(Fraction(got) - exact) <= bound else "off by more than the rounding"


def contract_error(op: str, values: list[float], got: float, dtype: torch.dtype) -> str | None:
    if op in ("maximumf", "minimumf", "maxnumf", "minnumf"):
        expected = ieee_extreme(values, op.startswith("max"), op.endswith("numf"))
        return None if same_bits(expected, got) else f"expected {expected!r}"
    return (sum_error if op == "addf" else prod_error)(values, got, dtype)


def check(name: str, per_rank: list[torch.Tensor], result: torch.Tensor) -> None:
    op = CONTRACT[name.split()[0]]
    columns = zip(*(x.to(torch.float64).tolist() for x in per_rank))
    for i, (values, got) in enumerate(zip(columns, result.to(torch.float64).tolist())):
        why = contract_error(op, list(values), got, per_rank[0].dtype)
        assert why is None, f"{name}: element {i} of {list(values)} gave {got!r}: {why}"


# Local: the folds, the order keys, the simulator -------------------------------

FOLDS = {"maximumf": kernels.BINARY_TORCH_OPS[arith.MaximumfOp],
         "minimumf": kernels.BINARY_TORCH_OPS[arith.MinimumfOp],
         "maxnumf": kernels.BINARY_TORCH_OPS[arith.MaxnumfOp],
         "minnumf": kernels.BINARY_TORCH_OPS[arith.MinnumfOp]}  # fmt: skip


@settings(max_examples=examples(1.5), deadline=None)
@given(st.data())
def test_extreme_folds_are_the_contract_in_every_order(data):
    dtype = DTYPES[data.draw(st.sampled_from(sorted(DTYPES)))]
    values = data.draw(st.lists(element(dtype), min_size=2, max_size=4))
    xs = [torch.tensor([v], dtype=torch.float64).to(dtype) for v in values]
    for op, fold in FOLDS.items():
        forward, backward = xs[0], xs[-1]
        for x in xs[1:]:
            forward = fold(forward, x)
        for x in reversed(xs[:-1]):
            backward = fold(x, backward)
        exact = [x.item() for x in xs]
        assert contract_error(op, exact, forward.item(), dtype) is None, (op, exact, forward)
        assert same_bits(forward.item(), backward.item()), (op, exact, forward, backward)


@settings(max_examples=examples(1.5), deadline=None)
@given(st.data())
def test_order_keys_order_floats_as_ieee_maximum_and_round_trip(data):
    dtype = DTYPES[data.draw(st.sampled_from(sorted(DTYPES)))]
    values = data.draw(st.lists(element(dtype), min_size=2, max_size=6))
    x = torch.tensor(values, dtype=torch.float64).to(dtype)
    for kind, op in (("max", "maximumf"), ("min", "minimumf")):
        keys = native.to_order_keys(x.clone(), kind)
        chosen = keys.max() if kind == "max" else keys.min()
        got = native.from_order_keys(
            chosen.reshape(1).clone(), torch.empty(1, dtype=dtype)
        ).item()
        assert contract_error(op, x.tolist(), got, dtype) is None, (kind, x.tolist(), got)
        finite = ~x.isnan()
        back = native.from_order_keys(keys, torch.empty_like(x))
        assert torch.equal(back[finite].view(torch.uint8), x[finite].view(torch.uint8))
        assert bool(back[~finite].isnan().all())


def test_the_issue_example_maximumf_becomes_native_max_and_keeps_nan():
    source = (
        "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %y = dist.all_reduce %x : tensor<2xf32> combine(%a, %b) {\n"
        "    %c = arith.maximumf %a, %b : tensor<2xf32>\n"
        "    dist.yield %c : tensor<2xf32>\n  }\n"
        "  func.return %y : tensor<2xf32>\n}"
    )
    inputs = [[torch.tensor([1.0, -0.0])], [torch.tensor([NAN, 0.0])]]
    native = distir.compile(source, "recognize-native-reductions")
    assert "dist.all_reduce max" in str(native.module)
    for program in (distir.compile(source), native):
        for y in distir.simulate(program, inputs):
            assert math.isnan(y[0].item()) and y[1].item() == 0.0 and not y[1].signbit()


# Real ranks --------------------------------------------------------------------


@pytest.mark.multirank
@pytest.mark.parametrize("p", [2, 3])
def test_every_variant_keeps_the_float_contract_on_gloo_and_in_the_simulator(p):
    inputs = generated_inputs(p, examples=25)
    batch = [(f"tensor<?x{name}>", name, per_rank) for name, per_rank in inputs.items()]
    ranks = launch(run_variants, p, batch, pass_context=True, timeout=100)
    for d, (t, _name, per_rank) in enumerate(batch):
        for variant in ranks[0][d]:
            for rank in range(p):
                check(f"{variant} (rank {rank}, {t})", per_rank, ranks[rank][d][variant])
        # The simulator, before and after each pass, keeps it too.
        simulated = {}
        for variant, source, pipeline, _implementations in variants(t):
            if (source, pipeline) not in simulated:
                program = distir.compile(source, pipeline)
                simulated[source, pipeline] = program.simulate([[x] for x in per_rank])
            for rank, y in enumerate(simulated[source, pipeline]):
                check(f"{variant} (simulated rank {rank}, {t})", per_rank, y)
