"""The ``tfrecordd`` command line: the daemon, its config check, and the shard tools."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from tfrecordd import __version__
from tfrecordd.errors import EXIT_USAGE, TfrecorddError

Command = Callable[[argparse.Namespace], int]


def _parser() -> argparse.ArgumentParser:
    from tfrecordd.cli import describe, initcmd, service, statecmd, status, tools

    p = argparse.ArgumentParser(
        prog="tfrecordd",
        description="Turn event streams into rotating, compressed TFRecord shards, exactly once.",
    )
    p.add_argument("--version", action="version", version=f"tfrecordd {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (service, tools, describe, status, initcmd, statecmd):
        module.add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    func: Command | None = getattr(args, "func", None)
    if func is None:  # pragma: no cover - argparse enforces a command
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    try:
        return func(args)
    except TfrecorddError as e:
        print(f"tfrecordd: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
