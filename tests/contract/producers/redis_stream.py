"""Contract producer for the redis-stream source: payloads arrive as XADDs to a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from redis.asyncio import Redis

from tests.redis_server import RedisServer
from tfrecordd.testing import Produce
from tfrecordd_plugins.sources.redis_stream import RedisStreamSourceConfig


@asynccontextmanager
async def producer(tmp_path: Path) -> AsyncIterator[tuple[RedisStreamSourceConfig, Produce]]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    client = Redis.from_url(server.url)
    config = RedisStreamSourceConfig(
        name="contract", type="redis-stream", url=server.url, stream="contract", encoder="e",
        block=0.05,
    )  # fmt: skip

    async def produce(payloads: list[bytes]) -> None:
        async with client.pipeline(transaction=False) as pipe:
            for p in payloads:
                pipe.xadd("contract", {"data": p})
            await pipe.execute()

    try:
        yield config, produce
    finally:
        await client.aclose()
        server.stop()
