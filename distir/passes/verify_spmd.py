"""`verify-spmd`: reject collectives under rank-dependent control flow.

Every rank of a group must enter the group's collectives in the same order.
A collective inside an `scf.if` whose condition differs between ranks, or in
an `scf.for` whose trip count differs, is entered by some ranks only: the
others hang, or worse, pair it with a different collective. This pass proves
the opposite by a forward *uniformity* analysis and fails with a diagnostic
naming the collective and the condition otherwise.

The pass reads the facts each op declares (`distir.ir.facts`): an op with
`EveryRankEnters` must not sit under rank-dependent control flow; an op with
`UniformResults` has uniform results. A value is *rank-varying* when it may
differ between ranks:
- `dist.rank` results;
- results of an op that communicates (`CollectiveEffect`) without declaring
  `UniformResults`: point-to-point ops, the variable all-to-all and mesh
  transfers (each rank gets its own);
- the entry function's arguments (each rank passes its own inputs; broadcast
  one to make it uniform);
- anything computed from a rank-varying value, and results of control flow
  that is itself rank-dependent.
Point-to-point ops may sit under rank-dependent control flow (rank 0 sends,
rank 1 receives); waves and mesh transfers may not. Constants and the
results of ops declaring `UniformResults` (`dist.group_size`, broadcast,
all-reduce, ciphertext all-reduce and all-gather) are uniform.

It then looks for point-to-point deadlocks (`PointToPointAnalysis`): when
every peer, branch condition and loop bound that decides the point-to-point
traffic follows from the rank, the group size and constants, it runs each
rank's sequence of sends, receives and collectives for a group size and
fails when ranks block forever — two ranks that both `dist.recv` first, or a
rank waiting for a peer that never sends. Sends are taken to complete
without waiting for their receiver (so only cycles that hang whatever the
transport's buffering are reported). Without a known group size (the world,
at compile time) it tries every size from the smallest the static peers
allow (at least 2) to 8, and reports only a deadlock found at all of them.
Programs whose traffic depends on data, on subgroups or waves are not
analysed (the runtime's deadline still bounds them).
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IntegerAttr, ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import DiagnosticException

from distir.ir.attributes import CollectiveEffect
from distir.ir.dialect import GroupMemberOp, PeerOp
from distir.ir.facts import EveryRankEnters, RankQuery, RunsBodyInPlace, UniformResults
from distir.ir.parsing import describe_op
from distir.ir.tensor_arith import CmpiOp, SelectOp


def _communicates_itself(op: Operation) -> bool:
    """The op moves data between ranks (its declared collective effect)."""
    return op.has_trait(CollectiveEffect)


class SPMDViolation(DiagnosticException):
    """A collective some ranks would skip."""


@dataclass
class _Why:
    """Why a value varies: the op (or argument) it derives from."""

    text: str


class UniformityAnalysis:
    def __init__(self, module: ModuleOp, entry: str = "main"):
        self.module = module
        self.entry = entry
        self.varying: dict[SSAValue, _Why] = {}

    def run(self) -> None:
        for op in self.module.ops:
            if isinstance(op, func.FuncOp) and op.body.blocks:
                is_entry = op.sym_name.data == self.entry
                for arg in op.body.block.args:
                    # Other functions get their arguments from calls; treat
                    # them as varying too: a conservative, call-site-free rule.
                    self.varying[arg] = _Why(
                        f"argument #{arg.index} of @{op.sym_name.data}"
                        + (" (each rank passes its own input)" if is_entry else "")
                    )
                self._block(op.body.block, control=None)

    def _why(self, value: SSAValue) -> _Why | None:
        return self.varying.get(value)

    def _block(self, block: Block, control: _Why | None) -> None:
        for op in block.ops:
            self._op(op, control)

    def _op(self, op: Operation, control: _Why | None) -> None:
        if op.has_trait(EveryRankEnters) and control is not None:
            raise SPMDViolation(
                f"{describe_op(op)} runs under control flow that differs between "
                f"ranks: {control.text}; every rank of the group must reach it"
            )
        if isinstance(op, RankQuery) and not op.has_trait(UniformResults):
            self.varying[op.results[0]] = _Why(f"{describe_op(op)} differs on every rank")
            return
        if isinstance(op, RunsBodyInPlace):
            # Its ops run unconditionally; its results are as uniform as theirs.
            self._block(op.body_block(), None)
            self._results_from_terminators(op, None)
            return
        if op.has_trait(UniformResults):
            return  # uniform results, whatever the operands
        if _communicates_itself(op):
            for r in op.results:
                self.varying[r] = _Why(f"{describe_op(op)} returns different data per rank")
            return
        if isinstance(op, scf.IfOp):
            cond = self._why(op.cond)
            inner = control or (
                _Why(f"the condition of {describe_op(op)} depends on the rank ({cond.text})")
                if cond
                else None
            )
            for region in op.regions:
                for block in region.blocks:
                    self._block(block, inner)
            self._results_from_terminators(op, inner)
            return
        if isinstance(op, scf.ForOp):
            bound = next((self._why(v) for v in (op.lb, op.ub, op.step) if self._why(v)), None)
            inner = control or (
                _Why(f"the trip count of {describe_op(op)} depends on the rank ({bound.text})")
                if bound
                else None
            )
            body = op.body.block
            # Iteration arguments: varying if their initial value is, or if the
            # loop yields a varying value; iterate to a fixed point.
            for arg, init in zip(body.args[1:], op.iter_args):
                if self._why(init):
                    self.varying[arg] = self._why(init)  # type: ignore[assignment]
            while True:
                before = len(self.varying)
                self._block(body, inner)
                yielded = body.last_op
                if isinstance(yielded, scf.YieldOp):
                    for arg, value in zip(body.args[1:], yielded.operands):
                        if self._why(value) and arg not in self.varying:
                            self.varying[arg] = self._why(value)  # type: ignore[assignment]
                if len(self.varying) == before:
                    break
            self._results_from_terminators(op, inner)
            return
        # Any other op: results vary if an operand does (or control does).
        why = control or next((self._why(v) for v in op.operands if self._why(v)), None)
        for region in op.regions:
            for block in region.blocks:
                self._block(block, control)
        if why is not None:
            for r in op.results:
                self.varying[r] = why

    def _results_from_terminators(self, op: Operation, control: _Why | None) -> None:
        for i, result in enumerate(op.results):
            if control is not None:
                self.varying[result] = control
                continue
            for region in op.regions:
                for block in region.blocks:
                    term = block.last_op
                    if term is not None and i < len(term.operands):
                        why = self._why(term.operands[i])
                        if why is not None:
                            self.varying[result] = why


# Point-to-point deadlocks ------------------------------------------------------------


class _Unknown(Exception):
    """The traffic depends on something the analysis does not evaluate."""


#: index/integer arith the analysis evaluates on Python ints
_INT_OPS: dict[type[Operation], Callable[[int, int], int]] = {
    arith.AddiOp: operator.add,
    arith.SubiOp: operator.sub,
    arith.MuliOp: operator.mul,
    arith.DivUIOp: operator.floordiv,
    arith.RemUIOp: operator.mod,
    arith.DivSIOp: lambda a, b: int(a / b),
    arith.RemSIOp: lambda a, b: a - b * int(a / b),
    arith.MinSIOp: min,
    arith.MaxSIOp: max,
    arith.MinUIOp: min,
    arith.MaxUIOp: max,
    arith.AndIOp: operator.and_,
    arith.OrIOp: operator.or_,
    arith.XOrIOp: operator.xor,
}
_CMPI: dict[str, Callable[[int, int], bool]] = {
    "eq": operator.eq, "ne": operator.ne, "slt": operator.lt, "sle": operator.le,
    "sgt": operator.gt, "sge": operator.ge, "ult": operator.lt, "ule": operator.le,
    "ugt": operator.gt, "uge": operator.ge,
}  # fmt: skip
_CMPI_NAMES = list(_CMPI)
#: loop iterations unrolled per loop; a longer loop is not analysed
_MAX_TRIPS = 256
_MAX_SIZE = 8

#: (kind, op, peer): "send" and "recv" with the peer, "collective" with None
_Event = tuple[str, Operation, int | None]


class PointToPointAnalysis:
    """Each rank's point-to-point traffic for one group size, and whether it
    completes. See the module docstring."""

    def __init__(self, module: ModuleOp, entry: str = "main"):
        self.module = module
        self.functions = {
            op.sym_name.data: op
            for op in module.ops
            if isinstance(op, func.FuncOp) and op.body.blocks
        }
        self.entry = entry

    def applies(self) -> bool:
        """Whether the program has point-to-point ops at all."""
        return any(isinstance(op, PeerOp) for op in self.module.walk())

    def min_size(self) -> int:
        peers = [0]
        for op in self.module.walk():
            for name in ("dest", "source"):
                attr = op.properties.get(name) if isinstance(op, PeerOp) else None
                if isinstance(attr, IntegerAttr):
                    peers.append(attr.value.data)
        return max(2, max(peers) + 1)

    def trace(self, rank: int, size: int) -> list[_Event]:
        events: list[_Event] = []
        fn = self.functions.get(self.entry)
        if fn is None:
            raise _Unknown()
        self._block(fn.body.block, {}, rank, size, events, depth=0)
        return events

    def _block(self, block: Block, env: dict, rank: int, size: int, events: list, depth: int):
        for op in block.ops:
            if isinstance(op, func.ReturnOp | scf.YieldOp) or op.name == "dist.yield":
                return [env.get(v) for v in op.operands]
            self._op(op, env, rank, size, events, depth)
        return []

    def _value(self, env: dict, value: SSAValue | None) -> int:
        known = env.get(value) if value is not None else None
        if known is None:
            raise _Unknown()
        return known

    def _peer(self, env: dict, op: PeerOp, which: str) -> int:
        peer = op.peer(which)
        return peer if isinstance(peer, int) else self._value(env, peer)

    def _op(self, op: Operation, env: dict, rank: int, size: int, events: list, depth: int):
        if isinstance(op, RunsBodyInPlace) or (
            isinstance(op, GroupMemberOp) and op.group is not None
        ):
            raise _Unknown()  # subgroups and waves: not analysed
        if isinstance(op, RankQuery):
            env[op.results[0]] = op.value_on(rank, size)
        elif isinstance(op, PeerOp):
            for event, which in op.TRAFFIC:
                events.append((event, op, self._peer(env, op, which)))
        elif op.has_trait(EveryRankEnters):
            events.append(("collective", op, None))
        elif isinstance(op, arith.ConstantOp) and isinstance(op.value, IntegerAttr):
            env[op.result] = op.value.value.data
        elif type(op) in _INT_OPS:
            a, b = env.get(op.operands[0]), env.get(op.operands[1])
            if a is not None and b is not None and (b != 0 or type(op) not in _DIVISIONS):
                env[op.results[0]] = _INT_OPS[type(op)](a, b)
        elif isinstance(op, arith.IndexCastOp):
            if env.get(op.operands[0]) is not None:
                env[op.results[0]] = env[op.operands[0]]
        elif isinstance(op, CmpiOp | arith.CmpiOp):
            a, b = env.get(op.operands[0]), env.get(op.operands[1])
            if a is not None and b is not None:
                name = _CMPI_NAMES[op.predicate.value.data]
                env[op.results[0]] = int(_CMPI[name](a, b))
        elif isinstance(op, SelectOp | arith.SelectOp):
            c = env.get(op.operands[0])
            if c is not None:
                chosen = env.get(op.operands[1] if c else op.operands[2])
                if chosen is not None:
                    env[op.results[0]] = chosen
        elif isinstance(op, scf.IfOp):
            cond = env.get(op.cond)
            if cond is None:
                if _communicates(op):
                    raise _Unknown()
                return
            if not cond and not op.false_region.blocks:
                return
            region = op.true_region if cond else op.false_region
            values = self._block(region.block, env, rank, size, events, depth)
            for result, value in zip(op.results, values):
                if value is not None:
                    env[result] = value
        elif isinstance(op, scf.ForOp):
            bounds = [env.get(v) for v in (op.lb, op.ub, op.step)]
            if any(b is None for b in bounds) or bounds[2] <= 0:  # type: ignore[operator]
                if _communicates(op):
                    raise _Unknown()
                return
            lb, ub, step = bounds  # type: ignore[misc]
            trips = range(lb, ub, step)
            if len(trips) > _MAX_TRIPS and _communicates(op):
                raise _Unknown()
            body = op.body.block
            carried = [env.get(v) for v in op.iter_args]
            for i in trips if _communicates(op) else ():
                env[body.args[0]] = i
                for arg, value in zip(body.args[1:], carried):
                    env.pop(arg, None)
                    if value is not None:
                        env[arg] = value
                carried = self._block(body, env, rank, size, events, depth)
        elif isinstance(op, func.CallOp):
            callee = self.functions.get(op.callee.root_reference.data)
            if callee is None or depth > 16:
                if callee is None or _communicates(callee):
                    raise _Unknown()
                return
            inner = {a: env.get(v) for a, v in zip(callee.body.block.args, op.operands)}
            inner = {k: v for k, v in inner.items() if v is not None}
            values = self._block(callee.body.block, inner, rank, size, events, depth + 1)
            for result, value in zip(op.results, values):
                if value is not None:
                    env[result] = value
        elif _communicates(op):
            raise _Unknown()

    def deadlock(self, size: int) -> str | None:
        """Why the ranks of a group of `size` block forever, or None."""
        traces = [deque(self.trace(r, size)) for r in range(size)]
        if any(kind != "collective" and not 0 <= peer < size  # type: ignore[operator]
               for trace in traces for kind, _, peer in trace):  # fmt: skip
            raise _Unknown()  # an out-of-range peer is an error of its own
        #: (source, dest) -> messages sent and not yet received
        mail: dict[tuple[int, int], int] = {}
        progress = True
        while progress:
            progress = False
            for rank, trace in enumerate(traces):
                while trace:
                    kind, op, peer = trace[0]
                    if kind == "send":
                        mail[rank, peer] = mail.get((rank, peer), 0) + 1  # type: ignore[index]
                    elif kind == "recv":
                        if not mail.get((peer, rank)):  # type: ignore[index]
                            break
                        mail[peer, rank] -= 1  # type: ignore[index]
                    elif all(t and t[0][0] == "collective" for t in traces):
                        for t in traces:
                            t.popleft()
                        progress = True
                        continue
                    else:  # a collective waits for every rank to reach one
                        break
                    trace.popleft()
                    progress = True
        blocked = [(r, t[0]) for r, t in enumerate(traces) if t]
        if not blocked:
            return None
        lines = []
        for rank, (kind, op, peer) in blocked:
            if kind == "collective":
                lines.append(f"rank {rank} waits at {describe_op(op)} for the other ranks")
                continue
            other = traces[peer]  # type: ignore[index]
            state = (
                f"which waits at {describe_op(other[0][1])}"
                if other
                else "which has finished without sending it"
            )
            lines.append(f"rank {rank} waits at {describe_op(op)} for rank {peer}, {state}")
        return "; ".join(lines)


_DIVISIONS = (arith.DivUIOp, arith.RemUIOp, arith.DivSIOp, arith.RemSIOp)


def _communicates(op: Operation) -> bool:
    return any(_communicates_itself(o) or isinstance(o, func.CallOp) for o in op.walk())


class PointToPointDeadlock(SPMDViolation):
    """Ranks block forever on point-to-point ops."""


def check_point_to_point(module: ModuleOp, entry: str = "main", size: int | None = None) -> None:
    """Raises `PointToPointDeadlock` when the ranks' sends and receives
    cannot complete for group size `size` (None: for every size from the
    smallest the static peers allow to 8)."""
    analysis = PointToPointAnalysis(module, entry)
    if not analysis.applies():
        return
    sizes = [size] if size is not None else range(analysis.min_size(), _MAX_SIZE + 1)
    found = None
    for p in sizes:
        try:
            why = analysis.deadlock(p)
        except _Unknown:
            return
        if why is None:
            return
        found = found or (p, why)
    if found is not None:
        p, why = found
        every = "" if size is not None else f" (and every size up to {_MAX_SIZE})"
        advice = (
            "Send first on one side, or exchange with dist.sendrecv, which cannot deadlock"
            if "which waits at" in why
            else "Every dist.recv needs a dist.send from its source"
        )
        raise PointToPointDeadlock(
            f"point-to-point deadlock with {p} ranks{every}: {why}. {advice}"
        )


def verify_spmd(module: ModuleOp, entry: str = "main", size: int | None = None) -> None:
    """Raises `SPMDViolation` if a collective may be skipped by some ranks,
    or if point-to-point ops provably deadlock (for group size `size`)."""
    UniformityAnalysis(module, entry).run()
    check_point_to_point(module, entry, size)


@dataclass(frozen=True)
class VerifySPMDPass(ModulePass):
    """Fails when a collective sits under rank-dependent control flow, or
    when point-to-point ops provably deadlock."""

    name = "verify-spmd"

    entry: str = "main"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        verify_spmd(op, self.entry)
