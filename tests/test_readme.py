"""The README and the documentation site show what the tools print.

In README.md and every page under docs/, every fenced block whose info string is `console` holds `$ command` lines,
each followed by what it prints (stdout and stderr together); this test runs
each block's commands in order from the repository root, as a new user
would, and compares (trailing spaces aside) exactly. `console approx` blocks
mask only what changes from run to run: durations (`12.3 ms`, `2.00 s`) and
port numbers (`[127.0.0.1]:26776`); shapes, counts, checksums and values are
compared exactly. Paths under `/tmp/` in a block (its commands and its
output) are rewritten into a directory of the test's own, so that two runs
never share a file. Blocks of other kinds (installation, long runs) are not
run here; the examples they show have tests of their own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the README and every page of the documentation site
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^```(console(?: approx)?)\n(.*?)^```$", re.M | re.S)
_DURATION = re.compile(r"\b\d+(\.\d+)? (ms|s)\b")
_PORT = re.compile(r"\]:\d+\b")

pytestmark = pytest.mark.multirank  # the commands start local gloo ranks


def _blocks() -> list[tuple[str, list[tuple[str, str]], bool]]:
    """Every console block: its page, its (command, expected output) pairs, in order."""
    found = []
    for page, (kind, body) in (
        (source, block) for source in PAGES for block in _FENCE.findall(source.read_text())
    ):
        pairs: list[tuple[str, str]] = []
        command, output = None, []
        for line in body.splitlines():
            if line.startswith("$ "):
                if command is not None:
                    pairs.append((command, "\n".join(output)))
                command, output = line[2:], []
            else:
                output.append(line)
        if command is not None:
            pairs.append((command, "\n".join(output)))
        found.append((page.relative_to(ROOT).as_posix(), pairs, kind == "console approx"))
    return found


BLOCKS = _blocks()


def _normal(text: str, approx: bool) -> str:
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    text = "\n".join(lines)
    if approx:
        text = _PORT.sub("]:PORT", _DURATION.sub(r"N \2", text))
    return text


def test_the_readme_shows_commands_to_check() -> None:
    in_readme = [pairs for page, pairs, _ in BLOCKS if page == "README.md"]
    assert sum(len(pairs) for pairs in in_readme) >= 3
    assert sum(len(pairs) for _, pairs, _ in BLOCKS) >= 8


def test_approximate_blocks_mask_only_durations_and_ports() -> None:
    line = "rank 0: run 11.236 ms ... float32[3, 16] crc32 a281eeae [0.061053] waited 2.00 s"
    assert _normal(line, True) == (
        "rank 0: run N ms ... float32[3, 16] crc32 a281eeae [0.061053] waited N s"
    )
    assert _normal("peer [127.0.0.1]:26776", True) == "peer [127.0.0.1]:PORT"
    assert _normal("float32[3, 16]", True) != _normal("float32[4, 16]", True)


@pytest.mark.parametrize(
    ("page", "pairs", "approx"),
    BLOCKS,
    ids=[f"{page}: {pairs[0][0][:60]}" for page, pairs, _ in BLOCKS],
)
def test_a_block_prints_what_its_page_shows(page, pairs, approx, tmp_path) -> None:
    env = dict(os.environ, COLUMNS="100", PYTHONWARNINGS="ignore")
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    private = f"{tmp_path}/"
    for command, expected in pairs:
        proc = subprocess.run(
            ["bash", "-c", command.replace("/tmp/", private) + " 2>&1"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        want = _normal(expected.replace("/tmp/", private), approx)
        assert _normal(proc.stdout, approx) == want, (page, command, proc.stdout)
