"""A run specialised once per binding: each rule's per-run cost, composed.

`Program.run` keeps every rule of a run (each listed below) in its one
home: liveness of the group (`distir.transport.domain`), the run gate
(`distir.runtime.concurrency`), gradient recording (`autograd`), the
deadline (`Binding.configure`), the agreement (`agreement`), the input check
(`Plan.check_inputs`), donation and result ownership (`ownership`), the
result check (`binding.checked_kernel`). Most of what a rule decides on a
run is fixed once the program is bound to a group with a given `donate`:
a trusted plan that was agreed stays agreed, a signature of integer tensors
never records gradients, one donated input has nothing to overlap. So each
home also says what its rule costs per run for a binding:

- nothing (None, or a constant): the rule cannot fire on this binding;
- a guard: a cheap test of what can change between runs (an input's dtype,
  shape, memory layout, `requires_grad`; the group's liveness; the domain's
  failure; the deadline the resources hold) that is true when the rule's
  general code would decide exactly what the specialisation assumes; a
  false guard sends this run to the general path (`Program._run_bound`),
  which decides, copies or names the error as always;
- the full check: the rule's own function, called as the general path
  calls it (the agreement of a verified plan, the overlap check of several
  donated inputs, the ownership of results that may be program state).

`specialised_run` composes them, once per (binding, donate), into one
closure. The general path stays what it was and is the definition: the
specialised run must return the same results and raise the same errors on
every input (tests/runtime/test_specialised_run.py draws inputs and checks
both paths agree), and a guard exists wherever the two could differ.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from distir.errors import DistirError
from distir.runtime import autograd
from distir.runtime.binding import Binding
from distir.runtime.ownership import donation_for, mark_written_for, owned_results_for
from distir.transport.direct import DirectCollective
from distir.transport.domain import group_alive

#: what a specialised run returns when a guard before the gate failed: the
#: caller runs the general path instead (nothing was claimed or changed)
GENERAL = object()


def specialised_run(
    program: Any, binding: Binding, donate: bool
) -> Callable[[Sequence[Any]], Any] | None:
    """`program`'s runs on `binding` with `donate` (a bool), as one closure:
    `run(inputs)` returns what `Program.run` returns, raises what it
    raises, or returns `GENERAL` (nothing done) when the caller must take
    the general path. `run(inputs, who, submitted)` is a run `run_async`
    queued, already claimed on the gate as run `who` (the worker releases
    it), with the versions its inputs had when queued (`submitted`). None
    when this binding has no specialised run yet (not compiled, or a
    trusted plan not yet agreed)."""
    plan = binding.plan
    compiled = binding.compiled
    if compiled is None or not (plan.agreement or not binding.must_agree):
        return None
    base = binding.base
    pg, domain, gate = base.pg, base.domain, binding.gate
    what = program._what
    count = len(plan.input_types)
    dtypes = [dtype for dtype, _ in plan._input_specs]
    # Each rule's specialisation for this binding, from the rule's home.
    guard = plan.input_guard()
    inputs_accepted = guard.accepts if guard is not None else None  # None: the full check
    # What an input the guard accepted is also (contiguous, no grad).
    pinned = guard is not None and guard.contiguous_no_grad
    # None: never records (the dtypes are the declared ones once the input
    # guard passed; with no such guard, the general rule runs).
    records = (
        autograd.records_gradient
        if inputs_accepted is None
        else autograd.gradient_guard(dtypes, no_grad=pinned)
    )
    donation = donation_for(donate, count, contiguous=pinned)  # a constant or a per-run check
    mark_written = mark_written_for(count)
    owned = owned_results_for(count, program._maybe_shared)
    agreement = program._run_agreement if plan.agreement else None  # None: agreed once
    fingerprint = binding.fingerprint
    # The block as the run calls it (its donated sets: none, or every input).
    call = compiled.specialised((frozenset(), frozenset(range(count))))
    general = program._run_bound
    single = len(plan.output_types) == 1
    collective = direct_collective(binding)
    if collective is not None and inputs_accepted is not None:
        body = _direct_body(binding, collective, owned, call)
    else:

        def body(inputs: Sequence[Any], writable: frozenset[int]) -> tuple[Any, ...]:
            return owned(call(inputs, writable), inputs, writable)

    def run(inputs: Sequence[Any], who: Any = None, submitted: Any = None) -> Any:
        # Guards before the gate: a failing one has claimed nothing.
        if (
            not group_alive(pg)
            or domain.first_failure is not None
            or binding.configured != program.deadline_s
        ):
            return GENERAL
        sync = who is None  # else a queued run, claimed when it was queued
        if sync:
            who = gate.enter(what)
            if who is None:  # this thread's queued async runs go first
                return GENERAL
        try:
            if (inputs_accepted is not None and not inputs_accepted(inputs)) or (
                records is not None and records(inputs)
            ):
                return general(binding, inputs, None, donate, who, submitted)
            try:
                if agreement is not None:
                    inputs, base.hoisted = agreement.agree(
                        inputs, base, fingerprint, who, submitted
                    )
                else:
                    base.hoisted = ()
                    if inputs_accepted is None or submitted is not None:
                        inputs = plan.check_inputs(inputs, submitted)
                writable = donation if type(donation) is frozenset else donation(inputs)
                mark_written(inputs, writable)
                results = body(inputs, writable)
                domain.completed += 1  # as the general path: where `distir.recover` resumes
            except BaseException as e:
                # As the general path: nothing here enters a collective again.
                domain.poison(e)
                raise
        finally:
            if sync:
                gate.leave()
        return results[0] if single else results

    return run


def direct_collective(binding: Binding) -> DirectCollective | None:
    """The one backend collective a run of `binding` is, when its block is
    a single collective over its one argument whose implementation says
    what it submits (`Implementation.direct`) and whose result has the
    argument's type; else None."""
    compiled = binding.compiled
    step = compiled.direct_step if compiled is not None else None
    if step is None or compiled.n_args != 1:
        return None
    collective = binding.direct.get(step.op)
    return collective if collective is not None and collective.same_type else None


