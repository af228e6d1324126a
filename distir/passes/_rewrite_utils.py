"""Helpers shared by distir's rewrite patterns."""

from __future__ import annotations

from collections.abc import Iterable

from xdsl.dialects.builtin import (
    LocationAttr,
)
from xdsl.ir import Operation


def with_location(ops: Iterable[Operation], location: LocationAttr) -> None:
    """Stamp the source op's location on ops a rewrite creates, so that errors
    raised later (a verifier, a backend) still point at the source line."""
    for op in ops:
        for nested in op.walk():
            nested.location = location
