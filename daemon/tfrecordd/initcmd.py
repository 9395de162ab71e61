"""``tfrecordd init``: write a commented starter config that runs as written."""

from __future__ import annotations

from typing import Any


def add_commands(sub: Any) -> None:
    """Register this module's subcommands on the CLI's subparsers."""
    del sub