def _direct_body(
    binding: Binding,
    collective: DirectCollective,
    owned: Callable[..., tuple[Any, ...]],
    call: Callable[[Sequence[Any], frozenset[int]], tuple[Any, ...]],
) -> Callable[[Sequence[Any], frozenset[int]], tuple[Any, ...]]:
    """The body of a specialised run that is one backend collective
    (`direct_collective`): the block's kernel (`DirectCollective.kernel`)
    inlined, so the run submits and waits for the collective itself (one
    Python call to c10d where the block's kernel takes five: each costs
    about five times its own time right after a barrier at P=2). What the
    inlined kernel no longer checks holds by the run's guards: the input
    guard accepted the declared dtype and shape, and the result has that
    type (`same_type`: no result check); an input donation makes writable
    is contiguous (`donation_for`)."""
    resource, invocation = collective.resource, collective.invocation
    submit, out_of_place, current = collective.submit, collective.out_of_place, collective.current
    options = collective.options
    step = binding.compiled.direct_step
    # Whether the op may overwrite its donated operand (the block's liveness).
    overwrites = 0 in step.writable_when(frozenset({0}))
    monotonic = time.monotonic

    def body(inputs: Sequence[Any], writable: frozenset[int]) -> tuple[Any, ...]:
        x = inputs[0]
        start = monotonic()
        try:
            y = x if writable and overwrites else out_of_place(x)
            if y is not None:
                if current[0] != resource.deadline_s:
                    options()  # the deadline changed: its options
                opts, timeout = current[1]
                submit([y], opts).wait(timeout=timeout)
        except RuntimeError as e:  # as the kernel: a named distir error
            raise resource.failure(e, invocation, monotonic() - start) from None
        except DistirError:
            raise
        except Exception as e:  # as the block: an error naming the op
            raise step.error(e) from e
        # `y` None: a root that copies its input (the kernel's way).
        return owned((y,) if y is not None else call(inputs, writable), inputs, writable)

    return body


