"""Train with distir: DDP's default hook, the distir sum hook, the encrypted hook.

Four local ranks train a small MLP on scikit-learn's handwritten digits (the
dataset ships with the package: no download), each rank on its own quarter of
the training set, for a few epochs, three times: with DDP's default gradient
all-reduce, with `distir.ddp.sum_hook` (the same mean through a distir
program) and with `distir.ddp.encrypted_hook` (gradients encrypted under a
threshold CKKS key no rank holds, summed as ciphertexts, decrypted together).
It prints the loss per epoch of each, the largest difference to the default,
the time per training step, and writes a PNG of the three loss curves.

With `--kill-rank R --at-step S` (sum hook only) rank R is killed (SIGKILL)
in the middle of `loss.backward()` at step S: every survivor gets distir's
named error from its backward within the deadline plus 2 s, calls
`distir.recover()` (which agrees on who is left and returns a process group
over them), re-wraps the model in DDP and a new hook state on that group and
trains on.

    pip install -e ".[he,examples]"
    python examples/train_with_distir.py [--epochs 4] [--plot train_with_distir.png]
    python examples/train_with_distir.py --kill-rank 3 --at-step 5
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch

import distir
from distir.runtime.launch import launch

HOOKS = ("default", "sum", "encrypted")
LABELS = {"default": "DDP default", "sum": "distir sum", "encrypted": "distir encrypted"}
BATCH = 32  # per rank
DEADLINE_S = 10.0
#: longer than the hook's deadline: a survivor may wait on the lost rank
#: until its own collective deadline before it joins the recovery
RECOVER_S = 2 * DEADLINE_S + 5.0


def digits(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of the digits training set, standardised."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.int64)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    return x[rank::world], y[rank::world]


def _wrap(model: torch.nn.Module, hook: str, group=None):
    from torch.nn.parallel import DistributedDataParallel as DDP

    import distir.ddp as hooks

    ddp = DDP(model, process_group=group)
    state = None
    if hook == "sum":
        state = hooks.SumHookState(group=group, deadline=DEADLINE_S)
        ddp.register_comm_hook(state, hooks.sum_hook)
    elif hook == "encrypted":
        state = hooks.EncryptedHookState(group=group, deadline=60.0)
        ddp.register_comm_hook(state, hooks.encrypted_hook)
    return ddp, state


def train(ctx, hook: str, epochs: int, kill_rank: int, at_step: int) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    ddp, state = _wrap(model, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = digits(ctx.rank, ctx.world_size)
    steps = len(x) // BATCH
    losses, step_times, events = [], [], []
    step = 0
    for _ in range(epochs):
        total = 0.0
        for i in range(steps):
            xb, yb = x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]
            start = time.perf_counter()
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
            if step == at_step and ctx.rank == kill_rank:
                # Dies in backward, after some buckets were handed to the hook.
                model[0].weight.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL))
            try:
                with state.named_errors() if state is not None else _nothing():
                    loss.backward()
            except Exception as e:  # noqa: BLE001 - shown, then recovered from
                seen = time.perf_counter() - start
                events.append(f"step {step}: {type(e).__name__} after {seen:.1f} s")
                del ddp  # its reducer's hooks leave the parameters with it
                m = distir.recover(deadline=RECOVER_S)
                ddp, state = _wrap(model, hook, m.group)
                events.append(
                    f"step {step}: recovered after {time.perf_counter() - start:.1f} s: epoch "
                    f"{m.epoch}, ranks {list(m.ranks)} (lost {list(m.lost)}); training on"
                )
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
                loss.backward()
            optimizer.step()
            step_times.append(time.perf_counter() - start)
            total += loss.item()
            step += 1
        losses.append(total / steps)
    if hook == "encrypted":
        state.close()
    return {"losses": losses, "step_s": sorted(step_times)[len(step_times) // 2], "events": events}


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _mean_over_ranks(results: list[dict]) -> list[float]:
    per_rank = [r["losses"] for r in results]
    return [sum(col) / len(col) for col in zip(*per_rank)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--plot", default="train_with_distir.png")
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--at-step", type=int, default=-1)
    args = parser.parse_args()

    if args.kill_rank >= 0:
        outcome = launch(
            train,
            args.nproc,
            "sum",
            args.epochs,
            args.kill_rank,
            args.at_step,
            pass_context=True,
            tolerate=1,
            timeout=300,
        )
        for rank, why in sorted(outcome.lost.items()):
            print(f"launcher: rank {rank} lost ({why.splitlines()[0]})")
        for rank, result in sorted(outcome.results.items()):
            for event in result["events"]:
                print(f"rank {rank}: {event}")
            print(f"rank {rank}: loss per epoch " + " ".join(f"{v:.4f}" for v in result["losses"]))
        return 0 if outcome.lost else 1

    curves, step_s = {}, {}
    for hook in HOOKS:
        results = launch(
            train, args.nproc, hook, args.epochs, -1, -1, pass_context=True, timeout=600
        )
        curves[hook] = _mean_over_ranks(results)
        step_s[hook] = max(r["step_s"] for r in results)

    print(f"{args.nproc} ranks, digits, MLP 64-64-10, batch {BATCH} per rank; mean loss per epoch")
    print("epoch  " + "".join(f"{LABELS[h]:>18}" for h in HOOKS))
    for epoch in range(args.epochs):
        print(f"{epoch + 1:>5}  " + "".join(f"{curves[h][epoch]:>18.6f}" for h in HOOKS))
    for hook in HOOKS[1:]:
        diff = max(abs(a - b) for a, b in zip(curves[hook], curves["default"]))
        print(f"largest loss difference, {LABELS[hook]} vs DDP default: {diff:.1e}")
    for hook in HOOKS:
        print(f"time per step, {LABELS[hook]}: {step_s[hook] * 1e3:.1f} ms (median)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    epochs = range(1, args.epochs + 1)
    for hook, style in zip(HOOKS, ("-", "--", ":")):
        ax.plot(epochs, curves[hook], style, marker="o", label=LABELS[hook])
    ax.set_xticks(list(epochs))
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss (mean over ranks)")
    ax.set_title(f"digits MLP on {args.nproc} ranks")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot)
    print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
