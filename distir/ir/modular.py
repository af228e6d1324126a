"""Exactness of modular sums in int64: the headroom proof, in one place.

Torch-free, so that passes (which prove a rewrite exact) and backends (which
choose a reduction schedule at run time) read the same rule.

Limbs are reduced, `0 <= x < q`, with `2 <= q < 2^62`. A plain int64 sum of
k reduced limbs is at most `k * (q - 1)`, and every partial sum, in any order,
is non-negative and no larger; so the sum is exact iff `k * (q_max - 1) <=
2^63 - 1`. For k = 2 this always holds (`2q - 2 < 2^63`), which is why the
subtract-and-mask modular add (`s = a + b; d = s - q; d + ((d >> 63) & q)`)
never overflows.
"""

from __future__ import annotations

INT64_MAX = (1 << 63) - 1

#: Every modulus must be strictly below this so that `a + b` fits in int64.
MAX_MODULUS_EXCLUSIVE = 1 << 62


def int64_sum_is_exact(terms: int, q_max: int) -> bool:
    """`terms * (q_max - 1) <= 2^63 - 1`: an int64 sum of `terms` reduced
    limbs cannot overflow."""
    return terms * (q_max - 1) <= INT64_MAX


def headroom(q_max: int) -> int:
    """How many reduced limbs an int64 sum can hold exactly."""
    return INT64_MAX // max(1, q_max - 1)


def lazy_reduction_schedule(size: int, q_max: int) -> list[int]:
    """For each of the P - 1 additions of a ring reduce-scatter, the bound b
    (values <= b * (q_max - 1)) to reduce from after that addition, or 1 for
    no reduction: limbs are added unreduced while the headroom lasts, and the
    last addition always reduces."""
    room = headroom(q_max)
    schedule: list[int] = []
    incoming = 1
    for step in range(size - 1):
        bound = incoming + 1
        last = step == size - 2
        if last or bound + 1 > room:
            schedule.append(bound)
            incoming = 1
        else:
            schedule.append(1)
            incoming = bound
    return schedule
