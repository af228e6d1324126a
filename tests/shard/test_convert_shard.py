"""MLIR `shard` programs converted to dist (`convert-shard-to-dist`) compute
what the shard dialect says, checked against an oracle written here from the
dialect's definitions (grid coordinates, groups and in-group indices in
numpy), sharing no code with the conversion.

Every communication op and every reduction kind upstream runs is drawn over
grids of 1 to 3 axes and ordered subsets of their axes (the order in which
`grid_axes` lists axes sets the in-group index); the reference simulator runs
the drawn programs, and real gloo ranks run a listed sample.
"""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from math import prod
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import distir
from distir.errors import CollectiveMismatchError, CompileError
from distir.ir.parsing import parse_module

PIPELINE = "convert-shard-to-dist"


# -- the oracle: the shard dialect's definitions, in numpy ---------------------


def coordinates(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """Row-major: `process_linear_index` of (1, 2, 3) on 10x20x30 is 3 + 30*2 + 20*30*1."""
    return tuple(int(c) for c in np.unravel_index(rank, shape))


def group_of(shape: tuple[int, ...], axes: tuple[int, ...], rank: int) -> list[int]:
    """The members of `rank`'s group, in in-group order: their coordinates on
    the unlisted axes equal `rank`'s; ordered row-major over `axes` as listed."""
    mine = coordinates(shape, rank)
    members = [
        r for r in range(prod(shape))
        if all(coordinates(shape, r)[a] == mine[a] for a in range(len(shape)) if a not in axes)
    ]  # fmt: skip
    return sorted(members, key=lambda r: [coordinates(shape, r)[a] for a in axes])


def in_group_index(shape, axes, rank) -> int:
    return group_of(shape, axes, rank).index(rank)


def member_at(shape, axes, rank, multi_index) -> int:
    """The member of `rank`'s group at in-group multi-index `multi_index`."""
    linear = 0
    for a, c in zip(axes, multi_index):
        linear = linear * shape[a] + c
    return group_of(shape, axes, rank)[linear]


REDUCE = {
    "sum": lambda xs: np.sum(xs, axis=0),
    "max": lambda xs: np.max(xs, axis=0),
    "min": lambda xs: np.min(xs, axis=0),
    "product": lambda xs: np.prod(xs, axis=0),
    "average": lambda xs: np.sum(xs, axis=0) / len(xs),
    "bitwise_and": lambda xs: np.bitwise_and.reduce(xs, axis=0),
    "bitwise_or": lambda xs: np.bitwise_or.reduce(xs, axis=0),
    "bitwise_xor": lambda xs: np.bitwise_xor.reduce(xs, axis=0),
}
FLOAT_KINDS = ("sum", "max", "min", "product", "average")
INT_KINDS = ("sum", "max", "min", "product", "bitwise_and", "bitwise_or", "bitwise_xor")


@dataclass(frozen=True)
class Case:
    """One shard op on one grid: the program and what each process must get
    (None where the dialect leaves the result undefined)."""

    name: str
    text: str
    inputs: list[np.ndarray]
    expected: list[np.ndarray | None]


def ttype(shape, element: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{element}>"


def program(grid: tuple[int, ...], in_t: str, out_t: str, body: str) -> str:
    return (
        f"shard.grid @g(shape = {'x'.join(map(str, grid))})\n"
        f"func.func @main(%x: {in_t}) -> {out_t} {{\n"
        f"  %y = {body}\n"
        f"  func.return %y : {out_t}\n"
        "}\n"
    )


def axes_text(axes) -> str:
    return f"grid_axes = [{', '.join(map(str, axes))}]"


def make_case(op: str, grid, axes, params: dict, inputs: list[np.ndarray]) -> Case:
    """The program for `op` with `params`, and the oracle's answer per process."""
    P = prod(grid)
    element = "f32" if inputs[0].dtype == np.float32 else "i32"
    x_t = ttype(inputs[0].shape, element)
    n = prod(grid[a] for a in axes)
    expected: list[np.ndarray | None] = []
    at = f"on @g {axes_text(axes)}"

    def members(r):
        return [inputs[m] for m in group_of(grid, axes, r)]

    def piece(x, axis, k, parts):
        return np.split(x, parts, axis=axis)[k]

    if op in ("all_reduce", "reduce"):
        kind = params["kind"]
        out = np.float64 if kind == "average" or element == "f32" and params.get("widen") else None
        out_element = "f64" if out is not None and element == "f32" else element
        out_t = ttype(inputs[0].shape, out_element)
        root = params.get("root")
        root_text = f" root = [{', '.join(map(str, root))}]" if op == "reduce" else ""
        sig = f"({x_t}) -> {out_t}" if op == "reduce" else f"{x_t} -> {out_t}"
        body = f"shard.{op} %x {at} reduction = {kind}{root_text} : {sig}"
        for r in range(P):
            xs = np.stack([m.astype(np.float64) if out is not None else m for m in members(r)])
            value = REDUCE[kind](xs).astype(np.float64 if out_element == "f64" else inputs[0].dtype)
            is_root = op == "all_reduce" or member_at(grid, axes, r, root) == r
            expected.append(value if is_root else None)
    elif op in ("all_gather", "gather"):
        axis = params["axis"]
        shape = list(inputs[0].shape)
        shape[axis] *= n
        out_t = ttype(shape, element)
        root = params.get("root")
        if op == "gather":
            body = (f"shard.gather %x {at} gather_axis = {axis} root = "
                    f"[{', '.join(map(str, root))}] : ({x_t}) -> {out_t}")
        else:
            body = f"shard.all_gather %x {at} gather_axis = {axis} : {x_t} -> {out_t}"
        for r in range(P):
            value = np.concatenate(members(r), axis=axis)
            is_root = op == "all_gather" or member_at(grid, axes, r, root) == r
            expected.append(value if is_root else None)
    elif op == "all_slice":
        axis = params["axis"]
        shape = list(inputs[0].shape)
        shape[axis] //= n
        out_t = ttype(shape, element)
        body = f"shard.all_slice %x {at} slice_axis = {axis} : {x_t} -> {out_t}"
        expected = [piece(inputs[r], axis, in_group_index(grid, axes, r), n) for r in range(P)]
    elif op == "scatter":
        axis, root = params["axis"], params["root"]
        shape = list(inputs[0].shape)
        shape[axis] //= n
        out_t = ttype(shape, element)
        body = (f"shard.scatter %x {at} scatter_axis = {axis} root = "
                f"[{', '.join(map(str, root))}] : ({x_t}) -> {out_t}")
        expected = [
            piece(inputs[member_at(grid, axes, r, root)], axis, in_group_index(grid, axes, r), n)
            for r in range(P)
        ]
    elif op == "broadcast":
        root = params["root"]
        body = (f"shard.broadcast %x {at} root = [{', '.join(map(str, root))}] "
                f": ({x_t}) -> {x_t}")
        out_t = x_t
        expected = [inputs[member_at(grid, axes, r, root)] for r in range(P)]
    elif op == "reduce_scatter":
        kind, axis = params["kind"], params["axis"]
        shape = list(inputs[0].shape)
        shape[axis] //= n
        out_element = "f64" if kind == "average" else element
        out_t = ttype(shape, out_element)
        body = (f"shard.reduce_scatter %x {at} reduction = {kind} scatter_axis = {axis} "
                f": {x_t} -> {out_t}")
        for r in range(P):
            xs = np.stack([m.astype(np.float64) if kind == "average" else m for m in members(r)])
            total = REDUCE[kind](xs)
            expected.append(piece(total, axis, in_group_index(grid, axes, r), n))
    elif op == "all_to_all":
        split, concat = params["split"], params["concat"]
        shape = list(inputs[0].shape)
        shape[split] //= n
        shape[concat] *= n
        out_t = ttype(shape, element)
        body = (f"shard.all_to_all %x {at} split_axis = {split} concat_axis = {concat} "
                f": {x_t} -> {out_t}")
        for r in range(P):
            me = in_group_index(grid, axes, r)
            expected.append(np.concatenate([piece(m, split, me, n) for m in members(r)], axis=concat))
    elif op == "shift":
        shift_axis, offset, rotate = params["shift_axis"], params["offset"], params["rotate"]
        out_t = x_t
        body = (f"shard.shift %x {at} shift_axis = {shift_axis} offset = {offset}"
                f"{' rotate' if rotate else ''} : {x_t} -> {x_t}")
        extent = grid[shift_axis]
        for r in range(P):
            c = list(coordinates(grid, r))
            source = c[shift_axis] - offset
            if rotate:
                source %= extent
            if 0 <= source < extent:
                c[shift_axis] = source
                expected.append(inputs[int(np.ravel_multi_index(c, grid))])
            else:
                expected.append(None)  # undefined upstream
    else:
        raise AssertionError(op)
    text = program(grid, x_t, out_t, body)
    return Case(f"{op}{params} on {grid} axes {list(axes)}", text, inputs, expected)


# -- strategies ----------------------------------------------------------------

GRIDS = [(1,), (2,), (3,), (4,), (1, 2), (2, 1), (2, 2), (1, 3), (2, 1, 2), (1, 2, 2), (2, 2, 2)]


@st.composite
def grids_and_axes(draw, max_size: int = 8):
    grid = draw(st.sampled_from([g for g in GRIDS if prod(g) <= max_size]))
    chosen = draw(st.lists(st.sampled_from(range(len(grid))), unique=True, max_size=len(grid)))
    return grid, tuple(chosen)


@st.composite
def cases(draw, max_size: int = 8):
    grid, axes = draw(grids_and_axes(max_size))
    n = prod(grid[a] for a in axes)
    op = draw(st.sampled_from(["all_reduce", "reduce", "all_gather", "gather", "all_slice",
                               "scatter", "broadcast", "reduce_scatter", "all_to_all", "shift"]))
    integer = draw(st.booleans())
    kinds = INT_KINDS if integer else FLOAT_KINDS
    rows, cols = draw(st.integers(1, 2)) * n, draw(st.integers(1, 2)) * n
    P = prod(grid)
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    if integer:
        inputs = [rng.integers(-9, 10, (rows, cols)).astype(np.int32) for _ in range(P)]
    else:  # small integers in f32: every sum and product is exact in any order
        inputs = [rng.integers(-4, 5, (rows, cols)).astype(np.float32) for _ in range(P)]
    root = tuple(draw(st.integers(0, grid[a] - 1)) for a in axes)
    params: dict = {}
    if op in ("all_reduce", "reduce", "reduce_scatter"):
        params["kind"] = draw(st.sampled_from(kinds))
        if op == "reduce_scatter" and params["kind"] == "average" and integer:
            params["kind"] = "sum"
    if op in ("reduce", "gather", "scatter", "broadcast"):
        params["root"] = root
    if op in ("all_gather", "gather", "all_slice", "scatter", "reduce_scatter"):
        params["axis"] = draw(st.integers(0, 1))
    if op == "all_to_all":
        params["split"], params["concat"] = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    if op == "shift":
        if not axes:
            op = "all_reduce"
            params = {"kind": "sum"}
        else:
            params["shift_axis"] = draw(st.sampled_from(axes))
            extent = grid[params["shift_axis"]]
            params["offset"] = draw(st.integers(-extent, extent))
            params["rotate"] = draw(st.booleans())
    if op == "all_reduce" and integer and params["kind"] == "average":
        params["kind"] = "sum"
    return make_case(op, grid, axes, params, inputs)


def check(case: Case, results: list) -> None:
    for rank, (want, got) in enumerate(zip(case.expected, results)):
        got = got[0] if isinstance(got, tuple | list) else got
        if want is None:
            continue
        assert tuple(got.shape) == want.shape, (case.name, rank)
        np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{case.name}, process {rank}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_converted_ops_match_the_grid_semantics(case: Case) -> None:
    results = distir.simulate(case.text, [[torch.from_numpy(x)] for x in case.inputs],
                              pipeline=PIPELINE)
    check(case, results)


# -- every axis order of a 3-axis grid, listed (the in-group order) ------------


@pytest.mark.parametrize("axes", list(itertools.permutations(range(3), 2)) + list(itertools.permutations(range(3))))
@pytest.mark.parametrize("op", ["all_gather", "all_slice", "all_to_all", "reduce_scatter", "scatter"])
def test_every_axis_order_sets_the_in_group_index(op: str, axes) -> None:
    grid = (2, 1, 2) if len(axes) == 2 else (2, 2, 2)
    n = prod(grid[a] for a in axes)
    rng = np.random.default_rng(len(axes))
    inputs = [rng.integers(-9, 10, (n, 2 * n)).astype(np.float32) for _ in range(prod(grid))]
    params = {"axis": 0, "kind": "sum", "split": 0, "concat": 1,
              "root": tuple(grid[a] - 1 for a in axes)}
    case = make_case(op, grid, axes, params, inputs)
    check(case, distir.simulate(case.text, [[torch.from_numpy(x)] for x in case.inputs],
                                pipeline=PIPELINE))


# -- real gloo ranks -------------------------------------------------------------


def gloo_cases(size: int) -> list[Case]:
    """A listed sample: every op, on every grid of `size` processes here."""
    rng = np.random.default_rng(size)
    grids = [g for g in GRIDS if prod(g) == size]
    out = []
    for grid in grids:
        for axes in [tuple(range(len(grid)))[::-1], (len(grid) - 1,)]:
            n = prod(grid[a] for a in axes)
            inputs = [rng.integers(-4, 5, (n, 2 * n)).astype(np.float32) for _ in range(size)]
            root = tuple(grid[a] - 1 for a in axes)
            shift_axis = axes[0]
            for op, params in [
                ("all_reduce", {"kind": "max"}), ("all_reduce", {"kind": "average"}),
                ("reduce", {"kind": "sum", "root": root}), ("all_gather", {"axis": 1}),
                ("gather", {"axis": 0, "root": root}), ("all_slice", {"axis": 1}),
                ("scatter", {"axis": 0, "root": root}), ("broadcast", {"root": root}),
                ("reduce_scatter", {"kind": "sum", "axis": 1}),
                ("all_to_all", {"split": 0, "concat": 1}),
                ("shift", {"shift_axis": shift_axis, "offset": 1, "rotate": True}),
                ("shift", {"shift_axis": shift_axis, "offset": -1, "rotate": False}),
            ]:  # fmt: skip
                out.append(make_case(op, grid, axes, params, inputs))
    return out


def run_cases(context, cases: list[Case]) -> list:
    results = []
    for case in cases:
        program = distir.compile(case.text, PIPELINE)
        results.append(program.run(torch.from_numpy(case.inputs[context.rank])))
    return results


@cache
def gloo_results(size: int) -> list:
    return distir.launch(run_cases, size, gloo_cases(size), pass_context=True, timeout=110)


@pytest.mark.multirank
@pytest.mark.parametrize("size", [2, 4])
def test_gloo_ranks_match_the_grid_semantics(size: int) -> None:
    per_rank = gloo_results(size)
    for index, case in enumerate(gloo_cases(size)):
        check(case, [per_rank[r][index] for r in range(size)])


@pytest.mark.parametrize("rotate", [True, False])
@pytest.mark.parametrize("offset", range(-4, 5))
@pytest.mark.parametrize(("grid", "axes", "shift_axis"), [
    ((4,), (0,), 0), ((3,), (0,), 0), ((2, 3), (1, 0), 1), ((2, 3), (0, 1), 0), ((1, 4), (1,), 1),
])  # fmt: skip
def test_every_shift(grid, axes, shift_axis, offset: int, rotate: bool) -> None:
    rng = np.random.default_rng(offset + 10)
    inputs = [rng.integers(-9, 10, (2, 3)).astype(np.int32) for _ in range(prod(grid))]
    params = {"shift_axis": shift_axis, "offset": offset, "rotate": rotate}
    case = make_case("shift", grid, axes, params, inputs)
    check(case, distir.simulate(case.text, [[torch.from_numpy(x)] for x in case.inputs],
                                pipeline=PIPELINE))


@pytest.mark.parametrize(("grid", "split", "halos", "shape"), [
    ((4,), "[[0]]", (1, 1), (5, 3)), ((4,), "[[0]]", (2, 0), (5, 3)), ((4,), "[[0]]", (0, 2), (4, 2)),
    ((2, 2), "[[], [1]]", (1, 2), (2, 6)), ((2, 2), "[[0], [1]]", (1, 1, 1, 1), (4, 4)),
    ((3,), "[[], [0]]", (1, 1), (2, 4)),
])  # fmt: skip
def test_update_halo_fills_halos_from_neighbours(grid, split, halos, shape) -> None:
    P = prod(grid)
    rng = np.random.default_rng(P)
    inputs = [rng.integers(-99, 100, shape).astype(np.int32) for _ in range(P)]
    t = ttype(shape, "i32")
    text = (f"shard.grid @g(shape = {'x'.join(map(str, grid))})\n"
            f"func.func @main(%x: {t}) -> {t} {{\n"
            f"  %y = shard.update_halo %x on @g split_axes = {split} "
            f"halo_sizes = [{', '.join(map(str, halos))}] : {t}\n"
            f"  func.return %y : {t}\n}}\n")
    # the oracle: dimension by dimension, as the halos are updated in order
    split_axes = ast.literal_eval(split)
    expected = [x.copy() for x in inputs]
    pair = 0
    for dim, axes in enumerate(split_axes):
        if not axes:
            continue
        (axis,) = axes
        low, high = halos[2 * pair], halos[2 * pair + 1]
        pair += 1
        before = [x.copy() for x in expected]
        size = shape[dim]
        for r in range(P):
            c = list(coordinates(grid, r))
            idx = [slice(None)] * len(shape)
            if low and c[axis] > 0:
                prev = c.copy()
                prev[axis] -= 1
                src = before[int(np.ravel_multi_index(prev, grid))]
                idx[dim] = slice(0, low)
                take = [slice(None)] * len(shape)
                take[dim] = slice(size - high - low, size - high)
                expected[r][tuple(idx)] = src[tuple(take)]
            if high and c[axis] < grid[axis] - 1:
                nxt = c.copy()
                nxt[axis] += 1
                src = before[int(np.ravel_multi_index(nxt, grid))]
                idx[dim] = slice(size - high, size)
                take = [slice(None)] * len(shape)
                take[dim] = slice(low, low + high)
                expected[r][tuple(idx)] = src[tuple(take)]
    results = distir.simulate(text, [[torch.from_numpy(x)] for x in inputs], pipeline=PIPELINE)
    for r in range(P):
        np.testing.assert_array_equal(results[r].numpy(), expected[r], err_msg=f"process {r}")


INDEX_PROGRAM = """
shard.grid @g(shape = {shape})
func.func @main(%d0: index, %d1: index, %d2: index) -> ({eight}) {{
  %m:3 = shard.process_multi_index on @g : index, index, index
  %m2:2 = shard.process_multi_index on @g axes = [2, 0] : index, index
  %l = shard.process_linear_index on @g : index
  %s:3 = shard.grid_shape @g : index, index, index
  %down, %up = shard.neighbors_linear_indices on @g[%d0, %d1, %d2] split_axes = [1] : index, index
  func.return %m#0, %m#1, %m#2, %m2#0, %m2#1, %l, %s#1, %down, %up : {eight}
}}
"""


@pytest.mark.parametrize("grid", [(2, 2, 1), (1, 3, 2), (2, 1, 2)])
def test_index_ops(grid) -> None:
    P = prod(grid)
    text = INDEX_PROGRAM.format(shape="x".join(map(str, grid)), eight=", ".join(["index"] * 9))
    devices = [coordinates(grid, (r * 5 + 1) % P) for r in range(P)]
    inputs = [[torch.tensor(c) for c in device] for device in devices]
    results = distir.simulate(text, inputs, pipeline=PIPELINE)
    for r in range(P):
        c = coordinates(grid, r)
        d = list(devices[r])
        below, above = d.copy(), d.copy()
        below[1] -= 1
        above[1] += 1
        down = int(np.ravel_multi_index(below, grid)) if d[1] > 0 else -1
        up = int(np.ravel_multi_index(above, grid)) if d[1] < grid[1] - 1 else -1
        want = [c[0], c[1], c[2], c[2], c[0], r, grid[1], down, up]
        assert [int(v) for v in results[r]] == want, f"process {r}"


SEND_RECV = """
shard.grid @g(shape = 2x2)
func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
  %i:2 = shard.process_multi_index on @g : index, index
  %zero = arith.constant 0 : index
  %first = arith.cmpi eq, %i#1, %zero : index
  %y = scf.if %first -> (tensor<3xf32>) {
    %s = shard.send %x on @g grid_axes = [1] destination = [1] : (tensor<3xf32>) -> tensor<3xf32>
    scf.yield %s : tensor<3xf32>
  } else {
    %r = shard.recv %x on @g grid_axes = [1] source = [0] : (tensor<3xf32>) -> tensor<3xf32>
    scf.yield %r : tensor<3xf32>
  }
  func.return %y : tensor<3xf32>
}
"""


def test_send_and_recv_within_groups() -> None:
    inputs = [[torch.full((3,), float(r))] for r in range(4)]
    results = distir.simulate(SEND_RECV, inputs, pipeline=PIPELINE)
    # within each row of the grid, process (i, 0) sends to (i, 1)
    assert [float(t[0]) for t in results] == [0.0, 0.0, 2.0, 2.0]


SHARD_SHAPE = """
shard.grid @g(shape = 2x3)
func.func @main() -> (index, index, index, index) {
  %s = shard.sharding @g split_axes = [[0], [1]] : !shard.sharding
  %a:2 = shard.shard_shape dims = [8, 6] sharding = %s device = [1, 2] : index, index
  %u = shard.sharding @g split_axes = [[], [1]] sharded_dims_offsets = [0, 1, 4, 9] : !shard.sharding
  %b:2 = shard.shard_shape dims = [5, 9] sharding = %u device = [0, 1] : index, index
  func.return %a#0, %a#1, %b#0, %b#1 : index, index, index, index
}
"""


def test_shard_shape_even_and_uneven() -> None:
    results = distir.simulate(SHARD_SHAPE, [[] for _ in range(6)], pipeline=PIPELINE)
    assert [int(v) for v in results[0]] == [4, 2, 5, 3]


# -- bad input: an error naming the shard op and its location ----------------------

REFUSED = {
    "dynamic grid": ("shard.grid @g(shape = 2x?)", "%y = shard.all_reduce %x on @g grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>",
                     "'shard.grid' at {f}:1:1: grid @g has a dynamic shape"),
    "axis the grid lacks": ("shard.grid @g(shape = 2x2)", "%y = shard.all_reduce %x on @g grid_axes = [2] : tensor<4xf32> -> tensor<4xf32>",
                            "'shard.all_reduce' at {f}:3:3: names grid axis 2, but grid @g has 2 axes"),
    "axis listed twice": ("shard.grid @g(shape = 2x2)", "%y = shard.all_reduce %x on @g grid_axes = [1, 1] : tensor<4xf32> -> tensor<4xf32>",
                          "'shard.all_reduce' at {f}:3:3: lists a grid axis twice"),
    "no such grid": ("shard.grid @g(shape = 2)", "%y = shard.all_reduce %x on @h grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>",
                     "'shard.all_reduce' at {f}:3:3: refers to @h, which is no shard.grid"),
    "does not divide": ("shard.grid @g(shape = 3)", "%y = shard.all_to_all %x on @g grid_axes = [0] split_axis = 0 concat_axis = 0 : tensor<4xf32> -> tensor<4xf32>",
                        "'shard.all_to_all' at {f}:3:3: split_axis 0 of tensor<4xf32> does not divide among the 3 processes"),
    "wrong result type": ("shard.grid @g(shape = 2)", "%y = shard.all_gather %x on @g grid_axes = [0] gather_axis = 0 : tensor<4xf32> -> tensor<4xf32>",
                          "'shard.all_gather' at {f}:3:3: result type tensor<4xf32> disagrees with the group: expected shape 8"),
    "generic without a combine": ("shard.grid @g(shape = 2)", "%y = shard.all_reduce %x on @g grid_axes = [0] reduction = generic : tensor<4xf32> -> tensor<4xf32>",
                                  "'shard.all_reduce' at {f}:3:3: has reduction 'generic' and names no combine"),
    "generic naming no function": ("shard.grid @g(shape = 2)", "%y = shard.all_reduce %x on @g grid_axes = [0] reduction = generic {combine = @nope} : tensor<4xf32> -> tensor<4xf32>",
                                   "'shard.all_reduce' at {f}:3:3: names combine @nope, which is no function"),
    "generic of the wrong type": ("shard.grid @g(shape = 2)", "%y = shard.all_reduce %x on @g grid_axes = [0] reduction = generic {combine = @main} : tensor<4xf32> -> tensor<4xf32>",
                                  "'shard.all_reduce' at {f}:3:3: names combine @main of type"),
    "recv without source": ("shard.grid @g(shape = 2)", "%y = shard.recv %x on @g grid_axes = [0] : (tensor<4xf32>) -> tensor<4xf32>",
                            "'shard.recv' at {f}:3:3: has no source"),
    "root outside the grid": ("shard.grid @g(shape = 2)", "%y = shard.broadcast %x on @g grid_axes = [0] root = [2] : (tensor<4xf32>) -> tensor<4xf32>",
                              "'shard.broadcast' at {f}:3:3: root coordinate 2 is outside the grid axis of size 2"),
    "shift axis not grouped": ("shard.grid @g(shape = 2x2)", "%y = shard.shift %x on @g grid_axes = [0] shift_axis = 1 offset = 1 : tensor<4xf32> -> tensor<4xf32>",
                               "'shard.shift' at {f}:3:3: shift_axis 1 must be one of grid_axes [0]"),
    "halo over two axes": ("shard.grid @g(shape = 2x2)", "%y = shard.update_halo %x on @g split_axes = [[0, 1]] halo_sizes = [1, 1] : tensor<4xf32>",
                           "'shard.update_halo' at {f}:3:3: splits dimension 0 over grid axes [0, 1]"),
    "annotation": ("shard.grid @g(shape = 2)", "%s = shard.sharding @g split_axes = [[0]] : !shard.sharding\n  %y = shard.shard %x to %s : tensor<4xf32>",
                   "'shard.shard' at {f}:4:3: is a sharding annotation"),
}  # fmt: skip


GENERIC = """
shard.grid @g(shape = {grid})
func.func @absmax(%a: {acc}, %b: {acc}) -> {acc} {{
  %x = math.absf %a : {acc}
  %y = math.absf %b : {acc}
  %m = arith.maximumf %x, %y : {acc}
  func.return %m : {acc}
}}
func.func @main(%x: {t}) -> {out} {{
  %y = {op} %x on @g grid_axes = {axes} reduction = generic {extra}{{combine = @absmax}} : {sig}
  func.return %y : {out}
}}
"""


@pytest.mark.parametrize("op", ["all_reduce", "reduce", "reduce_scatter"])
@pytest.mark.parametrize(("grid", "axes"), [((4,), (0,)), ((2, 2), (1, 0)), ((2, 2), (1,)), ((2, 3), (0, 1))])
def test_generic_reduction_with_a_combine_function(op: str, grid, axes) -> None:
    P, n = prod(grid), prod(grid[a] for a in axes)
    t, acc = ttype((2 * n,), "f32"), ttype((2 * n,), "f64")
    out = ttype((2,), "f64") if op == "reduce_scatter" else acc
    root = [grid[a] - 1 for a in axes]
    extra = {"reduce": f"root = {root} ", "reduce_scatter": "scatter_axis = 0 "}.get(op, "")
    sig = f"({t}) -> {out}" if op == "reduce" else f"{t} -> {out}"
    text = GENERIC.format(grid="x".join(map(str, grid)), acc=acc, t=t, out=out, op=f"shard.{op}",
                          axes=list(axes), extra=extra, sig=sig)
    rng = np.random.default_rng(P)
    inputs = [rng.standard_normal(2 * n).astype(np.float32) for _ in range(P)]
    results = distir.simulate(text, [[torch.from_numpy(x)] for x in inputs], pipeline=PIPELINE)
    for r in range(P):
        total = np.max(np.abs(np.stack([inputs[m].astype(np.float64) for m in group_of(grid, axes, r)])), axis=0)
        if op == "reduce_scatter":
            total = np.split(total, n)[in_group_index(grid, axes, r)]
        elif op == "reduce" and member_at(grid, axes, r, root) != r:
            continue
        np.testing.assert_array_equal(results[r].numpy(), total, err_msg=f"process {r}")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_with_the_op_and_its_location(name: str, tmp_path) -> None:
    grid, body, message = REFUSED[name]
    path = tmp_path / "prog.mlir"
    path.write_text(f"{grid}\nfunc.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {{\n"
                    f"  {body}\n  func.return %y : tensor<4xf32>\n}}\n")
    run = subprocess.run([sys.executable, "-m", "distir.cli.opt", "-p", PIPELINE, str(path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr
    assert message.format(f=path) in run.stderr
    assert "Traceback" not in run.stderr
    with pytest.raises(CompileError, match=re.escape(message.format(f=path).split(": ", 1)[1][:40])):
        distir.compile(path.read_text(), PIPELINE)


@pytest.mark.multirank
def test_the_mlp_example_matches_numpy() -> None:
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(root / "examples" / "shard_mlp.py")],
                         capture_output=True, text=True, timeout=300, cwd=root)
    assert run.returncode == 0, run.stderr
    assert "the 2x2 grid matches numpy within 1e-5" in run.stdout


# -- memrefs (the forms of upstream's ShardToMPI tests): values where that is exact --


@pytest.mark.parametrize(("op", "params", "grid", "axes"), [
    ("all_reduce", {"kind": "max", "widen": True}, (2, 2), (0, 1)),
    ("all_reduce", {"kind": "sum"}, (2, 3), (1,)),
    ("all_gather", {"axis": 1}, (2, 2), (1, 0)),
    ("all_gather", {"axis": 0}, (4,), (0,)),
    ("reduce_scatter", {"kind": "sum", "axis": 0}, (2, 2), (0,)),
    ("reduce_scatter", {"kind": "min", "axis": 1}, (2, 2), (1, 0)),
])  # fmt: skip
def test_memref_forms_compute_what_the_tensor_forms_do(op: str, params, grid, axes) -> None:
    """Upstream's MPI lowering gives these a fresh buffer and leaves the
    input as it was: on memrefs they mean what they mean on tensors."""
    n = prod(grid[a] for a in axes)
    rng = np.random.default_rng(n)
    inputs = [rng.integers(-9, 10, (n, 2 * n)).astype(np.float32) for _ in range(prod(grid))]
    case = make_case(op, grid, axes, params, inputs)
    text = case.text.replace("tensor<", "memref<")
    assert "tensor<" not in text
    check(case, distir.simulate(text, [[torch.from_numpy(x)] for x in inputs], pipeline=PIPELINE))


MEMREF_HALO = """
shard.grid @g(shape = 2x2)
func.func @main(%x: {t}) -> ({t}, {t}) {{
  %s = shard.all_reduce %x on @g grid_axes = [0] : {t} -> {t}
  %y = shard.update_halo %x on @g split_axes = [[0], [1]] halo_sizes = [1, 2, 1, 0] : {t}
  func.return %y, %s : {t}, {t}
}}
"""


def test_memref_update_halo_equals_the_tensor_form() -> None:
    """update_halo writes its memref in place upstream; read only before the
    op (here by an all_reduce) and through the result, that is a value."""
    rng = np.random.default_rng(3)
    inputs = [[torch.from_numpy(rng.integers(-99, 100, (5, 3)).astype(np.int32))] for _ in range(4)]
    as_memref = distir.simulate(MEMREF_HALO.format(t="memref<5x3xi32>"), inputs, pipeline=PIPELINE)
    as_tensor = distir.simulate(MEMREF_HALO.format(t="tensor<5x3xi32>"), inputs, pipeline=PIPELINE)
    for r in range(4):
        for got, want in zip(as_memref[r], as_tensor[r]):
            assert torch.equal(got, want), f"process {r}"
    assert not torch.equal(as_tensor[0][0], inputs[0][0])  # the halos did change


MEMREF_REFUSED = {
    "read after an in-place update": (
        "%y = shard.update_halo %x on @g split_axes = [[0]] halo_sizes = [1, 1] : memref<4xf32>\n"
        "  %z = shard.all_reduce %x on @g grid_axes = [0] : memref<4xf32> -> memref<4xf32>",
        "'shard.update_halo' at {f}:3:3: updates the halos of memref<4xf32> in place, and the "
        "buffer is used again after it (by 'shard.all_reduce')"),
    "another op on a memref": (
        "%y = func.call @main(%x) : (memref<4xf32>) -> memref<4xf32>",
        "'func.call' at {f}:3:3: uses a memref (memref<4xf32>); distir runs a memref as a value only"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MEMREF_REFUSED))
def test_memref_forms_that_are_not_values_are_refused(name: str, tmp_path) -> None:
    body, message = MEMREF_REFUSED[name]
    path = tmp_path / "prog.mlir"
    path.write_text("shard.grid @g(shape = 2)\n"
                    "func.func @main(%x: memref<4xf32>) -> memref<4xf32> {\n"
                    f"  {body}\n  func.return %y : memref<4xf32>\n}}\n")
    with pytest.raises(CompileError, match=re.escape(message.format(f=path))):
        distir.compile(path, PIPELINE)


def test_an_unused_in_place_update_is_refused(tmp_path) -> None:
    path = tmp_path / "prog.mlir"
    path.write_text("shard.grid @g(shape = 2)\n"
                    "func.func @main(%x: memref<4xf32>) {\n"
                    "  %y = shard.update_halo %x on @g split_axes = [[0]] halo_sizes = [1, 1] : memref<4xf32>\n"
                    "  func.return\n}\n")
    with pytest.raises(CompileError, match=re.escape(
            f"'shard.update_halo' at {path}:3:3: updates the halos of memref<4xf32> in place and "
            "its result is unused")):
        distir.compile(path, PIPELINE)


DYNAMIC_ROOTS = """
shard.grid @g(shape = 2x3)
func.func @main(%x: tensor<6xf32>, %r: index) -> (tensor<6xf32>, tensor<6xf64>, tensor<12xf32>, tensor<3xf32>) {
  %b = shard.broadcast %x on @g grid_axes = [1, 0] root = [%r, 1] : (tensor<6xf32>, index) -> tensor<6xf32>
  %m = shard.reduce %x on @g grid_axes = [1] reduction = max root = [%r] : (tensor<6xf32>, index) -> tensor<6xf64>
  %g = shard.gather %x on @g grid_axes = [0] gather_axis = 0 root = [%r] : (tensor<6xf32>, index) -> tensor<12xf32>
  %s = shard.scatter %x on @g grid_axes = [0] scatter_axis = 0 root = [%r] : (tensor<6xf32>, index) -> tensor<3xf32>
  func.return %b, %m, %g, %s : tensor<6xf32>, tensor<6xf64>, tensor<12xf32>, tensor<3xf32>
}
"""


@pytest.mark.parametrize("root", [0, 1])
def test_dynamic_roots(root: int) -> None:
    """Roots given as index operands (upstream's `root = [1, %arg1]` form),
    and a reduction accumulated in a wider type (f32 in, f64 out)."""
    grid = (2, 3)
    rng = np.random.default_rng(root)
    inputs = [rng.standard_normal(6).astype(np.float32) for _ in range(6)]
    results = distir.simulate(DYNAMIC_ROOTS, [[torch.from_numpy(x), torch.tensor(root)] for x in inputs],
                              pipeline=PIPELINE)
    for r in range(6):
        b, m, g, s = (t.numpy() for t in results[r])
        np.testing.assert_array_equal(b, inputs[member_at(grid, (1, 0), r, (root, 1))])
        if member_at(grid, (1,), r, (root,)) == r:
            want = np.max(np.stack([inputs[k] for k in group_of(grid, (1,), r)]).astype(np.float64), axis=0)
            np.testing.assert_array_equal(m, want)
        if member_at(grid, (0,), r, (root,)) == r:
            np.testing.assert_array_equal(g, np.concatenate([inputs[k] for k in group_of(grid, (0,), r)]))
        source = inputs[member_at(grid, (0,), r, (root,))]
        np.testing.assert_array_equal(s, np.split(source, 2)[in_group_index(grid, (0,), r)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grids_and_axes(), st.data())
def test_uneven_gathers(grid_axes, data) -> None:
    """Shards of different lengths along the gather axis (a dynamic
    dimension): each process's piece in in-group order, whatever the lengths."""
    grid, axes = grid_axes
    P = prod(grid)
    lengths = data.draw(st.lists(st.integers(0, 3), min_size=P, max_size=P))
    gather = data.draw(st.booleans())
    root = [grid[a] - 1 for a in axes]
    inputs = [np.full((n, 2), float(r), np.float32) + np.arange(n, dtype=np.float32)[:, None] / 8
              for r, n in enumerate(lengths)]
    # the other dimension dynamic too: taken whole where pieces are reordered
    t = "tensor<?x?xf32>" if data.draw(st.booleans()) else "tensor<?x2xf32>"
    op = (f"shard.gather %x on @g {axes_text(axes)} gather_axis = 0 root = {root} : ({t}) -> {t}"
          if gather else f"shard.all_gather %x on @g {axes_text(axes)} gather_axis = 0 : {t} -> {t}")
    text = program(grid, t, t, op)
    results = distir.simulate(text, [[torch.from_numpy(x)] for x in inputs], pipeline=PIPELINE)
    for r in range(P):
        if gather and member_at(grid, axes, r, root) != r:
            continue
        want = np.concatenate([inputs[m] for m in group_of(grid, axes, r)], axis=0)
        np.testing.assert_array_equal(results[r].numpy(), want, err_msg=f"process {r}")


# -- the listed programs on real gloo ranks: equal to the simulator, which the
#    tests above hold to the oracle ---------------------------------------------


def special_programs() -> list[tuple[str, str, list[list[torch.Tensor]]]]:
    """(name, program, inputs per rank) for 4 ranks."""
    rng = np.random.default_rng(4)
    halo_t = "tensor<5x3xi32>"
    halo = (f"shard.grid @g(shape = 2x2)\nfunc.func @main(%x: {halo_t}) -> {halo_t} {{\n"
            f"  %y = shard.update_halo %x on @g split_axes = [[0], [1]] halo_sizes = [1, 2, 1, 0] : {halo_t}\n"
            f"  func.return %y : {halo_t}\n}}\n")
    ints = [[torch.from_numpy(rng.integers(-99, 100, (5, 3)).astype(np.int32))] for _ in range(4)]
    floats = [[torch.from_numpy(rng.standard_normal(4).astype(np.float32))] for _ in range(4)]
    t, acc = "tensor<4xf32>", "tensor<4xf64>"
    generic = GENERIC.format(grid="2x2", acc=acc, t=t, out=acc, op="shard.all_reduce",
                             axes=[1, 0], extra="", sig=f"{t} -> {acc}")
    index = INDEX_PROGRAM.format(shape="2x2x1", eight=", ".join(["index"] * 9))
    devices = [[torch.tensor(c) for c in coordinates((2, 2, 1), (r * 5 + 1) % 4)] for r in range(4)]
    uneven = program((2, 2), "tensor<?x2xf32>", "tensor<?x2xf32>",
                     "shard.all_gather %x on @g grid_axes = [1, 0] gather_axis = 0 "
                     ": tensor<?x2xf32> -> tensor<?x2xf32>")
    uneven_to_root = program((2, 2), "tensor<?x2xf32>", "tensor<?x2xf32>",
                             "shard.gather %x on @g grid_axes = [1, 0] gather_axis = 0 root = [1, 0] "
                             ": (tensor<?x2xf32>) -> tensor<?x2xf32>")
    rows = [[torch.full((n, 2), float(r))] for r, n in enumerate([1, 0, 3, 2])]
    d = "tensor<?x4xf32>"
    dynamic = (f"shard.grid @g(shape = 2x2)\n"
               f"func.func @main(%x: {d}) -> ({d}, tensor<?x8xf32>, tensor<?x2xf32>, {d}) {{\n"
               f"  %a = shard.all_reduce %x on @g grid_axes = [1, 0] reduction = average : {d} -> {d}\n"
               f"  %b = shard.all_gather %x on @g grid_axes = [0] gather_axis = 1 : {d} -> tensor<?x8xf32>\n"
               f"  %c = shard.all_to_all %x on @g grid_axes = [1] split_axis = 1 concat_axis = 0 "
               f": {d} -> tensor<?x2xf32>\n"
               f"  %e = shard.shift %x on @g grid_axes = [0, 1] shift_axis = 1 offset = 1 rotate : {d} -> {d}\n"
               f"  func.return %a, %b, %c, %e : {d}, tensor<?x8xf32>, tensor<?x2xf32>, {d}\n}}\n")
    threes = [[torch.from_numpy(rng.integers(-9, 10, (3, 4)).astype(np.float32))] for _ in range(4)]
    return [
        ("update_halo", halo, ints),
        ("send_recv", SEND_RECV, [[torch.full((3,), float(r))] for r in range(4)]),
        ("index ops", index, devices),
        ("generic", generic, floats),
        ("uneven all_gather", uneven, rows),
        ("uneven gather to a root", uneven_to_root, rows),
        ("dynamic dimensions", dynamic, threes),
    ]


def run_programs(context, programs) -> list:
    return [distir.compile(text, PIPELINE).run(*inputs[context.rank])
            for _, text, inputs in programs]


@pytest.mark.multirank
def test_listed_programs_on_gloo_ranks_equal_the_simulator() -> None:
    programs = special_programs()
    per_rank = distir.launch(run_programs, 4, programs, pass_context=True, timeout=110)
    for index, (name, text, inputs) in enumerate(programs):
        simulated = distir.simulate(text, inputs, pipeline=PIPELINE)
        for rank in range(4):
            got, want = per_rank[rank][index], simulated[rank]
            got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
            assert len(got) == len(want), name
            for g, w in zip(got, want):
                assert torch.equal(torch.as_tensor(g), torch.as_tensor(w)), f"{name}, rank {rank}"


def test_reduce_scatter_reads_the_older_scatter_dim_spelling() -> None:
    """`scatter_dim = N` (upstream's ShardToMPI tests) reads as `scatter_axis
    = N`, prints in the canonical spelling, and computes the same."""
    grid, axes = (2, 2), (1, 0)
    rng = np.random.default_rng(7)
    inputs = [rng.integers(-9, 10, (2, 8)).astype(np.float32) for _ in range(4)]
    case = make_case("reduce_scatter", grid, axes, {"kind": "max", "axis": 1}, inputs)
    older = case.text.replace("scatter_axis", "scatter_dim")
    assert "scatter_dim = 1" in older
    printed = str(parse_module(older))
    assert "scatter_dim" not in printed and "scatter_axis = 1" in printed
    assert printed == str(parse_module(case.text)) == str(parse_module(printed))
    check(case, distir.simulate(older, [[torch.from_numpy(x)] for x in inputs], pipeline=PIPELINE))


# -- dynamic dimensions other than the gather axis --------------------------------


def with_dynamic_dim(text: str, dim: int) -> str:
    """`text` with dimension `dim` of every 2-D tensor type made dynamic."""
    def one(m: re.Match) -> str:
        dims = [m.group(1), m.group(2)]
        dims[dim] = "?"
        return f"tensor<{dims[0]}x{dims[1]}x{m.group(3)}>"
    return re.sub(r"tensor<(\d+)x(\d+)x(\w+)>", one, text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.data())
def test_dynamic_dimensions_the_group_does_not_split(case: Case, data) -> None:
    """A dimension no op splits may be dynamic (`tensor<?x4xf32>`): dist's
    ops take its size at run time; the results equal the static program's
    oracle."""
    params = ast.literal_eval(case.name[case.name.index("{"):case.name.index("}") + 1])
    split = {params.get("axis"), params.get("split")} - {None}
    dim = data.draw(st.sampled_from([d for d in (0, 1) if d not in split]))
    text = with_dynamic_dim(case.text, dim)
    assert "?" in text
    check(case, distir.simulate(text, [[torch.from_numpy(x)] for x in case.inputs],
                                pipeline=PIPELINE))


DYNAMIC_REFUSED = {
    "all_slice": ("%y = shard.all_slice %x on @g grid_axes = [0] slice_axis = 0 : tensor<?x4xf32> -> tensor<?x4xf32>",
                  "takes tensor<?x4xf32>, dynamic along slice_axis 0; the group splits that dimension"),
    "scatter": ("%y = shard.scatter %x on @g grid_axes = [0] scatter_axis = 0 root = [0] : (tensor<?x4xf32>) -> tensor<?x4xf32>",
                "takes tensor<?x4xf32>, dynamic along scatter_axis 0; the group splits that dimension"),
    "reduce_scatter": ("%y = shard.reduce_scatter %x on @g grid_axes = [0] scatter_axis = 0 : tensor<?x4xf32> -> tensor<?x4xf32>",
                       "takes tensor<?x4xf32>, dynamic along scatter_axis 0; the group splits that dimension"),
    "all_to_all": ("%y = shard.all_to_all %x on @g grid_axes = [0] split_axis = 0 concat_axis = 1 : tensor<?x4xf32> -> tensor<?x8xf32>",
                   "takes tensor<?x4xf32>, dynamic along split_axis 0; the group splits that dimension"),
    "update_halo": ("%y = shard.update_halo %x on @g split_axes = [[0]] halo_sizes = [1, 1] : tensor<?x4xf32>",
                    "takes tensor<?x4xf32>, dynamic along split dimension 0; distir needs the size"),
}  # fmt: skip


@pytest.mark.parametrize("op", sorted(DYNAMIC_REFUSED))
def test_a_dynamic_dimension_the_group_splits_is_refused(op: str) -> None:
    body, message = DYNAMIC_REFUSED[op]
    text = (f"shard.grid @g(shape = 2)\nfunc.func @main(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {{\n"
            f"  {body}\n  func.return %x : tensor<?x4xf32>\n}}\n")
    with pytest.raises(CompileError, match=re.escape(f"'shard.{op}' at <program>:3:3: {message}")):
        distir.compile(text, PIPELINE)


def test_ranks_with_different_dynamic_sizes_get_a_located_error() -> None:
    """The dist op the shard op became carries the shard op's location."""
    t = "tensor<?x4xf32>"
    text = program((2, 2), t, t, f"shard.all_reduce %x on @g grid_axes = [1, 0] : {t} -> {t}")
    with pytest.raises(CollectiveMismatchError, match=re.escape(
            "'dist.all_reduce' at <program>:3:3: ranks pass different input layouts")):
        distir.simulate(text, [[torch.zeros(3 - r % 2, 4)] for r in range(4)], pipeline=PIPELINE)


def test_the_memref_forms_file_equals_its_tensor_form() -> None:
    """docs/shard.md converts this file; its memref forms compute what the
    same program on tensors does (held to the oracle above)."""
    text = (Path(__file__).parent / "memref_forms.mlir").read_text()
    rng = np.random.default_rng(5)
    inputs = [[torch.from_numpy(rng.integers(-9, 10, (4, 3)).astype(np.float32))] for _ in range(4)]
    as_memref = distir.simulate(text, inputs, pipeline=PIPELINE)
    as_tensor = distir.simulate(text.replace("memref<", "tensor<"), inputs, pipeline=PIPELINE)
    for r in range(4):
        assert len(as_memref[r]) == 3
        for got, want in zip(as_memref[r], as_tensor[r]):
            assert torch.equal(got, want), f"process {r}"


@pytest.mark.multirank
def test_distir_run_takes_the_converted_arguments_of_a_memref_program(tmp_path, run_cli) -> None:
    """distir-run synthesises inputs for what the converted function takes:
    the memref program prints what the same program on tensors prints."""
    memref = Path(__file__).parent / "memref_forms.mlir"
    tensor_form = tmp_path / "tensor_forms.mlir"
    tensor_form.write_text(memref.read_text().replace("memref<", "tensor<"))

    def results(path: Path) -> list[str]:
        run = run_cli(str(path), "--nproc", "4", "-p", PIPELINE)
        assert run.returncode == 0, run.stderr
        return [line for line in run.stdout.splitlines() if "result #" in line]

    got = results(memref)
    assert len(got) == 12 and got == results(tensor_form)
