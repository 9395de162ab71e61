"""``tfrecordd schema``: the reader's side of an encoder's schema (tf.io feature descriptions)."""

from __future__ import annotations

from typing import Any


def add_commands(sub: Any) -> None:
    """Register this module's subcommands on the CLI's subparsers."""
    del sub
