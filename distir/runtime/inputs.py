"""Inputs for running a program without writing any: synthesised from the IR.

Random values would break the contracts of some ops (ciphertext limbs must be
reduced, counts must add up), so arguments are synthesised from what they
are to the ops that use them: the operand roles each op declares
(`distir.ir.facts`). An entry argument used as

- `MODULI`: 60-bit odd moduli, the same on every rank;
- `LIMBS`: random limbs reduced modulo the moduli of the same op;
- `GATHER_COUNTS` (uneven `dist.all_gather`): `counts[r] = r + 1` on every
  rank, and the op's payload argument gets `rank + 1` rows on its axis;
- `SHARD` (the source of a `dist.transfer`): the rank's local shard of the
  source layout (on ranks outside the source mesh an empty tensor, size 0
  along the dynamic dims);
- `SCATTER_COUNTS` (uneven `dist.scatter`): `counts[r] = r + 1` on every
  rank, and the op's payload argument gets their sum of rows on its axis;
- `SEND_COUNTS` (`dist.variable_all_to_all`): `(rank + peer) % 3`, and the
  op's payload argument gets as many rows as that sums to;
- `UNIFORM` (extra operands of a generic `dist.all_reduce`): the same values
  on every rank, in [1, 100) so that a modulus is never zero;
- `ROOT` (a dynamic broadcast root): 0;
- anything else: seeded random integers in [0, 100) or floats in [0, 1),
  dynamic dimensions of size `dynamic_size`.

Synthesise from the program as written, before passes: a lowering may turn
the moduli into an ordinary extra operand or drop the roles altogether, and
the entry signature is the same before and after.

`load_inputs` reads inputs from a file instead, with errors that say which
file and what is wrong with it, never a traceback.
"""

from __future__ import annotations

import importlib.util
import pickle
import re
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import torch
from xdsl.dialects import func
from xdsl.ir import Attribute, BlockArgument, Operation, SSAValue

from distir.core.dtypes import describe_tensor, element_dtype, matches_type, static_shape
from distir.errors import DistirError, ProgramInputError, count, one_line
from distir.ir.facts import OperandRole, operand_roles

#: Odd 60-bit moduli: P·(q−1) < 2^63 holds up to P = 8, as in SEAL's 60-bit primes.
DEFAULT_MODULI = [(1 << 60) - 93, (1 << 60) - 173, (1 << 60) - 233, (1 << 60) - 299]


def _arg_index(value: SSAValue | None) -> int | None:
    return value.index if isinstance(value, BlockArgument) else None


def _payload_args(op: Operation) -> list[int]:
    return [
        i
        for value, role in operand_roles(op)
        if role == OperandRole.PAYLOAD and (i := _arg_index(value)) is not None
    ]


def _axis(op: Operation) -> int:
    axis = op.properties.get("axis")
    return axis.value.data if axis is not None else 0  # type: ignore[attr-defined]


#: the largest seed: rank r's generator is seeded with seed * 1000 + r
#: (999 for values every rank shares), which torch takes below 2^64
MAX_SEED = (2**64 - 1000) // 1000


