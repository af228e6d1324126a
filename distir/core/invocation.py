"""What an executor needs about one op, decoded from the IR once.

Both the Torch backend and the reference interpreter run dist ops from an
`Invocation`: the op's description for errors, its group, its static
properties as plain Python values and the static shapes of its results,
decoded at compile time (by the op's semantics record,
`distir.core.semantics.make_invocation`) so that nothing reads IR at
run time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from xdsl.ir import Operation


@dataclass(frozen=True)
class Invocation:
    """Everything an implementation needs about one op, decoded once at
    compile time: its description for errors, its group, static properties,
    the static shapes of its results and its compiled regions."""

    op: Operation
    description: str
    group: str | None
    properties: Mapping[str, Any]
    result_shapes: tuple[tuple[int | None, ...], ...]
    operand_shapes: tuple[tuple[int | None, ...], ...] = ()
    regions: tuple[Callable[..., tuple[torch.Tensor, ...]], ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)

    def dynamic(self, operand: int) -> bool:
        """Whether the operand's IR type leaves some dimension dynamic."""
        return None in self.operand_shapes[operand]
