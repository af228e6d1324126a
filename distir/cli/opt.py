"""`distir-opt`: parse, verify, transform and print dist programs.

xDSL's `xdsl-opt` driver with distir's dialects and passes, a parser that
records `file:line:col` on every op, and errors meant for people: bad input
(a syntax error, an op that does not verify, an unknown pass, a missing file)
prints one located message to stderr and exits 1, never a Python traceback.

    distir-opt prog.mlir                         # verify and print back
    distir-opt prog.mlir -p lower-ciphertext-add,canonicalize -o out.mlir
    distir-opt bad.mlir --split-input-file --verify-diagnostics

With `--verify-diagnostics` (and `--parsing-diagnostics`) errors go to stdout
and the exit status is 0, as in xDSL, so that lit tests can check them.
Argument errors (an unknown flag) exit with argparse's status 2.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from io import StringIO
from typing import IO, NoReturn

from xdsl.dialects.builtin import FileLineColLoc, ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass, PassPipeline
from xdsl.printer import Printer
from xdsl.utils.exceptions import (
    ArgSpecParseError,
    DiagnosticException,
    MultipleSpansParseError,
    ParseError,
    ShrinkException,
    VerifyException,
)
from xdsl.xdsl_opt_main import xDSLOptMain

from distir.ir.parsing import LocatedParser, make_context

try:
    _DISTIR_VERSION = version("distir")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    _DISTIR_VERSION = "unknown"


class DriverError(Exception):
    """An error already phrased for the user: `main` prints it and exits 1."""


class LocatedVerifyException(VerifyException):
    """A verifier failure that names the failing op's source location.

    `str()` is `file:line:col: error: message`; the first note is the failing
    op in generic form, so `--verify-diagnostics` prints both.
    """

    def __init__(self, location: str, message: str, op: Operation | None):
        super().__init__(f"{location}: error: {message}")
        self.location = location
        self.message = message
        self.op = op
        if op is not None:
            self.add_note(_generic_text(op))


def _generic_text(op: Operation) -> str:
    out = StringIO()
    Printer(stream=out, print_generic_format=True).print_op(op)
    return out.getvalue()


def _op_location(op: Operation) -> str | None:
    """`file:line:col` of `op`, or of its nearest located ancestor (ops created
    by a pass have no location of their own)."""
    current: Operation | None = op
    while current is not None:
        loc = current.location
        if isinstance(loc, FileLineColLoc):
            return f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"
        current = current.parent_op()
    return None


def find_verify_failure(root: Operation) -> tuple[Operation, Exception] | None:
    """The innermost op whose verification fails, with its error.

    Ops are visited children first, so when an op's subtree fails but none of
    its descendants does, the op itself broke a rule (a verifier, a trait, or
    a structural check such as a missing terminator in its region).
    """
    for op in root.walk(region_first=True):
        try:
            op.verify()
        except (VerifyException, ValueError) as e:
            return op, e
    return None


def locate_verify_error(
    module: Operation, error: Exception, input_name: str, after_pass: str | None = None
) -> LocatedVerifyException:
    """Turn a verification error of `module` into one naming the failing op."""
    failure = find_verify_failure(module)
    op, message = (None, str(error)) if failure is None else (failure[0], str(failure[1]))
    location = (_op_location(op) if op is not None else None) or input_name
    if after_pass is not None:
        message = f"{message} (after pass '{after_pass}')"
    located = LocatedVerifyException(location, message, op)
    located.__cause__ = error
    return located


class DistirOptMain(xDSLOptMain):
    """xDSL's opt driver with distir's dialects, passes, parser and errors."""

    version_format = f"distir-opt (distir {_DISTIR_VERSION}) built on xdsl {{xdsl_version}}"

    _line_offset: int = 0

    def __init__(self, args: Sequence[str] | None = None):
        super().__init__(description="distir modular optimizer driver", args=args)

    # Registration ----------------------------------------------------------

    def register_all_dialects(self) -> None:
        # Exactly the dialects a dist program may use, as `make_context` has.
        for dialect in make_context().loaded_dialects:
            self.ctx.load_dialect(dialect)

    def register_all_passes(self) -> None:
        from distir.passes import get_all_passes

        super().register_all_passes()
        for name, factory in get_all_passes().items():
            self.register_pass(name, factory)

    def register_all_frontends(self) -> None:
        super().register_all_frontends()

        def parse_mlir(io: IO[bytes]) -> ModuleOp:
            parser = LocatedParser(self.ctx, io.read(), self.get_input_name())
            parser.line_offset = self._line_offset
            return parser.parse_module(not self.args.no_implicit_module)

        self.available_frontends["mlir"] = parse_mlir

    # Pipeline --------------------------------------------------------------

    def setup_pipeline(self) -> None:
        """xDSL's pipeline with the module verified before the first pass and
        after each one; a failure names the failing op's location."""
        start = time.perf_counter()

        def callback(
            previous: ModulePass | None, module: ModuleOp, following: ModulePass | None
        ) -> None:
            nonlocal start
            if self.args.time_passes and previous is not None:
                print(f"Pass {previous.name} took {time.perf_counter() - start} seconds")
            if not self.args.disable_verify:
                self.verify_module(module, None if previous is None else previous.name)
            if previous and following and self.args.print_between_passes:
                print(f"IR after {previous.name}:")
                Printer(stream=sys.stdout).print_op(module)
                print("\n\n\n")
            if self.args.time_passes and following is not None:
                start = time.perf_counter()

        try:
            self.pipeline = PassPipeline.parse_spec(
                self.available_passes, self.args.passes, callback
            )
        except ArgSpecParseError as e:
            raise DriverError(f"invalid pass pipeline '{self.args.passes}':\n{e}") from None
        except ValueError as e:
            raise DriverError(f"invalid pass pipeline '{self.args.passes}': {e}") from None

    def verify_module(self, module: ModuleOp, after_pass: str | None = None) -> None:
        try:
            module.verify()
        except (VerifyException, ValueError) as e:
            raise locate_verify_error(module, e, self.get_input_name(), after_pass) from e

    # Running ---------------------------------------------------------------

    def output_resulting_program(self, prog: ModuleOp) -> str:
        try:
            return super().output_resulting_program(prog)
        except (AssertionError, AttributeError, TypeError, ValueError) as e:
            # Custom printers assume verified IR; only --disable-verify gets here.
            if not self.args.disable_verify:
                raise
            raise DriverError(
                f"cannot print the unverified program in custom syntax "
                f"({type(e).__name__}: {e}); --print-op-generic prints any IR"
            ) from None

    def parse_chunk(self, chunk: IO[bytes], file_extension: str, start_offset: int = 0):
        # Ops in later `--split-input-file` chunks keep whole-file line numbers.
        self._line_offset = start_offset
        return super().parse_chunk(chunk, file_extension, start_offset)

    def run(self) -> None:
        """xDSL's `run`, with input errors raised as `DriverError`."""
        try:
            chunks, file_extension = self.prepare_input()
        except OSError as e:
            raise DriverError(f"cannot read input: {e.strerror}: '{e.filename}'") from None
        except ValueError as e:
            raise DriverError(str(e)) from None
        try:
            output_stream = self.prepare_output()
        except OSError as e:
            for chunk, _ in chunks:
                chunk.close()
            raise DriverError(f"cannot write output: {e.strerror}: '{e.filename}'") from None
        try:
            for i, (chunk, offset) in enumerate(chunks):
                try:
                    if i > 0:
                        output_stream.write("// -----\n")
                    module = self.parse_chunk(chunk, file_extension, offset)
                    if module is not None:
                        self.apply_passes(module)
                        output_stream.write(self.output_resulting_program(module))
                    output_stream.flush()
                except ParseError as e:
                    e.span = dataclasses.replace(e.span, line_offset=offset)
                    if not self.args.parsing_diagnostics:
                        raise
                    print(e)
                except DiagnosticException as e:
                    if not self.args.verify_diagnostics:
                        raise
                    print(e)
                    for note in getattr(e, "__notes__", ()):
                        print(note)
                finally:
                    chunk.close()
        except ShrinkException:
            assert self.args.shrink
            print("Success, can shrink")
            sys.exit(0)
        finally:
            if output_stream is not sys.stdout:
                output_stream.close()
        if self.args.shrink:
            print("Failure, can't shrink")
            sys.exit(1)


