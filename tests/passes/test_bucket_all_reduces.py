"""`bucket-all-reduces` packs a wave of small native all-reduces of the same
kind, element type and group into one all-reduce of a flat buffer, and
splits the result back; the program computes the same values."""

from __future__ import annotations

import pytest
import torch
from pass_support import op_names, ops_named, run

import distir
from distir.ir.dialect import AllReduceOp

PASS = "bucket-all-reduces"


def program(body: str, args: str, results: str, decl: str = "") -> str:
    values = ", ".join(r.split(":")[0].strip() for r in results.split(";"))
    types = ", ".join(r.split(":")[1].strip() for r in results.split(";"))
    return (
        f"{decl}func.func @main({args}) -> ({types}) {{\n{body}"
        f"  func.return {values} : {types}\n}}\n"
    )


WAVE = program(
    "  %a = dist.all_reduce sum %x : tensor<64x32xf32>\n"
    "  %c = dist.all_reduce sum %z : tensor<8xi64>\n"
    "  %b = dist.all_reduce sum %y : tensor<32xf32>\n"
    "  %d = dist.all_reduce sum %w : tensor<4x4xf32>\n",
    "%x: tensor<64x32xf32>, %y: tensor<32xf32>, %z: tensor<8xi64>, %w: tensor<4x4xf32>",
    "%a: tensor<64x32xf32>; %b: tensor<32xf32>; %c: tensor<8xi64>; %d: tensor<4x4xf32>",
)


def all_reduces(module) -> list[AllReduceOp]:
    return ops_named(module, "dist.all_reduce")  # type: ignore[return-value]


def same_results(text: str, pipeline: str, inputs_per_rank) -> None:
    got = distir.simulate(distir.compile(text, pipeline), inputs_per_rank)
    want = distir.simulate(distir.compile(text), inputs_per_rank)
    for g, w in zip(got, want):
        g, w = (g, w) if isinstance(g, tuple) else ((g,), (w,))
        for a, b in zip(g, w):
            assert a.shape == b.shape and a.dtype == b.dtype
            # Packing and unpacking is a pure repacking: bit for bit, NaN included.
            width = {torch.float32: torch.int32, torch.float64: torch.int64}.get(a.dtype)
            if width is not None:
                a, b = a.contiguous().view(width), b.contiguous().view(width)
            assert torch.equal(a, b), (a, b)


def test_a_wave_of_one_dtype_becomes_one_packed_all_reduce():
    text = str(run(WAVE, PASS))
    expected = [
        "%c = dist.all_reduce sum %z : tensor<8xi64>",
        "%x_flat = tensor.reshape %x(%x_shape) : (tensor<64x32xf32>, tensor<1xi64>) "
        "-> tensor<2048xf32>",
        "%packed = tensor.concat dim(0) %x_flat, %y, %w_flat : (tensor<2048xf32>, "
        "tensor<32xf32>, tensor<16xf32>) -> tensor<2096xf32>",
        "%bucket = dist.all_reduce sum %packed : tensor<2096xf32>",
        "%a_flat = tensor.extract_slice %bucket[0] [2048] [1] : tensor<2096xf32> to "
        "tensor<2048xf32>",
        "%b = tensor.extract_slice %bucket[2048] [32] [1] : tensor<2096xf32> to tensor<32xf32>",
        "%d_flat = tensor.extract_slice %bucket[2080] [16] [1] : tensor<2096xf32> to "
        "tensor<16xf32>",
    ]
    lines = [line.strip() for line in text.splitlines()]
    positions = [lines.index(line) for line in expected]
    assert positions == sorted(positions)
    assert len(all_reduces(run(WAVE, PASS))) == 2


def test_the_bucketed_program_computes_the_same_values():
    gen = torch.Generator().manual_seed(0)
    inputs = [
        [torch.randn(64, 32, generator=gen), torch.randn(32, generator=gen),
         torch.randint(0, 99, (8,), generator=gen), torch.randn(4, 4, generator=gen)]
        for _ in range(3)
    ]  # fmt: skip
    # The float specials travel through the packed buffer unchanged.
    inputs[1][1][:4] = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf")])
    inputs[2][0][0, :2] = torch.tensor([-0.0, float("nan")])
    same_results(WAVE, PASS, inputs)


@pytest.mark.parametrize(
    "between",
    [
        "  %u = arith.addf %a, %a : tensor<32xf32>\n",  # uses a member's result
        "  %u = scf.if %flag -> (tensor<32xf32>) {\n"  # a collective in control flow
        "    %v = dist.broadcast %y root 0 : tensor<32xf32>\n"
        "    scf.yield %v : tensor<32xf32>\n"
        "  } else {\n    scf.yield %y : tensor<32xf32>\n  }\n",
    ],
)
def test_a_wave_closes_before_a_use_of_its_results_or_control_flow_with_collectives(between):
    text = program(
        "  %a = dist.all_reduce sum %x : tensor<32xf32>\n"
        + between
        + "  %b = dist.all_reduce sum %y : tensor<32xf32>\n",
        "%x: tensor<32xf32>, %y: tensor<32xf32>, %flag: i1",
        "%a: tensor<32xf32>; %b: tensor<32xf32>",
    )
    assert [op.input.type for op in all_reduces(run(text, PASS))] == [
        op.input.type for op in all_reduces(run(text, ""))
    ]


