"""`distir-opt`: parse, verify, transform and print dist programs.

xDSL's `xdsl-opt` driver with distir's dialects and passes, a parser that
records `file:line:col` on every op, and errors meant for people: bad input
(a syntax error, bytes that are not UTF-8, regions nested deeper than
`MAX_NESTING_DEPTH`, an op that does not verify, an unknown pass or pass
option, a missing file) prints one located message to stderr and exits 1,
never a Python traceback.

    distir-opt prog.mlir                         # verify and print back
    distir-opt prog.mlir -p lower-ciphertext-add,canonicalize -o out.mlir
    distir-opt bad.mlir --split-input-file --verify-diagnostics
    distir-opt --help                            # distir's passes and options first

With `--verify-diagnostics` (and `--parsing-diagnostics`) errors go to stdout
and the exit status is 0, as in xDSL, so that lit tests can check them.
Argument errors (an unknown flag, `-p` given twice) exit with argparse's
status 2. As in mlir-opt, `-p` may occur once: passes are joined with commas
(`-p A,B`), never by repeating the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from io import StringIO
from typing import IO, Any, NoReturn, cast

from xdsl.dialects.builtin import FileLineColLoc, ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.printer import Printer
from xdsl.utils.exceptions import (
    DiagnosticException,
    ParseError,
    ShrinkException,
    VerifyException,
)
from xdsl.xdsl_opt_main import xDSLOptMain

from distir.cli import quiet_when_output_closes
from distir.ir.parsing import (
    NO_KERNEL,
    LocatedParser,
    find_verify_failure,
    format_parse_error,
    make_context,
    printable,
    unsupported_op,
)
from distir.passes import PipelineError, build_pipeline

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


# Help ------------------------------------------------------------------------

PIPELINE_HELP = (
    "passes to run in order, comma-separated, each with its options in braces: "
    "-p NAME{OPTION=VALUE ...},NAME. Give it once (-p A,B, not -p A -p B). The "
    "passes and their options are listed below."
)


def _help_width() -> int:
    """The terminal's width, kept between 60 and 100 columns (argparse's
    own text uses the terminal width minus 2)."""
    return max(60, min(100, shutil.get_terminal_size().columns - 2))


def format_pass_list(available: Mapping[str, Callable[[], type[ModulePass]]], width: int) -> str:
    """distir's passes, each with its one-line description and its options
    (name, type, default, description), then the names of xDSL's passes, as
    `mlir-opt --help` groups and describes them."""
    from distir.passes import DISTIR_PASSES, pass_options, pass_summary

    def wrap(text: str, indent: int, first: str = "") -> list[str]:
        """`text` filled to `width` after `first`, indented by `indent`;
        NO-BREAK SPACEs keep a default next to its value."""
        first = first.ljust(indent) if first else " " * indent
        if len(first) > indent:  # a long option name: its description goes below
            return [first.rstrip(), *wrap(text, indent)]
        filled = textwrap.wrap(
            text,
            width,
            initial_indent=first,
            subsequent_indent=" " * indent,
            break_on_hyphens=False,
        )
        return [line.replace("\N{NO-BREAK SPACE}", " ") for line in filled] or [first.rstrip()]

    lines = ["distir passes (-p 'name{option=value ...},name,...'):"]
    for name in DISTIR_PASSES:
        if name not in available:
            continue
        try:
            cls = available[name]()
        except Exception as e:  # a pass that fails to import must not break --help
            lines += [f"  {name}", *wrap(f"(cannot be loaded: {e})", 6)]
            continue
        lines.append(f"  {name}")
        lines += wrap(pass_summary(cls) or "(undocumented)", 6)
        for option in pass_options(cls):
            if option.required:
                default = "(required)"
            elif option.default is None:
                default = "(default:\N{NO-BREAK SPACE}unset)"
            else:
                default = f"(default:\N{NO-BREAK SPACE}{option.default})"
            doc = f"{option.doc} {default}" if option.doc else default
            lines += wrap(doc, 30, f"      {option.name}=<{option.type}>  ")
    others = sorted(n for n in available if n not in DISTIR_PASSES)
    lines += ["", f"xDSL passes ({len(others)}; options as in xdsl-opt):"]
    lines += textwrap.wrap(
        ", ".join(others), width, initial_indent="  ", subsequent_indent="  ",
        break_on_hyphens=False,
    )  # fmt: skip
    return "\n".join(lines)


class _PipelineOnce(argparse.Action):
    """Stores `-p`, refusing a second one: mlir-opt rejects a repeated
    `--pass-pipeline`, and silently keeping only the last would drop passes."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        first = getattr(namespace, "_pipeline_flag_given", None)
        if first is not None:
            parser.error(
                f"-p given twice ('{first}' and '{values}'); join passes with a comma: "
                f"-p '{first},{values}'"
            )
        namespace._pipeline_flag_given = values
        setattr(namespace, self.dest, values)


