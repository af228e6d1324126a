"""Everything that decides what a rank executes is agreed (issue 18, item 1).

Ranks compile the same program text with settings drawn per rank: the
implementation of a generic all-reduce (every legal one, and none: the
group size's default), the agreement mode, the deadline, and whether the
rank compiles an equal program again before its second run. Whenever the
plans differ (another algorithm after binding, another agreement mode)
every rank must raise `ProgramMismatch` at the first run, never return a
value or crash; whenever they are equal (deadlines differ, the default
algorithm named explicitly, a trusted program recompiled on one rank) both
runs must equal the reference simulator.

Spawning ranks costs seconds, so hypothesis draws the cases in this process
(derandomized: the same cases every time) and one launch per group size (2
and 3 ranks) runs them all, each on a fresh process group (a mismatch
poisons the group it ran on).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import distir
from distir.errors import DistirError
from distir.ir.dialect import AllReduceOp
from distir.ops.all_reduce.ir import default_algorithm
from distir.runtime.launch import launch

PROGRAMS = {
    # a generic all-reduce: which algorithm runs it is a bind-time choice
    "generic sum": """
func.func @main(%x: tensor<6xi64>) -> tensor<6xi64> {
  %y = dist.all_reduce %x commutative : tensor<6xi64> combine(%a, %b) {
    %s = arith.addi %a, %b : tensor<6xi64>
    dist.yield %s : tensor<6xi64>
  }
  func.return %y : tensor<6xi64>
}""",
    # on uneven subgroups ({0, 1} and the rest): each subgroup size gets its
    # own default algorithm, and every rank must still agree on one plan
    "generic sum on subgroups": """
dist.group @parts [[0, 1], {REST}]
func.func @main(%x: tensor<6xi64>) -> tensor<6xi64> {
  %y = dist.all_reduce %x group @parts commutative : tensor<6xi64> combine(%a, %b) {
    %s = arith.addi %a, %b : tensor<6xi64>
    dist.yield %s : tensor<6xi64>
  }
  func.return %y : tensor<6xi64>
}""",
    # a variable all-to-all, whose wire format depends on the agreement mode
    "variable all-to-all": """
