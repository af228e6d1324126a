"""One dtype table, both directions (`distir.ir.element_types`, read by
`distir.core.dtypes`)."""

from __future__ import annotations

import pytest
import torch

from distir.core.dtypes import IR_ELEMENT_TYPES, element_dtype, ir_element_type
from distir.ir.element_types import ELEMENT_TYPES
from distir.ir.parsing import parse_module

#: every element type IR can spell that distir runs, and torch's dtype for it,
#: written out here (not read from the table)
EXPECTED = {
    "i1": torch.bool, "si1": torch.bool, "ui1": torch.bool,
    "i8": torch.int8, "si8": torch.int8, "ui8": torch.uint8,
    "i16": torch.int16, "si16": torch.int16, "ui16": torch.uint16,
    "i32": torch.int32, "si32": torch.int32, "ui32": torch.uint32,
    "i64": torch.int64, "si64": torch.int64, "ui64": torch.uint64,
    "index": torch.int64,
    "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
}  # fmt: skip


def _parsed(spelling: str):
    module = parse_module(
        f"func.func @f(%x: tensor<2x{spelling}>) -> tensor<2x{spelling}> {{\n"
        f"  func.return %x : tensor<2x{spelling}>\n}}"
    )
    return next(iter(module.ops)).function_type.inputs.data[0]


@pytest.mark.parametrize("spelling", sorted(EXPECTED))
def test_ir_to_torch(spelling: str) -> None:
    assert element_dtype(_parsed(spelling)) == EXPECTED[spelling]


def test_the_table_holds_exactly_the_runnable_types() -> None:
    assert sorted(str(t) for t, _ in ELEMENT_TYPES) == sorted(EXPECTED)


@pytest.mark.parametrize("dtype", sorted(set(EXPECTED.values()), key=str), ids=str)
def test_torch_to_ir_and_back(dtype: torch.dtype) -> None:
    spelling = ir_element_type(dtype)
    assert EXPECTED[spelling] == dtype
    assert not spelling.startswith("si") and spelling != "index"  # the signless spelling
    assert element_dtype(_parsed(spelling)) == dtype
    assert IR_ELEMENT_TYPES[dtype] == spelling


def test_a_type_outside_the_table_is_named() -> None:
    with pytest.raises(TypeError, match="no torch dtype for IR type i3"):
        element_dtype(_parsed("i3"))
    with pytest.raises(TypeError, match="no IR element type for torch dtype torch.complex64"):
        ir_element_type(torch.complex64)
