"""Inputs for running a program without writing any: synthesised from the IR.

Random values would break the contracts of some ops (ciphertext limbs must be
reduced, counts must add up), so arguments are synthesised from how the
entry function uses them:

- moduli of `dist.all_reduce_add_ciphertext`: 60-bit odd moduli;
- its ciphertext: random limbs reduced modulo those moduli;
- `counts` of an uneven `dist.all_gather`: `counts[r] = r + 1` on every rank,
  and the gathered argument gets `rank + 1` rows on the axis;
- the source of a `dist.transfer`: the rank's local shard of its source
  layout (an empty tensor on ranks outside the source mesh);
- `send_counts` of `dist.variable_all_to_all`: `(rank + peer) % 3`, and the
  payload gets as many rows as that sums to;
- extra operands of a generic `dist.all_reduce` and dynamic broadcast roots,
  which must agree across ranks: the same values on every rank (extras in
  [1, 100), so a modulus is never zero; roots 0);
- everything else: seeded random integers in [0, 100) or floats in [0, 1),
  dynamic dimensions of size `dynamic_size`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import torch
from xdsl.dialects import func
from xdsl.ir import Attribute, BlockArgument

from distir.errors import DistirError
from distir.interpreters.dtypes import element_dtype, static_shape
from distir.ir.dialect import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AllReduceOp,
    BroadcastOp,
    TransferOp,
    VariableAllToAllOp,
)
from distir.ir.layouts import local_box

#: Odd 60-bit moduli: P·(q−1) < 2^63 holds up to P = 8, as in SEAL's 60-bit primes.
DEFAULT_MODULI = [(1 << 60) - 93, (1 << 60) - 173, (1 << 60) - 233, (1 << 60) - 299]


def _arg_index(value) -> int | None:
    return value.index if isinstance(value, BlockArgument) else None


def synthesize_inputs(
    function: func.FuncOp, rank: int, world_size: int, seed: int = 0, dynamic_size: int = 4
) -> list[torch.Tensor]:
    types: list[Attribute] = list(function.function_type.inputs.data)
    shapes: list[list[int | None]] = [list(static_shape(t)) for t in types]
    fixed: dict[int, torch.Tensor] = {}
    generator = torch.Generator().manual_seed(seed * 1000 + rank)

    def set_rows(index: int | None, axis: int, rows: int) -> None:
        if index is not None and shapes[index] and shapes[index][axis] is None:
            shapes[index][axis] = rows

    ciphertexts: list[tuple[int, int]] = []
    uniform: set[int] = set()
    for op in function.walk():
        if isinstance(op, AllReduceOp):
            uniform.update(i for i in map(_arg_index, op.extras) if i is not None)
        if isinstance(op, BroadcastOp) and op.root_value is not None:
            root = _arg_index(op.root_value)
            if root is not None:
                fixed[root] = torch.zeros((), dtype=torch.int64)
        if isinstance(op, AllReduceAddCiphertextOp):
            ct, mod = _arg_index(op.input), _arg_index(op.moduli)
            if mod is not None:
                limbs = shapes[mod][0] or 3
                fixed[mod] = torch.tensor(
                    [DEFAULT_MODULI[i % len(DEFAULT_MODULI)] - 64 * (i // 4) for i in range(limbs)]
                )
                if ct is not None:
                    ciphertexts.append((ct, mod))
        elif isinstance(op, AllGatherOp) and op.counts is not None:
            counts = _arg_index(op.counts)
            if counts is not None:
                fixed[counts] = torch.arange(1, world_size + 1, dtype=element_dtype(types[counts]))
            set_rows(_arg_index(op.input), op.axis.value.data, rank + 1)
        elif isinstance(op, TransferOp):
            arg = _arg_index(op.input)
            if arg is not None:
                src_mesh, src_layout, _, _, shape = op.transfer_spec()
                sizes = (
                    local_box(src_mesh, src_layout, shape, rank).sizes
                    if rank in src_mesh.ranks
                    else (0,) * len(shape)
                )
                shapes[arg] = list(sizes)
        elif isinstance(op, VariableAllToAllOp):
            counts = _arg_index(op.send_counts)
            sends = [(rank + peer) % 3 for peer in range(world_size)]
            if counts is not None:
                fixed[counts] = torch.tensor(sends, dtype=element_dtype(types[counts]))
            set_rows(_arg_index(op.input), op.axis.value.data, sum(sends))

    inputs: list[torch.Tensor] = []
    for i, t in enumerate(types):
        if i in fixed:
            inputs.append(fixed[i])
            continue
        shape = [dynamic_size if d is None else d for d in shapes[i]]
        dtype = element_dtype(t)
        if i in uniform:
            shared = torch.Generator().manual_seed(seed * 1000 + 999)
            values = torch.randint(1, 100, shape, generator=shared)
            inputs.append(values.to(dtype))
        elif dtype.is_floating_point:
            inputs.append(torch.rand(shape, generator=generator, dtype=torch.float64).to(dtype))
        elif dtype == torch.bool:
            inputs.append(torch.randint(0, 2, shape, generator=generator).bool())
        else:
            inputs.append(torch.randint(0, 100, shape, generator=generator, dtype=dtype))
    for ct, mod in ciphertexts:
        q = inputs[mod].view(-1, 1)
        raw = torch.randint(0, 1 << 62, tuple(inputs[ct].shape), generator=generator)
        inputs[ct] = torch.remainder(raw, q)
    return inputs


def load_inputs(path: str | Path, rank: int, world_size: int) -> list[torch.Tensor]:
    """Inputs from a file: a `.py` defining `make_inputs(rank, world_size)`, or
    a `.pt` holding one list of tensors (every rank) or a list of such lists
    (one per rank)."""
    path = Path(path)
    if path.suffix == ".py":
        spec = importlib.util.spec_from_file_location("distir_user_inputs", path)
        if spec is None or spec.loader is None:
            raise DistirError(f"cannot import inputs file {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not hasattr(module, "make_inputs"):
            raise DistirError(f"{path} must define make_inputs(rank, world_size)")
        return list(module.make_inputs(rank, world_size))
    data = torch.load(path, weights_only=True)
    if isinstance(data, Sequence) and data and all(isinstance(d, Sequence) for d in data):
        if len(data) != world_size:
            raise DistirError(f"{path} holds inputs for {len(data)} ranks, not {world_size}")
        return list(data[rank])
    if isinstance(data, Sequence):
        return list(data)
    raise DistirError(f"{path} must hold a list of tensors or one list per rank")
