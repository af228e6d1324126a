"""Every op of the dist dialect is finished: its syntax is declared and
round-trips, each of its verifier rules has an invalid program, and the
builder has a helper for it.

A new op added to `Dist` without these fails here. The op list comes from
`distir.ir.dialect.dist_ops()`, which other coverage tests reuse.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from xdsl.irdl import IRDLOperation
from xdsl.utils.exceptions import VerifyException

from distir.ir import builder
from distir.ir.dialect import Dist, dist_ops
from distir.ir.parsing import parse_module

HERE = Path(__file__).resolve().parent
DIALECT_FILECHECK = HERE.parent / "filecheck" / "dialect"


def _sibling(name: str) -> ModuleType:
    """A test module of this folder, loaded under a private name."""
    spec = importlib.util.spec_from_file_location(f"_coverage_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROUNDTRIP = _sibling("test_roundtrip")
VERIFIERS = _sibling("test_verifiers")
BUILDER_TESTS = _sibling("test_builder")

OPS = dist_ops()


def _op_id(op: type[IRDLOperation]) -> str:
    return op.name


def _names_in(text: str) -> set[str]:
    return {op.name for op in parse_module(text).walk()}


def _rejecting_ops(text: str) -> set[str]:
    """The ops of `text` whose own verification (nested ops left out) fails."""
    rejecting = set()
    for op in parse_module(text).walk():
        try:
            op.verify(verify_nested_ops=False)
        except VerifyException:
            rejecting.add(op.name)
    return rejecting


def test_dist_ops_lists_every_op_of_the_dialect_once() -> None:
    assert len(set(OPS)) == len(OPS)
    assert set(OPS) == set(Dist.operations)


@pytest.mark.parametrize("op", OPS, ids=_op_id)
def test_op_declares_its_syntax(op: type[IRDLOperation]) -> None:
    assert op.assembly_format is not None, f"{op.name} has no assembly_format"


@pytest.mark.parametrize("op", OPS, ids=_op_id)
def test_op_has_a_custom_syntax_round_trip_case(op: type[IRDLOperation]) -> None:
    in_pytest = set().union(*(_names_in(text) for text in ROUNDTRIP.PROGRAMS.values()))
    assert op.name in in_pytest, f"no program of test_roundtrip.py uses {op.name}"
    in_filecheck = _names_in((DIALECT_FILECHECK / "ops.mlir").read_text())
    assert op.name in in_filecheck, f"tests/filecheck/dialect/ops.mlir does not use {op.name}"


@pytest.mark.parametrize("op", OPS, ids=_op_id)
def test_op_has_an_invalid_program_it_rejects(op: type[IRDLOperation]) -> None:
    """Per op, some program is rejected by the op itself; per rule,
    test_verifiers.py checks that every raise site of the dialect (and every
    layout rule its verifiers delegate to) has a program."""
    programs = [text for text, _ in VERIFIERS.INVALID.values()] + [VERIFIERS.CAPTURE]
    assert any(op.name in _rejecting_ops(text) for text in programs), (
        f"no invalid program of test_verifiers.py is rejected by {op.name}"
    )


@pytest.mark.parametrize("op", OPS, ids=_op_id)
def test_op_has_a_documented_builder_helper(op: type[IRDLOperation]) -> None:
    helper = builder.HELPERS.get(op)
    assert helper is not None, f"distir.ir.builder has no helper for {op.name}"
    assert getattr(builder, helper.__name__) is helper and not helper.__name__.startswith("_")
    assert helper.__doc__, f"builder.{helper.__name__} has no docstring"


@pytest.mark.parametrize("op", OPS, ids=_op_id)
def test_op_is_built_by_the_every_op_program(op: type[IRDLOperation]) -> None:
    module = BUILDER_TESTS.every_op_program()
    assert op.name in {o.name for o in module.walk()}
