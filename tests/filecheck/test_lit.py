"""Runs the lit/FileCheck suite under pytest: `lit -v tests/filecheck`."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.slow  # it starts processes (left out by --fast)


def _lit_command() -> list[str]:
    # The lit package has no `__main__`; run its console entry point directly.
    if importlib.util.find_spec("lit.main") is not None:
        return [sys.executable, "-c", "import sys; from lit.main import main; sys.exit(main())"]
    lit = shutil.which("lit")
    if lit is None:
        pytest.fail("lit is not installed (pip install -e '.[test]' installs it)")
    return [lit]


def test_filecheck_suite_passes() -> None:
    if shutil.which("filecheck") is None or shutil.which("distir-opt") is None:
        pytest.fail("filecheck or distir-opt is not on PATH (pip install -e '.[test]')")
    tests = sorted(p.relative_to(HERE).as_posix() for p in HERE.rglob("*.mlir"))
    assert tests, "no .mlir tests found"
    done = subprocess.run(
        [*_lit_command(), "-v", str(HERE)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for test in tests:  # every test ran and passed, none was skipped or unsupported
        assert f"PASS: distir :: {test}" in done.stdout, done.stdout
