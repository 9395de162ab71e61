"""Contract producer for the UDP source: one datagram per payload."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from tests.support import free_port
from tfrecordd.testing import Produce
from tfrecordd_plugins.sources.socket import UdpSourceConfig


@asynccontextmanager
async def producer(tmp_path: Path) -> AsyncIterator[tuple[UdpSourceConfig, Produce]]:
    del tmp_path
    port = free_port()
    config = UdpSourceConfig(name="contract", type="udp", listen=f"127.0.0.1:{port}", encoder="e")

    async def produce(payloads: list[bytes]) -> None:
        async with await anyio.create_connected_udp_socket("127.0.0.1", port) as sock:
            for p in payloads:
                await sock.send(p)

    yield config, produce