_PASS_LIST = "(the pass list)"
"""The parser's epilog: replaced by the pass list when help is printed."""


class PassListHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help formatter, writing the pass list as the epilog. The
    list is built only when help is printed, since it loads every distir
    pass."""

    def __init__(self, prog: str, *, pass_list: Callable[[], str], **kwargs: Any):
        super().__init__(prog, **kwargs)
        self._pass_list = pass_list

    def add_text(self, text: str | None) -> None:
        super().add_text(self._pass_list() if text is _PASS_LIST else text)


class _DistirPipelineFlag:
    """Stands for the argument parser while xDSL registers its arguments,
    registering `-p` as distir's: a flag that may occur once, with a short
    help (xDSL's lists every pass name in one blob)."""

    def __init__(self, parser: argparse.ArgumentParser):
        self._parser = parser

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        if "--passes" in names:
            kwargs.update(action=_PipelineOnce, metavar="PIPELINE", help=PIPELINE_HELP)
        return self._parser.add_argument(*names, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class DistirOptMain(xDSLOptMain):
    """xDSL's opt driver with distir's dialects, passes, parser and errors."""

    version_format = f"distir-opt (distir {_DISTIR_VERSION}) built on xdsl {{xdsl_version}}"

    _line_offset: int = 0

    def __init__(self, args: Sequence[str] | None = None):
        super().__init__(description="Parse, verify, transform and print dist programs.", args=args)

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

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(
            cast(argparse.ArgumentParser, _DistirPipelineFlag(arg_parser))
        )
        available = self.available_passes
        arg_parser.epilog = _PASS_LIST
        arg_parser.formatter_class = functools.partial(
            PassListHelpFormatter, pass_list=lambda: format_pass_list(available, _help_width())
        )

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
            self.pipeline = build_pipeline(self.available_passes, self.args.passes, callback)
        except PipelineError as e:
            raise DriverError(str(e)) from None

    def verify_module(self, module: ModuleOp, after_pass: str | None = None) -> None:
        try:
            module.verify()
        except (VerifyException, ValueError) as e:
            raise locate_verify_error(module, e, self.get_input_name(), after_pass) from e
        op = unsupported_op(module)
        if op is not None:
            location = _op_location(op) or self.get_input_name()
            message = f"'{op.name}' {NO_KERNEL}"
            raise LocatedVerifyException(location, message, op)

    # Running ---------------------------------------------------------------

    def output_resulting_program(self, prog: ModuleOp) -> str:
        try:
            return super().output_resulting_program(prog)
        except Exception as e:
            # Custom printers assume verified IR and fail in any way on other
            # IR (an assertion, a missing property, an operand index).
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
                    print(printable(str(e)))  # xDSL's layout, which lit tests check
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


def _fail(message: str) -> NoReturn:
    print(f"distir-opt: error: {message}", file=sys.stderr)
    sys.exit(1)


@quiet_when_output_closes
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
    except RecursionError:
        # The parser bounds nesting; this is a pass or printer recursing on
        # IR that is deep in some other way.
        _fail("the program is nested too deeply to process (Python recursion limit reached)")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
