"""distir's exceptions. Every error about an op names the op and its location."""

from __future__ import annotations

import traceback
from pathlib import Path

from xdsl.ir import Operation
from xdsl.utils.exceptions import DiagnosticException

from distir.ir.parsing import describe_op


def count(n: int, noun: str) -> str:
    """`1 rank`, `4 ranks`: how messages say how many."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def one_line(e: BaseException, path: str | Path | None = None) -> str:
    """`ValueError: boom (at inputs.py:5)`: an unexpected exception in one
    line, without its traceback, located at the deepest frame (the deepest
    line of `path` it passed through, when given, and a syntax error in
    `path` at its own line)."""
    frames = traceback.extract_tb(e.__traceback__)
    if path is not None:
        frames = [f for f in frames if Path(f.filename) == Path(path)]
    if path is not None and isinstance(e, SyntaxError) and e.lineno is not None:
        where = f" (at {path}:{e.lineno})"
    elif frames:
        where = f" (at {path or frames[-1].filename}:{frames[-1].lineno})"
    else:
        where = ""
    detail = (e.msg if path is not None and isinstance(e, SyntaxError) else str(e)).strip()
    detail = detail.splitlines()[0] if detail else ""
    return f"{type(e).__name__}: {detail}{where}" if detail else f"{type(e).__name__}{where}"


class DistirError(Exception):
    """Base of every error distir raises on purpose."""


class CompileError(DistirError):
    """The program cannot be compiled (verification, passes, planning)."""


class ProgramInputError(DistirError):
    """The inputs given to `Program.run` do not match the entry function."""


class OpError(DistirError):
    """An error raised while executing (or planning) one op."""

    def __init__(self, op: Operation | str, message: str):
        self.op_description = op if isinstance(op, str) else describe_op(op)
        self.message = message
        super().__init__(f"{self.op_description}: {message}")


class UnsupportedOpError(OpError, CompileError):
    """No implementation can execute the op."""


class CollectiveMismatchError(OpError):
    """Ranks disagree about a collective (shape, counts, root, op)."""


class DeadlineExceeded(OpError):
    """A collective did not complete before its deadline."""


class CollectiveFailed(OpError):
    """The backend failed inside a collective (a peer exited, a connection broke)."""


class Poisoned(DistirError):
    """The execution domain already failed; nothing more runs on it.

    `first_failure` is the error that poisoned it. After a backend failure
    (a deadline, a lost peer) the group is gone: the survivors call
    `distir.recover()` and go on with a new group. After a refusal that left
    the group working (a rejected input), every rank may call
    `distir.transport.domain.reset_domain(group)` instead.
    """

    def __init__(self, message: str, first_failure: str):
        super().__init__(message)
        self.first_failure = first_failure


class NotDifferentiable(DistirError, DiagnosticException):
    """A program ran on tensors that require grad, but an op on the path
    from those inputs to the results has no derivative (the message names
    it). Raised on the rank before any collective of the run."""


class ProgramMismatch(DistirError):
    """Ranks run different programs, or some rank's inputs were rejected."""


class ConcurrentRun(DistirError):
    """Another thread's runs are in flight on the same process group (see
    `distir.runtime.concurrency`): nothing was exchanged, nothing poisoned."""


class Excluded(DistirError):
    """This rank was left out of the group's membership: the survivors moved
    on to `epoch` without it (it was frozen, late or cut off) and it must
    never take part in a collective of that epoch."""

    def __init__(self, message: str, epoch: int):
        super().__init__(message)
        #: the epoch this rank missed
        self.epoch = epoch


class RecoveryFailed(DistirError):
    """The survivors could not agree on a new membership within the deadline
    (the store is unreachable, or every round lost another member)."""


class JoinRefused(DistirError):
    """A process asked to join a running job and the members refused it: its
    state (the shapes and dtypes it would receive, or its tag) is not theirs."""


class JoinFailed(DistirError):
    """A process that asked to join a running job was not admitted, or did
    not form the new group with the members, within its deadline."""
