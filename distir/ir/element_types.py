"""The element types distir runs: one table, each IR type beside the torch
dtype that holds its values (named, not imported: the IR imports no torch).

Integer types follow MLIR's signedness: a signless `iN` (what `arith` ops
take and produce) and a signed `siN` are two's-complement signed integers,
torch's `intN`; an unsigned `uiN` is torch's `uintN` (`ui8` is `uint8`, never
`int8`). One-bit integers (`i1`, `si1`, `ui1`) are `bool`; `index` is `int64`.

Both directions are read from here: IR type -> torch dtype
(`distir.core.dtypes.element_dtype`), torch dtype -> IR type (the first type
listed for a dtype, so signless before signed and `i64` before `index`:
`distir.core.dtypes.ir_element_type`, which the eager collectives, the DDP
hooks and the backends' messages spell with), and the builder's spellings
(`builder.tensor_type("bf16", ...)`).
"""

from __future__ import annotations

from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IndexType,
    IntegerType,
    Signedness,
)
from xdsl.ir import Attribute

#: (IR element type, the name of its torch dtype), narrow before wide,
#: integers before floats
ELEMENT_TYPES: tuple[tuple[Attribute, str], ...] = (
    *(
        (IntegerType(width, signedness), dtype)
        for width, signed, unsigned in (
            (1, "bool", "bool"),
            (8, "int8", "uint8"),
            (16, "int16", "uint16"),
            (32, "int32", "uint32"),
            (64, "int64", "uint64"),
        )
        for signedness, dtype in (
            (Signedness.SIGNLESS, signed),
            (Signedness.SIGNED, signed),
            (Signedness.UNSIGNED, unsigned),
        )
    ),
    (IndexType(), "int64"),
    (Float16Type(), "float16"),
    (BFloat16Type(), "bfloat16"),
    (Float32Type(), "float32"),
    (Float64Type(), "float64"),
)

#: how IR spells each element type ("bf16", "ui8") -> the type
BY_SPELLING: dict[str, Attribute] = {str(t): t for t, _ in ELEMENT_TYPES}
