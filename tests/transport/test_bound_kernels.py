"""Bound kernels (`Implementation.bind`) against `execute`, at P=2.

An implementation may resolve its hot path when a program is bound (the
reduction, the root, the options) and return a flatter kernel than
`execute`. That kernel is a second way to run the op, so it must be the
same function: every implementation that overrides `bind`, or describes
its kernel as one backend collective (`Implementation.direct`), is checked
here, on real gloo ranks, against its own `execute` for every element type and reduction kind or root,
donated or not, contiguous or not, and with a tensor of another dtype than
the IR declares: the same bits, the same aliasing, the same inputs after,
or the same error.
"""

from __future__ import annotations

import pytest
import torch

import distir
from distir.errors import CompileError
from distir.ir.attributes import REDUCTION_KINDS
from distir.runtime.launch import launch
from distir.transport.implementations import distributed_operation_contributions
from distir.transport.registry import Implementation

#: element types gloo moves, as IR spells them
ELEMENTS = ["i1", "i8", "ui8", "i32", "i64", "f16", "bf16", "f32", "f64"]

#: implementation class -> the op texts (with {t} for the tensor type) its cases run
CASES: dict[str, list[str]] = {
    "NativeAllReduceImplementation": [f"dist.all_reduce {kind} %x" for kind in REDUCTION_KINDS],
    "BroadcastImplementation": ["dist.broadcast %x root 0", "dist.broadcast %x root 1"],
    "PsumImplementation": ["dist.psum %x"],
}


def _overriding_bind() -> list[Implementation]:
    """The implementations with a kernel of their own: `bind`, or `direct`
    (whose description the default `bind` returns as the kernel)."""
    return [
        i
        for i in distributed_operation_contributions()
        if type(i).bind is not Implementation.bind or type(i).direct is not Implementation.direct
    ]


def test_every_implementation_with_its_own_bind_is_checked_here():
    assert sorted(type(i).__name__ for i in _overriding_bind()) == sorted(CASES)


def _values(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A 3x2 tensor (transposed for the non-contiguous layout) with the
    values that tell reductions apart: NaN, signed zeros, infinities,
    extremes that wrap."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (3, 2), generator=g).bool()
    if dtype.is_floating_point:
        x = torch.randn(3, 2, generator=g, dtype=torch.float64) * 4
        specials = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), 1e4])
        x.view(-1)[seed % 6] = specials[seed % 6]
        return x.to(dtype)
    info = torch.iinfo(dtype)
    x = torch.randint(-100, 100, (3, 2), generator=g).to(dtype)
    x.view(-1)[seed % 6] = info.max if seed % 2 else info.min
    return x


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _outcome(kernel, x: torch.Tensor, writable: frozenset[int]):
    pristine = x.clone()
    try:
        (y,) = kernel((x,), writable)
    except Exception as e:  # noqa: BLE001 - compared with the other kernel's
        return ("error", type(e).__name__, None, None)
    aliased = y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    return ("ok", y, aliased, _same_bits(x, pristine))


def _compare(bound, generic, dtype: torch.dtype, seed: int, other: torch.dtype) -> list[str]:
    problems = []
    for layout in ("contiguous", "transposed", "other dtype"):
        for writable in (frozenset(), frozenset({0})):
            base = _values(other if layout == "other dtype" else dtype, seed)
            a, b = base.clone(), base.clone()
            if layout == "transposed":
                a, b = a.t(), b.t()
            else:
                a, b = a.reshape(2, 3), b.reshape(2, 3)
            mine, theirs = _outcome(bound, a, writable), _outcome(generic, b, writable)
            where = f"{layout}, writable {set(writable)}"
            if mine[0] != theirs[0] or (mine[0] == "error" and mine[1] != theirs[1]):
                problems.append(f"{where}: bound {mine[:2]} vs execute {theirs[:2]}")
            elif mine[0] == "ok":
                if not _same_bits(mine[1], theirs[1]):
                    problems.append(f"{where}: bound {mine[1]} vs execute {theirs[1]}")
                if mine[2:] != theirs[2:]:
                    problems.append(
                        f"{where}: bound (aliases, input kept) {mine[2:]} vs execute {theirs[2:]}"
                    )
                if not writable and not mine[3]:
                    problems.append(f"{where}: the bound kernel wrote an input it may not")
    return problems


