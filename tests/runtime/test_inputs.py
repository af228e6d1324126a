"""Inputs synthesised from a program's operand roles, inputs files, and the
IR-type-to-dtype mapping they rest on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float32Type,
    IndexType,
    IntegerType,
    Signedness,
    TensorType,
)

from distir.core.dtypes import element_dtype, matches_type
from distir.errors import DistirError, ProgramInputError
from distir.ir.dialect import BroadcastOp
from distir.ir.facts import OperandRole
from distir.ir.parsing import make_context, parse_file, parse_module
from distir.passes import apply_pipeline
from distir.runtime.inputs import (
    check_inputs,
    load_inputs,
    synthesize_inputs,
)

ROOT = Path(__file__).resolve().parents[2]


def entry(module, name: str = "main") -> func.FuncOp:
    return next(
        op for op in module.walk() if isinstance(op, func.FuncOp) and op.sym_name.data == name
    )


def synthesize(source: str | Path, world_size: int, seed: int = 0) -> list[list[torch.Tensor]]:
    module = parse_file(source) if isinstance(source, Path) else parse_module(source)
    fn = entry(module)
    return [synthesize_inputs(fn, r, world_size, seed) for r in range(world_size)]


# Element types -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("width", "signedness", "dtype"),
    [
        (1, Signedness.SIGNLESS, torch.bool),
        (8, Signedness.SIGNLESS, torch.int8),
        (16, Signedness.SIGNLESS, torch.int16),
        (32, Signedness.SIGNLESS, torch.int32),
        (64, Signedness.SIGNLESS, torch.int64),
        (8, Signedness.SIGNED, torch.int8),
        (64, Signedness.SIGNED, torch.int64),
        (8, Signedness.UNSIGNED, torch.uint8),
        (16, Signedness.UNSIGNED, torch.uint16),
        (32, Signedness.UNSIGNED, torch.uint32),
        (64, Signedness.UNSIGNED, torch.uint64),
        (1, Signedness.UNSIGNED, torch.bool),
    ],
)
def test_integer_types_keep_their_signedness(width, signedness, dtype) -> None:
    t = TensorType(IntegerType(width, signedness), [2])
    assert element_dtype(t) == dtype
    assert matches_type(torch.zeros(2, dtype=dtype), t)


def test_ui8_is_not_int8_and_signless_i8_is_signed() -> None:
    ui8 = TensorType(IntegerType(8, Signedness.UNSIGNED), [2])
    i8 = TensorType(IntegerType(8), [2])
    assert not matches_type(torch.zeros(2, dtype=torch.int8), ui8)
    assert not matches_type(torch.zeros(2, dtype=torch.uint8), i8)
    assert torch.iinfo(element_dtype(i8)).min == -128


def test_other_scalar_types() -> None:
    assert element_dtype(IndexType()) == torch.int64
    assert element_dtype(TensorType(BFloat16Type(), [3])) == torch.bfloat16
    assert element_dtype(Float32Type()) == torch.float32
    with pytest.raises(TypeError, match="no torch dtype"):
        element_dtype(IntegerType(7))


def test_an_input_of_the_wrong_signedness_is_rejected_by_name() -> None:
    module = parse_module("""\
