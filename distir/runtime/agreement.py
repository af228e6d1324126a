"""The agreement at the start of every run: one exchange of 4 + P int64 words per rank.

Before the first collective of a run, every rank of the program's base
group (of P ranks) contributes one row of 4 + P int64 words:

    [MAGIC, accepted, plan fingerprint, digest of the hoisted preconditions,
     send counts of the plan's first hoisted variable all-to-all (P words,
     zeros when it has none)]

`accepted` is 1 when the rank's inputs match the entry signature and every
hoisted precondition (the checks of entry-block ops whose operands are all
entry arguments: dynamic roots, counts, moduli and limbs, extras, dynamic
shapes) holds on this rank; the digest covers what those ops need equal on
every rank. When the first four words of every row match, the run goes on,
and the hoisted ops skip their own exchange; the variable all-to-all whose
counts rode along (`Plan.counts_in_agreement`) reads its receive counts
from the rows (`ProcessGroupResource.agreed_counts`), so a mixture-of-experts
dispatch costs the counts exchange and the rows, as raw torch.distributed
does, with the agreement folded into the counts. Otherwise every rank saw
it: they exchange reports (the failure path) and all raise, naming the rank
and the op.

The plan fingerprint (`Plan.bound_fingerprint`) covers everything that
decides what a rank executes: the lowered IR, the implementation and
algorithm of every op, the agreement mode and the wire format. The row has
the same size for every program on a group of P ranks, so an agreement can
never be matched with another program's exchange of another size.

What is agreed when: a program compiled with `agreement=True` agrees at
every run. One compiled with `agreement=False` (trusted) agrees only the
first time its plan runs on a group in this process (`Binding`), so two
ranks whose modes differ meet in that first exchange and both raise
`ProgramMismatch`; the mode cannot change afterwards. After that first run a
trusted program costs no exchange, and the caller promises that every rank
runs the same sequence of programs on the group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distir.core.checks import (
    Precondition,
    digest_of,
    evaluate,
    mismatch,
)
from distir.core.semantics import precondition_rule
from distir.errors import DistirError, ProgramInputError, ProgramMismatch
from distir.runtime.concurrency import RunId
from distir.runtime.planning import Plan
from distir.transport.groups import ProcessGroupResource, Step

MAGIC = 0x6469737469720002  # "distir", row format 2 (4 + P words)
#: words of the row every rank must have equal
AGREED_WORDS = 4


class RunAgreement:
    """The per-run agreement of one program."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.step = Step(f"@{plan.entry} (program agreement)")
        self.rules = [precondition_rule(type(op)) for op in plan.hoisted]
        #: the hoisted position of the op whose send counts ride in the row
        self.counts_index = (
            None
            if plan.counts_in_agreement is None
            else plan.hoisted.index(plan.counts_in_agreement)
        )

    def agree(
        self,
        inputs: Sequence[Any],
        base: ProcessGroupResource,
        fingerprint: int,
        who: RunId | str = "",
        submitted: Sequence[int | None] | None = None,
    ) -> tuple[Sequence[Any], list[Precondition]]:
        """Checks this rank's inputs and hoisted preconditions, agrees with
        every rank that they run the plan `fingerprint` names, and returns
        the inputs as the run reads them (`Plan.check_inputs`, with the
        versions `run_async` read, `submitted`) and the preconditions (or
        raises on every rank). `who` names the run (thread and position on
        the domain): runs pair only with the same run on every peer
        (`distir.runtime.concurrency`)."""
        plan = self.plan
        input_error: ProgramInputError | None = None
        hoisted: list[Precondition] = []
        try:
            inputs = plan.check_inputs(inputs, submitted)
        except ProgramInputError as e:
            input_error = e
        if input_error is None:
            for op, rule in zip(plan.hoisted, self.rules):
                operands = plan.hoisted_inputs(op, inputs)
                invocation = plan.invocations[op]
                hoisted.append(
                    evaluate(rule, invocation, operands, base.size, base.rank)
                    if rule is not None
                    else Precondition()
                )
        accepted = input_error is None and all(p.ok for p in hoisted)
        digest = digest_of(str(who).encode(), *(p.digest().to_bytes(8, "little") for p in hoisted))
        counts = [0] * base.size
        if self.counts_index is not None and accepted:
            counts = hoisted[self.counts_index].decoded["send"]
        rows = base.exchange_rows([MAGIC, int(accepted), fingerprint, digest, *counts], self.step)
        agreed = rows[0][:AGREED_WORDS]
        if accepted and all(row[:AGREED_WORDS] == agreed for row in rows):
            if self.counts_index is not None:
                me = AGREED_WORDS + base.rank
                base.agreed_counts = [row[me] for row in rows]
            return inputs, hoisted
        raise self._disagreement(rows, input_error, hoisted, base, fingerprint, who)

    def _disagreement(
        self,
        rows: list[list[int]],
        input_error: ProgramInputError | None,
        hoisted: list[Precondition],
        base: ProcessGroupResource,
        fingerprint: int,
        who: RunId | str = "",
    ) -> Exception:
        """Every rank saw the same rows: all explain, and all raise what
        this returns (this rank's own error when its inputs were rejected)."""
        plan = self.plan
        mine = {
            "input_error": None if input_error is None else str(input_error),
            "preconditions": [p.report() for p in hoisted],
            "plan": plan.describe(base.size, base),
            "run": str(who),
        }
        try:
            reports: list[Any] = base.gather_objects(mine, self.step)
        except DistirError:
            reports = [None] * base.size
        programs: dict[int, list[int]] = {}
        for r, row in enumerate(rows):
            programs.setdefault(row[2] if row[0] == MAGIC else -1, []).append(r)
        lines = []
        if len(programs) > 1:

            def described(ranks: list[int]) -> str:
                report = reports[ranks[0]]
                return f" ({report['plan']})" if isinstance(report, dict) else ""

            listed = "; ".join(
                f"ranks {ranks} run plan {fp:016x}{described(ranks)}" if fp >= 0 else
                f"ranks {ranks} run something else"
                for fp, ranks in programs.items()
            )
            lines.append(
                f"ranks run different programs or plans: {listed}; this rank, "
                f"{base.rank}, runs {fingerprint:016x}"
            )
        runs = {r: report.get("run") for r, report in enumerate(reports) if report}
        if len(set(runs.values())) > 1:
            listed = "; ".join(f"rank {r}: {run}" for r, run in runs.items())
            lines.append(
                f"ranks are at different runs ({listed}); a run pairs only with the run "
                "at the same position, from a thread of the same name, on every peer"
            )
        for r, report in enumerate(reports):
            if report is not None and report["input_error"]:
                lines.append(f"rank {r} rejected its inputs: {report['input_error']}")
        if lines:
            details = f"@{plan.entry}: " + "; ".join(lines)
            if input_error is not None:
                input_error.add_note(details)
                return input_error
            return ProgramMismatch(details)
        # Same program, inputs accepted: a hoisted precondition differs.
        for index, op in enumerate(plan.hoisted):
            own = hoisted[index]
            per_op = [
                None if report is None else report["preconditions"][index] for report in reports
            ]
            differs = (
                any(p is None or p["error"] for p in per_op)
                or len({tuple(item[2] for item in p["agreed"]) for p in per_op if p is not None})
                > 1
            )
            if not differs and own.ok:
                continue
            if own.error is not None:
                return own.error
            return mismatch(plan.invocations[op].description, base.name, per_op)
        return ProgramMismatch(f"@{plan.entry}: ranks disagree at the start of the run")
