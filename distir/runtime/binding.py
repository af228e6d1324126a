"""Binding: a planned program on this rank's process groups.

A `Binding` is created when a program first runs on a base group. After
the first run's agreement (so every rank knows every rank runs this very
program), it validates the declared groups and meshes against the base
group (a rank beyond it is a named error on every rank, before any
`new_group`), creates or reuses the declared process groups under the run's
deadline, and compiles the entry function with a kernel per dist op over
them. Nothing of this happens again for the same (program, group).

The binding also knows whether this rank's runs must agree: at every run
for a program compiled with `agreement=True`; for a trusted program only
until its plan (`Plan.bound_fingerprint`) has been agreed once on the
group's execution domain in this process, by this or an equal program
(so recompiling a trusted program does not make one rank agree while its
peers do not).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from xdsl.ir import Operation

from distir.core.block_compiler import BlockCompiler, CompiledBlock, DistKernel
from distir.core.checks import check_group_assumption, check_group_rank, check_result_shape
from distir.core.invocation import Invocation
from distir.core.semantics import semantics_of
from distir.runtime.concurrency import gate_for
from distir.runtime.planning import Plan
from distir.runtime.requirements import WorldSizeError, check_declarations, check_world_size
from distir.transport.direct import DirectCollective
from distir.transport.domain import group_alive
from distir.transport.groups import (
    NonMemberResource,
    ProcessGroupResource,
    create_declared_groups,
)
from distir.transport.registry import Implementation, choose


def result_check(invocation: Invocation) -> Callable[[Sequence[torch.Tensor]], None]:
    """Checks an op's results have the static dims their IR types declare."""
    static = [None if None in shape else torch.Size(shape) for shape in invocation.result_shapes]

    def check(results: Sequence[torch.Tensor]) -> None:
        for i, size in enumerate(static):
            if size is None or results[i].shape != size:
                check_result_shape(invocation, i, results[i])

    return check


def checked_kernel(
    run: DistKernel, invocation: Invocation, resource: ProcessGroupResource | NonMemberResource
) -> DistKernel:
    """`run` (an op's bound kernel) as the block calls it: a backend error
    raised on the way is a named distir error, and the results are checked
    against the op's IR types (`result_check`). This runs for every op of
    every run: the common case, one result of static shape, is checked
    inline."""
    shapes = invocation.result_shapes
    if len(shapes) == 1 and None not in shapes[0]:
        size = torch.Size(shapes[0])

        def kernel_one(xs: Sequence[torch.Tensor], writable: frozenset[int]):
            try:
                results = run(xs, writable)
            except RuntimeError as e:
                raise resource.failure(e, invocation) from None
            if results[0].shape != size:
                check_result_shape(invocation, 0, results[0])
            return results

        return kernel_one
    check = result_check(invocation)

    def kernel(xs: Sequence[torch.Tensor], writable: frozenset[int]):
        try:
            results = run(xs, writable)
        except RuntimeError as e:
            raise resource.failure(e, invocation) from None
        check(results)
        return results

    return kernel


#: execution domain -> the plan fingerprints agreed on it in this process
_AGREED_PLANS: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()
_AGREED_LOCK = threading.Lock()


