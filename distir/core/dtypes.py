"""The mapping between IR types and torch dtypes and shapes.

Integer types follow MLIR's signedness: a signless `iN` (what `arith` ops
take and produce) and a signed `siN` are two's-complement signed integers,
torch's `intN`; an unsigned `uiN` is torch's `uintN` (`ui8` is `torch.uint8`,
never `torch.int8`). One-bit integers (`i1`, `si1`, `ui1`) are `torch.bool`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IndexType,
    IntegerType,
    Signedness,
    TensorType,
)
from xdsl.ir import Attribute

#: width -> torch dtype of signless and signed integers
_SIGNED_INT_DTYPES = {
    1: torch.bool,
    8: torch.int8,
    16: torch.int16,
    32: torch.int32,
    64: torch.int64,
}
#: width -> torch dtype of unsigned integers
_UNSIGNED_INT_DTYPES = {
    1: torch.bool,
    8: torch.uint8,
    16: torch.uint16,
    32: torch.uint32,
    64: torch.uint64,
}

#: the element types `element_dtype` maps, as IR spells them (for messages)
RUNNABLE_ELEMENT_TYPES = "i1, i8-i64, si8-si64, ui8-ui64, f16, bf16, f32, f64, index"


def element_dtype(t: Attribute) -> torch.dtype:
    """The torch dtype of a scalar type, or of a tensor type's elements.

    >>> element_dtype(TensorType(IntegerType(8, Signedness.UNSIGNED), [2]))
    torch.uint8
    """
    if isinstance(t, TensorType):
        t = t.element_type
    if isinstance(t, IndexType):
        return torch.int64
    if isinstance(t, IntegerType):
        width = t.width.data
        table = (
            _UNSIGNED_INT_DTYPES
            if t.signedness.data == Signedness.UNSIGNED
            else _SIGNED_INT_DTYPES
        )
        if width in table:
            return table[width]
    if isinstance(t, Float16Type):
        return torch.float16
    if isinstance(t, BFloat16Type):
        return torch.bfloat16
    if isinstance(t, Float32Type):
        return torch.float32
    if isinstance(t, Float64Type):
        return torch.float64
    raise TypeError(f"no torch dtype for IR type {t}")


def static_shape(t: Attribute) -> tuple[int | None, ...]:
    """The shape of a value of type `t`: None for dynamic dims, () for scalars."""
    if isinstance(t, TensorType):
        return tuple(d if d >= 0 else None for d in t.get_shape())
    return ()


def fits_shape(declared: Sequence[int | None], shape: Sequence[int]) -> bool:
    """Whether a tensor of `shape` has the rank and the static dims of the
    `declared` shape (`static_shape`: None for a dynamic dim): the one
    statement of "a tensor matches its declared type" that inputs, results
    and received messages are checked with."""
    return len(declared) == len(shape) and all(
        d is None or d == s for d, s in zip(declared, shape)
    )


def matches_type(value: torch.Tensor, t: Attribute) -> bool:
    """Whether a runtime tensor is a value of IR type `t`."""
    return value.dtype == element_dtype(t) and fits_shape(static_shape(t), value.shape)


def describe_tensor(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {list(value.shape)} and dtype {value.dtype}"
    return f"{type(value).__name__}"