def _check_every_case(ctx) -> list[str]:
    from distir.core.dtypes import element_dtype
    from distir.transport.groups import ProcessGroupResource

    resource = ProcessGroupResource(None)
    resource.agreement = False
    problems: list[str] = []
    checked = 0
    for cls in sorted(CASES):
        for text in CASES[cls]:
            for n, element in enumerate(ELEMENTS):
                t = f"tensor<2x3x{element}>"
                try:
                    program = distir.compile(
                        f"func.func @main(%x: {t}) -> {t} {{\n  %y = {text} : {t}\n"
                        f"  func.return %y : {t}\n}}",
                        agreement=False,
                    )
                except CompileError:  # a kind the type does not take
                    continue
                ((op, impl),) = program.plan.choices.items()
                assert type(impl).__name__ == cls, (text, impl)
                invocation = program.plan.invocations[op]
                dtype = element_dtype(op.operands[0].type)
                other = torch.float64 if dtype != torch.float64 else torch.int32
                bound = impl.bind(invocation, resource)
                generic = impl.executing(invocation, resource)
                seed = 7919 * n + 31 * checked + ctx.rank
                for problem in _compare(bound, generic, dtype, seed, other):
                    problems.append(f"rank {ctx.rank}, {text} on {t}: {problem}")
                checked += 1
    assert checked >= 40, checked  # every type of every case that compiles
    return problems


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_bound_kernels_compute_what_execute_computes_on_every_type_and_layout():
    results = launch(_check_every_case, 2, pass_context=True, timeout=90)
    assert results == [[], []], "\n".join(p for r in results for p in r)


class _Recorder:
    """A process group method that records the timeouts it is given, and
    raises `error` when set."""

    def __init__(self):
        self.timeouts: list[float] = []
        self.error: RuntimeError | None = None

    def __call__(self, tensors, opts):
        self.timeouts.append(opts.timeout.total_seconds())
        if self.error is not None:
            raise self.error
        recorder = self

        class Work:
            def wait(self, timeout):
                recorder.timeouts.append(timeout.total_seconds())

        return Work()


def _all_reduce_invocation(deadline_ms: int | None = None):
    t = "tensor<4xf32>"
    attr = f" {{deadline_ms = {deadline_ms} : i64}}" if deadline_ms is not None else ""
    program = distir.compile(
        f"func.func @main(%x: {t}) -> {t} {{\n  %y = dist.all_reduce sum %x{attr} : {t}\n"
        f"  func.return %y : {t}\n}}"
    )
    (invocation,) = program.plan.invocations.values()
    return invocation


def _bound(resource, submit, invocation):
    """The bound kernel of a direct all-reduce that submits to `submit`,
    as `call(tensors)` on a writable f32 operand."""
    import torch.distributed as dist

    from distir.transport.buffers import pooled_copy
    from distir.transport.direct import DirectCollective

    direct = DirectCollective(
        invocation, resource, submit, dist.AllreduceOptions, (), torch.float32, pooled_copy
    )
    kernel = direct.kernel(execute=None)
    return lambda tensors: kernel(tensors, frozenset({0}))


def test_a_bound_collective_waits_under_the_deadline_its_resource_holds_at_each_call(
    one_rank_world,
):
    from distir.transport.groups import ProcessGroupResource

    resource = ProcessGroupResource(None)
    submit = _Recorder()
    call = _bound(resource, submit, _all_reduce_invocation())
    for deadline in (5.0, 5.0, 7.5, 5.0):  # a run's own deadline, then the program's again
        resource.deadline_s = deadline
        call([torch.zeros(4)])
        assert submit.timeouts[-2:] == [deadline, deadline]
    # An op's own deadline_ms wins over the run's.
    fixed = _Recorder()
    call = _bound(resource, fixed, _all_reduce_invocation(250))
    for deadline in (5.0, 7.5):
        resource.deadline_s = deadline
        call([torch.zeros(4)])
    assert fixed.timeouts == [0.25] * 4


def test_a_bound_collective_that_fails_raises_a_named_error(one_rank_world):
    from distir.errors import CollectiveFailed, DeadlineExceeded
    from distir.transport.groups import ProcessGroupResource

    resource = ProcessGroupResource(None)
    submit = _Recorder()
    call = _bound(resource, submit, _all_reduce_invocation())
    submit.error = RuntimeError("[gloo] Timed out waiting 5000ms for recv operation")
    with pytest.raises(DeadlineExceeded, match="dist.all_reduce"):
        call([torch.zeros(4)])
    submit.error = RuntimeError("Connection reset by peer")
    with pytest.raises(CollectiveFailed, match="a peer may have exited"):
        call([torch.zeros(4)])
