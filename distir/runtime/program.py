"""Compile-then-run: `distir.compile(...)` and `Program`.

`compile` verifies the module, runs the pass pipeline, checks the entry
function and chooses an implementation for every dist op, once. `Program.run`
then executes on the current rank: the entry function is a compiled block (a
flat list of kernels over value slots) bound to the rank's process groups, so
a run does no IR walking.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType
from xdsl.ir import Operation
from xdsl.printer import Printer
from xdsl.utils.exceptions import DiagnosticException, ParseError

from distir.backends.groups import _all_gather_single
from distir.backends.registry import ImplementationRegistry
from distir.durations import Duration, seconds
from distir.errors import CompileError, DistirError, ProgramInputError, ProgramMismatch
from distir.interpreters.block_compiler import BlockCompiler, CompiledBlock
from distir.interpreters.checks import check_group_assumption, check_result_shape
from distir.interpreters.dtypes import describe_tensor, element_dtype, matches_type
from distir.interpreters.invocation import make_invocation
from distir.interpreters.kernels import LOCAL_KERNELS
from distir.ir.dialect import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AllReduceOp,
    BroadcastOp,
    GroupOp,
    MeshOp,
    VariableAllToAllOp,
    WaveOp,
    YieldOp,
    group_declarations,
)
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


def is_executable_dist_op(op: Operation) -> bool:
    """Ops an implementation executes (a wave is executed through its ops;
    groups, meshes and yields are declarations and terminators; local checks
    such as `dist.assert_reduced` are plain kernels)."""
    return (
        op.name.startswith("dist.")
        and not isinstance(op, WaveOp | GroupOp | MeshOp | YieldOp)
        and type(op) not in LOCAL_KERNELS
    )


def program_fingerprint(module: ModuleOp, entry: str) -> int:
    """A 63-bit digest of the lowered program and its entry point."""
    digest = hashlib.sha256(f"{entry}\n{module}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def needs_descriptor_agreement(op: Operation) -> bool:
    """Whether ranks must compare descriptors before this op's payload:
    when its layout or parameters depend on run-time data (dynamic dims,
    counts, a dynamic root, ciphertext limbs and moduli). Static layouts are
    covered by the program agreement."""
    if isinstance(op, VariableAllToAllOp | AllReduceAddCiphertextOp):
        return True
    if isinstance(op, AllGatherOp) and op.counts is not None:
        return True
    if isinstance(op, BroadcastOp) and op.root_value is not None:
        return True
    return any(
        isinstance(v.type, TensorType) and any(d < 0 for d in v.type.get_shape())
        for v in op.operands
    )


def op_options(op: Operation) -> dict[str, Any]:
    """Per-op execution options: descriptor agreement and the op's own
    deadline (a `deadline_ms` attribute overrides the program's)."""
    options: dict[str, Any] = {"agree": needs_descriptor_agreement(op)}
    deadline = op.attributes.get("deadline_ms")
    if isinstance(deadline, IntegerAttr):
        options["deadline_s"] = deadline.value.data / 1000.0
    return options


@dataclass(frozen=True)
class _AgreementStep:
    """Stands in for an invocation in the program-agreement exchange."""

    description: str
    options: Mapping[str, Any] = field(default_factory=dict)


def _device_of(inputs: Sequence[Any], base: Any) -> torch.device:
    if base.backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _gather_objects(base: Any, obj: Any, step: _AgreementStep) -> list[Any]:
    """all_gather_object under the deadline (only used on the failure path)."""
    device = _device_of((), base)
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = torch.empty(base.size, dtype=torch.int64, device=device)
    base.complete(_all_gather_single(sizes, size, group=base.group, async_op=True), step)
    widest = int(sizes.max())
    padded = torch.zeros(widest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    out = torch.empty(base.size * widest, dtype=torch.uint8, device=device)
    base.complete(_all_gather_single(out, padded, group=base.group, async_op=True), step)
    rows = out.view(base.size, widest).cpu()
    return [pickle.loads(bytes(rows[r, : int(sizes[r])].tolist())) for r in range(base.size)]


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
        deadline: Duration = 60.0,
        agreement: bool = True,
    ):
        if registry is None:
            from distir.backends.collectives import distributed_operation_contributions

            registry = ImplementationRegistry(distributed_operation_contributions())
        self.module = module
        self.entry = entry
        self.registry = registry
        self.requested = dict(implementations or {})
        self.timeout = timeout
        self.deadline_s = seconds(deadline, "deadline")
        self.agreement = agreement
        self.fingerprint = program_fingerprint(module, entry)
        self.function = self._entry_function()
        self.groups: list[GroupOp] = group_declarations(module)
        self.input_types = list(self.function.function_type.inputs.data)
        self.output_types = list(self.function.function_type.outputs.data)
        # Choose every implementation now, so a missing one fails compile().
        self.choices = {
            op: self.registry.select(op, self._requested_name(op))
            for op in module.walk()
            if is_executable_dist_op(op)
        }
        # Compile once with placeholder binding: any unsupported local op, in the
        # program or in a combine region, fails here rather than at run time.
        checker = BlockCompiler(module, lambda op: (lambda *a: ()))
        checker.compile_function(entry)
        for op in module.walk():
            if isinstance(op, AllReduceOp) and op.kind is None:
                checker.compile_combine(op)
        self._bound: dict[Any, CompiledBlock] = {}

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

    def run(
        self,
        *inputs: torch.Tensor,
        group: Any = None,
        deadline: Duration | None = None,
        agreement: bool | None = None,
        donate: bool | Sequence[int] = False,
    ) -> Any:
        """Runs the entry function on this rank of `group` (default: world).

        `donate` (True, or the indices of donated inputs) lets distir
        overwrite those inputs and return results that alias them; other
        inputs are never modified and no result aliases them.

        Every collective must complete within `deadline` (default: the
        program's). With `agreement` (default: the program's), ranks first
        check that they all run this program on accepted inputs, and ops
        with data-dependent layouts exchange descriptors before their
        payload. Returns the single result, or a tuple when the function has
        several.
        """
        bound = self._bound.get(group)
        if bound is None:
            bound = self._bind_torch(group)
        compiled, resources, base = bound
        self._donated(donate, len(inputs))
        deadline_s = self.deadline_s if deadline is None else seconds(deadline, "deadline")
        agree = self.agreement if agreement is None else agreement
        for resource in resources:
            resource.deadline_s = deadline_s
            resource.agreement = agree
        if agree:
            base.domain.check_remote(f"@{self.entry}")
            self._agree_on_program(inputs, base)
        else:
            base.domain.check(f"@{self.entry}")
            self.check_inputs(inputs)
        results = compiled(*inputs)
        return results[0] if len(results) == 1 else results

    @staticmethod
    def _donated(donate: bool | Sequence[int], count: int) -> frozenset[int]:
        """The donated input indices (`donate=True`: all of them)."""
        if donate is True:
            return frozenset(range(count))
        if donate is False:
            return frozenset()
        indices = frozenset(donate)
        bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < count]
        if bad:
            raise ProgramInputError(f"donate names inputs {sorted(bad)} of {count}")
        return indices

    def _agree_on_program(self, inputs: Sequence[Any], base: Any) -> None:
        """One small exchange: same program everywhere, inputs accepted everywhere."""
        local_error: ProgramInputError | None = None
        try:
            self.check_inputs(inputs)
        except ProgramInputError as e:
            local_error = e
        step = _AgreementStep(f"@{self.entry} (program agreement)")
        device = _device_of(inputs, base)
        row = torch.tensor(
            [0 if local_error else 1, self.fingerprint], dtype=torch.int64, device=device
        )
        gathered = torch.empty(2 * base.size, dtype=torch.int64, device=device)
        try:
            base.complete(_all_gather_single(gathered, row, group=base.group, async_op=True), step)
        except DistirError as e:
            base.domain.poison(e)
            raise
        rows = gathered.view(base.size, 2).tolist()
        if all(ok == 1 and fp == self.fingerprint for ok, fp in rows):
            return
        # Something differs: every rank knows, so every rank explains and raises
        # (the rank whose own inputs were rejected raises that error itself).
        details = self._explain_disagreement(rows, local_error, inputs, base, step)
        error: DistirError = ProgramMismatch(details)
        if local_error is not None:
            local_error.add_note(details)
            error = local_error
        base.domain.poison(error)
        raise error

    def _explain_disagreement(self, rows, local_error, inputs, base, step) -> str:
        mine = {
            "error": str(local_error) if local_error else None,
            "inputs": [describe_tensor(x) for x in inputs],
        }
        try:
            reports = _gather_objects(base, mine, step)
        except DistirError:
            reports = [None] * base.size
        lines = []
        programs: dict[int, list[int]] = {}
        for r, (_ok, fp) in enumerate(rows):
            programs.setdefault(fp, []).append(r)
        if len(programs) > 1:
            listed = "; ".join(
                f"ranks {ranks} run program {fp:016x}" for fp, ranks in programs.items()
            )
            lines.append(f"ranks run different programs ({listed}; this rank, "
                         f"{base.rank}, runs {self.fingerprint:016x})")
        for r, (ok, _fp) in enumerate(rows):
            if ok == 0:
                why = reports[r]["error"] if reports[r] else "its inputs were rejected"
                lines.append(f"rank {r} rejected its inputs: {why}")
        return f"@{self.entry}: " + "; ".join(lines)

    def check_inputs(self, inputs: Sequence[Any]) -> None:
        name = f"@{self.entry}"
        if len(inputs) != len(self.input_types):
            raise ProgramInputError(
                f"{name} takes {len(self.input_types)} inputs, got {len(inputs)}"
            )
        for i, (value, t) in enumerate(zip(inputs, self.input_types, strict=True)):
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

    def _bind_torch(self, group: Any) -> tuple[CompiledBlock, list[Any], Any]:
        from distir.backends.groups import ProcessGroupResource, create_declared_groups

        base = ProcessGroupResource(group)
        base.domain.check(f"@{self.entry}")
        resources = create_declared_groups(self.groups, base, timeout=self.timeout)
        domain = base.domain

        def prepare(op: Operation):
            impl = self.choices[op]
            regions = [compiler.compile_combine(op)] if isinstance(op, AllReduceOp) and (
                op.kind is None
            ) else []
            invocation = make_invocation(op, regions, op_options(op))
            resource = resources[invocation.group]
            if isinstance(resource, ProcessGroupResource):
                check_group_assumption(invocation, resource.size)
            return impl, invocation, resource

        def bind(op: Operation):
            impl, invocation, resource = prepare(op)
            n_results = len(op.results)
            description = invocation.description

            def kernel(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
                domain.check(description)
                try:
                    results = impl.execute(invocation, xs, resource, in_place=False)
                    for i in range(n_results):
                        check_result_shape(invocation, i, results[i])
                except BaseException as e:
                    # Peers may be blocked in this collective or the next:
                    # poison the domain so nothing else enters the backend.
                    domain.poison(e)
                    raise
                return results

            return kernel

        def bind_start(op: Operation):
            impl, invocation, resource = prepare(op)
            description = invocation.description

            def start(*xs: torch.Tensor):
                domain.check(description)
                try:
                    wait = impl.start(invocation, xs, resource)
                except BaseException as e:
                    domain.poison(e)
                    raise

                def finish() -> tuple[torch.Tensor, ...]:
                    try:
                        results = wait()
                        for i in range(len(results)):
                            check_result_shape(invocation, i, results[i])
                    except BaseException as e:
                        domain.poison(e)
                        raise
                    return results

                return finish

            return start

        compiler = BlockCompiler(self.module, bind, bind_start)
        compiled = compiler.compile_function(self.entry)
        live = [r for r in resources.values() if isinstance(r, ProcessGroupResource)]
        self._bound[group] = (compiled, live, base)
        return self._bound[group]

    def _entry_function(self) -> func.FuncOp:
        for op in self.module.ops:
            if isinstance(op, func.FuncOp) and op.sym_name.data == self.entry:
                return op
        raise CompileError(f"the module has no entry function @{self.entry}")

    # -- simulation -------------------------------------------------------------

    def simulate(
        self, inputs_per_rank: Sequence[Sequence[torch.Tensor]], *, timeout: float = 30.0
    ) -> list[Any]:
        from distir.interpreters.reference import run_simulation

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
    deadline: Duration = 60.0,
    agreement: bool = True,
    verify_spmd: bool = True,
) -> Program:
    """Verify, lower (`pipeline`, in `distir-opt -p` syntax) and plan a program.

    `deadline` bounds every collective of every run (overridable per run and
    per op with a `deadline_ms` attribute); `agreement` makes ranks check,
    at each run, that they run the same program on accepted inputs;
    `verify_spmd` rejects collectives under rank-dependent control flow.
    """
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
    if verify_spmd:
        from distir.passes.verify_spmd import SPMDViolation
        from distir.passes.verify_spmd import verify_spmd as check_spmd

        try:
            check_spmd(module, entry)
        except SPMDViolation as e:
            raise CompileError(str(e)) from None
    return Program(
        module,
        entry=entry,
        registry=registry,
        implementations=implementations,
        timeout=timeout,
        deadline=deadline,
        agreement=agreement,
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
