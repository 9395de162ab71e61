"""Contract producer for the spool-directory source: payloads arrive as a published file."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.support import spool_file
from tfrecordd.testing import Produce
from tfrecordd_plugins.sources.directory import DirectorySourceConfig


@asynccontextmanager
async def producer(tmp_path: Path) -> AsyncIterator[tuple[DirectorySourceConfig, Produce]]:
    spool = tmp_path / "spool"
    spool.mkdir()
    config = DirectorySourceConfig(
        name="contract", type="directory", path=spool, encoder="e", poll_interval=0.05
    )

    # A name of CJK characters and a byte that is not UTF-8: any name the kernel takes is read.
    name = os.fsdecode("contract-数据".encode() + b"-\xff.jsonl")

    async def produce(payloads: list[bytes]) -> None:
        spool_file(spool, name, payloads)

    yield config, produce
