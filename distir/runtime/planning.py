"""Planning: everything about a program's runs that is decided once.

`Plan(module, ...)` reads the verified, lowered module and decides, for the
whole life of the program: its entry function and signature, whether its
runs agree (the agreement mode), the implementation of every dist op (a
missing one fails compile; a generic all-reduce without a recorded
algorithm gets its group size's default; among an op's candidates, the
binding takes the first its group's capabilities serve,
`implementation_for`), its
fingerprint on a group of a given size (`bound_fingerprint`: what ranks
compare to know they execute the same plan), each op's
`Invocation` with its run options (a `deadline_ms` attribute, whether the
op exchanges a precondition before its payload), and which ops' preconditions
are *hoisted* into the one agreement exchange at the start of every run:
ops of the entry block, on the program's base group, whose every operand is
an entry argument, so their checks depend on the run's inputs only (the
first such variable all-to-all also sends its counts in that exchange).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType
from xdsl.ir import BlockArgument, Operation

from distir.core.block_compiler import BlockCompiler
from distir.core.dtypes import RUNNABLE_ELEMENT_TYPES, element_dtype, static_shape
from distir.core.invocation import Invocation
from distir.core.semantics import make_invocation, precondition_rule
from distir.errors import CompileError, UnsupportedOpError
from distir.ir.dialect import GroupDeclaration, GroupMemberOp, group_declarations
from distir.ir.facts import (
    AgreementRidesWithPayload,
    ChoosesAlgorithm,
    LocalCheck,
    RunsBodyInPlace,
    Structural,
    needs_agreement,
)
from distir.ir.parsing import describe_op, function_named, reachable_functions
from distir.ops.all_reduce.ir import known_combine_error
from distir.runtime.input_guard import InputGuard, native_guard
from distir.runtime.inputs import check_inputs
from distir.runtime.ownership import check_unchanged, is_plain, plain_inputs
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation, ImplementationRegistry, choose


def is_executable_dist_op(op: Operation) -> bool:
    """Ops an implementation executes (a wave is executed through its ops;
    groups, meshes and yields are declarations and terminators; a
    `LocalCheck` such as `dist.assert_reduced` is a plain kernel)."""
    return (
        op.name.startswith("dist.")
        and not op.has_trait(Structural)
        and not op.has_trait(LocalCheck)
    )


#: bumped whenever a change to distir changes what goes on the wire for the
#: same plan (a new row format, a new algorithm schedule)
WIRE_FORMAT = 2


def _hoistable(op: Operation, entry_block: Any) -> bool:
    """Whether `op` runs exactly once per run, on the base group, on entry
    arguments only: then its check can move into the run agreement."""
    parent = op.parent_block()
    if parent is not entry_block:
        wave = parent.parent_op() if parent is not None else None
        if not (isinstance(wave, RunsBodyInPlace) and wave.parent_block() is entry_block):
            return False
    on_base = not (isinstance(op, GroupMemberOp) and op.group is not None)
    return on_base and all(
        isinstance(v, BlockArgument) and v.block is entry_block for v in op.operands
    )


def entry_function(module: ModuleOp, entry: str) -> func.FuncOp:
    """The module's entry function `@entry`; a `CompileError` without one."""
    function = function_named(module, entry)
    if function is None:
        raise CompileError(f"the module has no entry function @{entry}")
    return function


def check_value_types(module: ModuleOp, entry: str) -> None:
    """Refuses, naming where, any value a run of `@entry` could compute whose
    type torch cannot hold. `i2`, `f8E4M3FN`, `f128` or `complex<f32>` are
    valid IR, but no torch dtype holds them: the program is refused when it
    is compiled, not with a TypeError from wherever the type is first read."""
    for function in reachable_functions(module, entry):
        name = f"@{function.sym_name.data} ({describe_op(function)})"
        signature = function.function_type
        for role, types in (("argument", signature.inputs), ("result", signature.outputs)):
            for i, t in enumerate(types.data):
                _check_value_type(t, role, i, name)
        for op in function.walk():
            if op is function:
                continue
            for value in op.results:
                _check_value_type(value.type, "result", value.index, op)
            for region in op.regions:
                for block in region.blocks:
                    for arg in block.args:
                        _check_value_type(arg.type, "block argument", arg.index, op)


def _check_value_type(t: Any, role: str, index: int, owner: Operation | str) -> None:
    try:
        element_dtype(t)
    except TypeError:
        where = owner if isinstance(owner, str) else describe_op(owner)
        element = t.element_type if isinstance(t, TensorType) else t
        raise CompileError(
            f"{role} #{index} of {where} has type {t}: distir runs on torch tensors, and no "
            f"torch dtype holds {element} (element types: {RUNNABLE_ELEMENT_TYPES})"
        ) from None