def specialised_submit(
    program: Any, binding: Binding, donate: bool
) -> Callable[[Sequence[Any]], Any] | None:
    """`program`'s `run_async` on `binding` with `donate`, submitted on the
    calling thread, when a run is one backend collective with nothing to
    exchange before it (a trusted plan, agreed: `direct_collective`):
    `submit(inputs)` returns a `torch.futures.Future` of what `run`
    returns (or of its named error, the domain poisoned), or `GENERAL`
    (nothing claimed, nothing changed) when the run must be queued as
    always. Not queued means no hop to the group's worker thread, whose
    wake-up competes for the interpreter with the submitting thread (in a
    DDP step, with backward). The rules are the specialised run's, in the
    same order; the collective's own timeout is the deadline (the backend
    fails the work when it expires), and the input is read when submitted
    (an operand not donated is copied then: what `run_async`'s queued copy
    is for). None when this binding has no such run."""
    plan = binding.plan
    compiled = binding.compiled
    if compiled is None or plan.agreement or binding.must_agree:
        return None
    guard = plan.input_guard()
    collective = direct_collective(binding)
    if guard is None or collective is None:
        return None
    base = binding.base
    pg, domain, gate = base.pg, base.domain, binding.gate
    what = program._what
    accepted = guard.accepts
    pinned = guard.contiguous_no_grad
    dtypes = [dtype for dtype, _ in plan._input_specs]
    records = autograd.gradient_guard(dtypes, no_grad=pinned)
    donation = donation_for(donate, 1, contiguous=pinned)
    mark_written = mark_written_for(1)
    owned = owned_results_for(1, program._maybe_shared)
    resource, invocation = collective.resource, collective.invocation
    submit_work, out_of_place, options = collective.submit, collective.out_of_place, collective.options
    step = compiled.direct_step
    overwrites = 0 in step.writable_when(frozenset({0}))
    monotonic = time.monotonic

    def named(error: BaseException, waited: float) -> BaseException:
        # As the specialised run's body names what it raises.
        if isinstance(error, DistirError):
            return error
        if isinstance(error, RuntimeError):
            return resource.failure(error, invocation, waited)
        return step.error(error)

    def submit(inputs: Sequence[Any]) -> Any:
        # Guards before the gate, as the specialised run: nothing claimed.
        if (
            not group_alive(pg)
            or domain.first_failure is not None
            or binding.configured != program.deadline_s
            or not accepted(inputs)
            or (records is not None and records(inputs))
        ):
            return GENERAL
        x = inputs[0]
        writable = donation if type(donation) is frozenset else donation(inputs)
        y = x if writable and overwrites else out_of_place(x)
        if y is None:  # a root that copies its input: the general path
            return GENERAL
        who = gate.claim_direct(what)
        if who is None:  # runs are queued: behind them
            return GENERAL
        future: Any = torch.futures.Future()
        base.hoisted = ()
        start = monotonic()
        try:
            mark_written(inputs, writable)
            opts, _ = options(False)
            work = submit_work([y], opts)
        except BaseException as e:  # noqa: BLE001 - handed to the future
            error = named(e, monotonic() - start)
            domain.poison(error)
            gate.leave()
            future.set_exception(error)
            return future

        def complete(done: Any) -> None:
            try:
                done.value()
                results = owned((y,), inputs, writable)
                domain.completed += 1  # as the general path
            except BaseException as e:  # noqa: BLE001 - handed to the future
                error = named(e, monotonic() - start)
                domain.poison(error)
                gate.leave()
                with gate.completing_direct():
                    future.set_exception(error)
                return
            gate.leave()  # before completing, as the worker
            with gate.completing_direct():
                future.set_result(results[0])

        work.get_future().add_done_callback(complete)
        return future

    return submit