def synthesize_inputs(
    function: func.FuncOp, rank: int, world_size: int, seed: int = 0, dynamic_size: int = 4
) -> list[torch.Tensor]:
    """Inputs of `function` for `rank` of `world_size` ranks that keep every
    op's contract (see the module docstring); deterministic in `seed`."""
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be in [0, {MAX_SEED}], got {seed}")
    types: list[Attribute] = list(function.function_type.inputs.data)
    shapes: list[list[int | None]] = [list(static_shape(t)) for t in types]
    fixed: dict[int, torch.Tensor] = {}
    generator = torch.Generator().manual_seed(seed * 1000 + rank)

    def set_rows(index: int, axis: int, rows: int) -> None:
        if shapes[index] and shapes[index][axis] is None:
            shapes[index][axis] = rows

    ciphertexts: list[tuple[int, int]] = []
    uniform: set[int] = set()
    for op in function.walk():
        roles = [(role, _arg_index(value)) for value, role in operand_roles(op)]
        moduli_arg = next((i for role, i in roles if role == OperandRole.MODULI), None)
        for role, arg in roles:
            if role == OperandRole.UNIFORM and arg is not None:
                uniform.add(arg)
            elif role == OperandRole.ROOT and arg is not None:
                fixed[arg] = torch.zeros((), dtype=torch.int64)
            elif role == OperandRole.MODULI and arg is not None:
                limbs = shapes[arg][0] or 3
                fixed[arg] = torch.tensor(
                    [DEFAULT_MODULI[i % len(DEFAULT_MODULI)] - 64 * (i // 4) for i in range(limbs)]
                )
            elif role == OperandRole.LIMBS and arg is not None and moduli_arg is not None:
                ciphertexts.append((arg, moduli_arg))
            elif role == OperandRole.GATHER_COUNTS:
                if arg is not None:
                    fixed[arg] = torch.arange(1, world_size + 1).to(element_dtype(types[arg]))
                for payload in _payload_args(op):
                    set_rows(payload, _axis(op), rank + 1)
            elif role == OperandRole.SCATTER_COUNTS:
                if arg is not None:
                    fixed[arg] = torch.arange(1, world_size + 1).to(element_dtype(types[arg]))
                for payload in _payload_args(op):
                    set_rows(payload, _axis(op), world_size * (world_size + 1) // 2)
            elif role == OperandRole.SEND_COUNTS:
                sends = [(rank + peer) % 3 for peer in range(world_size)]
                if arg is not None:
                    fixed[arg] = torch.tensor(sends).to(element_dtype(types[arg]))
                for payload in _payload_args(op):
                    set_rows(payload, _axis(op), sum(sends))
            elif role == OperandRole.SHARD and arg is not None:
                sizes = op.source_shard_sizes(rank)  # type: ignore[attr-defined]
                # Outside the source mesh: empty, size 0 along the dynamic dims.
                shapes[arg] = (
                    list(sizes)
                    if sizes is not None
                    else [0 if d is None else d for d in shapes[arg]]
                )

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
            inputs.append(torch.randint(0, 100, shape, generator=generator).to(dtype))
    for ct, mod in ciphertexts:
        q = inputs[mod].view(-1, 1)
        raw = torch.randint(0, 1 << 62, tuple(inputs[ct].shape), generator=generator)
        inputs[ct] = torch.remainder(raw, q)
    return inputs


def check_inputs(inputs: Sequence[object], function: func.FuncOp) -> None:
    """Raises `ProgramInputError` unless `inputs` are values of `function`'s
    argument types, in the words `Program.run` uses."""
    types = list(function.function_type.inputs.data)
    name = f"@{function.sym_name.data}"
    if len(inputs) != len(types):
        raise ProgramInputError(f"{name} takes {len(types)} inputs, got {len(inputs)}")
    for i, (value, t) in enumerate(zip(inputs, types)):
        if not isinstance(value, torch.Tensor) or not matches_type(value, t):
            raise ProgramInputError(
                f"{name} input #{i} must be {t} ({element_dtype(t)}), got "
                f"{describe_tensor(value)}"
            )


_factories: dict[Path, Callable[[int, int], object]] = {}


def load_input_factory(path: str | Path) -> Callable[[int, int], object]:
    """`make_inputs` of a Python inputs file, imported once per process.
    Raises `DistirError` (the file, and what went wrong where) when the file
    is missing, does not import or defines no callable `make_inputs`."""
    path = Path(path)
    if path in _factories:
        return _factories[path]
    if not path.is_file():
        raise DistirError(f"inputs file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"distir_user_inputs_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise DistirError(f"cannot import inputs file {path}")
    module: ModuleType = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise DistirError(f"inputs file {path} does not import: {one_line(e, path)}") from None
    factory = getattr(module, "make_inputs", None)
    if not callable(factory):
        raise DistirError(f"{path} must define make_inputs(rank, world_size)")
    _factories[path] = factory
    return factory


def read_input_file(path: str | Path) -> object:
    """The object a `.pt` inputs file holds (tensors, lists and dicts only:
    it is loaded with `weights_only=True`, so it runs no code)."""
    path = Path(path)
    if not path.is_file():
        raise DistirError(f"inputs file {path} does not exist")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError) as e:
        text = str(e)
        found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\n\n|$)", text, re.S)
        detail = found.group(1).strip() if found else (text.strip().splitlines() or [""])[0]
        if not zipfile.is_zipfile(path):
            what = "is not a file torch.save wrote"
        else:
            what = "holds something other than tensors and lists of tensors"
        raise DistirError(
            f"inputs file {path} {what}" + (f" ({detail})" if detail else "")
        ) from None


def inputs_from_data(data: object, path: str | Path, rank: int, world_size: int) -> list:
    """This rank's inputs from what a `.pt` file holds: one list of tensors
    (every rank) or a list of such lists (one per rank)."""
    expected = f"{path} must hold a list of tensors or one list of tensors per rank"
    if not isinstance(data, list | tuple):
        raise DistirError(f"{expected}, not a {type(data).__name__}")
    if data and all(isinstance(d, list | tuple) for d in data):
        if len(data) != world_size:
            raise DistirError(f"{path} holds inputs for {count(len(data), 'rank')}, not {world_size}")
        data, where = data[rank], f" (the list of rank {rank})"
    else:
        where = ""
    for i, item in enumerate(data):
        if not isinstance(item, torch.Tensor):
            raise DistirError(f"{expected}: item #{i}{where} is a {type(item).__name__}")
    return list(data)


def _input_file(path: str | Path) -> Path:
    """`path`, which must be a `.py` or a `.pt` inputs file."""
    path = Path(path)
    if path.suffix not in (".py", ".pt"):
        if not path.exists():
            raise DistirError(f"inputs file {path} does not exist")
        raise DistirError(
            f"inputs file {path} must be a .py defining make_inputs(rank, world_size) or a .pt"
        )
    return path


def check_inputs_file(path: str | Path, function: func.FuncOp, world_size: int) -> None:
    """What can be known about an inputs file without running a rank: that
    it exists and imports (`.py`), or loads and fits `function` on every
    rank (`.pt`)."""
    path = _input_file(path)
    if path.suffix == ".py":
        load_input_factory(path)
        return
    data = read_input_file(path)
    for rank in range(world_size):
        try:
            check_inputs(inputs_from_data(data, path, rank, world_size), function)
        except ProgramInputError as e:
            raise DistirError(f"{path}, inputs of rank {rank}: {e}") from None


def load_inputs(path: str | Path, rank: int, world_size: int) -> list[torch.Tensor]:
    """Inputs from a file: a `.py` defining `make_inputs(rank, world_size)`, or
    a `.pt` holding one list of tensors (every rank) or a list of such lists
    (one per rank). Every failure is a `DistirError` naming the file."""
    path = _input_file(path)
    if path.suffix == ".py":
        factory = load_input_factory(path)
        try:
            made = factory(rank, world_size)
        except Exception as e:
            raise DistirError(f"{path}: make_inputs raised {one_line(e, path)}") from None
        if isinstance(made, torch.Tensor | str | bytes) or not isinstance(made, Sequence):
            raise DistirError(
                f"{path}: make_inputs must return a list of tensors, got {type(made).__name__}"
            )
        return list(made)
    return inputs_from_data(read_input_file(path), path, rank, world_size)
