"""Binding: a planned program on this rank's process groups.

A `Binding` is created when a program first runs on a base group. After
the first run's agreement (so every rank knows every rank runs this very
program), it validates the declared groups and meshes against the base
group (a rank beyond it is a named error on every rank, before any
`new_group`), creates or reuses the declared process groups under the run's
deadline, and compiles the entry function with a kernel per dist op over
them. Nothing of this happens again for the same (program, group).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from xdsl.ir import Operation

from distir.backends.domain import group_alive
from distir.backends.groups import (
    ProcessGroupResource,
    check_declarations,
    create_declared_groups,
)
from distir.interpreters.block_compiler import BlockCompiler, CompiledBlock
from distir.interpreters.checks import check_group_assumption, check_result_shape, check_root
from distir.interpreters.invocation import Invocation
from distir.ir.analysis import default_algorithm
from distir.ir.dialect import BroadcastOp
from distir.runtime.planning import Plan
from distir.runtime.requirements import WorldSizeError, check_world_size


def result_check(invocation: Invocation) -> Callable[[Sequence[torch.Tensor]], None]:
    """Checks an op's results have the static dims their IR types declare:
    one comparison per result when every dim is static."""
    shapes = invocation.result_shapes
    static = [None if None in shape else torch.Size(shape) for shape in shapes]

    def check(results: Sequence[torch.Tensor]) -> None:
        for i, size in enumerate(static):
            if size is None or results[i].shape != size:
                check_result_shape(invocation, i, results[i])

    return check


class Binding:
    """One program on one base group of this rank."""

    def __init__(self, plan: Plan, group: Any):
        self.plan = plan
        self.base = ProcessGroupResource(group)
        self.resources: list[ProcessGroupResource] = [self.base]
        self.compiled: CompiledBlock | None = None

    @property
    def ready(self) -> bool:
        return self.compiled is not None

    @property
    def alive(self) -> bool:
        """Whether the base group still exists (a destroyed one releases
        this binding, its resources and its domain)."""
        return group_alive(self.base.pg)

    def configure(self, deadline_s: float, agreement: bool) -> None:
        for resource in self.resources:
            resource.deadline_s = deadline_s
            resource.agreement = agreement

    def prepare(self, deadline_s: float) -> None:
        """Creates the declared groups and compiles the entry function."""
        plan = self.plan
        size = self.base.size
        check_declarations(plan.groups, plan.meshes, size)
        try:
            # The same on every rank: refused before any group is created.
            check_world_size(plan.module, size, plan.entry)
        except WorldSizeError as e:
            raise WorldSizeError(
                f"@{plan.entry} is refused on group {self.base.name}: {e}. Its meaning "
                f"depends on the group size (this happens on the smaller group formed by "
                f"distir.recover); compile it again for {size} ranks"
            ) from None
        resources = create_declared_groups(plan.groups, self.base, deadline_s)
        live = [r for r in resources.values() if isinstance(r, ProcessGroupResource)]

        def target(op: Operation):
            invocation = plan.invocations[op]
            resource = resources[invocation.group]
            implementation = plan.choices[op]
            if isinstance(resource, ProcessGroupResource):
                check_group_assumption(invocation, resource.size)
                root = invocation.properties.get("root")
                if isinstance(op, BroadcastOp) and root is not None:
                    check_root(invocation, root, resource.size)  # the same on every rank
                if op in plan.auto_algorithm:
                    implementation = plan.select(op, default_algorithm(op, resource.size))
            return implementation, invocation, resource

        def bind(op: Operation):
            implementation, invocation, resource = target(op)
            check = result_check(invocation)

            def kernel(xs: Sequence[torch.Tensor], writable: frozenset[int]):
                try:
                    results = implementation.execute(invocation, xs, resource, writable)
                except RuntimeError as e:  # raised by the backend when submitting
                    raise resource.failure(e, invocation) from None
                check(results)
                return results

            return kernel

        def bind_start(op: Operation):
            implementation, invocation, resource = target(op)
            check = result_check(invocation)

            def start(xs: Sequence[torch.Tensor], writable: frozenset[int]):
                try:
                    wait = implementation.start(invocation, xs, resource, writable)
                except RuntimeError as e:
                    raise resource.failure(e, invocation) from None

                def finish() -> tuple[torch.Tensor, ...]:
                    try:
                        results = wait()
                    except RuntimeError as e:
                        raise resource.failure(e, invocation) from None
                    check(results)
                    return results

                return finish

            return start

        compiled = BlockCompiler(plan.module, bind, bind_start).compile_function(plan.entry)
        self.resources = live
        self.configure(self.base.deadline_s, self.base.agreement)
        self.compiled = compiled

