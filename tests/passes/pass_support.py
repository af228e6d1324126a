"""Shared helpers for the pass tests: parse, run a pipeline, inspect."""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation

from distir.ir.parsing import format_location, make_context, parse_module
from distir.passes import apply_pipeline

FILENAME = "prog.mlir"


def run(text: str, pipeline: str) -> ModuleOp:
    """Parse `text` as prog.mlir, verify, run `pipeline` (verifying after each
    pass) and verify again."""
    ctx = make_context()
    module = parse_module(text, FILENAME, ctx)
    module.verify()
    apply_pipeline(ctx, module, pipeline)
    module.verify()
    return module


def rerun(module: ModuleOp, pipeline: str) -> ModuleOp:
    """Reparse the printed module and run `pipeline` on it again."""
    return run(str(module), pipeline)


def ops_named(root: Operation, name: str) -> list[Operation]:
    return [op for op in root.walk() if op.name == name]


def op_names(root: Operation) -> list[str]:
    return [op.name for op in root.walk() if op is not root]


def locations(ops: list[Operation]) -> set[str]:
    return {format_location(op) for op in ops}


def line_of(text: str, needle: str) -> int:
    """1-based line number of the first line of `text` containing `needle`."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in text")
