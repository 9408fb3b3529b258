"""The `cerberus-hf` command: one subcommand per job, each defined next to the code it runs.

A user's mistake (a bad argument, a missing or malformed file, a setting a checkpoint refuses) is reported
as one line, ``cerberus-hf <command>: error: <message>``, with exit status 2; ``--debug`` (or the
environment variable ``CERBERUS_HF_DEBUG=1``) shows the full traceback instead. Anything else, a bug
included, ends with its traceback as usual. A SIGTERM (``kill``, a job scheduler's stop) ends a command as Ctrl-C
does, through its ``finally`` blocks, so that what it keeps for a rerun (a state file, a temporary file removed) is
written as on any other stop; the exit status is 143.
"""

from __future__ import annotations

import argparse
import importlib
import contextlib
import os
import signal
import sys
import threading
import traceback

from ..errors import UserError
from .arguments import HelpFormatter

# Modules defining subcommands; each exposes add_cli(subparsers), which adds its parser and sets `func`.
SUBCOMMAND_MODULES = (
    "tools.demo", "tools.distill", "tools.train", "tools.calibrate", "tools.ngram", "tools.model_card",
    "tools.bench", "tools.divergence", "tools.refresh_folder", "tools.export", "tools.make_heads",
)
DEBUG_VARIABLE = "CERBERUS_HF_DEBUG"
EXIT_USER_ERROR = 2  # as argparse exits on a bad argument


class _Parser(argparse.ArgumentParser):
    """argparse, reporting a bad argument in one line (no usage block): ``cerberus-hf <command>: error: ...``;
    its ``--help`` shows each option's default (`arguments.HelpFormatter`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cerberus-hf", description=__doc__.split("\n\n")[0], epilog=(
        "A mistake in the arguments or files is reported in one line, 'cerberus-hf COMMAND: error: ...', with exit "
        f"status {EXIT_USER_ERROR}; --debug (or {DEBUG_VARIABLE}=1) shows the traceback instead."))
    parser.add_argument("--debug", action="store_true",
                        help=f"show the full traceback of an error (also: {DEBUG_VARIABLE}=1)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"cerberus_hf.{name}").add_cli(subparsers)
    for subparser in set(subparsers.choices.values()):  # `cerberus-hf demo --debug` too
        subparser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                               help="show the full traceback of an error")
    return parser


def one_line(error: BaseException) -> str:
    """The message of ``error`` as one line. An OS error raised with an errno (``open`` of a missing file)
    names its file; any message's line breaks become spaces."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        if isinstance(error, FileNotFoundError):
            return f"no file or folder {error.filename}"
        target = f" -> {error.filename2}" if error.filename2 is not None else ""
        return f"{error.filename}{target}: {error.strerror}"
    return " ".join(str(error).split()) or type(error).__name__


def _terminated(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _sigterm_unwinds():
    """Within: a SIGTERM raises SystemExit(143) in the main thread (its default ends the process where it stands)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")
    try:
        with _sigterm_unwinds():
            return args.func(args)
    except (UserError, OSError) as error:  # a user's mistake or a file problem; a bug keeps its traceback
        if debug:
            raise
        message = one_line(error)
    except SystemExit as stop:  # a subcommand's own refusal, SystemExit("cerberus-hf <command>: ...")
        if not isinstance(stop.code, str):
            raise
        if debug:
            traceback.print_exc()
            raise
        message = " ".join(stop.code.removeprefix(f"cerberus-hf {args.command}: ").split())
    print(f"cerberus-hf {args.command}: error: {message}", file=sys.stderr)
    return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
