"""Test-suite wide hooks.

The markers themselves (`cuda`, `multirank`) are declared in pyproject.toml;
here tests marked `cuda` are skipped, with the reason spelled out, on a
machine where torch sees no CUDA device. Select or drop the slow multi-rank
tests with `-m multirank` / `-m "not multirank"`.
"""

from __future__ import annotations

import pytest


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
