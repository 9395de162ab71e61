"""Contract producer for the Unix-socket source: length-prefixed frames on one connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from tfrecordd.testing import Produce
from tfrecordd_plugins.sources.socket import UnixSourceConfig


@asynccontextmanager
async def producer(tmp_path: Path) -> AsyncIterator[tuple[UnixSourceConfig, Produce]]:
    path = tmp_path / "ingest.sock"
    config = UnixSourceConfig(
        name="contract", type="unix", path=path, framing="length-prefixed", encoder="e"
    )

    async def produce(payloads: list[bytes]) -> None:
        async with await anyio.connect_unix(path) as stream:
            await stream.send(b"".join(len(p).to_bytes(4, "big") + p for p in payloads))

    yield config, produce
