"""The gradient check of a whole SPMD computation (see test_transpose_rules)."""

from __future__ import annotations

import torch

import distir
from distir.runtime.autograd import simulate_vjp

Inputs = list[list[torch.Tensor]]


def floats(shape, seed: int, low: float = -1.0, high: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low


def global_objective(program, inputs: Inputs, cotangents: Inputs) -> float:
    results = program.simulate(inputs)
    total = 0.0
    for rank, out in enumerate(results):
        out = out if isinstance(out, tuple) else (out,)
        floats = [y for y in out if y.is_floating_point()]
        for y, dy in zip(floats, cotangents[rank]):
            total += float((y * dy).sum())
    return total


def check_gradients(
    text: str, inputs: Inputs, seed: int, step: float = 1e-4, tolerance: float = 1e-6
) -> None:
    """The backward program's gradients are ∂F/∂x along two random directions
    (a step of 1/8 or more is a grid step: directions and cotangents are
    then multiples of 1/8, so that inputs on that grid stay on it)."""
    program = distir.compile(text)
    results = [o if isinstance(o, tuple) else (o,) for o in program.simulate(inputs)]
    cotangents = [
        [
            floats(y.shape, seed * 131 + 7 * r + i).to(y.dtype)
            for i, y in enumerate(out)
            if y.is_floating_point()
        ]
        for r, out in enumerate(results)
    ]
    if step >= 0.125:  # on a grid: the cotangents cross the f32 round trip too
        cotangents = [[torch.round(c * 8) / 8 for c in cs] for cs in cotangents]
    forward, gradients = simulate_vjp(program, inputs, cotangents)
    for mine, plain in zip(forward, results):
        assert all(torch.equal(a, b) for a, b in zip(mine, plain))
    for rank, xs in enumerate(inputs):
        for x, g in zip(xs, gradients[rank]):
            if x.is_floating_point():
                assert g is not None and g.shape == x.shape and g.dtype == x.dtype
            else:
                assert g is None
    h = step
    for trial in range(2):
        directions = [
            [
                floats(x.shape, seed * 977 + 31 * r + 5 * i + trial).to(x.dtype)
                if x.is_floating_point()
                else None
                for i, x in enumerate(xs)
            ]
            for r, xs in enumerate(inputs)
        ]
        if step >= 0.125:
            directions = [
                [v if v is None else torch.round(v * 8) / 8 for v in vs] for vs in directions
            ]

        def moved(step: float, directions=directions) -> Inputs:
            return [
                [x if v is None else x + step * v for x, v in zip(xs, vs)]
                for xs, vs in zip(inputs, directions)
            ]

        numeric = (
            global_objective(program, moved(h), cotangents)
            - global_objective(program, moved(-h), cotangents)
        ) / (2 * h)
        analytic = sum(
            float((g * v).sum())
            for gs, vs in zip(gradients, directions)
            for g, v in zip(gs, vs)
            if v is not None
        )
        assert abs(numeric - analytic) <= tolerance * max(1.0, abs(numeric)), (numeric, analytic)
