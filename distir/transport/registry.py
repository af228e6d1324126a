"""The registry of Torch implementations of dist ops.

An implementation is a small class declaring `name` and `operation_types`,
with `execute(invocation, inputs, resources, writable)` (`resources`, the
op's group, is a `Transport`: `transport.protocol`): `writable` holds the
positions of the inputs the implementation may overwrite and return as its
results (the runtime proves that nothing else reads them: a donated input,
or an intermediate whose last use is this op); every other input is read
only, and no result may alias it. `bind(invocation, resources)` makes the
op's kernel once per binding (by default one that calls `execute`; an
implementation may resolve its hot path there, tested against `execute` in
`tests/backends/test_bound_kernels.py`).
An execution owner gets its set from `distributed_operation_contributions()`
and builds an `ImplementationRegistry` from it.

Choosing among several implementations of one op is deterministic:

1. an implementation the program asks for by name (per op, through
   `compile(..., implementations={"dist.all_reduce": "ring"})` or the op's
   `algorithm` property) is used, or compilation fails naming the candidates;
2. otherwise, among the implementations whose `matches(op)` holds, the one
   with the highest `priority` wins; on a tie, the one contributed first.

The chosen implementation's `unsupported(op)` then has the last word: what
it declares it cannot run (an element type gloo does not reduce) fails
compilation, naming the op, its location and the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

import torch
from xdsl.ir import Operation

from distir.core.block_compiler import DistKernel
from distir.core.invocation import Invocation
from distir.errors import UnsupportedOpError
from distir.transport.protocol import Transport

if TYPE_CHECKING:
    from distir.transport.direct import DirectCollective


class Implementation:
    """Executes one kind of dist op with torch. Subclasses set the class
    attributes and implement `execute`."""

    name: ClassVar[str]
    operation_types: ClassVar[tuple[type[Operation], ...]]
    priority: ClassVar[int] = 0

    def matches(self, op: Operation) -> bool:
        """Whether this implementation can execute this particular op."""
        return isinstance(op, self.operation_types)

    def unsupported(self, op: Operation) -> str | None:
        """Why this implementation cannot run `op` (an element type, an
        option it lacks), or None: asked when a program is compiled, so what
        the backend cannot run is refused then, naming the op."""
        return None

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def bind(self, invocation: Invocation, resources: Transport) -> DistKernel:
        """This op's kernel on `resources`, made once per binding:
        `kernel(inputs, writable)` does what `execute` does.

        The default calls `execute`. An implementation whose hot path
        depends only on what the invocation and the resources fix (the
        reduction, the root, the options) resolves it here and returns a
        flatter kernel, which falls back to `execute` for anything else.
        An op that `direct` describes gets that description's kernel."""
        direct = self.direct(invocation, resources)
        if direct is not None:
            return direct.kernel(self.execute)
        return self.executing(invocation, resources)

    def executing(self, invocation: Invocation, resources: Transport) -> DistKernel:
        """The kernel that calls `execute` (what a rank outside the op's
        group binds: `execute` names that error if the op ever runs)."""
        execute = self.execute

        def kernel(
            inputs: Sequence[torch.Tensor], writable: frozenset[int]
        ) -> tuple[torch.Tensor, ...]:
            return execute(invocation, inputs, resources, writable)

        return kernel

    def direct(self, invocation: Invocation, resources: Transport) -> DirectCollective | None:
        """The op on `resources` as one backend collective on its operand
        (`distir.transport.direct`), or None (the default): what `execute`
        does on operands of the declared type when nothing is checked
        before the payload, said once per binding."""
        return None

    def start(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> Callable[[], tuple[torch.Tensor, ...]]:
        """Submits the op and returns a function that awaits its results.

        Waves submit every op with `start` before awaiting any. The default
        runs `execute` to completion at once; implementations over async
        collectives override it to return before the payload completes.
        """
        results = self.execute(invocation, inputs, resources, writable)
        return lambda: results

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class ImplementationRegistry:
    """Implementations in contribution order, looked up by op."""

    def __init__(self, implementations: Iterable[Implementation]):
        self.implementations = list(implementations)

    def candidates(self, op: Operation) -> list[Implementation]:
        return [i for i in self.implementations if isinstance(op, i.operation_types)]

    def select(self, op: Operation, requested: str | None = None) -> Implementation:
        candidates = self.candidates(op)
        names = ", ".join(sorted({c.name for c in candidates})) or "none"
        if requested is not None:
            for impl in candidates:
                if impl.name == requested and impl.matches(op):
                    return self._runnable(impl, op)
            raise UnsupportedOpError(
                op,
                f"no implementation named {requested!r} can execute this op "
                f"(registered for {op.name}: {names})",
            )
        matching = [c for c in candidates if c.matches(op)]
        if not matching:
            raise UnsupportedOpError(
                op, f"no registered implementation can execute this op (candidates: {names})"
            )
        best = max(c.priority for c in matching)
        return self._runnable(next(c for c in matching if c.priority == best), op)

    @staticmethod
    def _runnable(impl: Implementation, op: Operation) -> Implementation:
        reason = impl.unsupported(op)
        if reason is not None:
            raise UnsupportedOpError(op, reason)
        return impl
