"""Shards published to object storage through fsspec."""

from __future__ import annotations

from typing import Any

from tfrecordd.errors import ConfigError
from tfrecordd.fsys import FileSystem
from tfrecordd.output import LocalOutput


class FsspecOutput(LocalOutput):
    """Publishing to an fsspec URL (not available in this build)."""

    def __init__(self, config: Any, fs: FileSystem) -> None:
        raise ConfigError(
            [f"output.dir: object storage URLs are not supported yet ({config.output.dir})"]
        )
