"""The console scripts: `distir-opt`, `distir-run`, `distir-bench`."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: the exit status of a program whose output was closed early (128 + SIGPIPE,
#: what a shell reports for a program SIGPIPE ended)
CLOSED_OUTPUT_STATUS = 141


def quiet_when_output_closes(main: F) -> F:
    """`main`, ending quietly with `CLOSED_OUTPUT_STATUS` when its reader
    closes standard output early (`distir-opt big.mlir | head`) instead of
    a BrokenPipeError traceback."""

    @functools.wraps(main)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            result = main(*args, **kwargs)
            sys.stdout.flush()
            return result
        except BrokenPipeError:
            # Python flushes stdout again at exit: point it at /dev/null first.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(CLOSED_OUTPUT_STATUS)

    return wrapped  # type: ignore[return-value]
