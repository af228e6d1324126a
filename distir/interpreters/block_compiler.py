"""Compiles a block of IR into one Python callable over tensors.

Compilation happens once: each op becomes a kernel (see `local_ops`), each
SSA value a slot in a flat list, and the callable runs the kernels in order.
Nothing walks IR at run time, so dispatch costs a few microseconds per op.

Ops that communicate (`dist.*`) are not compiled here: the compiler asks its
`bind_dist_op` callback for their kernel, which is how the same compiler
serves real torch.distributed execution and the reference simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from xdsl.dialects import func, scf
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue

from distir.errors import DistirError, OpError, UnsupportedOpError
from distir.interpreters.kernels import LOCAL_KERNELS, Kernel
from distir.ir.dialect import AllReduceOp, WaveOp, YieldOp

TERMINATORS = (func.ReturnOp, YieldOp, scf.YieldOp)

DistBinder = Callable[[Operation], Kernel]
#: submits a dist op and returns the function that awaits its results
Starter = Callable[..., Callable[[], tuple[torch.Tensor, ...]]]
DistStarter = Callable[[Operation], Starter]


@dataclass(frozen=True)
class Step:
    kernel: Kernel
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    op: Operation
    #: slots whose last use is this step: dropped after it, so intermediates
    #: (and their buffers, which the result pool can then reuse) die early
    frees: tuple[int, ...] = ()


def _with_liveness(steps: list[Step], keep: tuple[int, ...]) -> list[Step]:
    last_use: dict[int, int] = {}
    for index, step in enumerate(steps):
        for slot in step.inputs:
            last_use[slot] = index
    kept = set(keep)
    frees: dict[int, list[int]] = {}
    for slot, index in last_use.items():
        if slot not in kept:
            frees.setdefault(index, []).append(slot)
    return [
        Step(s.kernel, s.inputs, s.outputs, s.op, tuple(frees.get(i, ()))) for i, s in enumerate(steps)
    ]


def _run_steps(steps: list[Step], env: list) -> None:
    for step in steps:
        try:
            results = step.kernel(*[env[i] for i in step.inputs])
        except DistirError:
            raise
        except Exception as e:  # a torch error: say which op raised it
            raise OpError(step.op, f"{type(e).__name__}: {e}") from e
        for slot, value in zip(step.outputs, results):
            env[slot] = value
        for slot in step.frees:
            env[slot] = None


class CompiledBlock:
    """A block as a callable: `block(*args) -> tuple of terminator operands`.

    `captured` lists values defined outside the block that it reads; callers
    pass them after the block arguments.
    """

    def __init__(
        self,
        steps: list[Step],
        n_slots: int,
        n_args: int,
        returned: tuple[int, ...],
        captured: tuple[SSAValue, ...],
    ):
        self.steps = steps
        self.n_slots = n_slots
        self.n_args = n_args
        self.returned = returned
        self.captured = captured

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        env: list = [None] * self.n_slots
        env[: len(args)] = args
        _run_steps(self.steps, env)
        return tuple(env[i] for i in self.returned)


class BlockCompiler:
    """Compiles blocks of one module; `bind_dist_op` supplies dist kernels."""

    def __init__(
        self,
        module: ModuleOp | None,
        bind_dist_op: DistBinder | None,
        bind_dist_start: DistStarter | None = None,
    ):
        self.module = module
        self.bind_dist_op = bind_dist_op
        self.bind_dist_start = bind_dist_start
        self._functions: dict[str, CompiledBlock] = {}
        self._compiling: set[str] = set()

    # -- entry points ---------------------------------------------------------

    def compile_function(self, name: str) -> CompiledBlock:
        if name in self._functions:
            return self._functions[name]
        fn = self._lookup_function(name)
        if name in self._compiling:
            raise UnsupportedOpError(fn, f"recursive call to @{name} is not supported")
        self._compiling.add(name)
        try:
            compiled = self.compile_block(fn.body.block)
        finally:
            self._compiling.discard(name)
        self._functions[name] = compiled
        return compiled

    def compile_combine(self, op: AllReduceOp) -> CompiledBlock:
        """The combine region of a generic all-reduce: local ops only."""
        return BlockCompiler(self.module, None).compile_block(op.combine.block)

    def compile_block(self, block: Block) -> CompiledBlock:
        slots: dict[SSAValue, int] = {arg: i for i, arg in enumerate(block.args)}
        n_local = len(block.args)
        captured: list[SSAValue] = []
        steps: list[Step] = []
        returned: tuple[int, ...] | None = None

        def slot_of(value: SSAValue, user: Operation) -> int:
            if value not in slots:
                # Defined outside this block: becomes a trailing argument.
                slots[value] = -1 - len(captured)
                captured.append(value)
            return slots[value]

        for op in block.ops:
            ins = [slot_of(v, op) for v in op.operands]
            if isinstance(op, TERMINATORS):
                returned = tuple(ins)
                break
            kernel, extra = self._kernel_for(op)
            ins += [slot_of(v, op) for v in extra]
            outs = []
            for result in op.results:
                slots[result] = n_local
                outs.append(n_local)
                n_local += 1
            steps.append(Step(kernel, tuple(ins), tuple(outs), op))
        if returned is None:
            raise UnsupportedOpError(
                block.parent_op() or "block", "block has no terminator"
            )

        # Captured values live after the locals: renumber them.
        def fix(i: int) -> int:
            return i if i >= 0 else n_local + (-1 - i)

        steps = [
            Step(s.kernel, tuple(map(fix, s.inputs)), s.outputs, s.op) for s in steps
        ]
        returned = tuple(map(fix, returned))
        steps = _with_liveness(steps, returned)
        if captured:
            # Captured values are passed after the block arguments, but slots
            # after the locals: shuffle them on entry.
            inner = CompiledBlock(steps, n_local + len(captured), n_local, returned, ())
            return _CapturingBlock(inner, len(block.args), n_local, tuple(captured))
        return CompiledBlock(steps, n_local, len(block.args), returned, ())

    # -- kernels for one op ---------------------------------------------------

    def _kernel_for(self, op: Operation) -> tuple[Kernel, Sequence[SSAValue]]:
        """The op's kernel and the captured values it needs after its operands."""
        factory = LOCAL_KERNELS.get(type(op))
        if factory is not None:
            try:
                return factory(op), ()
            except NotImplementedError as e:
                raise UnsupportedOpError(op, f"not supported: {e}") from e
        if isinstance(op, WaveOp):
            if self.bind_dist_op is None:
                raise UnsupportedOpError(op, "a combine region may not hold a wave")
            return self._wave_kernel(op)
        if op.name.startswith("dist."):
            if self.bind_dist_op is None:
                raise UnsupportedOpError(
                    op, "a combine region may only contain local (non-dist) ops"
                )
            return self.bind_dist_op(op), ()
        if isinstance(op, func.CallOp):
            callee = self.compile_function(op.callee.root_reference.data)
            return _call_kernel(callee), callee.captured
        if isinstance(op, scf.ForOp):
            return self._for_kernel(op)
        if isinstance(op, scf.IfOp):
            return self._if_kernel(op)
        raise UnsupportedOpError(
            op,
            "no kernel for this op (supported: dist, arith, tensor, linalg.broadcast, "
            "func.call, scf.for, scf.if)",
        )

    def _wave_kernel(self, op: WaveOp) -> tuple[Kernel, Sequence[SSAValue]]:
        """Starts every op of the wave in order, then awaits them in order."""
        inner = [o for o in op.body.block.ops if not isinstance(o, YieldOp)]
        captured: list[SSAValue] = []
        for o in inner:
            for v in o.operands:
                if v not in captured:
                    captured.append(v)
        plans = []
        for o in inner:
            start = (
                self.bind_dist_start(o)
                if self.bind_dist_start is not None
                else _eager_start(self.bind_dist_op(o))  # type: ignore[misc]
            )
            plans.append((start, tuple(captured.index(v) for v in o.operands)))
        produced = {r: (k, j) for k, o in enumerate(inner) for j, r in enumerate(o.results)}
        terminator = op.body.block.last_op
        assert isinstance(terminator, YieldOp)
        yielded = tuple(produced[v] for v in terminator.arguments)

        def run(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
            waiters = [start(*[values[i] for i in idx]) for start, idx in plans]
            results = [wait() for wait in waiters]
            return tuple(results[k][j] for k, j in yielded)

        return run, captured

    def _for_kernel(self, op: scf.ForOp) -> tuple[Kernel, Sequence[SSAValue]]:
        body = self.compile_block(op.body.block)
        n_iter = len(op.iter_args)

        def run(lb, ub, step, *rest):
            values, captured = rest[:n_iter], rest[n_iter:]
            for i in range(int(lb), int(ub), int(step)):
                values = body(torch.tensor(i, dtype=torch.int64), *values, *captured)
            return tuple(values)

        return run, body.captured

    def _if_kernel(self, op: scf.IfOp) -> tuple[Kernel, Sequence[SSAValue]]:
        then_block = self.compile_block(op.true_region.block)
        else_block = (
            self.compile_block(op.false_region.block)
            if op.false_region.blocks
            else None
        )
        n_then = len(then_block.captured)
        captured = list(then_block.captured) + (
            list(else_block.captured) if else_block else []
        )

        def run(cond, *caps):
            if bool(cond):
                return then_block(*caps[:n_then])
            return else_block(*caps[n_then:]) if else_block else ()

        return run, captured

    def _lookup_function(self, name: str) -> func.FuncOp:
        if self.module is not None:
            for op in self.module.ops:
                if isinstance(op, func.FuncOp) and op.sym_name.data == name:
                    if not op.body.blocks:
                        raise UnsupportedOpError(op, f"@{name} has no body")
                    return op
        raise DistirError(f"no function @{name} in the module")


class _CapturingBlock(CompiledBlock):
    """Runs a block whose captured values arrive after its arguments."""

    def __init__(self, inner: CompiledBlock, n_args: int, n_local: int, captured):
        super().__init__(inner.steps, inner.n_slots, n_args, inner.returned, captured)
        self.n_local = n_local

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        env: list = [None] * self.n_slots
        env[: self.n_args] = args[: self.n_args]
        env[self.n_local :] = args[self.n_args :]
        _run_steps(self.steps, env)
        return tuple(env[i] for i in self.returned)


def _eager_start(kernel: Kernel) -> Starter:
    def start(*inputs: torch.Tensor) -> Callable[[], tuple[torch.Tensor, ...]]:
        results = kernel(*inputs)
        return lambda: results

    return start


def _call_kernel(callee: CompiledBlock) -> Kernel:
    return lambda *args: callee(*args)
