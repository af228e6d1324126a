"""A type no torch dtype holds is refused at compile time, naming where.

`i2`, `f8E4M3FN`, `f128` or `complex<f32>` are valid IR; distir computes
on torch tensors, which hold none of them. Wherever such a type sits in
what a run can execute (an entry argument or result, an intermediate, a
scalar, a value in a region, a callee), `compile` raises `CompileError`
naming the value and its op's location; before, a raw `TypeError` escaped
from wherever the type was first read (and `distir-run` printed a
traceback). A function no run reaches may hold any type.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import distir
from distir.errors import CompileError

#: element types torch has no dtype for, grouped by how the IR converts to them
NARROW_INTS = ["i2", "i3", "i7", "si4", "ui2", "ui5"]
WIDE_INTS = ["i65", "i128", "ui128"]
NARROW_FLOATS = ["f8E4M3FN", "f8E5M2", "f4E2M1FN", "tf32"]
WIDE_FLOATS = ["f80", "f128"]


def _round_trip(element: str) -> tuple[str, str, str]:
    """(an element type torch holds, the op from it into `element`, the op
    back) for an element type of each group."""
    if element in NARROW_INTS:
        return "i64", "arith.trunci", "arith.extsi"
    if element in WIDE_INTS:
        return "i8", "arith.extsi", "arith.trunci"
    if element in NARROW_FLOATS:
        return "f64", "arith.truncf", "arith.extf"
    return "f32", "arith.extf", "arith.truncf"


def _program(element: str, where: str, tensor: bool) -> tuple[str, int]:
    """A program whose only odd type is `element`, placed at `where`, and
    the line of the value that has it (1: the function's signature)."""
    base, into, back = _round_trip(element)
    wrap = (lambda e: f"tensor<2x{e}>") if tensor else (lambda e: e)
    t, odd = wrap(base), wrap(element)
    if where == "argument":
        return (
            f"func.func @main(%x: {odd}) -> {t} {{\n"
            f"  %y = {back} %x : {odd} to {t}\n"
            f"  func.return %y : {t}\n}}\n"
        ), 1
    if where == "result":
        return (
            f"func.func @main(%x: {t}) -> {odd} {{\n"
            f"  %y = {into} %x : {t} to {odd}\n"
            f"  func.return %y : {odd}\n}}\n"
        ), 1
    if where == "intermediate":
        return (
            f"func.func @main(%x: {t}) -> {t} {{\n"
            f"  %o = {into} %x : {t} to {odd}\n"
            f"  %y = {back} %o : {odd} to {t}\n"
            f"  func.return %y : {t}\n}}\n"
        ), 2
    if where == "inside scf.if":
        return (
            f"func.func @main(%x: {t}, %c: i1) -> {t} {{\n"
            f"  %y = scf.if %c -> ({t}) {{\n"
            f"    %o = {into} %x : {t} to {odd}\n"
            f"    %z = {back} %o : {odd} to {t}\n"
            f"    scf.yield %z : {t}\n"
            f"  }} else {{\n"
            f"    scf.yield %x : {t}\n"
            f"  }}\n"
            f"  func.return %y : {t}\n}}\n"
        ), 3
    assert where == "callee"
    return (
        f"func.func @main(%x: {t}) -> {t} {{\n"
        f"  %y = func.call @helper(%x) : ({t}) -> {t}\n"
        f"  func.return %y : {t}\n}}\n"
        f"func.func @helper(%x: {t}) -> {t} {{\n"
        f"  %o = {into} %x : {t} to {odd}\n"
        f"  %y = {back} %o : {odd} to {t}\n"
        f"  func.return %y : {t}\n}}\n"
    ), 6


ODD = NARROW_INTS + WIDE_INTS + NARROW_FLOATS + WIDE_FLOATS
PLACES = ["argument", "result", "intermediate", "inside scf.if", "callee"]


@given(
    element=st.sampled_from(ODD),
    where=st.sampled_from(PLACES),
    tensor=st.booleans(),
)
def test_a_type_no_torch_dtype_holds_is_a_compile_error_naming_where(element, where, tensor):
    source, line = _program(element, where, tensor)
    with pytest.raises(CompileError) as info:
        distir.compile(source)
    message = str(info.value)
    assert f"<program>:{line}:" in message, message
    assert f"no torch dtype holds {element}" in message, message


@pytest.mark.parametrize("element", ["i2", "f8E4M3FN", "f128"])
def test_a_function_no_run_reaches_may_hold_any_type(element):
    odd, _ = _program(element, "intermediate", True)
    unreached = odd.replace("@main", "@unused")
    program = distir.compile(
        "func.func @main(%x: tensor<2xi64>) -> tensor<2xi64> {\n"
        "  func.return %x : tensor<2xi64>\n}\n" + unreached
    )
    assert program.input_types  # compiled: @unused never runs


def test_a_complex_argument_is_refused_naming_it():
    t = "tensor<2xcomplex<f32>>"
    with pytest.raises(CompileError, match=r"argument #1 of @main \('func.func' at <program>:1:1\)"):
        distir.compile(f"func.func @main(%x: tensor<2xf32>, %z: {t}) -> {t} {{\n"
                       f"  func.return %z : {t}\n}}\n")


def test_a_dist_op_on_such_a_type_is_refused_at_compile_time_too():
    source = (
        "func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {\n"
        "  %o = arith.trunci %x : tensor<4xi64> to tensor<4xi2>\n"
        "  %b = dist.broadcast %o root 0 : tensor<4xi2>\n"
        "  %y = arith.extsi %b : tensor<4xi2> to tensor<4xi64>\n"
        "  func.return %y : tensor<4xi64>\n}\n"
    )
    with pytest.raises(CompileError, match=r"'arith.trunci' at <program>:2:\d+ has type"):
        distir.compile(source)


@pytest.mark.slow
def test_distir_run_refuses_it_in_one_line_without_a_traceback(tmp_path):
    path = tmp_path / "odd.mlir"
    path.write_text(_program("i2", "argument", True)[0])
    done = subprocess.run(
        [sys.executable, "-m", "distir.cli.run", str(path), "--nproc", "1", "--random-inputs", "1"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert f"{path}:1:" in done.stderr and "no torch dtype holds i2" in done.stderr, done.stderr
