"""examples/megatron_mlp.py on real gloo ranks: at P = 2 and 4, every
parameter's gradient at every training step, the replicated ones (the
layer norm's scale and shift, the output bias) included, equals the
single-process model's (its cut of it, for a shard) within the example's
stated tolerance, and so do the losses; the example itself runs as a
script (its console block in docs/training/tensor-parallel.md is run by
tests/test_readme.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import distir

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Ranks are spawned with this process's sys.path, so they import it too.
sys.path.insert(0, str(EXAMPLES))
import megatron_mlp as example  # noqa: E402

pytestmark = pytest.mark.multirank


def test_some_parameters_are_replicated_and_some_sharded() -> None:
    replicated = {k for k, axes in example.SHARDING.items() if axes is None}
    assert replicated == {"ln_scale", "ln_shift", "b2"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("P", [2, 4])
def test_every_gradient_equals_the_single_process_one(P: int) -> None:
    ref_losses, ref_grads = example.reference()
    per_rank = distir.launch(example.worker, P, pass_context=True, timeout=150)
    for r, (losses, grads) in enumerate(per_rank):
        assert losses == pytest.approx(ref_losses, abs=example.TOLERANCE)
        assert len(grads) == example.STEPS
        for step, (got, ref) in enumerate(zip(grads, ref_grads)):
            assert set(got) == set(example.SHARDING)
            for name, g in got.items():
                torch.testing.assert_close(
                    g,
                    example.shard(name, ref[name], P, r),
                    rtol=0,
                    atol=example.TOLERANCE,
                    msg=f"rank {r}, step {step}, {name}",
                )
