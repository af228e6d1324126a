"""The sum hook's per-bucket check: a digest riding in the payload.

Each bucket of `distir.ddp.sum_hook` (float32, float64) carries the digest
of what its rank runs, byte d sent as (d, d*d); after the sum a rank
accepts only when the sums are (P*d, P*d*d) for its own digest
(`all_sent`). The property: for any digests of P ranks, summed as float32
in any order, every rank accepts exactly when all digests are equal (the
oracle: Python set equality). On 2 gloo ranks, a rank that sums another
bucket than its peer gets `ProgramMismatch` on every rank, and the group
runs nothing afterwards.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from distir.ddp import DIGEST_BYTES, all_sent, riding_words
from distir.runtime.launch import launch

digests = st.binary(min_size=DIGEST_BYTES, max_size=DIGEST_BYTES)


@given(
    st.integers(2, 16).flatmap(lambda p: st.lists(digests, min_size=p, max_size=p)),
    st.sampled_from([torch.float32, torch.float64]),
    st.randoms(use_true_random=False),
)
def test_every_rank_accepts_exactly_when_every_digest_is_equal(sent, dtype, random):
    rows = [torch.tensor(riding_words(d), dtype=dtype) for d in sent]
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
            mean = state.riding_sum(index, buffer).wait()
            seen.append(f"step {step}: {mean.tolist()}")
        except DistirError as e:
            seen.append(f"step {step}: {type(e).__name__}: {e}")
        dist.barrier()
    return seen


@pytest.mark.multirank
@pytest.mark.parametrize("nproc", [2, 3])  # appended, and in gloo's segments
def test_ranks_summing_different_buckets_fail_on_every_rank(nproc):
    per_rank = launch(mismatched_worker, nproc, pass_context=True, timeout=90)
    # the mean of 1, ..., P in plain torch, scaled as DDP scales
    mean = float(sum(torch.tensor(float(r + 1)) * (1.0 / nproc) for r in range(nproc)))
    for rank, seen in enumerate(per_rank):
        values = [float(v) for v in seen[0].removeprefix("step 0: [").rstrip("]").split(", ")]
        assert values == pytest.approx([mean] * 6, rel=1e-6), (rank, seen)
        assert seen[1].startswith("step 1: ProgramMismatch: DDP sum hook: ranks summed "
                                  "different buckets at hook call 1"), (rank, seen)  # fmt: skip
        assert seen[2].startswith("step 2: Poisoned"), (rank, seen)
