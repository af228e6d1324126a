"""The README shows what the tools print.

Every fenced block whose info string is `console` holds `$ command` lines,
each followed by what it prints (stdout and stderr together); this test runs
each command from the repository root, as a new user would, and compares
(trailing spaces aside) exactly. `console approx` blocks compare with every
number masked, for output with timings or checksums of random inputs.
Blocks of other kinds (installation, long runs) are not run here; the
examples they show have tests of their own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

_FENCE = re.compile(r"^```(console(?: approx)?)\n(.*?)^```$", re.M | re.S)
_NUMBER = re.compile(r"\b[0-9a-f]{8}\b|-?\d+(\.\d+)?(e[-+]?\d+)?")


def _examples() -> list[tuple[str, str, bool]]:
    found = []
    for kind, body in _FENCE.findall(README):
        command, output = None, []
        for line in body.splitlines():
            if line.startswith("$ "):
                if command is not None:
                    found.append((command, "\n".join(output), kind == "console approx"))
                command, output = line[2:], []
            else:
                output.append(line)
        if command is not None:
            found.append((command, "\n".join(output), kind == "console approx"))
    return found


EXAMPLES = _examples()


def _normal(text: str, approx: bool) -> str:
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    text = "\n".join(lines)
    return _NUMBER.sub("N", text) if approx else text


def test_the_readme_shows_commands_to_check() -> None:
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize(("command", "expected", "approx"), EXAMPLES,
                         ids=[e[0][:60] for e in EXAMPLES])
def test_a_readme_command_prints_what_the_readme_shows(command, expected, approx) -> None:
    env = dict(os.environ, COLUMNS="100", PYTHONWARNINGS="ignore")
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(
        ["bash", "-c", command + " 2>&1"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert _normal(proc.stdout, approx) == _normal(expected, approx), proc.stdout
