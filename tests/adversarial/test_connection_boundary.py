"""The boundary around one client connection: whatever serving it raises closes that
connection with an ``ERR`` reply, counted; the source and every other client go on."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.integration.test_socket_sources import (
    line,
    make_config,
    metric,
    read_line,
    received,
    running,
    tcp_port,
    until,
)
from tests.support import read_ids
from tfrecordd_plugins.sources.socket import framing


@pytest.mark.anyio
async def test_an_error_serving_one_connection_closes_only_that_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = framing.Deframer.feed

    def feed(self: framing.Deframer, data: bytes) -> list[framing.Frame]:
        if b"BOOM" in data:
            raise RuntimeError("a bug in one connection's path")
        return real(self, data)

    monkeypatch.setattr(framing.Deframer, "feed", feed)
    config = make_config(tmp_path, {"type": "tcp", "listen": "127.0.0.1:0", "ack": True})
    async with running(config) as daemon:
        port = tcp_port(daemon)
        async with await anyio.connect_tcp("127.0.0.1", port) as bad:
            await bad.send(b"BOOM\n")
            reply = await read_line(bad, bytearray())
            assert reply == b"ERR 1 internal error\n"
        async with await anyio.connect_tcp("127.0.0.1", port) as good:
            await good.send(b"".join(line(i) for i in range(100)))
            await until(lambda: received(daemon) >= 100)
        refused = metric(
            daemon, "tfrecordd_inputs_refused_total", source="in", reason="connection_error"
        )
        assert refused == 1
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(100), 1)
