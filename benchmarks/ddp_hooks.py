"""Time per DDP training step of distir's hooks against DDP's default, as ratios.

P local gloo ranks (default 2) train MLPs of about 1M and 10M parameters
(batch 32 per rank, SGD) with DDP's default all-reduce, `distir.ddp.sum_hook`
and `distir.ddp.encrypted_hook`, each on its own copy of the same model. Each
iteration runs one step of every hook in turn (in an order rotated at every
iteration), so that load on the machine hits them alike; a step's time is
the maximum over ranks, and a row reports the median over iterations and the
ratio to the default's median, and `paired`, the median over iterations
of the step's ratio to the default's step in the same iteration. `torch
hook` is the least a Python hook costs: DDP's default written as a plain
torch hook (scaled in place, one async all-reduce on its own group). For the sum hook it also reports the
overlap: the share of the hooks' communication time (hook returned ->
future completed) that passed while backward was still computing (before
DDP called the last bucket's hook).

The encrypted hook costs one CKKS encryption per 4096 gradients and one
committed ciphertext sum and one collective decryption per bucket; it is timed for
`--encrypted-steps` steps on models up to `--encrypted-max` parameters, and
the per-ciphertext cost is printed so that larger models can be estimated.

    python benchmarks/ddp_hooks.py [--nproc 2] [--iterations 10]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from distir.runtime.launch import launch

SIZES = {"1M": (1024, 512), "10M": (2048, 2560)}  # Linear(a, b) + Linear(b, a)
BATCH = 32


def _model(a: int, b: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.ReLU(), torch.nn.Linear(b, a))


def _overlap(timings) -> tuple[float, float]:
    """(communication seconds, of which before the last hook call)."""
    last_call = max(t.called for t in timings)
    total = sum(t.completed - t.returned for t in timings)
    before = sum(max(0.0, min(t.completed, last_call) - t.returned) for t in timings)
    return total, before


def _torch_hook(group, bucket):
    """DDP's default in a Python hook: scaled in place, one async all-reduce."""
    import torch.distributed as dist

    buffer = bucket.buffer()
    buffer.mul_(1.0 / dist.get_world_size(group))
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(
        lambda done: done.value()[0]
    )


def rank_main(ctx, iterations: int, encrypted_steps: int, encrypted_max: int) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import distir.ddp as hooks

    out: dict = {}
    encrypted_state = None
    for name, (a, b) in SIZES.items():
        base = _model(a, b)
        params = sum(p.numel() for p in base.parameters())
        models = {}
        models["default"] = (DDP(copy.deepcopy(base)), None)
        # The least any Python hook costs: plain torch, in place, on its own group.
        torch_group = dist.new_group(list(range(ctx.world_size)))
        ddp = DDP(copy.deepcopy(base))
        ddp.register_comm_hook(torch_group, _torch_hook)
        models["torch hook"] = (ddp, None)
        state = hooks.SumHookState(deadline=60, record_timings=True)
        ddp = DDP(copy.deepcopy(base))
        ddp.register_comm_hook(state, hooks.sum_hook)
        models["sum"] = (ddp, state)
        if params <= encrypted_max and encrypted_steps:
            if encrypted_state is None:
                encrypted_state = hooks.EncryptedHookState(deadline=600)
            ddp = DDP(copy.deepcopy(base))
            ddp.register_comm_hook(encrypted_state, hooks.encrypted_hook)
            models["encrypted"] = (ddp, encrypted_state)
        g = torch.Generator().manual_seed(ctx.rank)
        x, y = torch.randn(BATCH, a, generator=g), torch.randn(BATCH, a, generator=g)
        times: dict[str, list[float]] = {h: [] for h in models}
        overlap = [0.0, 0.0]
        for it in range(iterations + 1):  # the first iteration warms up (compiles)
            # A new order each iteration: in a fixed order the hook timed last
            # was up to a third slower at 10M, whatever hook it was.
            order = list(models)[it % len(models) :] + list(models)[: it % len(models)]
            for hook in order:
                ddp, state = models[hook]
                if hook == "encrypted" and it > encrypted_steps:
                    continue
                if state is not None:
                    state.timings.clear()
                dist.barrier()
                start = time.perf_counter()
                ddp.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                elapsed = torch.tensor([time.perf_counter() - start])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if it:
                    times[hook].append(float(elapsed))
                    if hook == "sum":
                        total, before = _overlap(state.timings)
                        overlap[0] += total
                        overlap[1] += before
        default = times["default"]
        out[name] = {
            "params": params,
            "median_s": {h: statistics.median(v) for h, v in times.items() if v},
            # the median of each iteration's ratio to the default's step
            "paired": {
                h: statistics.median(t / d for t, d in zip(v, default))
                for h, v in times.items()
                if v
            },
            "overlap": overlap[1] / overlap[0] if overlap[0] else 0.0,
            "buckets": len(models["sum"][1].timings),
        }
    if encrypted_state is not None:
        encrypted_state.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--encrypted-steps", type=int, default=1)
    parser.add_argument(
        "--encrypted-max",
        type=int,
        default=2_000_000,
        help="largest model (parameters) timed with the encrypted hook",
    )
    args = parser.parse_args()
    results = launch(
        rank_main,
        args.nproc,
        args.iterations,
        args.encrypted_steps,
        args.encrypted_max,
        pass_context=True,
        timeout=3000,
    )
    report = results[0]
    print(
        f"DDP training step, {args.nproc} gloo ranks, batch {BATCH} per rank, "
        f"median of {args.iterations} steps (encrypted: {args.encrypted_steps})"
    )
    print(
        f"{'model':>6} {'params':>11} {'buckets':>7} {'hook':>10} {'step':>10} "
        f"{'x default':>10} {'paired':>7}"
    )
    for name, row in report.items():
        default = row["median_s"]["default"]
        for hook, t in row["median_s"].items():
            print(
                f"{name:>6} {row['params']:>11,} {row['buckets']:>7} {hook:>10} "
                f"{t * 1e3:>8.1f}ms {t / default:>9.2f}x {row['paired'][hook]:>6.2f}x"
            )
        print(
            f"{name:>6} sum hook: {row['overlap']:.0%} of its communication time "
            "overlapped backward"
        )
        if "encrypted" in row["median_s"]:
            per = (row["median_s"]["encrypted"] - default) / -(-row["params"] // 4096)
            print(
                f"{name:>6} encrypted hook: {per * 1e3:.0f} ms per 4096 gradients "
                "(one ciphertext) over the default"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
