"""Compile-then-run: `distir.compile(...)` and `Program`.

`compile` verifies the module, runs the pass pipeline, checks the entry
function and chooses an implementation for every dist op, once. `Program.run`
then executes on the current rank: the entry function is a compiled block (a
flat list of kernels over value slots) bound to the rank's process groups, so
a run does no IR walking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.printer import Printer
from xdsl.utils.exceptions import DiagnosticException, ParseError

from distir.backends.dtypes import describe_tensor, element_dtype, matches_type
from distir.backends.region_compiler import BlockCompiler, CompiledBlock
from distir.backends.registry import ImplementationRegistry, make_invocation
from distir.backends.validation import check_result_shape
from distir.errors import CompileError, ProgramInputError
from distir.ir.dialect import AllReduceOp, CollectiveOp, GroupOp, group_declarations
from distir.ir.parsing import describe_op, make_context, parse_module
from distir.passes import apply_pipeline

ProgramSource = ModuleOp | str | Path


def load_module(source: ProgramSource) -> ModuleOp:
    """A module from IR text, a path to a .mlir file, or a module (cloned)."""
    if isinstance(source, ModuleOp):
        return source.clone()
    try:
        if isinstance(source, Path) or (
            isinstance(source, str) and "\n" not in source and source.endswith(".mlir")
        ):
            path = Path(source)
            return parse_module(path.read_text(), str(path))
        return parse_module(source, "<program>")
    except ParseError as e:
        raise CompileError(f"parse error: {e}") from None


def _verify(module: ModuleOp, when: str) -> None:
    try:
        module.verify()
    except DiagnosticException as e:
        failing = _find_failing_op(module)
        where = f" ({describe_op(failing)})" if failing is not None else ""
        raise CompileError(f"{when}: {e.args[0] if e.args else e}{where}") from None


def _find_failing_op(module: ModuleOp) -> Operation | None:
    """The innermost op whose own verification fails (for a located error)."""
    for op in module.walk(reverse=True):
        try:
            op.verify(verify_nested_ops=False)
        except DiagnosticException:
            return op
    return None


class Program:
    """A compiled dist program: verified, lowered and planned."""

    def __init__(
        self,
        module: ModuleOp,
        *,
        entry: str = "main",
        registry: ImplementationRegistry | None = None,
        implementations: Mapping[str, str] | None = None,
        timeout: timedelta = timedelta(seconds=60),
    ):
        if registry is None:
            from distir.backends.torch_collectives import distributed_operation_contributions

            registry = ImplementationRegistry(distributed_operation_contributions())
        self.module = module
        self.entry = entry
        self.registry = registry
        self.requested = dict(implementations or {})
        self.timeout = timeout
        self.function = self._entry_function()
        self.groups: list[GroupOp] = group_declarations(module)
        self.input_types = list(self.function.function_type.inputs.data)
        self.output_types = list(self.function.function_type.outputs.data)
        # Choose every implementation now, so a missing one fails compile().
        self.choices = {
            op: self.registry.select(op, self._requested_name(op))
            for op in module.walk()
            if isinstance(op, CollectiveOp) or op.name in ("dist.rank", "dist.group_size")
        }
        # Compile once with placeholder binding: any unsupported local op fails here.
        BlockCompiler(module, lambda op: (lambda *a: ())).compile_function(entry)
        self._bound: dict[Any, CompiledBlock] = {}
        self._contexts: dict[Any, Any] = {}

    # -- inspection -----------------------------------------------------------

    def __str__(self) -> str:
        return str(self.module)

    def print_generic(self) -> str:
        import io

        buf = io.StringIO()
        Printer(stream=buf, print_generic_format=True).print_op(self.module)
        return buf.getvalue()

    def plan_summary(self) -> list[tuple[str, str]]:
        """(op, implementation name) for every dist op, in program order."""
        return [(describe_op(op), impl.name) for op, impl in self.choices.items()]

    # -- running --------------------------------------------------------------

    def run(self, *inputs: torch.Tensor, group: Any = None) -> Any:
        """Runs the entry function on this rank of `group` (default: world).

        Returns the single result, or a tuple when the function has several.
        """
        self.check_inputs(inputs)
        compiled = self._bound.get(group)
        if compiled is None:
            compiled = self._bind_torch(group)
        results = compiled(*inputs)
        return results[0] if len(results) == 1 else results

    def check_inputs(self, inputs: Sequence[Any]) -> None:
        name = f"@{self.entry}"
        if len(inputs) != len(self.input_types):
            raise ProgramInputError(
                f"{name} takes {len(self.input_types)} inputs, got {len(inputs)}"
            )
        for i, (value, t) in enumerate(zip(inputs, self.input_types)):
            if not isinstance(value, torch.Tensor) or not matches_type(value, t):
                raise ProgramInputError(
                    f"{name} input #{i} must be {t} ({element_dtype(t)}), got "
                    f"{describe_tensor(value)}"
                )

    def _requested_name(self, op: Operation) -> str | None:
        if op.name in self.requested:
            return self.requested[op.name]
        if isinstance(op, AllReduceOp) and op.algorithm is not None:
            return op.algorithm.data
        return None

    def _bind_torch(self, group: Any) -> CompiledBlock:
        from distir.backends.resources import ProcessGroupResource, create_declared_groups

        base = ProcessGroupResource(group)
        resources = create_declared_groups(self.groups, base, timeout=self.timeout)

        def bind(op: Operation):
            impl = self.choices[op]
            regions = [compiler.compile_combine(op)] if isinstance(op, AllReduceOp) and (
                op.kind is None
            ) else []
            invocation = make_invocation(op, regions)
            resource = resources[invocation.group]
            n_results = len(op.results)

            def kernel(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
                results = impl.execute(invocation, xs, resource, in_place=False)
                for i in range(n_results):
                    check_result_shape(invocation, i, results[i])
                return results

            return kernel

        compiler = BlockCompiler(self.module, bind)
        compiled = compiler.compile_function(self.entry)
        self._bound[group] = compiled
        return compiled

    def _entry_function(self) -> func.FuncOp:
        for op in self.module.ops:
            if isinstance(op, func.FuncOp) and op.sym_name.data == self.entry:
                return op
        raise CompileError(f"the module has no entry function @{self.entry}")

    # -- simulation -------------------------------------------------------------

    def simulate(
        self, inputs_per_rank: Sequence[Sequence[torch.Tensor]], *, timeout: float = 30.0
    ) -> list[Any]:
        from distir.runtime.simulator import run_simulation

        for inputs in inputs_per_rank:
            self.check_inputs(inputs)

        def run_rank(rank_ctx) -> tuple[torch.Tensor, ...]:
            def bind(op: Operation):
                regions = [compiler.compile_combine(op)] if isinstance(op, AllReduceOp) and (
                    op.kind is None
                ) else []
                return rank_ctx.bind(op, regions)

            compiler = BlockCompiler(self.module, bind)
            results = compiler.compile_function(self.entry)(*inputs_per_rank[rank_ctx.rank])
            return results[0] if len(results) == 1 else results

        return run_simulation(run_rank, len(inputs_per_rank), self.groups, timeout)


def compile(
    source: ProgramSource,
    pipeline: str = "",
    *,
    entry: str = "main",
    implementations: Mapping[str, str] | None = None,
    registry: ImplementationRegistry | None = None,
    timeout: timedelta = timedelta(seconds=60),
) -> Program:
    """Verify, lower (`pipeline`, in `distir-opt -p` syntax) and plan a program."""
    module = load_module(source)
    _verify(module, "the program does not verify")
    if pipeline:
        try:
            apply_pipeline(make_context(), module, pipeline)
        except DiagnosticException as e:
            raise CompileError(f"pipeline {pipeline!r}: {e}") from None
        except ValueError as e:  # unknown pass or bad option
            raise CompileError(f"pipeline {pipeline!r}: {e}") from None
        _verify(module, f"the program does not verify after {pipeline!r}")
    return Program(
        module,
        entry=entry,
        registry=registry,
        implementations=implementations,
        timeout=timeout,
    )


def simulate(
    program: Program | ProgramSource,
    inputs_per_rank: Sequence[Sequence[torch.Tensor]],
    *,
    pipeline: str = "",
    timeout: float = 30.0,
) -> list[Any]:
    """Runs `program` for `len(inputs_per_rank)` ranks in this process and
    returns every rank's results (the reference semantics)."""
    if not isinstance(program, Program):
        program = compile(program, pipeline)
    return program.simulate(inputs_per_rank, timeout=timeout)
