"""The ``tfrecordd`` command line: the daemon, its config check, and the shard tools.

Each command's module is imported only when that command runs: ``tfrecordd --version`` and
``tfrecordd healthcheck`` (Docker runs it every few seconds) import neither pydantic nor the
plugins nor the compressors. :data:`COMMANDS` lists every command for ``--help`` without
importing them."""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from tfrecordd import __version__
from tfrecordd.errors import EXIT_USAGE, TfrecorddError

Command = Callable[[argparse.Namespace], int]

EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (SIGINT) before it finished: 128 + SIGINT, as a shell reports it."""
EXIT_BROKEN_PIPE = 141
"""The reader of the output went away (``| head``): the output is cut short, quietly, and the
status is what a shell reports for a command SIGPIPE ended (128 + SIGPIPE), as ``cat`` gives."""


COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("service", "run the daemon"),
    "check-config": ("service", "validate a config file without starting anything"),
    "plugins": ("service", "list the installed source and encoder plugins"),
    "healthcheck": ("health", "exit 0 if a running daemon reports itself healthy"),
    "verify": (
        "tools",
        "check every record's CRCs, each compressed stream, the manifest beside a shard, and "
        "a dataset's completion markers",
    ),
    "cat": ("tools", "print records as JSON lines (feature name → values)"),
    "transcode": ("tools", "re-compress shards, each published atomically"),
    "convert": ("convertcmd", "convert files of JSON lines, CSV or images into shards, resumably"),
    "schema": (
        "describe",
        "print the tf.io feature description that reads a dataset's records, or (--infer) "
        "propose the features of a sample of JSON lines or CSV",
    ),
    "status": (
        "status",
        "a live view of a running daemon: rates, pending events, shards, dead letters",
    ),
    "init": ("initcmd", "write a commented starter config that runs as written"),
    "state": (
        "statecmd",
        "check or repair the daemon's state (journal, checkpoint) while it is stopped",
    ),
    "completion": ("completion", "print the shell completion script for bash, zsh or fish"),
    "reload": ("signalcmd", "make the running daemon read its config file again (SIGHUP)"),
    "flush": ("signalcmd", "make the running daemon publish its open shards now (SIGUSR1)"),
}
"""Every command: the module of :mod:`tfrecordd.cli` that adds it (``add_commands``), and its
one-line help."""


def help_of(command: str) -> str:
    """The one-line help of ``command``, as :data:`COMMANDS` has it."""
    return COMMANDS[command][1]


def _command_of(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with ``command``'s module loaded (every command's, if ``"*"``) and the other
    commands listed by name and help only."""
    p = argparse.ArgumentParser(
        prog="tfrecordd",
        description="Turn event streams into rotating, compressed TFRecord shards, exactly once.",
    )
    p.add_argument("--version", action="version", version=f"tfrecordd {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = COMMANDS[command][0] if command in COMMANDS else None
    for name, (module, help) in COMMANDS.items():
        if name in sub.choices:
            continue  # added with the other commands of its module
        if command == "*" or module == wanted:
            importlib.import_module(f"tfrecordd.cli.{module}").add_commands(sub)
        else:
            sub.add_parser(name, help=help, add_help=False)
    for name, command_parser in sub.choices.items():
        # A command's --help opens with what it does, as the command list says it, unless the
        # module that adds it describes it at more length.
        if command_parser.description is None and name in COMMANDS:
            command_parser.description = help_of(name)
    return p


@functools.cache
def _cached_parser(command: str | None) -> argparse.ArgumentParser:
    # Built once per command and process: argparse spends milliseconds on each build (its
    # gettext look-ups), which callers of main() in a loop (the tests' in-process verify)
    # paid on every call.
    return parser(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    if argv is None:
        argv = sys.argv[1:]
    command = _command_of(argv)
    cli = _cached_parser(command if command in COMMANDS else None)
    try:
        args = cli.parse_args(argv)
    except SystemExit:
        # --help and --version write to stdout and exit: what is left in the buffer must not
        # meet a closed pipe at the interpreter's exit.
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _closed_pipe()  # argparse's own status stands (it lets a failed write pass)
        raise
    func: Command | None = getattr(args, "func", None)
    if func is None:  # pragma: no cover - argparse enforces a command
        cli.print_usage(sys.stderr)
        return EXIT_USAGE
    try:
        code = func(args)
        # Output waiting in the buffer meets a closed pipe here, not at exit.
        sys.stdout.flush()
    except BrokenPipeError:
        return _closed_pipe()
    except TfrecorddError as e:
        print(f"tfrecordd: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return code


def _closed_pipe() -> int:
    """The end of the output after its reader went away: what is left in the buffer goes to
    /dev/null, so neither the interpreter's exit nor a later print raises again (the recipe of
    Python's ``signal`` docs)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # a stdout with no descriptor (in-process callers capture it): nothing to flush
    finally:
        os.close(devnull)
    return EXIT_BROKEN_PIPE
