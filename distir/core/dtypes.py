"""The mapping between IR types and torch dtypes and shapes.

Both directions are read from the one table of element types
(`distir.ir.element_types`, which says how signedness maps).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Attribute

from distir.ir.element_types import ELEMENT_TYPES

#: IR element type -> torch dtype, from the one table (`distir.ir.element_types`)
_DTYPES: dict[Attribute, torch.dtype] = {t: getattr(torch, name) for t, name in ELEMENT_TYPES}
#: torch dtype -> how IR spells its element type, in the table's order
IR_ELEMENT_TYPES: dict[torch.dtype, str] = {
    dtype: next(str(t) for t, d in _DTYPES.items() if d == dtype)
    for dtype in dict.fromkeys(_DTYPES.values())
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
    dtype = _DTYPES.get(t)
    if dtype is None:
        raise TypeError(f"no torch dtype for IR type {t}")
    return dtype


def ir_element_type(dtype: torch.dtype) -> str:
    """How IR spells the element type of a torch dtype (`torch.bfloat16`:
    "bf16", `torch.int64`: "i64"): the inverse of `element_dtype` on the
    types it maps first.

    >>> ir_element_type(torch.uint8)
    'ui8'
    """
    try:
        return IR_ELEMENT_TYPES[dtype]
    except KeyError:
        raise TypeError(f"no IR element type for torch dtype {dtype}") from None


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
