"""`distir-bench`'s console entry point; the benchmark lives in `distir.bench`
(families, runner, report, cli)."""

from __future__ import annotations

import sys

from distir.bench.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
