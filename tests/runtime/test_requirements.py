"""World sizes a program can run on, read from its IR before any rank starts
(`distir.runtime.requirements`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distir.ir.parsing import make_context, parse_file, parse_module
from distir.passes import apply_pipeline
from distir.runtime.requirements import (
    WorldSizeError,
    check_world_size,
    world_size_range,
    world_size_requirements,
)

ROOT = Path(__file__).resolve().parents[2]


def allowed(module, sizes=range(1, 11)) -> list[int]:
    ok = []
    for n in sizes:
        try:
            check_world_size(module, n)
        except WorldSizeError:
            continue
        ok.append(n)
    return ok


def test_a_program_without_pinned_sizes_runs_on_any_world() -> None:
    module = parse_file(ROOT / "examples/all_reduce.mlir")
    assert world_size_requirements(module) == []
    assert world_size_range(module) == (1, None)
    assert allowed(module) == list(range(1, 11))


def test_send_counts_pin_the_world_size_and_the_message_names_the_op() -> None:
    path = "examples/variable_all_to_all.mlir"
    module = parse_module((ROOT / path).read_text(), path)
    assert allowed(module) == [4]
    with pytest.raises(WorldSizeError) as info:
        check_world_size(module, 3)
    assert str(info.value) == (
        "this program needs 4 ranks, not 3: 'dist.variable_all_to_all' at "
        f"{path}:4:5 takes send counts tensor<4xi64> (one per rank)"
    )


def test_uneven_gather_counts_pin_the_world_size() -> None:
    module = parse_module("""\
func.func @main(%rows: tensor<?x4xf32>, %counts: tensor<3xi64>) -> tensor<?x4xf32> {
  %g = dist.all_gather %rows counts(%counts : tensor<3xi64>) axis 0 : tensor<?x4xf32> -> tensor<?x4xf32>
  func.return %g : tensor<?x4xf32>
}
""", "gather.mlir")
    assert allowed(module) == [3]
    with pytest.raises(WorldSizeError, match=r"gather counts tensor<3xi64> \(one per rank\)"):
        check_world_size(module, 2)


def test_dynamic_counts_pin_nothing() -> None:
    module = parse_module("""\
func.func @main(%x: tensor<?x16xf32>, %c: tensor<?xi64>) -> (tensor<?x16xf32>, tensor<?xi64>) {
  %y, %r = dist.variable_all_to_all %x, %c axis 0 : tensor<?x16xf32>, tensor<?xi64> -> tensor<?x16xf32>
  func.return %y, %r : tensor<?x16xf32>, tensor<?xi64>
}
""")
    assert allowed(module) == list(range(1, 11))


def test_an_even_gather_with_static_rows_pins_the_world_size() -> None:
    module = parse_module("""\
func.func @main(%x: tensor<2x4xf32>) -> tensor<6x4xf32> {
  %g = dist.all_gather %x axis 0 : tensor<2x4xf32> -> tensor<6x4xf32>
  func.return %g : tensor<6x4xf32>
}
""", "even.mlir")
    assert allowed(module) == [3]
    with pytest.raises(WorldSizeError, match="needs 3 ranks, not 4: 'dist.all_gather' at even.mlir:2"):
        check_world_size(module, 4)


def test_an_even_gather_whose_rows_do_not_divide_runs_nowhere() -> None:
    module = parse_module("""\
func.func @main(%x: tensor<2x4xf32>) -> tensor<7x4xf32> {
  %g = dist.all_gather %x axis 0 : tensor<2x4xf32> -> tensor<7x4xf32>
  func.return %g : tensor<7x4xf32>
}
""")
    assert allowed(module) == []
    low, high = world_size_range(module)
    assert high is not None and low > high
    with pytest.raises(WorldSizeError, match="cannot run on any number of ranks"):
        check_world_size(module, 2)


def test_a_mesh_names_the_ranks_a_small_world_lacks() -> None:
    module = parse_file(ROOT / "examples/mesh_transfer.mlir")
    # Ranks outside both meshes only pass empty shards: any world of >= 6 works.
    assert allowed(module) == [6, 7, 8, 9, 10]
    with pytest.raises(WorldSizeError) as info:
        check_world_size(module, 4)
    assert str(info.value) == "mesh @infer names ranks 4, 5 but the program runs on 4 ranks"
    with pytest.raises(WorldSizeError, match="mesh @train names ranks 2, 3 but"):
        check_world_size(module, 2)


def test_a_group_every_rank_uses_bounds_the_world_from_both_sides() -> None:
    path = ROOT / "examples/subgroups.mlir"
    module = parse_file(path)
    assert allowed(module) == [4]
    with pytest.raises(WorldSizeError, match="group @pairs names rank 3 but the program runs on 3"):
        check_world_size(module, 3)
    # Rank 4 of 6 would be in no pair, yet runs the ops on @pairs.
    with pytest.raises(WorldSizeError) as info:
        check_world_size(module, 6)
    assert "at most 4 ranks, not 6" in str(info.value)
    assert f"'dist.rank' at {path}:5:5 runs on every rank on group @pairs" in str(info.value)
    assert "no subgroup for rank 4" in str(info.value)


def test_a_group_used_only_under_control_flow_does_not_bound_the_world() -> None:
    module = parse_module("""\
dist.group @low [[0, 1]]
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = dist.rank : index
  %two = arith.constant 2 : index
  %in_low = arith.cmpi ult, %r, %two : index
  %y = scf.if %in_low -> (tensor<4xf32>) {
    %s = dist.all_reduce sum %x group @low : tensor<4xf32>
    scf.yield %s : tensor<4xf32>
  } else {
    scf.yield %x : tensor<4xf32>
  }
  func.return %y : tensor<4xf32>
}
""")
    assert allowed(module) == list(range(2, 11))


def test_a_pass_assumption_on_the_group_size_is_an_upper_bound() -> None:
    path = ROOT / "examples/ciphertext_add.mlir"
    module = parse_file(path)
    assert allowed(module) == list(range(1, 11))
    apply_pipeline(make_context(), module, "defer-modular-reduction{max-group-size=8}")
    assert allowed(module) == list(range(1, 9))
    with pytest.raises(WorldSizeError) as info:
        check_world_size(module, 9)
    assert "at most 8 ranks, not 9" in str(info.value)
    assert "assumed_max_group_size = 8" in str(info.value)


def test_only_the_entry_function_and_its_callees_count() -> None:
    module = parse_module("""\
func.func @main(%x: tensor<2xf32>) -> tensor<4xf32> {
  %y = func.call @helper(%x) : (tensor<2xf32>) -> tensor<4xf32>
  func.return %y : tensor<4xf32>
}
func.func @helper(%x: tensor<2xf32>) -> tensor<4xf32> {
  %g = dist.all_gather %x axis 0 : tensor<2xf32> -> tensor<4xf32>
  func.return %g : tensor<4xf32>
}
func.func @other(%x: tensor<1xf32>) -> tensor<3xf32> {
  %g = dist.all_gather %x axis 0 : tensor<1xf32> -> tensor<3xf32>
  func.return %g : tensor<3xf32>
}
""")
    assert world_size_range(module, "main") == (2, 2)
    assert world_size_range(module, "other") == (3, 3)


@pytest.mark.slow
def test_the_requirements_module_imports_no_torch() -> None:
    code = (
        "import sys, distir.runtime.requirements as r; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