def test_a_member_fed_by_another_member_starts_a_new_wave():
    text = program(
        "  %a = dist.all_reduce sum %x : tensor<32xf32>\n"
        "  %b = dist.all_reduce sum %a : tensor<32xf32>\n"
        "  %c = dist.all_reduce sum %y : tensor<32xf32>\n",
        "%x: tensor<32xf32>, %y: tensor<32xf32>",
        "%b: tensor<32xf32>; %c: tensor<32xf32>",
    )
    module = run(text, PASS)
    assert [str(op.input.type) for op in all_reduces(module)] == [
        "tensor<32xf32>",
        "tensor<64xf32>",
    ]
    same_results(text, PASS, [[torch.randn(32), torch.randn(32)] for _ in range(2)])


def test_other_collectives_between_members_do_not_close_the_wave():
    text = program(
        "  %a = dist.all_reduce sum %x : tensor<32xf32>\n"
        "  %g = dist.all_gather %y axis 0 : tensor<32xf32> -> tensor<64xf32>\n"
        "  %b = dist.all_reduce sum %y : tensor<32xf32>\n",
        "%x: tensor<32xf32>, %y: tensor<32xf32>",
        "%a: tensor<32xf32>; %b: tensor<32xf32>; %g: tensor<64xf32>",
    )
    assert len(all_reduces(run(text, PASS))) == 1
    same_results(text, PASS, [[torch.randn(32), torch.randn(32)] for _ in range(2)])


def test_kinds_element_types_and_groups_are_never_mixed():
    text = program(
        "  %a = dist.all_reduce sum %x : tensor<8xf32>\n"
        "  %b = dist.all_reduce max %y : tensor<8xf32>\n"
        "  %c = dist.all_reduce sum %z : tensor<8xf64>\n"
        "  %d = dist.all_reduce sum %x group @pair : tensor<8xf32>\n",
        "%x: tensor<8xf32>, %y: tensor<8xf32>, %z: tensor<8xf64>",
        "%a: tensor<8xf32>; %b: tensor<8xf32>; %c: tensor<8xf64>; %d: tensor<8xf32>",
        decl="dist.group @pair [[0, 1]]\n",
    )
    assert "tensor.concat" not in op_names(run(text, PASS))


def test_large_dynamic_scalar_and_algorithm_carrying_ops_stay_alone():
    text = program(
        "  %a = dist.all_reduce sum %x : tensor<1048576xf32>\n"
        "  %b = dist.all_reduce sum %x : tensor<1048576xf32>\n"
        "  %c = dist.all_reduce sum %d : tensor<?xf32>\n"
        "  %e = dist.all_reduce sum %d : tensor<?xf32>\n"
        "  %f = dist.all_reduce sum %s : tensor<f32>\n"
        "  %g = dist.all_reduce sum %s : tensor<f32>\n",
        "%x: tensor<1048576xf32>, %d: tensor<?xf32>, %s: tensor<f32>",
        "%a: tensor<1048576xf32>; %b: tensor<1048576xf32>; %c: tensor<?xf32>; "
        "%e: tensor<?xf32>; %f: tensor<f32>; %g: tensor<f32>",
    )
    assert "tensor.concat" not in op_names(run(text, PASS))


def test_the_bucket_size_caps_a_wave():
    body = "".join(f"  %r{i} = dist.all_reduce sum %x : tensor<256xf32>\n" for i in range(5))
    text = program(
        body, "%x: tensor<256xf32>", "; ".join(f"%r{i}: tensor<256xf32>" for i in range(5))
    )
    module = run(text, f"{PASS}{{bucket-bytes=2048}}")
    assert [str(op.input.type) for op in all_reduces(module)] == [
        "tensor<512xf32>",
        "tensor<512xf32>",
        "tensor<256xf32>",
    ]
    module = run(text, f"{PASS}{{max-op-bytes=512}}")
    assert len(all_reduces(module)) == 5
    module = run(text, f"{PASS}{{min-ops=6}}")
    assert len(all_reduces(module)) == 5


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="min-ops"):
        run(WAVE, f"{PASS}{{min-ops=1}}")


def test_new_ops_carry_the_locations_of_the_ops_they_replace():
    module = run(WAVE, PASS)
    (bucket,) = [op for op in all_reduces(module) if op.result.name_hint == "bucket"]
    (first,) = [op for op in all_reduces(run(WAVE, "")) if op.result.name_hint == "a"]
    assert bucket.location == first.location


@pytest.mark.parametrize(
    "shape", ["256x64xf32", "1024xf32"], ids=["packing-needs-reshapes", "packing-is-one-concat"]
)
def test_all_reduces_inside_a_wave_are_left_alone(shape):
    """A wave holds only collectives (no reshape, no concat) and already
    submits its members together: the pass leaves it as it is, and an
    all-reduce after the wave does not join one inside it."""
    t = f"tensor<{shape}>"
    text = program(
        "  %a, %b = dist.wave {\n"
        f"    %0 = dist.all_reduce sum %x : {t}\n"
        f"    %1 = dist.all_reduce sum %y : {t}\n"
        f"    dist.yield %0, %1 : {t}, {t}\n"
        f"  }} : {t}, {t}\n"
        f"  %c = dist.all_reduce sum %x : {t}\n",
        f"%x: {t}, %y: {t}",
        f"%a: {t}; %b: {t}; %c: {t}",
    )
    module = run(text, PASS)  # verifies after the pass
    assert str(module) == str(run(text, ""))


def test_the_wave_example_stays_valid():
    from pathlib import Path

    path = Path(__file__).parents[2] / "examples" / "wave.mlir"
    module = run(path.read_text(), PASS)
    assert op_names(module).count("dist.all_reduce") == 2