class Plan:
    """What a program runs, decided at compile time."""

    def __init__(
        self,
        module: ModuleOp,
        entry: str,
        registry: ImplementationRegistry,
        implementations: Mapping[str, str],
        agreement: bool = True,
    ):
        self.module = module
        self.entry = entry
        self.registry = registry
        self.requested = dict(implementations)
        #: whether every run agrees (else only the first run on each group);
        #: fixed for the program's life and part of its fingerprint
        self.agreement = agreement
        self.function = entry_function(module, entry)
        check_value_types(module, entry)
        self._text = f"{entry}\n{module}"
        self.groups: list[GroupDeclaration] = group_declarations(module)
        self.input_types = list(self.function.function_type.inputs.data)
        #: (dtype, torch.Size when every dim is static, else None) per input:
        #: what `check_inputs` compares on every run without reading the IR
        self._input_specs = [
            (element_dtype(t), None if None in shape else torch.Size(shape))
            for t in self.input_types
            for shape in (static_shape(t),)
        ]
        self._static_inputs = all(size is not None for _, size in self._input_specs)
        self.output_types = list(self.function.function_type.outputs.data)
        self.ops = [op for op in module.walk() if is_executable_dist_op(op)]
        #: ops whose algorithm follows from the group size (`ChoosesAlgorithm`:
        #: a generic all-reduce), chosen again when the program binds to a group
        self.auto_algorithm: set[Operation] = set()
        #: op -> its candidates in preference order (`registry.preferences`);
        #: binding takes the first its group serves (`implementation_for`)
        self.preferences: dict[Operation, tuple[Implementation, ...]] = {}
        #: (op, group size) -> a generic all-reduce's candidates for that size
        self._sized: dict[tuple[Operation, int | None], tuple[Implementation, ...]] = {}
        for op in self.ops:
            error = known_combine_error(op)
            if error is not None:
                raise CompileError(f"{describe_op(op)}: {error}")
            name = self._requested_name(op)
            default = None
            if name is None and isinstance(op, ChoosesAlgorithm):
                default = op.default_algorithm(op.static_group_size())  # type: ignore[attr-defined]
            if default is not None:
                self.auto_algorithm.add(op)
                self.preferences[op] = self._default_preferences(op, default)
            else:
                self.preferences[op] = registry.preferences(op, name)
        #: op -> its preferred implementation (what it runs with on a group
        #: that serves every candidate: on gloo, what every op runs with)
        self.choices: dict[Operation, Implementation] = {
            op: candidates[0] for op, candidates in self.preferences.items()
        }
        # Compile once with placeholder kernels: any unsupported local op, in the
        # program or in a combine region, fails here rather than at run time.
        self.compiler = BlockCompiler(module, lambda op: (lambda xs, w: ()))
        self.compiler.compile_function(entry)
        entry_block = self.function.body.block
        self.hoisted: list[Operation] = []
        #: the variable all-to-all whose send counts travel in the run
        #: agreement (the first hoistable one), so that its receive counts
        #: cost no exchange of their own
        self.counts_in_agreement: Operation | None = None
        self.invocations: dict[Operation, Invocation] = {}
        for op in self.ops:
            options: dict[str, Any] = {"agree": needs_agreement(op)}
            if options["agree"]:
                options["rule"] = precondition_rule(type(op))
            deadline = op.attributes.get("deadline_ms")
            if isinstance(deadline, IntegerAttr):
                options["deadline_s"] = deadline.value.data / 1000.0
            # A variable all-to-all's send counts ride in the run agreement's
            # row (one slot per peer, so for one such op per program); any
            # other exchanges its counts itself, and its check rides on that.
            counts = op.has_trait(AgreementRidesWithPayload)
            if (
                options["agree"]
                and _hoistable(op, entry_block)
                and not (counts and self.counts_in_agreement is not None)
            ):
                if counts:
                    options["counts_in_agreement"] = True
                    self.counts_in_agreement = op
                options["hoisted"] = len(self.hoisted)
                self.hoisted.append(op)
            # A region with a body (a generic all-reduce's combine) runs as local kernels.
            regions = [self.compiler.compile_local_region(r) for r in op.regions if r.blocks]
            self.invocations[op] = make_invocation(op, regions, options)

    def implementation_for(
        self, op: Operation, size: int | None, transport: Transport | None = None
    ) -> Implementation:
        """The implementation `op` runs with on `transport`, a group of
        `size` ranks: the first of its candidates (those chosen at compile
        time, or for a generic all-reduce that records no algorithm, the
        default algorithm's for that size) whose needs the transport's
        capabilities meet (`registry.choose`; None: the preferred one). The
        binding and the fingerprint both read it from here."""
        candidates = self.preferences[op]
        if op in self.auto_algorithm:
            candidates = self._sized.get((op, size)) or self._size_preferences(op, size)
        if transport is None:
            return candidates[0]
        return choose(op, candidates, transport)

    def _size_preferences(self, op: Operation, size: int | None) -> tuple[Implementation, ...]:
        assert isinstance(op, ChoosesAlgorithm)
        default = op.default_algorithm(size)
        candidates = self._default_preferences(op, default)  # type: ignore[arg-type]
        self._sized[(op, size)] = candidates
        return candidates

    def _group_sizes(self, op: Operation, base_size: int) -> list[int]:
        """Every size the group `op` runs on has on some rank (a declared
        group's subgroups may differ in size)."""
        if isinstance(op, GroupMemberOp) and op.group is not None:
            decl = op.group_declaration()
            if decl is not None:
                return sorted({len(part) for part in decl.rank_lists})
        return [base_size]

    def bound_fingerprint(self, base_size: int, transport: Transport | None = None) -> int:
        """A 63-bit digest of everything that decides what a rank executes
        when the program runs on a base group of `base_size` ranks: the
        lowered IR and entry point, the implementation every op runs with on
        every (sub)group size it meets on `transport`'s capabilities (so
        also the algorithm a generic all-reduce gets at bind time; declared
        subgroups are made with the base group's backend), the agreement mode and the wire
        format. Every rank of the group computes the same digest for the
        same plan, whatever its own subgroups. Deadlines are not in it:
        they change no byte on the wire."""
        parts = [f"wire {WIRE_FORMAT}", f"agreement {self.agreement}", f"size {base_size}"]
        for index, op in enumerate(self.ops):
            names = [
                f"{size}:{self.implementation_for(op, size, transport).name}"
                for size in self._group_sizes(op, base_size)
            ]
            parts.append(f"op {index} {op.name} {' '.join(names)}")
        text = "\n".join([*parts, self._text])
        digest = hashlib.sha256(text.encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1

    def describe(self, base_size: int, transport: Transport | None = None) -> str:
        """The plan's settings in words, for a mismatch report: the mode and
        the implementation of every op on this rank."""
        mode = "agreement at every run" if self.agreement else "trusted (agreement=False)"
        ops = ", ".join(
            f"{describe_op(op)} {self.implementation_for(op, size, transport).name}"
            for op in self.ops
            for size in self._group_sizes(op, base_size)[:1]
        )
        return f"{mode}; {ops}" if ops else mode

    def _default_preferences(self, op: Operation, algorithm: str) -> tuple[Implementation, ...]:
        """The candidates of a generic all-reduce's default algorithm, or
        the registry's defaults when the registry has no such one."""
        try:
            return self.registry.preferences(op, algorithm)
        except UnsupportedOpError:
            return self.registry.preferences(op, None)

    def _requested_name(self, op: Operation) -> str | None:
        if op.name in self.requested:
            return self.requested[op.name]
        if isinstance(op, ChoosesAlgorithm):
            return op.recorded_algorithm()
        return None

    def check_inputs(
        self, inputs: Sequence[Any], submitted: Sequence[int | None] | None = None
    ) -> Sequence[Any]:
        """The inputs as a run reads them: `inputs`, once they match the
        entry signature (dtype and every static dim) and each holds its
        value in memory of its own (`ownership.plain_inputs`: a negation
        view is replaced by a copy of its value), and for a queued run none
        changed since `run_async` read their versions (`submitted`). Raises
        `ProgramInputError` naming the input otherwise."""
        if submitted is not None:
            check_unchanged(inputs, submitted, f"@{self.entry}")
        specs = self._input_specs
        if self._static_inputs and len(inputs) == len(specs):
            for value, (dtype, size) in zip(inputs, specs):
                if not (
                    isinstance(value, torch.Tensor)
                    and value.dtype == dtype
                    and value.shape == size
                    and is_plain(value)
                ):
                    break
            else:  # the common case: fully static types, every input matches
                return inputs
        inputs = plain_inputs(inputs, f"@{self.entry}")
        check_inputs(inputs, self.function)
        return inputs

    def input_guard(self) -> InputGuard | None:
        """`check_inputs` specialised for a binding's runs
        (`distir.runtime.specialised`): for a fully static signature, a
        guard that is True when a run's inputs are accepted exactly as they
        are (the common case of `check_inputs`: each a tensor of its
        declared dtype and shape whose memory is its value), so a False
        sends the run to the general path, which copies or names the input;
        None when the signature has a dynamic dim (the full check runs).
        One native call where torch has it (`distir.runtime.input_guard`),
        else the accessors in Python."""
        if not self._static_inputs:
            return None
        specs = tuple(self._input_specs)
        native = native_guard(specs)
        if native is not None:
            return native
        if len(specs) == 1:
            ((dtype, size),) = specs

            def one(inputs: Sequence[Any]) -> bool:
                if len(inputs) != 1:
                    return False
                x = inputs[0]
                return (
                    isinstance(x, torch.Tensor)
                    and x.dtype == dtype
                    and x.shape == size
                    and is_plain(x)
                )

            return InputGuard(one, False)
        count = len(specs)

        def every(inputs: Sequence[Any]) -> bool:
            if len(inputs) != count:
                return False
            for x, (dtype, size) in zip(inputs, specs):
                if not (
                    isinstance(x, torch.Tensor)
                    and x.dtype == dtype
                    and x.shape == size
                    and is_plain(x)
                ):
                    return False
            return True

        return InputGuard(every, False)

    def hoisted_inputs(self, op: Operation, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """A hoisted op's operands: entry arguments, taken from the run's inputs."""
        return [inputs[v.index] for v in op.operands]  # type: ignore[attr-defined]
