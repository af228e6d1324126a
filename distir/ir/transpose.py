"""How a dist op declares its transpose rule (its backward), beside its definition.

As JAX keeps a primitive's transpose rule in the primitive's own block
(`lax/parallel.py`), every differentiable dist op subclasses `Transposable`
and writes `transpose(t, cotangents)` next to its verifier, with distir's
own ops. `passes/vjp.py` walks a function backwards and calls it through a
`Transposer`, the small interface of the backward function being written
(its `_Transposer` implements it); rules of xDSL's own ops (arith, tensor,
linalg) stay in the pass, in a literal table. Nothing here imports torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Protocol

from xdsl.ir import Attribute, Operation, SSAValue

#: one cotangent per result (None: no gradient reaches it) or per operand
#: (None: the operand gets none)
Cotangents = Sequence[SSAValue | None]


class Transposer(Protocol):
    """The backward function being written, as a transpose rule sees it."""

    def emit(self, op: Operation) -> Operation:
        """Appends `op` to the backward function (at the forward op's location)."""
        ...

    def primal(self, value: SSAValue) -> SSAValue:
        """`value` of the forward run, usable in the backward function."""
        ...

    def index(self, number: int) -> SSAValue:
        """An `index` constant."""
        ...

    def shape_of(self, value: SSAValue, primal: bool) -> list[SSAValue | int]:
        """The dims of `value` (a forward value when `primal`), static ones as ints."""
        ...

    def zeros_like(self, value: SSAValue, primal: bool = True) -> SSAValue:
        """Zeros of `value`'s type and shape."""
        ...

    def or_zeros(self, cotangent: SSAValue | None, like: SSAValue) -> SSAValue:
        """`cotangent`, or zeros like `like` when there is none."""
        ...

    def binary(self, op_type: type[Operation], a: SSAValue, b: SSAValue) -> SSAValue:
        """The result of the binary op `op_type(a, b)`."""
        ...

    def on_rank(self, group: Attribute | None, rank: SSAValue, kept: SSAValue) -> SSAValue:
        """`kept` on the rank of `group` equal to `rank`, zeros elsewhere."""
        ...

    def all_reduce_sum(self, value: SSAValue, group: Attribute | None) -> SSAValue:
        """The sum of `value` over the ranks of `group` (a native sum all-reduce)."""
        ...

    def reduce_scatter_sum(
        self, value: SSAValue, result_type: Attribute, axis: int, group: Attribute | None
    ) -> SSAValue:
        """This rank's even part along `axis` of the sum of `value` over the
        ranks of `group` (a native sum reduce-scatter)."""
        ...

    def reduce_sum(self, value: SSAValue, root: int, group: Attribute | None) -> SSAValue:
        """The sum of `value` over the ranks of `group` on group rank `root`,
        zeros elsewhere (a native sum reduce)."""
        ...


class Transposable(ABC):
    """A dist op with a derivative: a linear map of its float operands (or
    none at all) whose transpose is written in distir's ops. An op that is
    not `Transposable` and reads a float value has no derivative."""

    #: transposed even where no cotangent reaches the op: point-to-point ops,
    #: whose peer's transposed op (always emitted) must find its partner
    TRANSPOSED_WITHOUT_COTANGENT: ClassVar[bool] = False

    #: its result is replicated over its group: one value, counted once in
    #: the objective (`dist.psum`; see `passes/vjp.py`)
    REPLICATED_RESULT: ClassVar[bool] = False

    #: the cotangent its rule returns for its operand is already summed over
    #: the group (`dist.pvary`): a replicated operand takes it as it is
    SUMS_COTANGENT: ClassVar[bool] = False

    @abstractmethod
    def transpose(self, t: Transposer, cotangents: Cotangents) -> Cotangents:
        """One cotangent per operand (None: none), from one per result."""


class NoDerivative(Exception):
    """Raised by a transpose rule where the op, as configured, has no
    derivative; the pass names the op (`NotDifferentiable`)."""
