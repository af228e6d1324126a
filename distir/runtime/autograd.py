"""Programs in torch autograd: a run on inputs that require grad is one
autograd node whose backward runs the program's derived backward program.

`Program.run` hands such a run here. The `vjp` pass (`distir.passes.vjp`)
derives, once per program, `@main_fwd` (the program, also returning the
residuals its backward reads) and `@main_bwd` (cotangents and residuals ->
gradients), each compiled as a `Program` of its own: verified, agreed, run
under the deadline and in the group's execution domain like any other, so a
rank failing during backward is a named error on every rank.

Why one node per run (a `torch.autograd.Function`), not one per op: the
backward of a run is one program, so its collectives are issued in one
order fixed by the IR on every rank, whatever order autograd's engine visits
nodes in; and one agreement covers them all. Ranks must run the backward
together, as they ran the forward: every rank calls `backward()` through
the run's results (a rank that does not leaves its peers at the deadline,
a named error).

What is agreed: the forward program differs from the plain one (it has
another entry and fingerprint), so ranks of which some record gradients and
some do not fail the agreement together (`ProgramMismatch`) instead of
running different backwards. A program with an op that has no derivative is
refused with `NotDifferentiable` before any collective (that rank poisons
its domain, so a peer that went on is told within its deadline + 2 s).

Limits: with `agreement=False` nothing checks that every rank records
gradients, so a rank that does not leaves its peers to their deadline in
the backward. Several runs in one autograd graph are backpropagated in the
order torch's engine picks, the same on every rank only when every rank
built the same graph (SPMD code does); each backward run's agreement
catches ranks that disagree.

What a backward reads. The backward program reads the cotangents and the
residuals the forward program returned. A residual may be the very tensor
handed to the caller as a result (the result of an all-reduce max is what
its backward compares with), and a caller may edit a result in place —
through autograd (`y += 1`), or around it (`y.data`, `y.detach()`,
`torch.no_grad()`, `.numpy()`), which torch's version counter does not
always see. So every residual that shares memory with a result or an
input is copied when the forward runs (`_owned`), and all residuals are
saved with `ctx.save_for_backward`: the backward reads only memory that no
caller can reach, and its gradients are those of the values the forward
computed, whatever happens to the results afterwards.

Double backward (`create_graph=True`) is refused: the residuals are not
outputs of the autograd node, so a backward recorded by autograd would miss
every second-order term that flows through them and return a silently wrong
second derivative. Each rank raises `NotDifferentiable` before the backward
program's first collective and poisons its domain, so a peer that went on
is told within its deadline + 2 s.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import DiagnosticException

from distir.errors import CompileError, NotDifferentiable, ProgramInputError
from distir.passes.vjp import VJPFunctions, add_vjp


class Program(Protocol):
    """What this module asks of a `distir.runtime.program.Program` (which
    imports this module, so this one names it only by its interface)."""

    module: ModuleOp
    entry: str
    plan: Any
    deadline_s: float | None
    agreement: bool

    def run(self, *inputs: Any, **options: Any) -> Any: ...

    def simulate(self, inputs_per_rank: Any, **options: Any) -> Any: ...

    def poison(self, group: Any, error: BaseException) -> None: ...


def records_gradient(inputs: Sequence[Any]) -> bool:
    """Whether autograd would record a run on `inputs`."""
    if not torch.is_grad_enabled():
        return False
    for x in inputs:  # a loop, not any(...): it runs on every run
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return True
    return False


def gradient_guard(
    dtypes: Sequence[torch.dtype], no_grad: bool = False
) -> Callable[[Sequence[Any]], bool] | None:
    """`records_gradient` specialised for a binding whose inputs have
    `dtypes` (checked before this guard runs): None when no input can
    require grad (torch allows it on floating and complex tensors only), or
    when the guard before this one accepts only inputs that do not
    (`no_grad`), so a run never records; else `records_gradient` itself,
    whose True sends the run to the general path."""
    if no_grad or not any(dtype.is_floating_point or dtype.is_complex for dtype in dtypes):
        return None
    return records_gradient


@dataclass(frozen=True)
class DifferentiableForm:
    """A program's forward (results + residuals) and backward programs."""

    forward: Program
    backward: Program
    functions: VJPFunctions


_forms: weakref.WeakKeyDictionary[Program, DifferentiableForm] = weakref.WeakKeyDictionary()


def _only(module: ModuleOp, name: str) -> ModuleOp:
    """A copy of `module` whose only function is `@name` (declarations kept)."""
    copy = module.clone()
    for op in list(copy.ops):
        if isinstance(op, func.FuncOp) and op.sym_name.data != name:
            copy.body.block.erase_op(op)
    return copy


def differentiable_form(program: Program) -> DifferentiableForm:
    """The forward and backward programs of `program` (derived once), or
    `NotDifferentiable` naming the op without a transpose rule."""
    form = _forms.get(program)
    if form is not None:
        return form
    compiled = type(program)  # the forward and backward are Programs too
    module = program.module.clone()
    functions = add_vjp(module, program.entry)
    try:
        module.verify()
    except DiagnosticException as e:  # a transpose rule built invalid IR: a bug
        raise CompileError(f"the backward of @{program.entry} does not verify: {e}") from None
    plan = program.plan
    common = dict(registry=plan.registry, deadline=program.deadline_s, agreement=program.agreement)
    form = DifferentiableForm(
        forward=compiled(
            _only(module, functions.forward),
            entry=functions.forward,
            implementations=plan.requested,
            **common,  # type: ignore[arg-type]
        ),
        backward=compiled(
            _only(module, functions.backward),
            entry=functions.backward,
            **common,  # type: ignore[arg-type]
        ),
        functions=functions,
    )
    _forms[program] = form
    return form


