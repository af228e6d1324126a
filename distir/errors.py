"""distir's exceptions. Every error about an op names the op and its location."""

from __future__ import annotations

from xdsl.ir import Operation

from distir.ir.parsing import describe_op


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
