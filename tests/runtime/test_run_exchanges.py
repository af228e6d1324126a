"""What a run puts on the wire (issue 26): a verified run is its payload plus
one small exchange, the run agreement, and nothing else; a variable
all-to-all whose counts are entry arguments sends them in that exchange, so
it costs the counts exchange and the rows, as raw torch.distributed does. A
trusted run (agreement=False) after its first is the payload alone.
Whatever rides in the agreement, a divergence is still a named error on
every rank, never a result."""

from __future__ import annotations

import pytest
import torch

import distir
from distir.errors import DistirError
from distir.runtime.launch import launch
from distir.transport.groups import ProcessGroupResource

A2A = """
func.func @main(%x: tensor<?x?xi64>, %s: tensor<{P}xi64>) -> (tensor<?x?xi64>, tensor<{P}xi64>) {
  %y, %r = dist.variable_all_to_all %x, %s axis 0 : tensor<?x?xi64>, tensor<{P}xi64> -> tensor<?x?xi64>
  func.return %y, %r : tensor<?x?xi64>, tensor<{P}xi64>
}"""

TWO_A2A = """
func.func @main(%x: tensor<?x2xi64>, %s: tensor<{P}xi64>) -> (tensor<?x2xi64>, tensor<?x2xi64>) {
  %y, %r = dist.variable_all_to_all %x, %s axis 0 : tensor<?x2xi64>, tensor<{P}xi64> -> tensor<?x2xi64>
  %z, %q = dist.variable_all_to_all %x, %s axis 0 : tensor<?x2xi64>, tensor<{P}xi64> -> tensor<?x2xi64>
  func.return %y, %z : tensor<?x2xi64>, tensor<?x2xi64>
}"""

ALL_REDUCE = """
func.func @main(%x: tensor<1024xf32>) -> tensor<1024xf32> {
  %y = dist.all_reduce sum %x : tensor<1024xf32>
  func.return %y : tensor<1024xf32>
}"""

#: the process group method every collective is submitted with -> what it is
#: here (the run agreement's rows go as a bare all-to-all)
COLLECTIVES = {
    "alltoall_base": "exchange_rows", "allreduce": "all_reduce", "broadcast": "broadcast",
    "all_gather_single": "all_gather", "all_to_all_single": "all_to_all",
}  # fmt: skip


def _count_collectives() -> dict[str, int]:
    """Wraps the functions every collective is submitted through
    (`ProcessGroupResource._run`, and the process group method a
    `DirectCollective` holds, which a specialised run calls itself;
    class-wide, in this rank) and returns the live call counts."""
    from distir.transport.direct import DirectCollective

    calls = dict.fromkeys(COLLECTIVES.values(), 0)
    original = ProcessGroupResource._run

    def counted(self, submit, *args, **kwargs):
        if not getattr(submit, "counted", False):
            calls[COLLECTIVES[submit.__name__]] += 1
        return original(self, submit, *args, **kwargs)

    ProcessGroupResource._run = counted
    made = DirectCollective.__init__

    def counting(self, invocation, resource, submit, *rest):
        def counted_submit(*args):
            calls[COLLECTIVES[submit.__name__]] += 1
            return submit(*args)

        counted_submit.counted = True
        made(self, invocation, resource, counted_submit, *rest)

    DirectCollective.__init__ = counting
    return calls


def _send_counts(rank: int, size: int) -> list[int]:
    return [(rank + peer) % 3 + 1 for peer in range(size)]


def exchanges_rank(context) -> dict:
    size, rank = context.world_size, context.rank
    counts = _send_counts(rank, size)
    x = torch.arange(sum(counts) * 3, dtype=torch.int64).reshape(-1, 3) + 100 * rank
    s = torch.tensor(counts, dtype=torch.int64)
    a2a = distir.compile(A2A.replace("{P}", str(size)))
    two = distir.compile(TWO_A2A.replace("{P}", str(size)))
    trusted = distir.compile(ALL_REDUCE, agreement=False)
    verified = distir.compile(ALL_REDUCE)
    calls = _count_collectives()  # before binding: a specialised run submits itself
    v = torch.ones(1024)
    trusted.run(v.clone(), donate=True)  # the first trusted run agrees
    seen = {}
    for name, run in [
        ("a2a", lambda: a2a.run(x, s)),
        ("two a2a", lambda: two.run(x[:, :2].contiguous(), s)),
        ("verified all-reduce", lambda: verified.run(v.clone(), donate=True)),
        ("trusted all-reduce", lambda: trusted.run(v.clone(), donate=True)),
    ]:
        before = dict(calls)
        results = run()
        seen[name] = ({k: calls[k] - before[k] for k in calls if calls[k] != before[k]}, results)
    return seen


