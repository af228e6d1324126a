"""Programs in torch autograd.

A run whose inputs require grad (with grad mode on) records its results in
the autograd graph, or is refused with `NotDifferentiable` before any
collective: never a result whose backward silently ignores the collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from distir.errors import NotDifferentiable


def records_gradient(inputs: Sequence[Any]) -> bool:
    """Whether a run on `inputs` would be recorded by autograd."""
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in inputs
    )


def refuse(entry: str, inputs: Sequence[Any]) -> None:
    """Raises `NotDifferentiable` when a run on `inputs` would need a gradient."""
    if records_gradient(inputs):
        wanting = [
            i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.requires_grad
        ]
        raise NotDifferentiable(
            f"@{entry}: inputs {wanting} require grad, and this program is not "
            "differentiable; detach them or run under torch.no_grad()"
        )
