"""Test-suite wide hooks.

The markers themselves (`cuda`, `multirank`) are declared in pyproject.toml;
here tests marked `cuda` are skipped, with the reason spelled out, on a
machine where torch sees no CUDA device. Select or drop the slow multi-rank
tests with `-m multirank` / `-m "not multirank"`.

`--fast` runs the process-free development subset: it drops tests marked
`multirank`, `slow`, `large` or `cuda`, loads the `dev` hypothesis profile (unless
HYPOTHESIS_PROFILE says otherwise) and fails any remaining test that starts
a process (a subprocess or a multiprocessing child), naming the marker it
lacks, so that the subset stays process-free as tests are added.

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
# A search past CI's fixed examples (random seeds, ten times as many):
# HYPOTHESIS_PROFILE=deep pytest -m "not multirank" ...
settings.register_profile(
    "deep",
    max_examples=1000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_NOT_FAST = ("multirank", "slow", "large", "cuda")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="the process-free development subset (no multirank, slow or cuda tests; "
        "hypothesis profile dev)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--fast") and "HYPOTHESIS_PROFILE" not in os.environ:
        settings.load_profile("dev")


@pytest.fixture(scope="session", autouse=True)
def _no_process_in_the_fast_subset(request: pytest.FixtureRequest):
    """Under --fast, from the first test on (fixtures of every scope set up
    after this one), starting a process fails naming the marker to add."""
    if not request.config.getoption("--fast"):
        yield
        return
    import multiprocessing.process
    import subprocess

    def refuse(*args, **kwargs):
        raise AssertionError(
            "a test (or its fixture) starts a process under --fast: mark it `slow` (or "
            "`multirank` when it starts ranks) so that --fast stays process-free"
        )

    saved = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start
    subprocess.Popen.__init__ = refuse  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = refuse  # type: ignore[method-assign]
    yield
    subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start = saved


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


#: the modules that take longest (minutes, measured with --durations=0):
#: they start first, so that no worker runs one alone at the end while the
#: other has nothing left (`--dist loadscope` hands out whole modules in
#: collection order; the README's blocks, collected last, ran 3 min alone)
LONGEST_FIRST = ("tests/test_readme.py", "tests/runtime/test_launch.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--fast"):
        kept = [i for i in items if not any(i.get_closest_marker(m) for m in _NOT_FAST)]
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    cuda_items = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not cuda_items:
        return  # torch is not even imported for suites without CUDA tests
    reason = _no_cuda_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in cuda_items:
        item.add_marker(skip)


@pytest.fixture(scope="module")
def one_rank_world():
    """A one-rank gloo world for in-process runs (module scope). Never
    skipped: a one-rank gloo world another test left serves as well."""
    import torch.distributed as dist

    from distir.runtime.launch import free_port

    if dist.is_initialized():
        assert dist.get_world_size() == 1 and dist.get_backend() == "gloo", (
            "torch.distributed was initialised in this process by another test "
            f"(world size {dist.get_world_size()}, {dist.get_backend()}): these tests need a "
            "one-rank gloo world"
        )
        yield
        return
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """distir-run called in this process, its result as a subprocess's
    (`CompletedProcess`): the ranks fork from the worker's warm fork server
    instead of a fresh interpreter importing torch twice (the console script
    itself keeps subprocess tests: a program piped in, an output that cannot
    be written, and those in tests/runtime/test_launch.py)."""
    import subprocess
    from pathlib import Path

    from distir.cli import run as cli

    root = Path(__file__).resolve().parents[1]

    def run(*args: str) -> subprocess.CompletedProcess:
        monkeypatch.chdir(root)
        capsys.readouterr()
        try:
            status = cli.main(list(args))
        except SystemExit as e:  # argparse
            status = e.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["distir-run", *args], status, out.out, out.err)

    return run