class Binding:
    """One program on one base group of this rank."""

    def __init__(self, plan: Plan, group: Any):
        self.plan = plan
        #: the group as the caller named it (None: the default group)
        self.group = group
        self.base = ProcessGroupResource(group)
        self.base.agreement = plan.agreement
        #: what this rank agrees to execute on this group
        self.fingerprint = plan.bound_fingerprint(self.base.size, self.base)
        #: whether this rank's runs skip the agreement: a trusted plan known
        #: to be agreed on this domain (read on every run before `must_agree`)
        self.trusted = False
        self.resources: list[ProcessGroupResource] = [self.base]
        self.compiled: CompiledBlock | None = None
        #: the run gate of the base group's domain (`distir.runtime.concurrency`)
        self.gate = gate_for(self.base.domain)
        #: the deadline every resource holds (None: not yet set)
        self.configured: float | None = None
        #: donate (True/False) -> this binding's specialised run
        #: (`distir.runtime.specialised`), made after a general run
        self.specialised: dict[bool, Callable[[Sequence[Any]], Any]] = {}
        #: donate -> its `run_async(..., on_backend_thread=True)` submission
        #: (`distir.runtime.specialised.specialised_submit`), made with it
        self.submitted: dict[bool, Callable[[Sequence[Any]], Any]] = {}
        #: op -> its kernel as one backend collective, where its
        #: implementation says so (`Implementation.direct`)
        self.direct: dict[Operation, DirectCollective] = {}
        #: op -> the implementation it was bound to (`Plan.implementation_for`)
        self.implementations: dict[Operation, Implementation] = {}

    @property
    def alive(self) -> bool:
        """Whether the base group still exists (a destroyed one releases
        this binding, its resources and its domain)."""
        return group_alive(self.base.pg)

    @property
    def must_agree(self) -> bool:
        """Whether this run starts with the agreement exchange."""
        if self.plan.agreement:
            return True
        if not self.trusted:  # an agreed plan stays agreed: look until it is
            with _AGREED_LOCK:
                self.trusted = self.fingerprint in _AGREED_PLANS.get(self.base.domain, ())
        return not self.trusted

    def agreed(self) -> None:
        """Records that every rank agreed on this plan on this group (what
        lets a trusted plan skip later agreements)."""
        if self.plan.agreement:
            return
        with _AGREED_LOCK:
            _AGREED_PLANS.setdefault(self.base.domain, set()).add(self.fingerprint)

    def configure(self, deadline_s: float) -> None:
        """Sets the run's deadline on every resource (a run calls it when
        the deadline differs from `configured`)."""
        for resource in self.resources:
            resource.deadline_s = deadline_s
            resource.agreement = self.plan.agreement
        self.configured = deadline_s

    def prepare(self, deadline_s: float) -> CompiledBlock:
        """Creates the declared groups and compiles the entry function
        (returned, and kept as `compiled`)."""
        plan = self.plan
        size = self.base.size
        check_declarations(plan.module, size)
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
            if isinstance(resource, ProcessGroupResource):
                check_group_assumption(invocation, resource.size)
                record = semantics_of(type(op))
                for name in () if record is None else record.group_ranks:
                    value = invocation.properties.get(name)
                    if value is not None:  # same on every rank
                        check_group_rank(invocation, name, value, resource.size)
                # What the fingerprint covered for this size and backend.
                implementation = plan.implementation_for(op, resource.size, resource)
            else:  # a rank outside the op's group: chosen as on the base group
                implementation = choose(op, plan.preferences[op], self.base)
            self.implementations[op] = implementation
            return implementation, invocation, resource

        def bind(op: Operation):
            implementation, invocation, resource = target(op)
            if isinstance(resource, ProcessGroupResource):
                direct = implementation.direct(invocation, resource)
                if direct is not None:  # the kernel the specialised run inlines
                    self.direct[op] = direct
                    run = direct.kernel(implementation.execute)
                else:
                    run = implementation.bind(invocation, resource)
            else:  # a rank in no subgroup: `execute` raises that if the op ever runs here
                run = implementation.executing(invocation, resource)
            return checked_kernel(run, invocation, resource)

        def bind_start(op: Operation):
            implementation, invocation, resource = target(op)
            check = result_check(invocation)

            def start(xs: Sequence[torch.Tensor], writable: frozenset[int]):
                try:
                    wait = implementation.start(invocation, xs, resource, writable)
                except RuntimeError as e:
                    raise resource.failure(e, invocation) from None

                return lambda: _checked(wait, resource, invocation, check)

            return start

        compiled = BlockCompiler(plan.module, bind, bind_start).compile_function(plan.entry)
        self.resources = live
        self.configure(self.base.deadline_s)  # the new resources too
        self.compiled = compiled
        return compiled


def _checked(
    call: Callable[[], tuple[torch.Tensor, ...]],
    resource: ProcessGroupResource | NonMemberResource,
    invocation: Invocation,
    check: Callable[[Sequence[torch.Tensor]], object],
) -> tuple[torch.Tensor, ...]:
    """`call()`'s results after `check`; a backend error raised on the way
    (submitting or completing) is a named distir error."""
    try:
        results = call()
    except RuntimeError as e:
        raise resource.failure(e, invocation) from None
    check(results)
    return results
