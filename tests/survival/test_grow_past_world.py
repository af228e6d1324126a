"""Growth past the starting world size is refused, by name (issue 39).

A running job grows back to the ranks of the world it started with: every
membership's group is made from torch.distributed's default group, whose
size `init_process_group` fixes. Two facts of torch 2.13 behind it, and
distir's refusal of a process started in a larger world:

- a process cannot be rank N of a default group of N ranks (gloo enforces
  rank < size), so a joiner outside `range(world)` must start a world of
  its own, larger than the job's;
- such a process can initialise that larger world on the job's store
  (lazily connected, as a replacement's is), and torch then forms a gloo
  group of the members and it (`distir.transport.groups.create_group`) on
  which collectives run: torch does not stand in the way, distir's protocol
  does (the members look for requests of the ranks of their own world
  only);
- so it asks to join and the members never look at its rank: without a
  check it would wait for its whole deadline. The members publish the
  job's world size at their first `grow`, and `join` refuses at once,
  naming both sizes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from distir.runtime import elastic
from distir.runtime.launch import launch

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(120)]


def test_torch_refuses_a_rank_outside_the_default_groups_size():
    script = textwrap.dedent(
        """
        import torch.distributed as dist
        try:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=2, world_size=2)
            print("initialised")
        except RuntimeError as e:
            print(str(e).splitlines()[0])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    ).stdout
    assert "rank < size. 2 vs 2" in out, out


#: a process started as rank 2 of a world of 3 on the job's store (the job has 2)
OUTSIDER = textwrap.dedent(
    """
    import os, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    from distir.errors import JoinFailed, JoinRefused
    from distir.runtime import elastic

    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=30))
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
    dist.init_process_group("gloo", store=store, rank=2, world_size=3)
    began = time.monotonic()
    try:
        elastic.join([torch.zeros(3)], deadline=20)
        print("admitted")
    except (JoinRefused, JoinFailed) as e:
        print(f"{type(e).__name__} after {time.monotonic() - began:.1f} s: {e}")
    """
)


#: rank 2 of a world of 3 on the job's store forms a group with the job's 2 ranks
GROUPED = textwrap.dedent(
    """
    import os
    from datetime import timedelta
    import torch, torch.distributed as dist
    from distir.transport.groups import create_group

    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=30))
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
    dist.init_process_group("gloo", store=store, rank=2, world_size=3)
    os.environ.pop("TORCH_GLOO_LAZY_INIT")  # its later groups connect at once, as the members'
    group = create_group([0, 1, 2], "test-past-the-world", timedelta(seconds=30))
    t = torch.tensor([3.0])
    dist.all_reduce(t, group=group)
    print(f"sum {t.item():g}")
    """
)


def grouped(ctx) -> float:
    from distir.transport.groups import create_group

    if ctx.rank == 0:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        outsider = subprocess.Popen(
            [sys.executable, "-c", GROUPED], stdout=subprocess.PIPE, text=True, env=env
        )
    group = create_group([0, 1, 2], "test-past-the-world", timedelta(seconds=60))
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t, group=group)
    if ctx.rank == 0:
        out, _ = outsider.communicate(timeout=60)
        assert out.strip() == "sum 6", out
    return t.item()


def test_torch_forms_a_group_with_a_process_of_a_larger_world():
    assert launch(grouped, 2, pass_context=True, timeout=100) == [6.0, 6.0]


def member(ctx) -> str:
    store = dist.distributed_c10d._get_default_store()
    state = [torch.zeros(3)]
    m = elastic.grow(state, deadline=10)  # publishes the world size
    out = ""
    if ctx.rank == 0:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        out = subprocess.run(
            [sys.executable, "-c", OUTSIDER], capture_output=True, text=True, timeout=90, env=env
        ).stdout
        store.set("test/outsider done", "1")
    store.wait(["test/outsider done"], timedelta(seconds=100))
    # The members go on unchanged.
    after = elastic.grow(state, deadline=10)
    assert (after.epoch, after.ranks) == (m.epoch, m.ranks) == (0, (0, 1))
    return out


def test_a_joiner_from_a_larger_world_is_refused_by_name():
    # Refused (JoinRefused), not left to wait for its deadline (JoinFailed).
    out = launch(member, 2, pass_context=True, timeout=110)[0]
    assert out.startswith("JoinRefused after "), out
    assert "this process is rank 2 of a world of 3 ranks, the running job's world has 2" in out
    assert "start the replacement as a rank of range(2) that is not a member" in out
