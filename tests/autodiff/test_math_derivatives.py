"""Every differentiable `math` op has a derivative, each checked against
torch.autograd of the plain-torch function (which shares no code with the
`vjp` pass) on drawn values of its domain, through an all-reduce on
simulated ranks; the ops without one are refused by name."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.errors import NotDifferentiable
from distir.runtime.autograd import simulate_vjp

P = 2
N = 4

#: op -> (plain torch function, domain the values are drawn from)
UNARY = {
    "exp": (torch.exp, (-3, 3)),
    "exp2": (torch.exp2, (-3, 3)),
    "expm1": (torch.expm1, (-3, 3)),
    "log": (torch.log, (0.1, 10)),
    "log2": (torch.log2, (0.1, 10)),
    "log10": (torch.log10, (0.1, 10)),
    "log1p": (torch.log1p, (-0.9, 10)),
    "sqrt": (torch.sqrt, (0.1, 10)),
    "rsqrt": (torch.rsqrt, (0.1, 10)),
    "sin": (torch.sin, (-3, 3)),
    "cos": (torch.cos, (-3, 3)),
    "tan": (torch.tan, (-1.2, 1.2)),
    "sinh": (torch.sinh, (-3, 3)),
    "cosh": (torch.cosh, (-3, 3)),
    "tanh": (torch.tanh, (-3, 3)),
    "asin": (torch.asin, (-0.9, 0.9)),
    "acos": (torch.acos, (-0.9, 0.9)),
    "atan": (torch.atan, (-3, 3)),
    "asinh": (torch.asinh, (-3, 3)),
    "acosh": (torch.acosh, (1.1, 10)),
    "atanh": (torch.atanh, (-0.9, 0.9)),
    "erf": (torch.erf, (-3, 3)),
    "absf": (torch.abs, (-3, 3)),
    "floor": (torch.floor, (-3, 3)),
    "ceil": (torch.ceil, (-3, 3)),
    "round": (lambda x: torch.sign(x) * torch.floor(x.abs() + 0.5), (-3, 3)),
    "roundeven": (torch.round, (-3, 3)),
    "trunc": (torch.trunc, (-3, 3)),
    "cbrt": (lambda x: torch.sign(x) * x.abs().pow(1 / 3), (0.1, 10)),
}

#: op -> (plain torch function, domain of each operand); `None`: drawn from a
#: few values so that ties, zeros and signed zeros come up
BINARY = {
    "math.powf": (torch.pow, [(0.1, 10), (-3, 3)]),
    "math.atan2": (torch.atan2, [(-3, 3), (-3, 3)]),
    "math.copysign": (torch.copysign, [None, None]),
    "arith.maximumf": (torch.maximum, [None, None]),
    "arith.minimumf": (torch.minimum, [None, None]),
    "arith.maxnumf": (torch.fmax, [None, None]),
    "arith.minnumf": (torch.fmin, [None, None]),
}

#: the few values that make ties and zeros likely
FEW = [-2.0, -1.0, -0.0, 0.0, 1.0, 2.5]


def _program(op: str, arity: int = 1) -> str:
    args = ", ".join(f"%a{i}: tensor<{N}xf64>" for i in range(arity))
    operands = ", ".join(f"%a{i}" for i in range(arity))
    name = op if "." in op else f"math.{op}"
    return f"""
