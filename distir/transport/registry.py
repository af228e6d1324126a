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
`tests/transport/test_bound_kernels.py`).
An execution owner gets its set from `distributed_operation_contributions()`
and builds an `ImplementationRegistry` from it.

Choosing among several implementations of one op is deterministic, and
made in two steps:

1. when a program is compiled (`ImplementationRegistry.preferences`), the
   op's candidates in preference order: the implementations named as the
   program asks (per op, through
   `compile(..., implementations={"dist.all_reduce": "ring"})` or the op's
   `algorithm` property; compilation fails naming the candidates when none
   has that name), otherwise those whose `matches(op)` holds, highest
   `priority` first and, on a tie, the one contributed first. The list
   ends at the first candidate that needs nothing of its transport (no
   later one could be chosen); each candidate's `unsupported(op)` is asked
   then (what it declares it cannot run, an element type gloo does not
   reduce, drops it), and when no candidate is left compilation fails,
   naming the op, its location and the first candidate's reason;
2. when the program is bound to a group (`choose`), the first candidate
   whose `needs` (`transport.protocol.Needs`) that group's `Capabilities`
   meet; none is a named `UnsupportedOpError` (the op, its location, what
   each candidate needs). So "this implementation when the group is NCCL
   on CUDA" is an implementation with `needs = Needs(devices={"cuda"})`
   contributed before the one that runs anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

import torch
from xdsl.ir import Operation

from distir.core.block_compiler import DistKernel
from distir.core.invocation import Invocation
from distir.errors import UnsupportedOpError
from distir.transport.protocol import ANY_TRANSPORT, Capabilities, Needs, Transport

if TYPE_CHECKING:
    from distir.transport.direct import DirectCollective


class Implementation:
    """Executes one kind of dist op with torch. Subclasses set the class
    attributes and implement `execute`."""

    name: ClassVar[str]
    operation_types: ClassVar[tuple[type[Operation], ...]]
    priority: ClassVar[int] = 0
    #: what it needs of the group it is bound to (default: nothing)
    needs: ClassVar[Needs] = ANY_TRANSPORT

    def serves(self, capabilities: Capabilities) -> bool:
        """Whether it runs on a transport with `capabilities`: asked when a
        program is bound to a group. The default reads `needs`; an
        implementation whose condition `Needs` cannot say overrides this
        (and `needs_anything`)."""
        return self.needs.met_by(capabilities)

    def needs_anything(self) -> bool:
        """Whether some transport would not serve it (an implementation
        that serves every transport ends its op's preference list)."""
        return self.needs != ANY_TRANSPORT

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

    def preferences(
        self, op: Operation, requested: str | None = None
    ) -> tuple[Implementation, ...]:
        """`op`'s candidates in preference order (step 1 of the module's
        rule): a non-empty tuple, or a named `UnsupportedOpError`."""
        candidates = self.candidates(op)
        names = ", ".join(sorted({c.name for c in candidates})) or "none"
        if requested is not None:
            matching = [c for c in candidates if c.name == requested and c.matches(op)]
            if not matching:
                raise UnsupportedOpError(
                    op,
                    f"no implementation named {requested!r} can execute this op "
                    f"(registered for {op.name}: {names})",
                )
        else:
            matching = [c for c in candidates if c.matches(op)]
            if not matching:
                raise UnsupportedOpError(
                    op, f"no registered implementation can execute this op (candidates: {names})"
                )
            # Highest priority first; sorted() keeps contribution order on a tie.
            matching = sorted(matching, key=lambda c: -c.priority)
        ordered: list[Implementation] = []
        for impl in matching:
            ordered.append(impl)
            if not impl.needs_anything():
                break
        runnable = tuple(impl for impl in ordered if impl.unsupported(op) is None)
        if not runnable:
            raise UnsupportedOpError(op, ordered[0].unsupported(op) or "")
        return runnable

    def select(self, op: Operation, requested: str | None = None) -> Implementation:
        """The preferred candidate (`preferences`' first): what `op` runs
        with on a transport that meets every candidate's needs."""
        return self.preferences(op, requested)[0]


def choose(
    op: Operation, preferences: Sequence[Implementation], transport: Transport
) -> Implementation:
    """The first of `op`'s `preferences` that `transport` serves (step 2 of
    the module's rule), or an `UnsupportedOpError` naming the op, its
    location, the group and what each candidate needs."""
    capabilities = transport.capabilities
    for impl in preferences:
        if impl.serves(capabilities):
            return impl
    needs = "; ".join(f"{impl.name} needs {impl.needs.describe()}" for impl in preferences)
    raise UnsupportedOpError(
        op,
        f"no implementation of {op.name} runs on group {transport.name} "
        f"({transport.backend}, devices {sorted(capabilities.devices)}): {needs}",
    )