func.func @main(%x: tensor<2xui8>) -> tensor<2xui8> {
  %y = dist.all_reduce sum %x : tensor<2xui8>
  func.return %y : tensor<2xui8>
}
""")
    fn = entry(module)
    check_inputs([torch.tensor([1, 255], dtype=torch.uint8)], fn)
    with pytest.raises(ProgramInputError) as info:
        check_inputs([torch.tensor([1, 2], dtype=torch.int8)], fn)
    assert str(info.value) == (
        "@main input #0 must be tensor<2xui8> (torch.uint8), got tensor of shape [2] and "
        "dtype torch.int8"
    )
    (x,) = synthesize_inputs(fn, 0, 2)
    assert x.dtype == torch.uint8 and x.shape == (2,)


# Synthesis from operand roles ----------------------------------------------------------


def test_ciphertext_moduli_are_odd_60_bit_the_same_everywhere_and_limbs_are_reduced() -> None:
    per_rank = synthesize(ROOT / "examples/ciphertext_add.mlir", 3)
    moduli = per_rank[0][1]
    assert moduli.shape == (3,)
    for q in moduli.tolist():
        assert q % 2 == 1 and q.bit_length() == 60
    for ct, q in per_rank:
        assert torch.equal(q, moduli)
        assert ct.shape == (2, 3, 16)
        assert bool((ct >= 0).all()) and bool((ct < q.view(3, 1)).all())
    assert not torch.equal(per_rank[0][0], per_rank[1][0]), "limbs are per-rank data"


def test_lowering_keeps_what_the_inputs_must_be() -> None:
    # The moduli become an extra operand of a generic all-reduce; synthesis from
    # the program as written and from the lowered one (through dist.assert_reduced)
    # agree, so inputs do not depend on the pipeline.
    path = ROOT / "examples/ciphertext_add.mlir"
    written = synthesize(path, 3)
    for pipeline in ("lower-ciphertext-add", "defer-modular-reduction{max-group-size=8}"):
        module = parse_file(path)
        apply_pipeline(make_context(), module, pipeline)
        fn = entry(module)
        lowered = [synthesize_inputs(fn, r, 3) for r in range(3)]
        for a, b in zip(written, lowered):
            assert all(torch.equal(x, y) for x, y in zip(a, b)), pipeline


def test_gather_counts_and_rows() -> None:
    for rank, (even, rows, counts) in enumerate(synthesize(ROOT / "examples/all_gather.mlir", 4)):
        assert even.shape == (2, 4)
        assert counts.tolist() == [1, 2, 3, 4]
        assert rows.shape == (rank + 1, 4)


def test_send_counts_and_payload_rows() -> None:
    for rank, (tokens, sends) in enumerate(
        synthesize(ROOT / "examples/variable_all_to_all.mlir", 4)
    ):
        assert sends.tolist() == [(rank + peer) % 3 for peer in range(4)]
        assert tokens.shape == (sum(sends.tolist()), 16)


def test_transfer_sources_are_the_local_shards_of_the_source_layout() -> None:
    shapes = [tuple(x.shape) for (x,) in synthesize(ROOT / "examples/mesh_transfer.mlir", 6)]
    # @train [2, 2], rows sharded over axis 0 of a [4, 6] tensor; ranks 4, 5 hold nothing.
    assert shapes == [(2, 6), (2, 6), (2, 6), (2, 6), (0, 0), (0, 0)]


def test_combine_extras_are_equal_on_every_rank_and_never_zero() -> None:
    per_rank = synthesize(ROOT / "examples/all_reduce.mlir", 3, seed=5)
    extras = [m for _, m in per_rank]
    assert all(torch.equal(extras[0], m) for m in extras)
    assert int(extras[0].min()) >= 1 and int(extras[0].max()) < 100
    payloads = [x for x, _ in per_rank]
    assert not torch.equal(payloads[0], payloads[1])


DYNAMIC_ROOT = """\
func.func @main(%x: tensor<4xf32>, %root: index) -> tensor<4xf32> {
  %y = dist.broadcast %x root %root : tensor<4xf32>
  func.return %y : tensor<4xf32>
}
"""


def test_a_dynamic_root_argument_is_rank_zero() -> None:
    for _, root in synthesize(DYNAMIC_ROOT, 3):
        assert root.dtype == torch.int64 and root.shape == () and int(root) == 0


def test_synthesis_reads_the_roles_an_op_declares(monkeypatch) -> None:
    # Declare the broadcast's payload UNIFORM: synthesis follows the
    # declaration, with no knowledge of the op class.
    monkeypatch.setattr(
        BroadcastOp,
        "OPERAND_ROLES",
        {"input": OperandRole.UNIFORM, "root_value": OperandRole.ROOT},
    )
    xs = [x for x, _ in synthesize(DYNAMIC_ROOT, 3)]
    assert all(torch.equal(xs[0], x) for x in xs)
    assert float(xs[0].min()) >= 1.0


def test_synthesis_is_deterministic_in_the_seed() -> None:
    a = synthesize(ROOT / "examples/wave.mlir", 2, seed=1)
    b = synthesize(ROOT / "examples/wave.mlir", 2, seed=1)
    c = synthesize(ROOT / "examples/wave.mlir", 2, seed=2)
    assert all(torch.equal(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    assert not torch.equal(a[0][0], c[0][0])


# Inputs files ----------------------------------------------------------------------------


def test_a_python_inputs_file(tmp_path) -> None:
    path = tmp_path / "make.py"
    path.write_text(
        "import torch\n\ndef make_inputs(rank, world_size):\n"
        "    return [torch.full((2,), rank * 10 + world_size)]\n"
    )
    assert load_inputs(path, 1, 3)[0].tolist() == [13, 13]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("def make_inputs(rank, world_size):\n    raise ValueError('no data')\n",
         r"make\.py: make_inputs raised ValueError: no data \(at .*make\.py:2\)"),
        ("def make_inputs(rank, world_size)\n    return []\n",
         r"inputs file .*make\.py does not import: SyntaxError: .* \(at .*make\.py:1\)"),
        ("import no_such_module_anywhere\n",
         r"does not import: ModuleNotFoundError: No module named 'no_such_module_anywhere' "
         r"\(at .*make\.py:1\)"),
        ("x = 1\n", r"make\.py must define make_inputs\(rank, world_size\)"),
        ("def make_inputs(rank, world_size):\n    return 3\n",
         r"make_inputs must return a list of tensors, got int"),
        # a string is a sequence too: it was "takes 2 inputs, got 11"
        ("def make_inputs(rank, world_size):\n    return 'hello world'\n",
         r"make_inputs must return a list of tensors, got str"),
        ("def make_inputs(rank, world_size):\n    return b'ab'\n",
         r"make_inputs must return a list of tensors, got bytes"),
    ],
)
def test_a_broken_python_inputs_file_is_one_located_line(tmp_path, text, expected) -> None:
    path = tmp_path / "make.py"
    path.write_text(text)
    with pytest.raises(DistirError, match=expected) as info:
        load_inputs(path, 0, 2)
    assert "\n" not in str(info.value)
    assert "Traceback" not in str(info.value)


def test_pt_inputs_files(tmp_path) -> None:
    shared = tmp_path / "shared.pt"
    torch.save([torch.arange(3)], shared)
    assert load_inputs(shared, 1, 2)[0].tolist() == [0, 1, 2]
    per_rank = tmp_path / "per_rank.pt"
    torch.save([[torch.zeros(1)], [torch.ones(1)]], per_rank)
    assert load_inputs(per_rank, 1, 2)[0].tolist() == [1.0]
    with pytest.raises(DistirError, match="holds inputs for 2 ranks, not 3"):
        load_inputs(per_rank, 0, 3)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"garbage", r"garbage\.pt is not a file torch.save wrote"),
        (b"", r"garbage\.pt is not a file torch.save wrote"),
    ],
)
def test_a_garbage_pt_file_is_one_line(tmp_path, content, expected) -> None:
    path = tmp_path / "garbage.pt"
    path.write_bytes(content)
    with pytest.raises(DistirError, match=expected) as info:
        load_inputs(path, 0, 2)
    assert "\n" not in str(info.value)


def test_a_pt_file_of_something_else(tmp_path) -> None:
    path = tmp_path / "odd.pt"
    torch.save([torch.zeros(1), {1, 2}], path)
    with pytest.raises(DistirError, match=r"item #1 is a set"):
        load_inputs(path, 0, 2)
    torch.save({"x": torch.zeros(1)}, path)
    with pytest.raises(DistirError, match=r"not a dict"):
        load_inputs(path, 0, 2)


def test_missing_and_unknown_inputs_files(tmp_path) -> None:
    with pytest.raises(DistirError, match="nothing.py does not exist"):
        load_inputs(tmp_path / "nothing.py", 0, 1)
    with pytest.raises(DistirError, match="nothing.pt does not exist"):
        load_inputs(tmp_path / "nothing.pt", 0, 1)
    other = tmp_path / "inputs.json"
    other.write_text("[]")
    with pytest.raises(DistirError, match=r"must be a \.py defining make_inputs"):
        load_inputs(other, 0, 1)
