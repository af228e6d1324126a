"""`verify-spmd`: reject collectives under rank-dependent control flow.

Every rank of a group must enter the group's collectives in the same order.
A collective inside an `scf.if` whose condition differs between ranks, or in
an `scf.for` whose trip count differs, is entered by some ranks only: the
others hang, or worse, pair it with a different collective. This pass proves
the opposite by a forward *uniformity* analysis and fails with a diagnostic
naming the collective and the condition otherwise.

A value is *rank-varying* when it may differ between ranks:
- `dist.rank` results and `dist.variable_all_to_all` results;
- results of point-to-point ops and mesh transfers (each rank gets its own);
- the entry function's arguments (each rank passes its own inputs; broadcast
  one to make it uniform);
- anything computed from a rank-varying value, and results of control flow
  that is itself rank-dependent.
Point-to-point ops may sit under rank-dependent control flow (rank 0 sends,
rank 1 receives); waves and mesh transfers may not. Constants,
`dist.group_size` and the results of broadcast, all-reduce,
ciphertext all-reduce and all-gather are uniform.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func, scf
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import DiagnosticException

from distir.ir.dialect import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AllReduceOp,
    BroadcastOp,
    CollectiveOp,
    GroupSizeOp,
    PeerOp,
    RankOp,
    TransferOp,
    VariableAllToAllOp,
    WaveOp,
)
from distir.ir.parsing import describe_op

UNIFORM_COLLECTIVES = (BroadcastOp, AllReduceOp, AllReduceAddCiphertextOp, AllGatherOp)


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
        if isinstance(op, CollectiveOp | WaveOp | TransferOp) and control is not None:
            raise SPMDViolation(
                f"{describe_op(op)} runs under control flow that differs between "
                f"ranks: {control.text}; every rank of the group must reach it"
            )
        if isinstance(op, RankOp):
            self.varying[op.result] = _Why(f"{describe_op(op)} differs on every rank")
            return
        if isinstance(op, WaveOp):
            # Its ops run unconditionally; its results are as uniform as theirs.
            self._block(op.body.block, None)
            self._results_from_terminators(op, None)
            return
        if isinstance(op, VariableAllToAllOp | PeerOp | TransferOp):
            for r in op.results:
                self.varying[r] = _Why(f"{describe_op(op)} returns different data per rank")
            return
        if isinstance(op, (*UNIFORM_COLLECTIVES, GroupSizeOp)):
            return  # uniform results, whatever the operands
        if isinstance(op, scf.IfOp):
            cond = self._why(op.cond)
            inner = control or (
                _Why(f"the condition of {describe_op(op)} depends on the rank "
                     f"({cond.text})") if cond else None
            )
            for region in op.regions:
                for block in region.blocks:
                    self._block(block, inner)
            self._results_from_terminators(op, inner)
            return
        if isinstance(op, scf.ForOp):
            bound = next(
                (self._why(v) for v in (op.lb, op.ub, op.step) if self._why(v)), None
            )
            inner = control or (
                _Why(f"the trip count of {describe_op(op)} depends on the rank "
                     f"({bound.text})") if bound else None
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


def verify_spmd(module: ModuleOp, entry: str = "main") -> None:
    """Raises `SPMDViolation` if a collective may be skipped by some ranks."""
    UniformityAnalysis(module, entry).run()


@dataclass(frozen=True)
class VerifySPMDPass(ModulePass):
    """Fails when a collective sits under rank-dependent control flow."""

    name = "verify-spmd"

    entry: str = "main"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        verify_spmd(op, self.entry)
