"""`distir.ddp.unwrap`: an old DDP taken off its module's parameters before
the module is wrapped again (after `recover` or `grow`), without the full
garbage collection that took a second in the elastic example.

Two gloo ranks wrap a model in a DDP whose comm hook counts its calls, run
a step, abandon the next one after its forward (as a failure in the
backward leaves it: the old DDP's reducer still expects a backward), then
wrap the model again in a plain DDP. Without `unwrap` (the old DDP still
referenced, as it is until the collector frees it) the old hook runs again
at the next backward; after `unwrap` it never does, and the gradients are
the mean of both ranks' local gradients (plain torch: each rank's local
backward on a copy, gathered with `dist.all_gather`).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations.
import copy

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distir import ddp as hooks
from distir.runtime.launch import launch

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(60)]


def _counting(state: dict, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    state["calls"] += 1
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda f: f.value()[0] / dist.get_world_size())


def _backward(model: torch.nn.Module, rank: int) -> None:
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()


def worker(ctx, unwrap: bool) -> dict:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    plain = copy.deepcopy(net)
    old = DDP(net)
    counter = {"calls": 0}
    old.register_comm_hook(counter, _counting)
    _backward(old, ctx.rank)
    # A step abandoned after the forward (as a failure in the backward
    # leaves it): the old DDP's reducer still expects its backward.
    old(torch.zeros(1, 6))
    before = counter["calls"]
    if unwrap:
        hooks.unwrap(old)
    new = DDP(net)
    _backward(new, ctx.rank)
    _backward(plain, ctx.rank)  # the oracle: local gradients, averaged below
    mean = []
    for p in plain.parameters():
        both = [torch.empty_like(p.grad) for _ in range(ctx.world_size)]
        dist.all_gather(both, p.grad)
        mean.append(sum(both) / ctx.world_size)
    return {
        "old hook calls at the second backward": counter["calls"] - before,
        "first backward called it": before > 0,
        "grads": [p.grad.clone() for p in net.parameters()],
        "mean": mean,
    }


def test_an_unwrapped_ddp_no_longer_acts_on_the_parameters():
    for v in launch(worker, 2, True, pass_context=True, timeout=50):
        assert v["first backward called it"]
        assert v["old hook calls at the second backward"] == 0
        for got, want in zip(v["grads"], v["mean"]):
            torch.testing.assert_close(got, want)


def test_without_unwrap_the_old_ddp_still_reduces():
    # What unwrap prevents: the old DDP, still referenced, hooks the next backward.
    for v in launch(worker, 2, False, pass_context=True, timeout=50):
        assert v["old hook calls at the second backward"] > 0