def format_parse_error(e: ParseError) -> str:
    """`file:line:col: error: message`, then the source line with carets
    under the offending text (and, for errors about two places, the other)."""
    context = e.span.print_with_context(None).splitlines()[1:]
    lines = [f"{e.span.get_location()}: error: {e.msg}", *context]
    if isinstance(e, MultipleSpansParseError):
        if e.ref_text is not None:
            lines.append(e.ref_text.rstrip("\n"))
        for span, msg in e.refs:
            lines.append(span.print_with_context(msg).rstrip("\n"))
    return "\n".join(lines)


def _fail(message: str) -> NoReturn:
    print(f"distir-opt: error: {message}", file=sys.stderr)
    sys.exit(1)


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the `distir-opt` console script."""
    try:
        DistirOptMain(args=args).run()
    except DriverError as e:
        _fail(str(e))
    except ParseError as e:
        print(format_parse_error(e), file=sys.stderr)
        sys.exit(1)
    except LocatedVerifyException as e:
        print(e, file=sys.stderr)
        if e.op is not None:
            print("note: the failing operation (generic form):", file=sys.stderr)
            print(_generic_text(e.op), file=sys.stderr)
        sys.exit(1)
    except DiagnosticException as e:
        # Raised by a pass (PassFailedException, a verifier called by a pass).
        _fail(str(e))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
