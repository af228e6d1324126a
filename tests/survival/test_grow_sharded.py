"""Growing with sharded state (issue 39): a joiner receives its shard of
state split across the members, by `dist.transfer` from the old layout to
the new one.

Three gloo ranks hold a `ShardedState` (two tensors split over the members
along different dims, one held whole). At every step each member adds the
group's size (an all-reduce) to every element of its shards. Rank 2 is
killed; the survivors recover and restore their shards of the smaller
membership from the full state (a checkpoint's stand-in, built with plain
torch); a replacement joins and gets its shards. The oracle is plain torch:
the full state is a base plus the sum of the sizes of the steps (one
survivor's record), and every rank's shard is `torch.tensor_split` of it
over the members in rank order.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

import distir
from distir.errors import DistirError, JoinRefused
from distir.runtime import elastic
from distir.runtime.elastic_shards import Shard, ShardedState
from distir.runtime.launch import launch

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(120)]

STEPS = 8
KILLED_AT = 2
JOINS_AT = 4

LAYOUT = {
    "w": Shard((7, 3), torch.float64, 0),  # rows split: 3/2/2, then 4/3 over two
    "m": Shard((2, 5), torch.float32, 1),  # columns split
    "count": Shard((2,), torch.int64, None),  # held whole by every member
}


def full(total: float) -> dict[str, torch.Tensor]:
    """The whole state after steps whose sizes add to `total` (plain torch)."""
    out = {}
    for name, spec in LAYOUT.items():
        base = torch.arange(torch.Size(spec.shape).numel(), dtype=torch.float64).reshape(spec.shape)
        out[name] = (base * 10 + total).to(spec.dtype)
    return out


def shards_of(whole: dict[str, torch.Tensor], members: int, index: int) -> dict[str, torch.Tensor]:
    return {
        name: whole[name].clone()
        if LAYOUT[name].dim is None
        else torch.tensor_split(whole[name], members, dim=LAYOUT[name].dim)[index].clone()
        for name in LAYOUT
    }


def worker(ctx, bad: str) -> dict:
    sizes: dict[int, int] = {}
    if ctx.joining:
        state = ShardedState(LAYOUT)
        try:
            m = elastic.join(state, deadline=40)
        except JoinRefused as e:
            return {"error": str(e)}
        done = m.completed
        received = {k: v.clone() for k, v in state.shards.items()}
    else:
        m = distir.membership()
        state = ShardedState(LAYOUT, shards_of(full(0), m.size, m.rank))
        done = 0
        received = None
    joined_at = None
    try:
        while done < STEPS:
            if ctx.rank == 2 and not ctx.joining and done == KILLED_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                # The members admit joiners at one point only (the
                # replacement's start takes longer than the steps): there
                # they pause until it asks, agreeing when to stop.
                if done == JOINS_AT and m.size < ctx.world_size:
                    if bad == "shape" and ctx.rank == 1:
                        # this member's shard is of the layout over three
                        state.shards["w"] = state.shards["w"][:2].clone()
                    grown = elastic.grow(state, deadline=8, progress=done, wait=60)
                    if grown.epoch != m.epoch:
                        m, joined_at = grown, done
                total = distir.all_reduce(torch.ones(1), "sum", group=m.group, deadline=2.0)
                for x in state.shards.values():
                    x += total.to(x.dtype)
                sizes[done] = m.size
                done += 1
            except DistirError as e:
                if "grow:" in str(e):
                    raise
                m = distir.recover(deadline=8, progress=done)
                done = m.completed
                # A checkpoint's stand-in: the full state at the agreed step.
                total = float(sum(sizes[s] for s in range(done)))
                state.shards = shards_of(full(total), m.size, m.rank)
    except DistirError as e:
        return {"error": str(e)}
    return {
        "shards": state.shards,
        "sizes": sizes,
        "ranks": m.ranks,
        "index": m.rank,
        "received": received,
        "received at": done if received is None else m.completed,
        "joined at": joined_at,
    }


def test_a_joiner_receives_exactly_its_shard():
    outcome = launch(worker, 3, "", pass_context=True, tolerate=1, replace=True, timeout=100)
    assert outcome.lost == {2: "killed by SIGKILL without a result (replaced)"}, outcome.lost
    results = outcome.results
    assert all("shards" in v for v in results.values()), results
    survivor = results[0]
    assert survivor["ranks"] == (0, 1, 2)
    assert [survivor["sizes"][s] for s in range(STEPS)] == [3] * KILLED_AT + [2] * (
        JOINS_AT - KILLED_AT
    ) + [3] * (STEPS - JOINS_AT)
    # The joiner's shards when it was admitted: the state after JOINS_AT steps.
    joiner = results[2]
    assert joiner["received"] is not None
    assert joiner["received at"] == JOINS_AT
    at_join = float(sum(survivor["sizes"][s] for s in range(JOINS_AT)))
    expected = shards_of(full(at_join), 3, 2)
    for name, x in joiner["received"].items():
        assert x.dtype == LAYOUT[name].dtype
        assert torch.equal(x, expected[name]), (name, x, expected[name])
    # Every rank at the end: its shard of the final full state.
    final = full(float(sum(survivor["sizes"].values())))
    for rank, v in results.items():
        assert v["index"] == rank
        for name, x in shards_of(final, 3, rank).items():
            assert torch.equal(v["shards"][name], x), (rank, name)


def test_a_member_whose_shard_does_not_fit_is_named_on_every_rank():
    outcome = launch(worker, 3, "shape", pass_context=True, tolerate=1, replace=True, timeout=100)
    errors = {rank: v.get("error", "no error") for rank, v in outcome.results.items()}
    for rank, error in errors.items():
        assert "rank 1's shard of 'w' is not the [3, 3] torch.float64" in error, (rank, error)
        assert "over the members [0, 1]" in error, (rank, error)
    assert errors[2].startswith("join: the members refused rank 2")
    assert errors[0].startswith("grow:") and errors[1].startswith("grow:")
    assert "rank 1 holds [2, 3] torch.float64" in errors[1]


def test_a_joiner_with_another_layout_is_refused():
    from distir.runtime.elastic import state_digest

    other = dict(LAYOUT, w=Shard((7, 3), torch.float64, 1))
    assert state_digest(ShardedState(other)) != state_digest(ShardedState(LAYOUT))
    assert state_digest(ShardedState(LAYOUT)) != state_digest(list(full(0).values()))


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        ({"w": (3, 4)}, "declared by a tuple, not a Shard"),
        ({"w": Shard((), torch.float32)}, "shape [] must be one or more non-negative ints"),
        ({"w": Shard((3, -1), torch.float32)}, "shape [3, -1] must be"),
        ({"w": Shard((3,), torch.complex64)}, "dtype torch.complex64 is not carried"),
        ({"w": Shard((3, 4), torch.float32, 2)}, "dim 2 is not a dim of shape [3, 4]"),
    ],
)
def test_bad_declarations_are_named(layout, says):
    with pytest.raises(DistirError, match="ShardedState: tensor 'w'") as e:
        ShardedState(layout)
    assert says in str(e.value)