func.func @main(%x: tensor<?x2xi64>, %s: tensor<{P}xi64>) -> (tensor<?x2xi64>, tensor<{P}xi64>) {
  %y, %r = dist.variable_all_to_all %x, %s axis 0 : tensor<?x2xi64>, tensor<{P}xi64> -> tensor<?x2xi64>
  func.return %y, %r : tensor<?x2xi64>, tensor<{P}xi64>
}""",
}


def source(program: str, size: int) -> str:
    rest = list(range(2, size)) or [size - 1]
    text = PROGRAMS[program].replace("{P}", str(size)).replace("{REST}", str(rest))
    # two subgroups of a 2-rank world: {0} and {1}
    return text.replace("[[0, 1], [1]]", "[[0], [1]]")

#: the implementations a generic commutative all-reduce may request (None:
#: the default for the group size, chosen at bind time)
GENERIC = (None, "gather-fold", "ring", "halving-doubling", "recursive-doubling")


@dataclass(frozen=True)
class Setting:
    """What one rank passes to `distir.compile`."""

    implementation: str | None = None
    agreement: bool = True
    deadline: float = 8.0
    #: compile an equal program again before the second run
    recompile: bool = False

    def compile(self, source: str) -> distir.Program:
        implementations = (
            {"dist.all_reduce": self.implementation} if self.implementation else None
        )
        return distir.compile(
            source, implementations=implementations, agreement=self.agreement,
            deadline=self.deadline,
        )  # fmt: skip


@dataclass(frozen=True)
class PlanCase:
    program: str
    settings: tuple[Setting, ...]

    @property
    def size(self) -> int:
        return len(self.settings)

    def inputs(self, rank: int) -> list[torch.Tensor]:
        if self.program == "variable all-to-all":
            sends = [(rank + peer) % 3 for peer in range(self.size)]
            rows = sum(sends)
            return [torch.arange(rows * 2).reshape(rows, 2) + 100 * rank, torch.tensor(sends)]
        return [torch.arange(6) * (rank + 1) + rank]

    def executed(self, setting: Setting) -> tuple[tuple[str, ...], bool]:
        """The plan of a rank with `setting`: the algorithm of the all-reduce
        on every group size it meets (a subgroup program's plan includes the
        other subgroups') and the agreement mode (the test's own account,
        not distir's fingerprint)."""
        if not self.program.startswith("generic"):
            return ((), setting.agreement)
        sizes = [self.size]
        if self.program == "generic sum on subgroups":
            sizes = sorted({2, self.size - 2} - {0}) if self.size > 2 else [1]
        op = next(
            o for o in distir.compile(source(self.program, self.size)).module.walk()
            if isinstance(o, AllReduceOp)
        )  # fmt: skip
        names = tuple(setting.implementation or default_algorithm(op, n) for n in sizes)
        return (names, setting.agreement)

    def plans_differ(self) -> bool:
        return len({self.executed(s) for s in self.settings}) > 1


def plan_worker(ctx, cases: list[PlanCase]) -> list[tuple[str, object]]:
    outcomes = []
    groups = []  # kept alive: a freed group's address must not be reused
    for case in cases:
        group = dist.new_group(list(range(ctx.world_size)))
        groups.append(group)
        setting = case.settings[ctx.rank]
        text = source(case.program, ctx.world_size)
        inputs = case.inputs(ctx.rank)
        runs = []
        try:
            program = setting.compile(text)
            for run in range(2):
                if run == 1 and setting.recompile:
                    program = setting.compile(text)
                result = program.run(*inputs, group=group)
                result = result if isinstance(result, tuple) else (result,)
                runs.append(tuple(r.clone() for r in result))
            outcomes.append(("ok", runs))
        except DistirError as e:
            outcomes.append((type(e).__name__, str(e)))
    return outcomes


SETTING = st.builds(
    Setting,
    implementation=st.sampled_from(GENERIC),
    agreement=st.booleans(),
    deadline=st.sampled_from([8.0, 9.5]),
    recompile=st.booleans(),
)


@st.composite
def plan_cases(draw, size: int) -> PlanCase:
    program = draw(st.sampled_from(sorted(PROGRAMS)))
    first = draw(SETTING)
    if not program.startswith("generic"):
        first = Setting(None, first.agreement, first.deadline, first.recompile)
    rest = []
    for _ in range(size - 1):
        # Half the time the same plan with other deadlines and recompiles.
        other = draw(SETTING)
        if draw(st.booleans()):
            other = Setting(first.implementation, first.agreement, other.deadline,
                            other.recompile)  # fmt: skip
        elif not program.startswith("generic"):
            other = Setting(None, other.agreement, other.deadline, other.recompile)
        rest.append(other)
    return PlanCase(program, (first, *rest))


#: the examples of issue 18, item 1
EXAMPLES = [
    PlanCase("generic sum", (Setting("ring"), Setting("halving-doubling"))),
    PlanCase("generic sum", (Setting("ring"), Setting("recursive-doubling"))),
    PlanCase("generic sum", (Setting("ring", False), Setting("halving-doubling", False))),
    PlanCase("variable all-to-all", (Setting(agreement=False), Setting(agreement=True))),
    PlanCase("variable all-to-all", (Setting(agreement=True), Setting(agreement=False))),
    # equal plans: the default algorithm named explicitly, a recompiled trusted program
    PlanCase("generic sum", (Setting(None), Setting("recursive-doubling"))),
    PlanCase("generic sum", (Setting("ring", False), Setting("ring", False, 9.5, True))),
]


def drawn_cases(count: int, size: int) -> list[PlanCase]:
    drawn: list[PlanCase] = []

    @settings(max_examples=count, derandomize=True, database=None,
              phases=[Phase.generate], deadline=None)  # fmt: skip
    @given(plan_cases(size))
    def collect(case: PlanCase) -> None:
        drawn.append(case)

    collect()
    return drawn


#: per group size, the cases one launch runs
#: uneven subgroups on 3 ranks: sizes 2 and 1 get different default
#: algorithms, and the ranks' plans are still one plan
EXAMPLES_3 = [
    PlanCase("generic sum on subgroups", (Setting(),) * 3),
    PlanCase("generic sum on subgroups", (Setting(agreement=False),) * 3),
    PlanCase("generic sum on subgroups", (Setting(), Setting(), Setting("ring"))),
]
CASES = {2: EXAMPLES + drawn_cases(24, 2), 3: EXAMPLES_3 + drawn_cases(12, 3)}
_launched: dict[int, list] = {}


def outcomes(size: int) -> list:
    if size not in _launched:
        _launched[size] = launch(plan_worker, size, CASES[size], pass_context=True, timeout=150)
    return _launched[size]


def test_the_drawn_cases_cover_both_outcomes():
    differ = [c.plans_differ() for cases in CASES.values() for c in cases]
    assert sum(differ) >= 10 and len(differ) - sum(differ) >= 10


@pytest.mark.multirank
@pytest.mark.timeout(170)
@pytest.mark.parametrize(
    ("size", "index"), [(size, i) for size, cases in CASES.items() for i in range(len(cases))]
)
def test_ranks_with_different_plans_all_raise_program_mismatch(size, index):
    case = CASES[size][index]
    got = outcomes(size)  # per rank, per case
    if case.plans_differ():
        for rank in range(size):
            kind, text = got[rank][index]
            assert kind == "ProgramMismatch", (rank, case, kind, text)
            assert "different programs or plans" in text, text
        return
    expected = distir.compile(source(case.program, size)).simulate(
        [case.inputs(r) for r in range(size)]
    )
    for rank in range(size):
        kind, runs = got[rank][index]
        assert kind == "ok", (rank, case, runs)
        want = expected[rank] if isinstance(expected[rank], tuple) else (expected[rank],)
        for results in runs:
            assert len(results) == len(want)
            for g, w in zip(results, want, strict=True):
                assert g.dtype == w.dtype and torch.equal(g, w), (rank, case, g, w)


@pytest.mark.multirank
@pytest.mark.timeout(170)
def test_a_mismatch_report_says_what_each_rank_runs():
    kind, text = outcomes(2)[0][0]  # ring against halving-doubling
    assert kind == "ProgramMismatch"
    assert "ring" in text and "halving-doubling" in text, text
    kind, text = outcomes(2)[1][3]  # trusted against verified
    assert "trusted (agreement=False)" in text and "agreement at every run" in text, text
