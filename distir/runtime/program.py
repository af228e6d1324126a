"""Compile-then-run: `distir.compile(...)` and `Program`.

`compile` verifies the module, runs the pass pipeline and plans the program
once (`planning.Plan`). `Program.run` then executes on the current rank: it
agrees with its peers (`agreement`), binds to the rank's process groups the
first time (`binding`), and runs the entry function, a compiled block (a
flat list of kernels over value slots), so a run does no IR walking.

The rule every run keeps: any exception raised on this rank during a run
(an input check, the agreement, group creation, any kernel, local or
collective) poisons the rank's execution domain before it propagates, and a
poisoned domain never enters a collective again until the user recovers
explicitly (see `distir.transport.domain`).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.utils.exceptions import DiagnosticException, ParseError

from distir.core.block_compiler import BlockCompiler
from distir.durations import Duration, seconds
from distir.errors import CompileError
from distir.ir.parsing import (
    describe_op,
    find_verify_failure,
    format_parse_error,
    make_context,
    parse_file,
    parse_module,
)
from distir.passes import apply_pipeline
from distir.runtime import autograd
from distir.runtime.agreement import RunAgreement
from distir.runtime.binding import Binding
from distir.runtime.concurrency import RunId
from distir.runtime.ownership import (
    input_versions,
    mark_written,
    owned_results,
    queued_inputs,
    results_maybe_shared,
    writable_inputs,
)
from distir.runtime.planning import Plan
from distir.runtime.specialised import GENERAL, specialised_run, specialised_submit
from distir.transport.domain import group_alive
from distir.transport.registry import ImplementationRegistry

ProgramSource = ModuleOp | str | Path


def load_module(source: ProgramSource) -> ModuleOp:
    """A module from IR text, a path to a .mlir file, or a module (cloned)."""
    if isinstance(source, ModuleOp):
        return source.clone()
    try:
        if isinstance(source, Path) or (
            isinstance(source, str) and "\n" not in source and source.endswith(".mlir")
        ):
            try:
                return parse_file(source)
            except OSError as e:
                raise CompileError(f"cannot read {source}: {e.strerror or e}") from None
        return parse_module(source, "<program>")
    except ParseError as e:
        raise CompileError(f"parse error: {format_parse_error(e)}") from None


def _verify(module: ModuleOp, when: str) -> None:
    try:
        module.verify()
    except DiagnosticException as e:
        failure = find_verify_failure(module)
        where = f" ({describe_op(failure[0])})" if failure is not None else ""
        raise CompileError(f"{when}: {e.args[0] if e.args else e}{where}") from None


#: every program of this process, weakly: see `_drop_dead_bindings`
_programs: weakref.WeakSet[Program] = weakref.WeakSet()


def _drop_dead_bindings() -> None:
    """Drops the bindings on destroyed groups from every program. A binding
    holds its group's threads and sockets; a program that ran on a group a
    recovery replaced and never runs again would keep them for the life of
    the process, so the first new binding anywhere (the first run on the
    new group) lets them go from all programs, not only its own."""
    for program in list(_programs):
        for key, binding in list(program._bindings.items()):
            if not binding.alive:
                # Its specialised run refers back to it: clear that cycle so
                # the binding goes now, not at the next garbage collection.
                program._bindings.pop(key, None)
                binding.specialised.clear()
                binding.submitted.clear()


class Program:
    """A compiled dist program: verified, lowered and planned."""

    def __init__(
        self,
        module: ModuleOp,
        *,
        entry: str = "main",
        registry: ImplementationRegistry | None = None,
        implementations: Mapping[str, str] | None = None,
        deadline: Duration = 60.0,
        agreement: bool = True,
    ):
        if registry is None:
            from distir.transport.implementations import distributed_operation_contributions

            registry = ImplementationRegistry(distributed_operation_contributions())
        self.module = module
        self.entry = entry
        self.deadline_s = seconds(deadline, "deadline")
        self.plan = Plan(module, entry, registry, implementations or {}, agreement)
        self._run_agreement = RunAgreement(self.plan)
        self._maybe_shared = results_maybe_shared(self.plan.function)
        self._bindings: dict[Any, Binding] = {}
        _programs.add(self)
        self._what = f"@{entry}"
        #: whether runs take their binding's specialised path
        #: (`distir.runtime.specialised`) once it exists; False: every run
        #: takes the general path, which defines what a run does
        self.specialise = True

    # -- inspection -----------------------------------------------------------

    def __str__(self) -> str:
        return str(self.module)

    @property
    def function(self):
        """The entry `func.func`."""
        return self.plan.function

    @property
    def agreement(self) -> bool:
        """Whether every run agrees (fixed at compile time)."""
        return self.plan.agreement

    def bound_fingerprint(self, group_size: int) -> int:
        """What ranks agree on when this program runs on `group_size` ranks
        (see `Plan.bound_fingerprint`)."""
        return self.plan.bound_fingerprint(group_size)

    @property
    def input_types(self) -> list:
        """The entry function's argument types."""
        return self.plan.input_types

    @property
    def output_types(self) -> list:
        """The entry function's result types."""
        return self.plan.output_types

    def plan_summary(self) -> list[tuple[str, str]]:
        """(op, implementation name) for every dist op, in program order."""
        return [(describe_op(op), impl.name) for op, impl in self.plan.choices.items()]

    def check_inputs(self, inputs: Sequence[Any]) -> None:
        """Raises `ProgramInputError` unless a run accepts `inputs` (the
        entry signature's types, in memory that holds their values)."""
        self.plan.check_inputs(inputs)

    # -- running --------------------------------------------------------------

    def run(
        self,
        *inputs: torch.Tensor,
        group: Any = None,
        deadline: Duration | None = None,
        donate: bool | Sequence[int] = False,
    ) -> Any:
        """Runs the entry function on this rank of `group` (default: world).

        Every collective must complete within `deadline` (seconds or a
        timedelta; default: the program's). Ranks first agree, in one
        exchange, that they all run this plan on accepted inputs: at every
        run, or for a program compiled with `agreement=False` at the first
        run on the group only (see `distir.runtime.agreement`).
        `donate` (True, or the indices of donated inputs) lets distir
        overwrite those inputs and return results that alias them, as JAX's
        `donate_argnums`; other inputs are never modified and no result
        aliases them or the program's constants. A donated input that
        overlaps another input, or is not contiguous, is not overwritten
        (`distir.runtime.ownership`). Returns the single result, or a tuple.
        Threads: see `distir.runtime.concurrency`.

            y = program.run(x, donate=True)   # x's memory may now hold y
        """
        # The hot path of every run: the binding's specialised run (a
        # trusted 4 KiB all-reduce is 12 us of c10d, and a microsecond of
        # Python here costs about five at P=2: benchmarks/README.md).
        binding = self._bindings.get(group)
        if binding is not None and deadline is None and (donate is True or donate is False):
            fast = binding.specialised.get(donate)
            if fast is not None:
                result = fast(inputs)
                if result is not GENERAL:
                    return result
        if binding is None or not group_alive(binding.base.pg):
            binding = self._binding(group)
        gate = binding.gate
        who = gate.enter(self._what)
        if who is None:  # this thread's queued async runs go first
            return self.run_async(*inputs, group=group, deadline=deadline, donate=donate).wait()
        try:
            result = self._run_bound(binding, inputs, deadline, donate, who)
        finally:
            gate.leave()
        self._specialise(binding, deadline, donate)
        return result

    def _specialise(
        self, binding: Binding, deadline: Duration | None, donate: bool | Sequence[int]
    ) -> None:
        """Makes `binding`'s specialised run for `donate` after a general
        run, if it can have one and has none yet."""
        if (
            self.specialise
            and deadline is None
            and (donate is True or donate is False)
            and donate not in binding.specialised
        ):
            fast = specialised_run(self, binding, donate)
            if fast is not None:
                binding.specialised[donate] = fast
                submit = specialised_submit(self, binding, donate)
                if submit is not None:
                    binding.submitted[donate] = submit

    def run_async(
        self,
        *inputs: torch.Tensor,
        group: Any = None,
        deadline: Duration | None = None,
        donate: bool | Sequence[int] = False,
        on_backend_thread: bool = False,
    ) -> torch.futures.Future:
        """`run`, queued on the group's distir worker: returns at once a
        future of what `run` returns (or of its named error). Runs of a
        group execute one at a time, in submission order. A queued run
        reads copies of its inputs made now, so the caller may change them
        at once; a donated input is not copied, and one changed in place
        before its run starts is a `ProgramInputError` on every rank
        (`distir.runtime.ownership.queued_inputs`).

        `on_backend_thread=True`: a run that is one backend collective with
        nothing to agree first (a trusted program after its first run) is
        submitted to the backend on the calling thread, with no hop to the
        worker, when no run is queued (`distir.runtime.specialised.
        specialised_submit`); its future then completes on the backend's
        thread, and a callback of it that starts a run on the group is
        refused with `ConcurrentRun` (it would race the submitting thread).
        Other runs are queued as always."""
        if on_backend_thread:
            binding = self._bindings.get(group)
            if binding is not None and deadline is None and (donate is True or donate is False):
                submit = binding.submitted.get(donate)
                if submit is not None:
                    future = submit(inputs)
                    if future is not GENERAL:
                        return future
        inputs = queued_inputs(inputs, donate)
        submitted = input_versions(inputs)

        def queued(who: RunId) -> Any:
            # The binding's specialised run as the run executes (its guards
            # read the group, the domain and the deadline then), or the
            # general path.
            binding = self._bindings.get(group)
            if binding is not None and deadline is None and (donate is True or donate is False):
                fast = binding.specialised.get(donate)
                if fast is not None:
                    result = fast(inputs, who, submitted)
                    if result is not GENERAL:
                        return result
            binding = self._binding(group)
            result = self._run_bound(binding, inputs, deadline, donate, who, submitted)
            self._specialise(binding, deadline, donate)
            return result

        return self._binding(group).gate.submit(self._what, queued)

    def poison(self, group: Any, error: BaseException) -> None:
        """Marks this rank's execution domain of `group` failed with `error`
        (what a run does before its error propagates), for a refusal decided
        outside a run: peers waiting in a collective hear it within their
        deadline + 2 s."""
        self._binding(group).base.domain.poison(error)

    def _binding(self, group: Any) -> Binding:
        """This program's binding on `group` (created on first use). A
        binding is alive while its process group object is registered;
        bindings on destroyed groups go: they hold the groups' threads and
        sockets."""
        binding = self._bindings.get(group)
        if binding is None or not binding.alive:
            _drop_dead_bindings()
            binding = self._bindings[group] = Binding(self.plan, group)
        return binding

    def _run_bound(
        self,
        binding: Binding,
        inputs: Sequence[torch.Tensor],
        deadline: Duration | None,
        donate: bool | Sequence[int],
        who: RunId,
        submitted: Sequence[int | None] | None = None,
    ) -> Any:
        """One run on `binding`, claimed on its gate as run `who`;
        `submitted`: the inputs' versions when `run_async` queued it."""
        base = binding.base
        if base.domain.first_failure is not None:  # failed before: `check` says how
            base.domain.check(self._what)
        try:
            if autograd.records_gradient(inputs):  # one autograd node per run
                # (queued: every input is a private copy, nothing to check)
                return autograd.run_recorded(
                    self, inputs, group=binding.group, deadline=deadline, donate=donate
                )
            deadline_s = self.deadline_s if deadline is None else seconds(deadline, "deadline")
            if deadline_s != binding.configured:
                binding.configure(deadline_s)
            # From here on, `inputs` are the accepted inputs as the run reads
            # them (`Plan.check_inputs`: a negation view is its value's copy).
            if not binding.trusted and binding.must_agree:
                # A trusted plan's first run on a group agrees too: groups are
                # created only once every rank is known to run this very plan.
                inputs, base.hoisted = self._run_agreement.agree(
                    inputs, base, binding.fingerprint, who, submitted
                )
                binding.agreed()
            else:
                base.hoisted = ()
                inputs = self.plan.check_inputs(inputs, submitted)
            writable = writable_inputs(inputs, donate)
            mark_written(inputs, writable)
            compiled = binding.compiled
            if compiled is None:
                compiled = binding.prepare(deadline_s)
            results = owned_results(
                compiled(*inputs, donated=writable), inputs, writable, self._maybe_shared
            )
            base.domain.completed += 1  # the position `distir.recover` agrees on
        except BaseException as e:
            # Peers may be waiting in a collective this rank will not enter:
            # poison the domain so that nothing here enters one again.
            base.domain.poison(e)
            raise
        return results[0] if len(results) == 1 else results

    # -- simulation -------------------------------------------------------------

    def simulate(
        self,
        inputs_per_rank: Sequence[Sequence[torch.Tensor]],
        *,
        timeout: float = 30.0,
        lost: Sequence[int] = (),
    ) -> list[Any]:
        """Runs the program for `len(inputs_per_rank)` ranks in this process
        with the reference semantics, and returns every rank's results.

        `lost` drops those ranks first, as `distir.recover` does: the others
        run as a group of the survivors, renumbered in order, and only their
        results are returned (what a recovered group must compute)."""
        from distir.core.simulator import run_simulation

        dropped = set(lost)
        inputs_per_rank = [
            self.plan.check_inputs(x) for r, x in enumerate(inputs_per_rank) if r not in dropped
        ]
        plan = self.plan

        def run_rank(rank_ctx) -> tuple[torch.Tensor, ...]:
            def bind(op: Operation):
                kernel = rank_ctx.bind(op, plan.invocations[op].regions)
                return lambda xs, writable: kernel(*xs)

            compiled = BlockCompiler(self.module, bind).compile_function(self.entry)
            results = compiled(*inputs_per_rank[rank_ctx.rank])
            return results[0] if len(results) == 1 else results

        return run_simulation(run_rank, len(inputs_per_rank), plan.groups, timeout)


def compile(
    source: ProgramSource,
    pipeline: str = "",
    *,
    entry: str = "main",
    implementations: Mapping[str, str] | None = None,
    registry: ImplementationRegistry | None = None,
    deadline: Duration = 60.0,
    agreement: bool = True,
    verify_spmd: bool = True,
) -> Program:
    """Verify, lower (`pipeline`, in `distir-opt -p` syntax) and plan a program.

    `source` is IR text, a path to a `.mlir` file or a module. `deadline`
    (seconds or a timedelta) bounds every collective of every run, and the
    creation of the program's process groups (overridable per run and per
    op with a `deadline_ms` attribute); `agreement` makes ranks check, at
    each run, that they run the same plan on accepted inputs (with
    `agreement=False`, at the first run on each group only);
    `verify_spmd` rejects collectives under rank-dependent control flow.
    """
    deadline_s = seconds(deadline, "deadline")
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
        deadline=deadline_s,
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
