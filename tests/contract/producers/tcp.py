"""Contract producer for the TCP source: payloads arrive as lines on one connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from tests.support import free_port
from tfrecordd.testing import Produce
from tfrecordd_plugins.sources.socket import TcpSourceConfig


@asynccontextmanager
async def producer(tmp_path: Path) -> AsyncIterator[tuple[TcpSourceConfig, Produce]]:
    del tmp_path
    port = free_port()
    config = TcpSourceConfig(name="contract", type="tcp", listen=f"127.0.0.1:{port}", encoder="e")

    async def produce(payloads: list[bytes]) -> None:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(b"".join(p + b"\n" for p in payloads))

    yield config, produce
