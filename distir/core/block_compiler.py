"""Compiles a block of IR into one Python callable over tensors.

Compilation happens once: each op becomes a kernel (see `kernels`), each SSA
value a slot in a flat list, and the callable runs the kernels in order.
Nothing walks IR at run time, so dispatch costs a few microseconds per op.

Ops that communicate (`dist.*`) are not compiled here: the compiler asks its
`bind_dist_op` callback for their kernel, which is how the same compiler
serves real torch.distributed execution and the reference interpreter. A dist
kernel is called as `kernel(inputs, writable)`: `writable` holds the operand
positions it may overwrite, proved here once per op: the operand is used
only by this op, and it is either a value nothing else holds (a fresh result
of a kernel or collective of the same block) or a block argument the caller
donated. Intermediates die after their last use.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from xdsl.dialects import func, scf
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, BlockArgument, Operation, Region, SSAValue
from xdsl.traits import IsTerminator

from distir.core.kernels import FRESH_RESULTS, LOCAL_KERNELS, Kernel
from distir.core.semantics import LOCAL_CHECK_KERNELS, semantics_of
from distir.errors import DistirError, OpError, UnsupportedOpError
from distir.ir.facts import RunsBodyInPlace, Structural
from distir.ir.parsing import NO_KERNEL, NO_KERNEL_OPS, function_named
from distir.ir.region_program import RegionProgram, region_program


def _dialect_ops(dialect: str) -> str:
    names = sorted(t.name.removeprefix(dialect + ".") for t in LOCAL_KERNELS
                   if t.name.startswith(dialect + "."))  # fmt: skip
    return f"{dialect}.{{{', '.join(names)}}}"


#: what has a kernel, listed from the kernel table itself (a dialect whose
#: every op runs is named whole; tensor and linalg op by op), so that the
#: message never claims an op it cannot run
_SUPPORTED = (
    f"dist; arith; math; {_dialect_ops('tensor')}; {_dialect_ops('linalg')}; "
    "func.call; scf.for; scf.if"
)
#: the op with a kernel that does what an unsupported one does
_SHAPE_HINTS = {
    "tensor.expand_shape": "; tensor.reshape with a shape operand does the same",
    "tensor.collapse_shape": "; tensor.reshape with a shape operand does the same",
}

TERMINATORS = (func.ReturnOp, scf.YieldOp)


def _ends_block(op: Operation) -> bool:
    """A terminator whose operands are the block's results: a return, an
    `scf.yield`, or dist's own (the `Structural` terminator `dist.yield`)."""
    return isinstance(op, TERMINATORS) or (op.has_trait(IsTerminator) and op.has_trait(Structural))

#: kernel(inputs, writable) -> results
DistKernel = Callable[[Sequence[torch.Tensor], frozenset[int]], tuple[torch.Tensor, ...]]
DistBinder = Callable[[Operation], DistKernel]
#: starter(inputs, writable) -> the function that awaits the results
Starter = Callable[
    [Sequence[torch.Tensor], frozenset[int]], Callable[[], tuple[torch.Tensor, ...]]
]
DistStarter = Callable[[Operation], Starter]

_NOTHING: frozenset[int] = frozenset()
#: donation patterns a step remembers (a caller varying them without end
#: must not grow memory without end)
_WRITABLE_PATTERNS_KEPT = 16


