"""Shard tools: ``verify``, ``cat`` and ``transcode``."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(sub: Any) -> None:
    """Register the shard tools' subcommands on the CLI's subparsers."""
    del sub


__all__ = ["add_commands", "argparse"]