@pytest.mark.multirank
@pytest.mark.timeout(90)
@pytest.mark.parametrize("size", [2, 3])
def test_a_verified_run_is_its_payload_and_one_small_exchange(size):
    per_rank = launch(exchanges_rank, size, pass_context=True, timeout=80)
    for rank, seen in enumerate(per_rank):
        calls = {name: c for name, (c, _) in seen.items()}
        assert calls == {
            # the agreement carries the counts: then only the rows move
            "a2a": {"exchange_rows": 1, "all_to_all": 1},
            # one program, two variable all-to-alls: the second exchanges its own counts
            "two a2a": {"exchange_rows": 2, "all_to_all": 2},
            "verified all-reduce": {"exchange_rows": 1, "all_reduce": 1},
            "trusted all-reduce": {"all_reduce": 1},
        }, f"rank {rank}"
        y, received = seen["a2a"][1]
        expected_counts = [_send_counts(peer, size)[rank] for peer in range(size)]
        assert received.tolist() == expected_counts
        # rows from peer p: the slice of p's rows that p's counts send to this rank
        parts = []
        for peer in range(size):
            sent = _send_counts(peer, size)
            start = sum(sent[:rank])
            rows = torch.arange(sum(sent) * 3, dtype=torch.int64).reshape(-1, 3) + 100 * peer
            parts.append(rows[start : start + sent[rank]])
        assert torch.equal(y, torch.cat(parts))
        first, second = seen["two a2a"][1]
        assert torch.equal(first, second) and torch.equal(first, y[:, :2])
        all_reduced = seen["verified all-reduce"][1]
        assert torch.equal(all_reduced, torch.full((1024,), float(size)))


def divergent_rank(context, case: str) -> str:
    size, rank = context.world_size, context.rank
    counts = _send_counts(rank, size)
    columns = 3
    if case == "row layouts differ" and rank == 1:
        columns = 2
    if case == "one rank's counts do not add up" and rank == 1:
        counts = [c + 1 for c in counts]
    x = torch.zeros(sum(_send_counts(rank, size)), columns, dtype=torch.int64)
    s = torch.tensor(counts, dtype=torch.int64)
    program = distir.compile(A2A.replace("{P}", str(size)))
    try:
        if case == "another program" and rank == 1:
            distir.compile(ALL_REDUCE).run(torch.ones(1024))
        else:
            program.run(x, s)
    except DistirError as e:
        return f"{type(e).__name__}: {e}"
    return "returned a result"


@pytest.mark.multirank
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "case, everyone, rank_1",
    [
        ("row layouts differ", "ranks pass different row layouts (rank 0: int64[*, 3]; "
         "rank 1: int64[*, 2]; rank 2: int64[*, 3])", None),
        ("one rank's counts do not add up", "rank(s) [1] of group world rejected their inputs",
         "OpError: 'dist.variable_all_to_all' at <program>:3:3: input has 6 rows on axis 0 but "
         "the sum of send counts says 9"),
        ("another program", "ProgramMismatch: @main: ranks run different programs or plans: "
         "ranks [0, 2] run plan", None),
    ],
)  # fmt: skip
def test_a_divergence_in_what_rides_with_the_counts_is_a_named_error_on_every_rank(
    case, everyone, rank_1
):
    outcomes = launch(divergent_rank, 3, case, pass_context=True, timeout=80)
    for rank, outcome in enumerate(outcomes):
        wanted = rank_1 if rank == 1 and rank_1 is not None else everyone
        assert wanted in outcome, f"rank {rank}: {outcome}"