@dataclass(frozen=True)
class Step:
    kernel: Callable[..., tuple[torch.Tensor, ...]]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    op: Operation
    #: slots whose last use is this step: dropped after it, so intermediates
    #: (and their buffers, which the result pool can then reuse) die early
    frees: tuple[int, ...] = ()
    #: a dist kernel, called as kernel(inputs, writable)
    dist: bool = False
    #: operand positions the dist kernel may overwrite on every run
    writable: frozenset[int] = _NOTHING
    #: (operand position, block argument index): writable when donated
    donatable: tuple[tuple[int, int], ...] = ()
    #: donated block arguments -> the operand positions then writable
    #: (filled as runs meet them: a program sees few donation patterns)
    _writable_when: dict[frozenset[int], frozenset[int]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def writable_when(self, donated: frozenset[int]) -> frozenset[int]:
        """The operand positions this step may overwrite when the run's
        caller donated the block arguments `donated`."""
        if not donated or not self.donatable:
            return self.writable
        writable = self._writable_when.get(donated)
        if writable is None:
            writable = self.writable | {p for p, arg in self.donatable if arg in donated}
            if len(self._writable_when) < _WRITABLE_PATTERNS_KEPT:
                self._writable_when[donated] = writable
        return writable

    def error(self, e: Exception) -> OpError:
        """What the block raises for a torch error its kernel raised."""
        return _op_error(self, e)


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
    return [replace(s, frees=tuple(frees.get(i, ()))) for i, s in enumerate(steps)]


def _fresh(op: Operation) -> bool:
    """Whether the op's results are new tensors nothing else holds."""
    if type(op) in FRESH_RESULTS:
        return True
    semantics = semantics_of(type(op))
    return semantics is not None and semantics.fresh_results(op)


def _writable(
    op: Operation, block: Block, order: dict[Operation, int]
) -> tuple[frozenset[int], tuple[tuple[int, int], ...]]:
    """Which operands `op` may overwrite: it is their last use, every earlier
    use in the block only read them (its results, if any, are fresh), and
    they are fresh values of this block or (when donated) its arguments."""
    writable, donatable = set(), []
    here = order[op]
    for position, value in enumerate(op.operands):
        if list(op.operands).count(value) != 1 or not _only_read_before(value, op, order, here):
            continue
        if isinstance(value, BlockArgument):
            if value.block is block:
                donatable.append((position, value.index))
        elif value.owner.parent_block() is block and _fresh(value.owner):
            writable.add(position)
    return frozenset(writable), tuple(donatable)


def _only_read_before(
    value: SSAValue, op: Operation, order: dict[Operation, int], here: int
) -> bool:
    for use in value.uses:
        user = use.operation
        if user is op:
            continue
        position = order.get(user)  # None: in a nested block, or a terminator
        if position is None or position > here or (user.results and not _fresh(user)):
            return False
    return True


def _op_error(step: Step, e: Exception) -> OpError:
    """A torch error raised by a step's kernel, naming the op that raised it."""
    return OpError(step.op, f"{type(e).__name__}: {e}")


def _run_steps(steps: list[Step], env: list, donated: frozenset[int]) -> None:
    for step in steps:
        args = [env[i] for i in step.inputs]
        try:
            if step.dist:
                results = step.kernel(args, step.writable_when(donated))
            else:
                results = step.kernel(*args)
        except DistirError:
            raise
        except Exception as e:
            raise _op_error(step, e) from e
        for slot, value in zip(step.outputs, results):
            env[slot] = value
        for slot in step.frees:
            env[slot] = None


class CompiledBlock:
    """A block as a callable: `block(*args) -> tuple of terminator operands`.

    `captured` lists values defined outside the block that it reads; callers
    pass them after the block arguments. `donated` (entry blocks) names the
    block arguments the caller lets collectives overwrite.
    """

    def __init__(
        self,
        steps: list[Step],
        n_slots: int,
        n_args: int,
        n_local: int,
        returned: tuple[int, ...],
        captured: tuple[SSAValue, ...],
    ):
        self.steps = steps
        self.n_slots = n_slots
        self.n_args = n_args
        self.n_local = n_local
        self.returned = returned
        self.captured = captured
        #: a dist op's region: the compiled form its steps were made from
        self.program: RegionProgram | None = None
        self._returned = operator.itemgetter(*returned) if len(returned) > 1 else None
        #: the one step of a block that is a single collective over its
        #: arguments, returning its results: called without the slots (the
        #: most common program; each layer of a run costs ~5x at P=2)
        self._direct = (
            steps[0]
            if len(steps) == 1
            and steps[0].dist
            and not captured
            and steps[0].inputs == tuple(range(n_args))
            and steps[0].outputs == returned
            else None
        )

    @property
    def direct_step(self) -> Step | None:
        """The block's one step when the block is a single collective over
        its arguments, returning its results (else None)."""
        return self._direct

    def __call__(
        self, *args: torch.Tensor, donated: frozenset[int] = _NOTHING
    ) -> tuple[torch.Tensor, ...]:
        direct = self._direct
        if direct is not None and len(args) == self.n_args:
            try:
                return direct.kernel(args, direct.writable_when(donated))
            except DistirError:
                raise
            except Exception as e:
                raise _op_error(direct, e) from e
        env: list = [None] * self.n_slots
        env[: self.n_args] = args[: self.n_args]
        if self.captured:
            # Captured values arrive after the block arguments but live after the locals.
            env[self.n_local :] = args[self.n_args :]
        _run_steps(self.steps, env, donated)
        if self._returned is not None:
            return self._returned(env)
        return (env[self.returned[0]],) if self.returned else ()


    def specialised(
        self, donated: Sequence[frozenset[int]]
    ) -> Callable[[Sequence[torch.Tensor], frozenset[int]], tuple[torch.Tensor, ...]]:
        """`block(*args, donated=d)` as `call(args, d)`, specialised for a
        run whose donated sets are among `donated`: a block that is one
        collective over its arguments calls that kernel directly, its
        writable operands resolved now (one layer less per run)."""
        direct = self._direct
        if direct is None:
            return lambda args, d: self(*args, donated=d)
        kernel = direct.kernel
        writable = {d: direct.writable_when(d) for d in donated}
        n_args = self.n_args

        def call(args: Sequence[torch.Tensor], d: frozenset[int]) -> tuple[torch.Tensor, ...]:
            if len(args) != n_args:
                return self(*args, donated=d)
            w = writable.get(d)
            try:
                return kernel(args, direct.writable_when(d) if w is None else w)
            except DistirError:
                raise
            except Exception as e:
                raise _op_error(direct, e) from e

        return call


class BlockCompiler:
    """Compiles blocks of one module; `bind_dist_op` supplies dist kernels."""

    def __init__(
        self,
        module: Operation | None,
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
        fn = function_named(self.module, name) if isinstance(self.module, ModuleOp) else None
        if fn is None:
            raise DistirError(f"no function @{name} in the module")
        if not fn.body.blocks:
            raise UnsupportedOpError(fn, f"@{name} has no body")
        if name in self._compiling:
            raise UnsupportedOpError(fn, f"recursive call to @{name} is not supported")
        self._compiling.add(name)
        try:
            compiled = self.compile_block(fn.body.block)
        finally:
            self._compiling.discard(name)
        self._functions[name] = compiled
        return compiled

    def compile_local_region(self, region: Region) -> CompiledBlock:
        """A region of a dist op (a generic all-reduce's combine): local ops
        only. Its steps are the region's compiled form
        (`ir.region_program`, made once per region and read by the
        analysis too), each given its kernel here, once; the block keeps
        that form as `program` for the algorithms that run the region tile
        by tile (`ops.all_reduce.torch.combines.RegionCombine`)."""
        block = region.block
        program = region_program(block)
        local = BlockCompiler(self.module, None)
        steps: list[Step] = []
        for step in program.steps:
            kernel, extra, _ = local._kernel_for(step.op)
            captured = []
            for value in extra:  # read by an op's own region (scf.for, scf.if)
                if value not in program.slots:
                    raise UnsupportedOpError(
                        step.op, "a combine region may only read its own arguments and values"
                    )
                captured.append(program.slots[value])
            steps.append(Step(kernel, (*step.operands, *captured), step.results, step.op))
        if program.returned is None:
            raise UnsupportedOpError(block.parent_op() or "block", "block has no terminator")
        returned = program.returned
        compiled = CompiledBlock(
            _with_liveness(steps, returned), program.n_slots, program.n_args, program.n_slots,
            returned, (),
        )  # fmt: skip
        compiled.program = program
        return compiled

    def compile_block(self, block: Block) -> CompiledBlock:
        slots: dict[SSAValue, int] = {arg: i for i, arg in enumerate(block.args)}
        n_local = len(block.args)
        captured: list[SSAValue] = []
        steps: list[Step] = []
        returned: tuple[int, ...] | None = None

        def slot_of(value: SSAValue) -> int:
            if value not in slots:
                # Defined outside this block: becomes a trailing argument.
                slots[value] = -1 - len(captured)
                captured.append(value)
            return slots[value]

        order = {
            op: i for i, op in enumerate(block.ops) if not _ends_block(op)
        }
        for op in block.ops:
            ins = [slot_of(v) for v in op.operands]
            if _ends_block(op):
                returned = tuple(ins)
                break
            kernel, extra, dist = self._kernel_for(op)
            ins += [slot_of(v) for v in extra]
            outs = []
            for result in op.results:
                slots[result] = n_local
                outs.append(n_local)
                n_local += 1
            writable, donatable = _writable(op, block, order) if dist else (_NOTHING, ())
            steps.append(Step(kernel, tuple(ins), tuple(outs), op, (), dist, writable, donatable))
        if returned is None:
            raise UnsupportedOpError(block.parent_op() or "block", "block has no terminator")

        # Captured values live after the locals: renumber them.
        def fix(i: int) -> int:
            return i if i >= 0 else n_local + (-1 - i)

        steps = [replace(s, inputs=tuple(map(fix, s.inputs))) for s in steps]
        returned = tuple(map(fix, returned))
        steps = _with_liveness(steps, returned)
        return CompiledBlock(
            steps, n_local + len(captured), len(block.args), n_local, returned, tuple(captured)
        )

    # -- kernels for one op ---------------------------------------------------

    def _kernel_for(
        self, op: Operation
    ) -> tuple[Callable[..., tuple[torch.Tensor, ...]], Sequence[SSAValue], bool]:
        """The op's kernel, the captured values it needs after its operands,
        and whether it is a dist kernel."""
        factory = LOCAL_KERNELS.get(type(op)) or LOCAL_CHECK_KERNELS.get(type(op))
        if factory is not None:
            try:
                return factory(op), (), False
            except NotImplementedError as e:
                raise UnsupportedOpError(op, f"not supported: {e}") from e
        if isinstance(op, RunsBodyInPlace):
            if self.bind_dist_op is None:
                raise UnsupportedOpError(op, "a combine region may not hold a wave")
            kernel, captured = self._wave_kernel(op)
            return kernel, captured, False
        if op.name.startswith("dist."):
            if self.bind_dist_op is None:
                raise UnsupportedOpError(
                    op, "a combine region may only contain local (non-dist) ops"
                )
            return self.bind_dist_op(op), (), True
        if isinstance(op, func.CallOp):
            callee = self.compile_function(op.callee.root_reference.data)
            return (lambda *args: callee(*args)), callee.captured, False
        if isinstance(op, scf.ForOp):
            kernel, captured = self._for_kernel(op)
            return kernel, captured, False
        if isinstance(op, scf.IfOp):
            kernel, captured = self._if_kernel(op)
            return kernel, captured, False
        if type(op) in NO_KERNEL_OPS:
            raise UnsupportedOpError(op, NO_KERNEL)
        hint = _SHAPE_HINTS.get(op.name, "")
        if op.dialect_name() == "shard":
            hint = "; convert shard programs to dist first: the pass convert-shard-to-dist"
        raise UnsupportedOpError(op, f"no kernel for this op{hint} (supported: {_SUPPORTED})")

    def _wave_kernel(self, op: RunsBodyInPlace) -> tuple[Kernel, Sequence[SSAValue]]:
        """Starts every op of the wave in order, then awaits them in order.
        Operands come from outside the wave, where other ops may read them:
        nothing in a wave overwrites its inputs."""
        inner = [o for o in op.body_block().ops if not o.has_trait(IsTerminator)]
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
        yielded = tuple(produced[v] for v in op.yielded())

        def run(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
            waiters = [start([values[i] for i in idx], _NOTHING) for start, idx in plans]
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
            self.compile_block(op.false_region.block) if op.false_region.blocks else None
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


def _eager_start(kernel: DistKernel) -> Starter:
    def start(inputs: Sequence[torch.Tensor], writable: frozenset[int]):
        results = kernel(inputs, writable)
        return lambda: results

    return start
