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
}


def _program(op: str, arity: int = 1) -> str:
    args = ", ".join(f"%a{i}: tensor<{N}xf64>" for i in range(arity))
    operands = ", ".join(f"%a{i}" for i in range(arity))
    return f"""
func.func @main({args}) -> tensor<{N}xf64> {{
  %y = math.{op} {operands} : tensor<{N}xf64>
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
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", sorted(UNARY))
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_each_math_derivative_equals_torch_autograd(op, data):
    fn, (low, high) = UNARY[op]
    inputs = [[data.draw(_values(low, high, N))] for _ in range(P)]
    cotangents = [data.draw(_values(-2, 2, N)) for _ in range(P)]
    _check(_program(op), fn, inputs, cotangents)


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_the_fma_derivative_equals_torch_autograd(data):
    # f32: math.fma is refused on f64 (torch cannot round it once there)
    inputs = [[data.draw(_values(-3, 3, N)).float() for _ in range(3)] for _ in range(P)]
    cotangents = [data.draw(_values(-2, 2, N)).float() for _ in range(P)]
    program = _program("fma", 3).replace("f64", "f32")
    _, gradients = simulate_vjp(distir.compile(program), inputs, [[c] for c in cotangents])
    expected = _oracle(lambda a, b, c: a * b + c, inputs, cotangents)
    for rank in range(P):
        for got, want in zip(gradients[rank], expected[rank]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_absf_at_zero_sends_no_gradient_as_torch():
    x = torch.tensor([0.0, -0.0, 1.0, -2.0], dtype=torch.float64)
    ct = torch.ones(N, dtype=torch.float64)
    _check(_program("absf"), torch.abs, [[x], [x]], [ct, ct])


@pytest.mark.parametrize("op", ["atan2", "copysign", "powf"])
def test_a_math_op_without_a_derivative_is_refused_by_name(op):
    program = distir.compile(_program(op, 2))
    x = torch.ones(N, dtype=torch.float64)
    with pytest.raises(NotDifferentiable, match=f"'math.{op}' has no derivative"):
        simulate_vjp(program, [[x, x]] * P, [[x]] * P)
