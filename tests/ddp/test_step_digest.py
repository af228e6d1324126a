"""The sum hook's per-step check: a digest of the step's buckets.

At the last bucket of a step, `distir.ddp.sum_hook` all-reduces the digest
of what its rank ran in the step (each bucket's hook call, index, size and
dtype), byte d sent as the int64 pair (d, d*d); a rank accepts only when
the sums are (P*d, P*d*d) for its own digest (`all_sent`). The property:
for any digests of P ranks, summed in any order, every rank accepts
exactly when all digests are equal (the oracle: Python set equality). On
gloo ranks, a rank that sums another bucket than its peers gets
`ProgramMismatch` on every rank, and the group runs nothing afterwards.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from distir.ddp import DIGEST_BYTES, all_sent, digest_words
from distir.runtime.launch import launch

digests = st.binary(min_size=DIGEST_BYTES, max_size=DIGEST_BYTES)


@given(
    st.integers(1, 64).flatmap(lambda p: st.lists(digests, min_size=p, max_size=p)),
    st.randoms(use_true_random=False),
)
def test_every_rank_accepts_exactly_when_every_digest_is_equal(sent, random):
    rows = [torch.tensor(digest_words(d), dtype=torch.int64) for d in sent]
    random.shuffle(rows)  # the order the backend sums in is its own
    total = rows[0].clone()
    for row in rows[1:]:
        total += row
    verdicts = [all_sent(total.tolist(), d, len(sent)) for d in sent]
    assert verdicts == [len(set(sent)) == 1] * len(sent)


def mismatched_worker(ctx) -> list[str]:
    import torch.distributed as dist

    from distir import ddp as hooks
    from distir.errors import DistirError

    state = hooks.SumHookState(deadline=20)
    seen = []
    for step, index in enumerate([0, 1 if ctx.rank == 1 else 0, 0]):
        buffer = torch.full((6,), float(ctx.rank + 1))
        try:
            mean = state.checked_sum(index, buffer, last=True).wait()
            seen.append(f"step {step}: {mean.tolist()}")
        except DistirError as e:
            seen.append(f"step {step}: {type(e).__name__}: {e}")
        dist.barrier()
    return seen


@pytest.mark.multirank
@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_summing_different_buckets_fail_on_every_rank(nproc):
    per_rank = launch(mismatched_worker, nproc, pass_context=True, timeout=90)
    # the mean of 1, ..., P in plain torch, scaled as DDP scales
    mean = float(sum(torch.tensor(float(r + 1)) * (1.0 / nproc) for r in range(nproc)))
    for rank, seen in enumerate(per_rank):
        values = [float(v) for v in seen[0].removeprefix("step 0: [").rstrip("]").split(", ")]
        assert values == pytest.approx([mean] * 6, rel=1e-6), (rank, seen)
        assert seen[1].startswith("step 1: ProgramMismatch: DDP sum hook: ranks summed "
                                  "different buckets in the step ending at hook call 1"), (rank, seen)  # fmt: skip
        assert seen[2].startswith("step 2: Poisoned"), (rank, seen)


def swapped_worker(ctx) -> list[str]:
    import torch.distributed as dist

    from distir import ddp as hooks
    from distir.errors import DistirError

    state = hooks.SumHookState(deadline=20)
    # One step of two buckets of one size: rank 1 hands them over in the
    # other order; only the first bucket differs, the last is the same.
    order = [1, 0] if ctx.rank == 1 else [0, 1]
    futures = [
        state.checked_sum(index, torch.full((5,), float(ctx.rank + 1)), last=False)
        for index in order
    ]
    futures.append(state.checked_sum(2, torch.full((5,), float(ctx.rank + 1)), last=True))
    seen = []
    for future in futures:
        try:
            seen.append(str(future.wait().tolist()))
        except DistirError as e:
            seen.append(f"{type(e).__name__}: {e}")
    dist.barrier()
    return seen


@pytest.mark.multirank
def test_a_difference_in_any_bucket_of_a_step_fails_the_step_on_every_rank():
    per_rank = launch(swapped_worker, 2, pass_context=True, timeout=90)
    for rank, seen in enumerate(per_rank):
        # The step's last future carries the verdict: DDP waits for it.
        assert seen[2].startswith(
            "ProgramMismatch: DDP sum hook: ranks summed different buckets in the step "
            "ending at hook call 2"
        ), (rank, seen)
