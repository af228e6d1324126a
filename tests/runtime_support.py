"""Helpers shared by the runtime tests: references computed from the
definitions of docs/reference/dialect.md, element types, and source locations."""

from __future__ import annotations

import functools
import operator
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

#: torch dtype name -> IR element type
ELEMENT_TYPES = {
    "int64": "i64",
    "int32": "i32",
    "int8": "i8",
    "bool": "i1",
    "float32": "f32",
    "float64": "f64",
}

#: the native reduction kinds, as Python folds of one element
PY_FOLDS: dict[str, Callable[[Any, Any], Any]] = {
    "sum": operator.add,
    "prod": operator.mul,
    "min": min,
    "max": max,
    "band": operator.and_,
    "bor": operator.or_,
    "bxor": operator.xor,
}

ARITHMETIC_KINDS = ("sum", "prod", "min", "max")
BITWISE_KINDS = ("band", "bor", "bxor")


def tensor_type(shape: Sequence[int | None], dtype: str) -> str:
    dims = "".join(("?" if d is None else str(d)) + "x" for d in shape)
    return f"tensor<{dims}{ELEMENT_TYPES[dtype]}>"


def as_tuple(result: Any) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


def reference_native(kind: str, values: Sequence[torch.Tensor]) -> torch.Tensor:
    """Element by element, the rank-order fold of Python scalars."""
    columns = zip(*(v.reshape(-1).tolist() for v in values))
    out = [functools.reduce(PY_FOLDS[kind], column) for column in columns]
    return torch.tensor(out, dtype=values[0].dtype).reshape(values[0].shape)


def reference_gather(parts: Sequence[torch.Tensor], axis: int) -> torch.Tensor:
    """Rank-order concatenation, written as slice assignment."""
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    out = torch.full(shape, -1, dtype=parts[0].dtype) if shape else parts[0].clone()
    offset = 0
    for p in parts:
        index = [slice(None)] * len(shape)
        index[axis] = slice(offset, offset + p.shape[axis])
        out[tuple(index)] = p
        offset += p.shape[axis]
    return out


def reference_all_to_all(
    xs: Sequence[torch.Tensor], sends: Sequence[Sequence[int]], me: int, axis: int
) -> tuple[torch.Tensor, list[int]]:
    """What rank `me` receives: from each sender s, in rank order, the rows
    of s's input that s's send counts assign to `me`."""
    blocks = []
    for x, send in zip(xs, sends):
        start = sum(send[:me])
        index = [slice(None)] * x.dim()
        index[axis] = slice(start, start + send[me])
        blocks.append(x[tuple(index)])
    return reference_gather(blocks, axis), [send[me] for send in sends]


def reference_ciphertext_sum(cts: Sequence[torch.Tensor], moduli: Sequence[int]) -> torch.Tensor:
    """Σ_r ct_r mod q_l in Python integers (no int64 overflow possible)."""
    shape = cts[0].shape
    flat = [c.reshape(-1, shape[-2], shape[-1]).tolist() for c in cts]
    out = [
        [
            [sum(f[b][limb][n] for f in flat) % moduli[limb] for n in range(shape[-1])]
            for limb in range(shape[-2])
        ]
        for b in range(len(flat[0]))
    ]
    return torch.tensor(out, dtype=torch.int64).reshape(shape)


def matmul_in_rank_order(matrices: Sequence[torch.Tensor]) -> torch.Tensor:
    return functools.reduce(torch.matmul, matrices)


#: generic all-reduce whose combine is the 2x2 matrix product lhs @ rhs,
#: written with tensor.extract / arith.muli / arith.addi / tensor.from_elements
MATMUL_COMBINE_PROGRAM = """\
func.func @main(%x: tensor<2x2xi64>) -> tensor<2x2xi64> {
  %y = dist.all_reduce %x : tensor<2x2xi64> combine(%a, %b) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %a00 = tensor.extract %a[%c0, %c0] : tensor<2x2xi64>
    %a01 = tensor.extract %a[%c0, %c1] : tensor<2x2xi64>
    %a10 = tensor.extract %a[%c1, %c0] : tensor<2x2xi64>
    %a11 = tensor.extract %a[%c1, %c1] : tensor<2x2xi64>
    %b00 = tensor.extract %b[%c0, %c0] : tensor<2x2xi64>
    %b01 = tensor.extract %b[%c0, %c1] : tensor<2x2xi64>
    %b10 = tensor.extract %b[%c1, %c0] : tensor<2x2xi64>
    %b11 = tensor.extract %b[%c1, %c1] : tensor<2x2xi64>
    %p0 = arith.muli %a00, %b00 : i64
    %q0 = arith.muli %a01, %b10 : i64
    %r00 = arith.addi %p0, %q0 : i64
    %p1 = arith.muli %a00, %b01 : i64
    %q1 = arith.muli %a01, %b11 : i64
    %r01 = arith.addi %p1, %q1 : i64
    %p2 = arith.muli %a10, %b00 : i64
    %q2 = arith.muli %a11, %b10 : i64
    %r10 = arith.addi %p2, %q2 : i64
    %p3 = arith.muli %a10, %b01 : i64
    %q3 = arith.muli %a11, %b11 : i64
    %r11 = arith.addi %p3, %q3 : i64
    %r = tensor.from_elements %r00, %r01, %r10, %r11 : tensor<2x2xi64>
    dist.yield %r : tensor<2x2xi64>
  }
  func.return %y : tensor<2x2xi64>
}
"""


def order_sensitive_matrices(world_size: int, seed: int) -> list[torch.Tensor]:
    """Small integer 2x2 matrices whose product changes if the order does
    (for world sizes of at least 2)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        ms = [torch.randint(-2, 3, (2, 2), generator=generator) for _ in range(world_size)]
        if world_size < 2:
            return ms
        forward = matmul_in_rank_order(ms)
        if not torch.equal(forward, matmul_in_rank_order(ms[::-1])) and bool(forward.any()):
            return ms


def example_pipeline(path: Path) -> str:
    """The pipeline an example runs after, as its first line's `Run:` comment
    gives it (`... -p convert-shard-to-dist`); "" for none."""
    first = path.read_text().splitlines()[0]
    words = first.split("Run:", 1)[-1].split() if "Run:" in first else []
    return words[words.index("-p") + 1] if "-p" in words else ""


def location(text: str, needle: str, filename: str) -> str:
    """`file:line:col` of the op on the first line containing `needle`, as
    distir's parser records it (the column of the line's first character)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return f"{filename}:{number}:{len(line) - len(line.lstrip()) + 1}"
    raise AssertionError(f"{needle!r} not in program")


def write_program(directory: Path, text: str, name: str = "prog.mlir") -> Path:
    path = directory / name
    path.write_text(text)
    return path


#: arith.cmpi predicates: (Python comparison, whether operands read as unsigned)
INTEGER_PREDICATES = {
    "eq": (operator.eq, False),
    "ne": (operator.ne, False),
    "slt": (operator.lt, False),
    "sle": (operator.le, False),
    "sgt": (operator.gt, False),
    "sge": (operator.ge, False),
    "ult": (operator.lt, True),
    "ule": (operator.le, True),
    "ugt": (operator.gt, True),
    "uge": (operator.ge, True),
}


class FrozenStore:
    """A store whose reads and writes never answer (its server is
    SIGSTOPped) until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def check(self, keys):
        self.release.wait()
        return False

    def set(self, key, value):
        self.release.wait()

    def compare_set(self, key, expected, desired):
        self.release.wait()
        return expected