func.func @main({args}) -> tensor<{N}xf64> {{
  %y = {name} {operands} : tensor<{N}xf64>
  %s = dist.all_reduce sum %y : tensor<{N}xf64>
  func.return %s : tensor<{N}xf64>
}}"""


def _values(low: float, high: float, count: int):
    return st.lists(
        st.floats(low, high, allow_nan=False, allow_infinity=False), min_size=count, max_size=count
    ).map(lambda v: torch.tensor(v, dtype=torch.float64))


def _oracle(fn, inputs: list[list[torch.Tensor]], cotangents: list[torch.Tensor]):
    """Every rank's gradients of sum_r <ct_r, sum_r' fn(x_r')>, in plain torch."""
    leaves = [[x.clone().requires_grad_(True) for x in xs] for xs in inputs]
    total = sum(fn(*xs) for xs in leaves)
    objective = sum((total * ct).sum() for ct in cotangents)
    objective.backward()
    return [[x.grad for x in xs] for xs in leaves]


def _check(text: str, fn, inputs, cotangents) -> None:
    program = distir.compile(text)
    _, gradients = simulate_vjp(program, inputs, [[c] for c in cotangents])
    expected = _oracle(fn, inputs, cotangents)
    for rank in range(P):
        for got, want in zip(gradients[rank], expected[rank]):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("op", sorted(UNARY))
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_each_math_derivative_equals_torch_autograd(op, data):
    fn, (low, high) = UNARY[op]
    inputs = [[data.draw(_values(low, high, N))] for _ in range(P)]
    cotangents = [data.draw(_values(-2, 2, N)) for _ in range(P)]
    _check(_program(op), fn, inputs, cotangents)


@pytest.mark.parametrize("op", sorted(BINARY))
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_each_binary_derivative_equals_torch_autograd(op, data):
    fn, domains = BINARY[op]

    def operand(domain):
        if domain is None:
            few = st.lists(st.sampled_from(FEW), min_size=N, max_size=N)
            return few.map(lambda v: torch.tensor(v, dtype=torch.float64))
        return _values(*domain, N)

    inputs = [[data.draw(operand(d)) for d in domains] for _ in range(P)]
    cotangents = [data.draw(_values(-2, 2, N)) for _ in range(P)]
    _check(_program(op, 2), fn, inputs, cotangents)


def test_powf_at_a_zero_base_masks_as_torch():
    a = torch.tensor([0.0, 0.0, 0.0, 2.0], dtype=torch.float64)
    b = torch.tensor([0.0, 2.0, 3.0, 0.0], dtype=torch.float64)
    ct = torch.ones(N, dtype=torch.float64)
    _check(_program("math.powf", 2), torch.pow, [[a, b], [a, b]], [ct, ct])


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_the_fma_derivative_equals_torch_autograd(data):
    inputs = [[data.draw(_values(-3, 3, N)) for _ in range(3)] for _ in range(P)]
    cotangents = [data.draw(_values(-2, 2, N)) for _ in range(P)]
    # f32: math.fma is refused on f64 (no kernel rounds it once); the
    # gradients (ct*b, ct*a, ct) round once each in both, so they agree exactly
    f32 = [[x.float() for x in xs] for xs in inputs]
    text = _program("fma", 3).replace("f64", "f32")
    _check(text, lambda a, b, c: a * b + c, f32, [c.float() for c in cotangents])


def test_absf_at_zero_sends_no_gradient_as_torch():
    x = torch.tensor([0.0, -0.0, 1.0, -2.0], dtype=torch.float64)
    ct = torch.ones(N, dtype=torch.float64)
    _check(_program("absf"), torch.abs, [[x], [x]], [ct, ct])


#: the local ops with a kernel and no derivative rule that may read a float:
#: each refused by name when a gradient would flow through it
REFUSED = {"arith.bitcast", "math.fpowi", "tensor.reshape"}

#: the local ops with a kernel and no derivative rule that read no float
#: (integers, indices, constants, fresh tensors): no gradient flows through
#: them, so the pass never asks for a rule
READ_NO_FLOAT = {
    *(f"arith.{n}" for n in ["addi", "andi", "cmpi", "constant", "divsi", "divui", "extsi",
                             "extui", "index_cast", "maxsi", "maxui", "minsi", "minui", "muli",
                             "ori", "remsi", "remui", "shli", "shrsi", "shrui", "sitofp",
                             "subi", "trunci", "uitofp", "xori"]),
    "math.absi", "tensor.empty", "dist.assert_reduced",
}  # fmt: skip


def test_every_local_op_with_a_kernel_has_a_derivative_or_is_listed():
    """The kernel table and the rule table are compared op by op, so an op
    given a kernel is never silently left without a decision."""
    from distir.core.kernels import LOCAL_KERNELS
    from distir.core.semantics import LOCAL_CHECK_KERNELS
    from distir.passes.vjp import LOCAL_RULES

    kernels = [*LOCAL_KERNELS, *LOCAL_CHECK_KERNELS]
    without_rule = {t.name for t in kernels if t not in LOCAL_RULES}
    assert without_rule == REFUSED | READ_NO_FLOAT
    assert not REFUSED & READ_NO_FLOAT


#: a program per refused op, a gradient flowing through it
REFUSED_PROGRAMS = {
    "arith.bitcast": ("%y = arith.bitcast %a : tensor<4xf64> to tensor<4xi64>\n"
                      "  %z = arith.bitcast %y : tensor<4xi64> to tensor<4xf64>", "%z"),
    "math.fpowi": ("%n = arith.constant dense<2> : tensor<4xi32>\n"
                   "  %z = math.fpowi %a, %n : tensor<4xf64>, tensor<4xi32>", "%z"),
    "tensor.reshape": ("%shape = arith.constant dense<4> : tensor<1xi64>\n"
                       "  %z = tensor.reshape %a(%shape) : (tensor<4xf64>, tensor<1xi64>) -> tensor<4xf64>",
                       "%z"),
}  # fmt: skip


@pytest.mark.parametrize("op", sorted(REFUSED))
def test_each_refused_op_is_refused_by_name(op):
    body, out = REFUSED_PROGRAMS[op]
    text = f"""
func.func @main(%a: tensor<{N}xf64>) -> tensor<{N}xf64> {{
  {body}
  %s = dist.all_reduce sum {out} : tensor<{N}xf64>
  func.return %s : tensor<{N}xf64>
}}"""
    program = distir.compile(text)
    x = torch.ones(N, dtype=torch.float64)
    with pytest.raises(NotDifferentiable, match=f"'{op}' has no derivative"):
        simulate_vjp(program, [[x]] * P, [[x]] * P)


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_the_from_elements_derivative_equals_torch_autograd(data):
    """Elements of a 2x3 tensor built from scalars extracted in a drawn order."""
    order = data.draw(st.permutations(range(6)))
    extracts = "\n".join(
        f"  %i{k} = arith.constant {k} : index\n  %e{k} = tensor.extract %a0[%i{k}] : tensor<6xf64>"
        for k in range(6)
    )
    elements = ", ".join(f"%e{k}" for k in order)
    text = f"""
func.func @main(%a0: tensor<6xf64>) -> tensor<2x3xf64> {{
{extracts}
  %y = tensor.from_elements {elements} : tensor<2x3xf64>
  %s = dist.all_reduce sum %y : tensor<2x3xf64>
  func.return %s : tensor<2x3xf64>
}}"""
    inputs = [[data.draw(_values(-3, 3, 6))] for _ in range(P)]
    cotangents = [data.draw(_values(-2, 2, 6)).reshape(2, 3) * (1 + r) for r in range(P)]
    _check(text, lambda a: a[list(order)].reshape(2, 3), inputs, cotangents)
