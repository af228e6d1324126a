"""Test-suite wide hooks.

The markers themselves (`cuda`, `multirank`) are declared in pyproject.toml;
here tests marked `cuda` are skipped, with the reason spelled out, on a
machine where torch sees no CUDA device. Select or drop the slow multi-rank
tests with `-m multirank` / `-m "not multirank"`; `-m fast` runs the
process-free development subset.

Hypothesis profiles, chosen by the environment variable HYPOTHESIS_PROFILE:
`ci` (the default: hypothesis's 100 examples, derandomized, so a run is
reproducible and its failures are the same on every machine) and `dev`
(10 examples, random, for a quick loop). Tests that scale their example
count do so through `strategies.examples`.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=100,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _no_cuda_reason() -> str | None:
    """Why CUDA tests cannot run here, or None when they can."""
    import torch

    if torch.cuda.is_available():
        return None
    built = torch.version.cuda
    how = f"built with CUDA {built}" if built else "a CPU-only build"
    return (
        "needs a CUDA GPU: torch.cuda.is_available() is False "
        f"(torch {torch.__version__}, {how}); run on a GPU machine to exercise NCCL "
        "and CUDA tensors"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda_items = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not cuda_items:
        return  # torch is not even imported for suites without CUDA tests
    reason = _no_cuda_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in cuda_items:
        item.add_marker(skip)