class _ProgramRun(torch.autograd.Function):
    """One run of a program as one autograd node."""

    @staticmethod
    def forward(ctx: Any, form: DifferentiableForm, options: dict, *inputs: torch.Tensor):
        outputs = form.forward.run(*inputs, **options)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        count = form.functions.results
        results, residuals = outputs[:count], outputs[count:]
        ctx.save_for_backward(*_owned(residuals, (*results, *inputs)))
        ctx.form, ctx.options = form, options
        ctx.result_specs = [(r.shape, r.dtype) for r in results]
        ctx.input_count = len(inputs)
        floats = set(form.functions.float_results)
        ctx.mark_non_differentiable(*(r for i, r in enumerate(results) if i not in floats))
        return results

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None):
        form: DifferentiableForm = ctx.form
        if torch.is_grad_enabled():  # create_graph=True: see the module docstring
            error = NotDifferentiable(
                f"@{form.forward.entry}: double backward (create_graph=True) through a "
                "distir program is not supported; its second derivative would miss the "
                "terms through the backward's residuals"
            )
            form.backward.poison(ctx.options["group"], error)
            raise error
        residuals = ctx.saved_tensors
        cotangents = []
        for i in form.functions.float_results:
            grad = grads[i]
            shape, dtype = ctx.result_specs[i]
            cotangents.append(
                torch.zeros(shape, dtype=dtype) if grad is None else grad.contiguous()
            )
        gradients = form.backward.run(*cotangents, *residuals, **ctx.options)
        gradients = gradients if isinstance(gradients, tuple) else (gradients,)
        per_input: list[torch.Tensor | None] = [None] * ctx.input_count
        for i, gradient in zip(form.functions.float_inputs, gradients):
            per_input[i] = gradient
        return (None, None, *per_input)


def _owned(residuals: Sequence[torch.Tensor], reachable: Sequence[Any]) -> list[torch.Tensor]:
    """`residuals`, each copied if it shares memory with a tensor of
    `reachable` (what the caller holds), so that no edit of those can change
    what the backward reads."""
    held = set()
    for x in reachable:
        if isinstance(x, torch.Tensor) and x.numel():
            held.add(x.untyped_storage().data_ptr())
    owned = []
    for r in residuals:
        shared = r.numel() and r.untyped_storage().data_ptr() in held
        owned.append(r.clone() if shared else r)
    return owned


def run_recorded(
    program: Program,
    inputs: Sequence[Any],
    *,
    group: Any,
    deadline: Any,
    donate: bool | Sequence[int],
) -> Any:
    """`program.run(*inputs)` recorded by autograd (see the module docstring)."""
    wanting = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.requires_grad]
    donated = range(len(inputs)) if donate is True else () if donate is False else donate
    clash = sorted(set(wanting) & set(donated))
    if clash:
        raise ProgramInputError(
            f"@{program.entry}: inputs {clash} require grad and cannot be donated"
        )
    try:
        form = differentiable_form(program)
    except NotDifferentiable as e:
        raise NotDifferentiable(
            f"@{program.entry}: inputs {wanting} require grad, and {e}; detach them or "
            "run under torch.no_grad()"
        ) from None
    options = {"group": group, "deadline": deadline}
    results = _ProgramRun.apply(form, options, *inputs)
    return results[0] if len(results) == 1 else results


def simulate_vjp(
    program: Program,
    inputs_per_rank: Sequence[Sequence[torch.Tensor]],
    cotangents_per_rank: Sequence[Sequence[torch.Tensor]],
    *,
    timeout: float = 30.0,
) -> tuple[list[tuple[torch.Tensor, ...]], list[list[torch.Tensor | None]]]:
    """The reference semantics of a run and its backward: every rank's
    results, and every rank's input gradients (None for non-float inputs)
    given one cotangent per float result on every rank."""
    form = differentiable_form(program)
    functions = form.functions
    outputs = form.forward.simulate(inputs_per_rank, timeout=timeout)
    outputs = [o if isinstance(o, tuple) else (o,) for o in outputs]
    results = [o[: functions.results] for o in outputs]
    backward_inputs = [
        [*cotangents, *o[functions.results :]]
        for cotangents, o in zip(cotangents_per_rank, outputs)
    ]
    gradients = form.backward.simulate(backward_inputs, timeout=timeout)
    per_rank: list[list[torch.Tensor | None]] = []
    for inputs, grads in zip(inputs_per_rank, gradients):
        grads = grads if isinstance(grads, tuple) else (grads,)
        row: list[torch.Tensor | None] = [None] * len(inputs)
        for i, g in zip(functions.float_inputs, grads):
            row[i] = g
        per_rank.append(row)
    return results, per_rank
