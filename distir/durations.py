"""One convention for every time parameter of distir's API.

Every duration distir accepts (a program's `deadline`, a launch `timeout`,
`distir-run --deadline`) is either a number of seconds (`int` or `float`)
or a `datetime.timedelta`, and is converted here, once, to float seconds.
"""

from __future__ import annotations

import math
from datetime import timedelta

#: seconds, or a timedelta
Duration = float | int | timedelta


def seconds(value: Duration, what: str) -> float:
    """`value` in seconds; a clear error names `what` when it is not a
    positive finite duration."""
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    else:
        raise TypeError(
            f"{what} must be a number of seconds or a datetime.timedelta, "
            f"got {type(value).__name__} {value!r}"
        )
    if not math.isfinite(result) or result <= 0:
        raise ValueError(f"{what} must be a positive, finite duration, got {value!r}")
    return result
