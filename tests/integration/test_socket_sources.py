"""The daemon in-process with the socket sources: real TCP, UDP and Unix sockets on loopback."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import socket
import stat
import struct
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import ByteStream

from tests.support import MOVIES_FEATURES, dead_letters, movie_event, read_ids, shard_files
from tfrecordd.config import DaemonConfig, load_config, parse_config
from tfrecordd.errors import EXIT_IN_USE, ConfigError, ListenError
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.plugin import Encoder, EncoderConfig, EncodeResult, RawEvent, Registry
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig
from tfrecordd_plugins.sources.socket import (
    TcpSource,
    TcpSourceConfig,
    UdpSource,
    UdpSourceConfig,
    UnixSource,
    UnixSourceConfig,
)
from tfrecordd_plugins.sources.socket.connection import recv

pytestmark = pytest.mark.anyio

DOCS = Path(__file__).parents[2] / "docs" / "sources" / "sockets.md"
REGISTRY = Registry.from_entry_points()


def make_config(
    root: Path,
    source: Mapping[str, Any],
    *,
    output: Mapping[str, Any] | None = None,
    daemon: Mapping[str, Any] | None = None,
) -> DaemonConfig:
    data = {
        "daemon": {"node_id": "test", "state_dir": str(root / "state"), "drain_timeout": "20s"}
        | dict(daemon or {}),
        "metrics": {"enabled": False},
        "output": {"dir": str(root / "shards"), "compression": "gzip", "max_shard_age": "1m"}
        | dict(output or {}),
        "sources": [{"name": "in", "encoder": "movies"} | dict(source)],
        "encoders": {"movies": {"type": "example", "features": MOVIES_FEATURES}},
    }
    return parse_config(data, REGISTRY)


class _SlowEncoder(Encoder):
    def __init__(self, inner: Encoder, delay: float) -> None:
        self.inner, self.delay = inner, delay

    def encode_batch(self, events: Sequence[RawEvent]) -> EncodeResult:
        time.sleep(self.delay)
        return self.inner.encode_batch(events)


class SlowEncoderConfig(EncoderConfig):
    """The example encoder taking ``delay`` seconds per batch: a slow pipeline."""

    type: str = "slow"
    inner: ExampleEncoderConfig
    delay: float

    def build(self) -> Encoder:
        return _SlowEncoder(self.inner.build(), self.delay)


def slowed(config: DaemonConfig, delay: float) -> DaemonConfig:
    inner = config.encoders["movies"]
    assert isinstance(inner, ExampleEncoderConfig)
    slow = SlowEncoderConfig(inner=inner, delay=delay)
    return config.model_copy(update={"encoders": {"movies": slow}})


def metric(daemon: Daemon, name: str, **labels: str) -> float:
    value = daemon.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def received(daemon: Daemon) -> float:
    return metric(daemon, "tfrecordd_events_received_total", source="in")


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


@asynccontextmanager
async def running(config: DaemonConfig) -> AsyncIterator[Daemon]:
    """The daemon running in this event loop; stopped (drained) on exit."""
    daemon = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        try:
            yield daemon
        finally:
            daemon.request_stop()


def tcp_port(daemon: Daemon) -> int:
    source = daemon.sources["in"]
    assert isinstance(source, TcpSource)
    assert source.address is not None
    return source.address[1]


def udp_port(daemon: Daemon) -> int:
    source = daemon.sources["in"]
    assert isinstance(source, UdpSource)
    assert source.address is not None
    return source.address[1]


def line(i: int) -> bytes:
    return json.dumps(movie_event(i)).encode() + b"\n"


def prefixed(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


async def closed_by_server(stream: ByteStream, within: float) -> bool:
    """True if the server closes the connection within ``within`` seconds."""
    with anyio.move_on_after(within):
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return True
    return False


async def read_exactly(stream: ByteStream, n: int, within: float = 10.0) -> bytes:
    out = b""
    with anyio.fail_after(within):
        while len(out) < n:
            out += await stream.receive(n - len(out))
    return out


async def read_line(stream: ByteStream, buf: bytearray, within: float = 10.0) -> bytes:
    with anyio.fail_after(within):
        while b"\n" not in buf:
            buf += await stream.receive()
    end = buf.index(b"\n") + 1
    got = bytes(buf[:end])
    del buf[:end]
    return got


# -- tcp -------------------------------------------------------------------------------------


async def test_tcp_lines_events_out_once_and_bad_frames_dead_lettered(tmp_path: Path) -> None:
    config = make_config(
        tmp_path, {"type": "tcp", "listen": "127.0.0.1:0", "max_frame_bytes": 4096}
    )
    async with running(config) as daemon:
        port = tcp_port(daemon)
        async with await anyio.connect_tcp("127.0.0.1", port) as a:
            await a.send(b"".join(line(i) for i in range(0, 150)))
            await a.send(b"{not json\n\n   \n" + b"x" * 5000 + b"\n")
            await a.send(b"".join(line(i) for i in range(150, 300)))
        async with await anyio.connect_tcp("127.0.0.1", port) as b:
            data = b"".join(line(i) for i in range(300, 600))
            for at in range(0, len(data), 97):  # frames split across reads
                await b.send(data[at : at + 97])
        async with await anyio.connect_tcp("127.0.0.1", port) as c:
            await c.send(b"".join(line(i) for i in range(600, 900)) + b'{"id": 999')
        await until(lambda: received(daemon) >= 903)

    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(900), 1)
    letters = dead_letters(tmp_path / "state")
    assert sorted(d["reason"] for d in letters) == ["malformed", "rejected", "rejected"]
    by_raw = {d.get("raw"): d for d in letters}
    assert by_raw["{not json"]["reason"] == "malformed"
    assert "frame of 5000 bytes is over max_frame_bytes (4096)" in by_raw["x" * 4096]["detail"]
    assert "unfinished frame" in by_raw['{"id": 999']["detail"]
    assert all(re.match(r"127\.0\.0\.1:\d+#\d+:\d+$", d["where"]) for d in letters)
    assert metric(daemon, "tfrecordd_events_dead_lettered_total", source="in") == 3


async def test_length_prefixed_skips_an_oversized_frame_and_goes_on(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        {
            "type": "tcp",
            "listen": "127.0.0.1:0",
            "framing": "length-prefixed",
            "max_frame_bytes": 4096,
        },
    )
    big = bytes(range(256)) * 40  # 10240 bytes, not UTF-8
    frames = [prefixed(line(i)[:-1]) for i in range(100)]
    frames.insert(50, prefixed(big))
    data = b"".join(frames)
    async with running(config) as daemon:
        async with await anyio.connect_tcp("127.0.0.1", tcp_port(daemon)) as conn:
            for at in range(0, len(data), 1001):  # headers and bodies split across reads
                await conn.send(data[at : at + 1001])
            await conn.send(struct.pack(">I", 100) + b'{"id": 7')
        await until(lambda: received(daemon) >= 102)

    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(100), 1)
    letters = sorted(dead_letters(tmp_path / "state"), key=lambda d: d["where"])
    assert [d["reason"] for d in letters] == ["rejected", "rejected"]
    oversized = next(d for d in letters if "max_frame_bytes" in d["detail"])
    assert "frame of 10240 bytes" in oversized["detail"]
    assert base64.b64decode(oversized["raw_base64"]) == big[:4096]
    assert oversized["where"].endswith(":51")
    cut = next(d for d in letters if "unfinished" in d["detail"])
    assert cut["raw"] == '{"id": 7'


async def test_tcp_acks_only_what_is_published(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        {"type": "tcp", "listen": "127.0.0.1:0", "ack": True, "max_frame_bytes": 4096},
        output={"max_shard_age": "1h"},
    )
    async with (
        running(config) as daemon,
        await anyio.connect_tcp("127.0.0.1", tcp_port(daemon)) as conn,
    ):
        await conn.send(b"".join(line(i) for i in range(10)) + b"y" * 5000 + b"\n")
        buf = bytearray()
        # The rejected frame is reported at once, long before anything is published.
        err = await read_line(conn, buf)
        assert err == b"ERR 11 frame of 5000 bytes is over max_frame_bytes (4096)\n"
        await until(lambda: received(daemon) >= 11)
        with anyio.move_on_after(0.5):
            buf += await conn.receive()
        assert buf == b"", "an ack before the shard was published"
        assert shard_files(tmp_path / "shards") == []

        daemon.request_flush()
        assert await read_line(conn, buf) == b"ACK 11\n"
        # The ack means published and durable: the shard and the dead letter are there.
        assert read_ids(tmp_path / "shards") == dict.fromkeys(range(10), 1)
        assert [d["raw"] for d in dead_letters(tmp_path / "state")] == ["y" * 4096]

        await conn.send(line(10))
        await until(lambda: received(daemon) >= 12)
        daemon.request_flush()
        assert await read_line(conn, buf) == b"ACK 12\n"
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(11), 1)


async def test_length_prefixed_acks_and_close_after_the_last_ack(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        {
            "type": "tcp",
            "listen": "127.0.0.1:0",
            "ack": True,
            "framing": "length-prefixed",
            "max_frame_bytes": 4096,
        },
        output={"max_shard_age": "200ms"},
    )
    frames = [prefixed(line(i)[:-1]) for i in range(3)]
    frames += [prefixed(b"z" * 5000)]
    frames += [prefixed(line(i)[:-1]) for i in range(3, 5)]
    async with (
        running(config) as daemon,
        await anyio.connect_tcp("127.0.0.1", tcp_port(daemon)) as conn,
    ):
        await conn.send(b"".join(frames))
        await conn.send_eof()
        replies: list[int] = []
        with anyio.fail_after(10):
            while not replies or replies[-1] != 6:
                replies.append(int.from_bytes(await read_exactly(conn, 8), "big"))
        assert replies[0] == (1 << 63) | 4, "the rejected frame is reported first"
        acks = replies[1:]
        assert acks == sorted(acks)
        assert all(a < 1 << 63 for a in acks)
        # Everything acked, input ended: the server closes the connection.
        assert await closed_by_server(conn, 5)
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(5), 1)


async def test_docs_client_example_gets_every_event_acked(tmp_path: Path) -> None:
    text = DOCS.read_text()
    intro = text.index("A client in Python")
    code = re.search(r"```python\n(.*?)```", text[intro:], re.DOTALL)
    assert code is not None
    assert len(code.group(1).strip().splitlines()) <= 16
    namespace: dict[str, Any] = {}
    exec(compile(code.group(1), str(DOCS), "exec"), namespace)
    send_acked = namespace["send_acked"]

    config = make_config(
        tmp_path,
        {"type": "tcp", "listen": "127.0.0.1:0", "ack": True},
        output={"max_shard_age": "200ms"},
    )
    async with running(config) as daemon:
        events = [movie_event(i) for i in range(50)]
        with anyio.fail_after(20):
            await anyio.to_thread.run_sync(send_acked, events, ("127.0.0.1", tcp_port(daemon)))
        # Returned: so every event is in a published shard already.
        assert read_ids(tmp_path / "shards") == dict.fromkeys(range(50), 1)


async def test_max_connections_refuses_extra_clients(tmp_path: Path) -> None:
    config = make_config(tmp_path, {"type": "tcp", "listen": "127.0.0.1:0", "max_connections": 2})
    async with running(config) as daemon:
        port = tcp_port(daemon)
        source = daemon.sources["in"]
        assert isinstance(source, TcpSource)
        a = await anyio.connect_tcp("127.0.0.1", port)
        b = await anyio.connect_tcp("127.0.0.1", port)
        async with a, b:
            await a.send(line(0))
            await b.send(line(1))
            await until(lambda: source.connections == 2 and received(daemon) >= 2)
            async with await anyio.connect_tcp("127.0.0.1", port) as c:
                assert await closed_by_server(c, 5)
            reason = {"source": "in", "reason": "max_connections"}
            assert metric(daemon, "tfrecordd_inputs_refused_total", **reason) == 1
            await a.send(line(2))
            await until(lambda: received(daemon) >= 3)
        await until(lambda: source.connections == 0)
        async with await anyio.connect_tcp("127.0.0.1", port) as d:
            await d.send(line(3))
            await until(lambda: received(daemon) >= 4)
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(4), 1)


async def test_idle_timeout_disconnects_a_silent_client(tmp_path: Path) -> None:
    config = make_config(
        tmp_path, {"type": "tcp", "listen": "127.0.0.1:0", "idle_timeout": "300ms"}
    )
    async with (
        running(config) as daemon,
        await anyio.connect_tcp("127.0.0.1", tcp_port(daemon)) as conn,
    ):
        await conn.send(line(0))
        t0 = time.monotonic()
        assert await closed_by_server(conn, 5)
        assert time.monotonic() - t0 >= 0.25
    assert read_ids(tmp_path / "shards") == {0: 1}


async def test_slowloris_clients_are_disconnected(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        {"type": "tcp", "listen": "127.0.0.1:0", "idle_timeout": "1m", "read_timeout": "500ms"},
    )
    async with running(config) as daemon:
        port = tcp_port(daemon)
        async with await anyio.connect_tcp("127.0.0.1", port) as stalled:
            await stalled.send(b'{"id": 1, "user": "half a fr')
            assert await closed_by_server(stalled, 5)

        async with await anyio.connect_tcp("127.0.0.1", port) as trickle:
            closed = anyio.Event()

            async def watch() -> None:
                if await closed_by_server(trickle, 10):
                    closed.set()

            sent = 0
            t0 = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                while not closed.is_set() and sent < 100:  # at most 5 s of trickling
                    try:
                        await trickle.send(b"{")
                    except (anyio.BrokenResourceError, OSError):
                        break
                    sent += 1
                    await anyio.sleep(0.05)
                with anyio.fail_after(5):
                    await closed.wait()
            assert time.monotonic() - t0 < 4, "a trickle of bytes kept the connection"
    letters = dead_letters(tmp_path / "state")
    assert len(letters) == 2
    assert all("read_timeout" in d["detail"] for d in letters)
    assert letters[0]["raw"] == '{"id": 1, "user": "half a fr'


async def test_tcp_backpressure_stops_reading(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        {"type": "tcp", "listen": "127.0.0.1:0"},
        daemon={"queue_batches": 1, "max_batch_events": 10, "drain_timeout": "5s"},
    )
    config = slowed(config, 0.05)
    total = 32 << 20
    data = line(1) * (total // len(line(1)))
    async with running(config) as daemon:
        with socket.create_connection(("127.0.0.1", tcp_port(daemon))) as client:
            client.setblocking(False)
            accepted = 0
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and accepted < len(data):
                try:
                    accepted += client.send(data[accepted : accepted + 65536])
                except BlockingIOError:
                    await anyio.sleep(0.01)
            # The source stopped reading: the client is held back by TCP's window, and the
            # source never held more than it could hand on.
            assert accepted < len(data) // 2
            assert metric(daemon, "tfrecordd_backpressure_seconds_total", source="in") > 0
            assert received(daemon) < 2000


# -- unix ------------------------------------------------------------------------------------


async def test_unix_socket_mode_round_trip_and_removal(tmp_path: Path) -> None:
    path = tmp_path / "ingest.sock"
    config = make_config(tmp_path, {"type": "unix", "path": str(path)})
    async with running(config) as daemon:
        st = path.lstat()
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o660
        async with await anyio.connect_unix(path) as conn:
            await conn.send(b"".join(line(i) for i in range(20)) + b"{bad\n")
        await until(lambda: received(daemon) >= 21)
    assert not path.exists(), "the socket file is removed on shutdown"
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(20), 1)
    [letter] = dead_letters(tmp_path / "state")
    assert letter["reason"] == "malformed"
    assert letter["where"].startswith("unix:pid=")


async def test_unix_mode_is_configurable_and_acks_work(tmp_path: Path) -> None:
    path = tmp_path / "ingest.sock"
    config = make_config(
        tmp_path,
        {"type": "unix", "path": str(path), "mode": "0600", "ack": True},
        output={"max_shard_age": "200ms"},
    )
    async with running(config):
        assert stat.S_IMODE(path.lstat().st_mode) == 0o600
        async with await anyio.connect_unix(path) as conn:
            await conn.send(line(0) + line(1))
            buf = bytearray()
            assert await read_line(conn, buf) == b"ACK 2\n"
    assert read_ids(tmp_path / "shards") == {0: 1, 1: 1}


async def test_unix_stale_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "ingest.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as old:
        old.bind(str(path))  # then closed without unlinking: what a killed daemon leaves
    assert stat.S_ISSOCK(path.lstat().st_mode)
    config = make_config(tmp_path, {"type": "unix", "path": str(path)})
    async with running(config) as daemon:
        assert stat.S_IMODE(path.lstat().st_mode) == 0o660
        async with await anyio.connect_unix(path) as conn:
            await conn.send(line(5))
        await until(lambda: received(daemon) >= 1)
    assert read_ids(tmp_path / "shards") == {5: 1}


async def test_unix_live_socket_or_other_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ingest.sock"
    source = UnixSourceConfig(name="in", path=path, encoder="movies").build()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen()
        with pytest.raises(ListenError, match="another process is listening"):
            await source.recover(None, [])
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(str(path))  # the other listener's socket is untouched
    os.unlink(path)
    path.write_text("not a socket")
    with pytest.raises(ListenError, match="not a socket"):
        await source.recover(None, [])
    await source.aclose()
    assert path.read_text() == "not a socket"


async def test_a_port_in_use_is_a_clear_start_up_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = TcpSourceConfig(name="in", listen=f"127.0.0.1:{port}", encoder="movies")
        source = config.build()
        with pytest.raises(ListenError, match=f"127.0.0.1:{port}: cannot listen") as caught:
            await source.recover(None, [])
        await source.aclose()
    # Not "cannot create an output" (73): another process holds the port, and a later start
    # may find it free.
    assert caught.value.exit_code == EXIT_IN_USE


# -- ipv6 ------------------------------------------------------------------------------------


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
async def test_tcp_and_udp_on_ipv6_loopback(tmp_path: Path) -> None:
    config = make_config(tmp_path, {"type": "tcp", "listen": "[::1]:0"})
    async with running(config) as daemon:
        async with await anyio.connect_tcp("::1", tcp_port(daemon)) as conn:
            await conn.send(line(1) + b"[\n")
        await until(lambda: received(daemon) >= 2)
    assert read_ids(tmp_path / "shards") == {1: 1}
    [letter] = dead_letters(tmp_path / "state")
    assert letter["where"].startswith("[::1]:")

    root = tmp_path / "udp"
    config = make_config(root, {"type": "udp", "listen": "[::1]:0"})
    async with running(config) as daemon:
        async with await anyio.create_connected_udp_socket("::1", udp_port(daemon)) as sock:
            await sock.send(line(2)[:-1])
        await until(lambda: received(daemon) >= 1)
    assert read_ids(root / "shards") == {2: 1}


# -- udp -------------------------------------------------------------------------------------


async def test_udp_datagrams_out_once_and_oversized_dead_lettered(tmp_path: Path) -> None:
    config = make_config(
        tmp_path, {"type": "udp", "listen": "127.0.0.1:0", "max_frame_bytes": 1024}
    )
    async with running(config) as daemon:
        async with await anyio.create_connected_udp_socket("127.0.0.1", udp_port(daemon)) as sock:
            for i in range(200):
                await sock.send(line(i)[:-1])
                if i % 20 == 0:
                    await anyio.sleep(0.01)
            await sock.send(b"o" * 2000)
            await sock.send(b"{nope")
        await until(lambda: received(daemon) >= 202)
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(200), 1)
    letters = {d["reason"]: d for d in dead_letters(tmp_path / "state")}
    assert letters.keys() == {"rejected", "malformed"}
    assert letters["rejected"]["raw"] == "o" * 1024
    assert "max_frame_bytes (1024)" in letters["rejected"]["detail"]
    assert (
        metric(daemon, "tfrecordd_events_dropped_total", source="in", reason="pipeline_full") == 0
    )


async def test_udp_drops_are_counted_when_the_pipeline_is_full(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        {"type": "udp", "listen": "127.0.0.1:0", "buffer_events": 20},
        daemon={"queue_batches": 1, "max_batch_events": 10},
    )
    config = slowed(config, 0.05)
    sent = 1000

    def dropped(reason: str) -> float:
        return metric(daemon, "tfrecordd_events_dropped_total", source="in", reason=reason)

    async with running(config) as daemon:
        source = daemon.sources["in"]
        assert isinstance(source, UdpSource)
        async with await anyio.create_connected_udp_socket("127.0.0.1", udp_port(daemon)) as sock:
            for i in range(sent):
                await sock.send(line(i)[:-1])
                if i % 10 == 0:
                    # Let the source read, so that the kernel itself drops nothing.
                    await anyio.lowlevel.checkpoint()
        await until(lambda: received(daemon) + dropped("pipeline_full") >= sent - 20)
        assert dropped("pipeline_full") > sent / 2
    accounted = received(daemon) + dropped("pipeline_full") + dropped("shutdown")
    assert accounted == sent
    ids = read_ids(tmp_path / "shards")
    assert sum(ids.values()) == received(daemon)
    assert set(ids.values()) == {1}


# -- config ----------------------------------------------------------------------------------


def test_the_documented_config_loads(tmp_path: Path) -> None:
    text = DOCS.read_text()
    toml = re.search(r"```toml\n(.*?)```", text, re.DOTALL)
    assert toml is not None
    features = "\n".join(f"{k} = {json.dumps(v)}" for k, v in MOVIES_FEATURES.items())
    (tmp_path / "t.toml").write_text(
        f'[output]\ndir = "{tmp_path}"\n{toml.group(1)}\n'
        f'[encoders.movies]\ntype = "example"\n[encoders.movies.features]\n{features}\n'
    )
    config = load_config(tmp_path / "t.toml", REGISTRY)
    tcp, udp, unix = config.sources
    assert isinstance(tcp, TcpSourceConfig)
    assert tcp.listen == "127.0.0.1:7070"
    assert tcp.framing == "lines"
    assert not tcp.ack
    assert isinstance(udp, UdpSourceConfig)
    assert udp.listen == "127.0.0.1:7071"
    assert isinstance(unix, UnixSourceConfig)
    assert unix.mode == 0o660
    assert "at-least-once with ack = true" in TcpSourceConfig.delivery
    assert UdpSourceConfig.delivery == "at-most-once (drops counted)"
    assert isinstance(unix.build(), UnixSource)


def test_bad_socket_config_is_reported() -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(
            {
                "output": {"dir": "/tmp/x"},
                "sources": [
                    {"name": "a", "type": "tcp", "listen": "7070", "encoder": "m"},
                    {"name": "b", "type": "unix", "path": "/x", "mode": "rw", "encoder": "m"},
                    {"name": "c", "type": "udp", "framing": "lines", "encoder": "m"},
                ],
                "encoders": {"m": {"type": "example", "features": {"id": "int64"}}},
            },
            REGISTRY,
        )
    text = str(e.value)
    assert "sources[0].listen: expected host:port" in text
    assert "sources[1].mode: expected an octal mode" in text
    assert "sources[2].framing: unknown key" in text


# -- graceful stop with acks -----------------------------------------------------------------


async def test_a_drain_acks_what_it_published_before_closing(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        {
            "type": "unix",
            "path": str(tmp_path / "in.sock"),
            "ack": True,
            "framing": "length-prefixed",
        },
        output={"max_shard_age": "1h"},
    )
    daemon = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        quiet = await anyio.connect_unix(str(tmp_path / "in.sock"))
        async with await anyio.connect_unix(str(tmp_path / "in.sock")) as conn, quiet:
            await conn.send(b"".join(prefixed(line(i)[:-1]) for i in range(20)))
            await until(lambda: received(daemon) >= 20)
            with anyio.move_on_after(0.3):
                assert await conn.receive() == b"", "an ack before anything was published"
            daemon.request_stop()
            # The drain publishes the 20 events, acks them, then closes the connection.
            assert int.from_bytes(await read_exactly(conn, 8), "big") == 20
            assert await closed_by_server(conn, 5)
            # A connection that sent nothing is closed with nothing to say.
            assert await closed_by_server(quiet, 5)
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(20), 1)


async def test_a_drain_acks_a_client_that_goes_on_sending(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        {"type": "tcp", "listen": "127.0.0.1:0", "ack": True},
        output={"max_shard_age": "1h"},
        daemon={"queue_batches": 1, "max_batch_events": 10},
    )
    daemon = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        port = tcp_port(daemon)
        with socket.create_connection(("127.0.0.1", port)) as client:

            def stream_until_closed() -> tuple[int, bytes]:
                # Sends without reading, as the documented client does, until the server ends.
                sent = 0
                try:
                    for i in range(200_000):
                        client.sendall(line(i))
                        sent = i + 1
                except OSError:
                    pass
                client.settimeout(10)
                replies = b""
                with contextlib.suppress(OSError):
                    while chunk := client.recv(65536):
                        replies += chunk
                return sent, replies

            async with anyio.create_task_group() as clients:
                result: list[tuple[int, bytes]] = []

                async def run_client() -> None:
                    result.append(await anyio.to_thread.run_sync(stream_until_closed))

                clients.start_soon(run_client)
                await until(lambda: received(daemon) >= 1000, timeout=20)
                daemon.request_stop()
        sent, replies = result[0]
    acks = [int(r.split()[1]) for r in replies.splitlines() if r.startswith(b"ACK ")]
    assert acks, "the drain's ack never reached the client"
    published = read_ids(tmp_path / "shards")
    # Exactly the acked frames are published: the client resends the rest and none twice.
    assert published == dict.fromkeys(range(acks[-1]), 1)
    assert acks[-1] < sent


# -- idle connections cannot starve real clients ---------------------------------------------


async def test_silent_connections_give_their_slots_to_new_clients(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        {
            "type": "tcp",
            "listen": "127.0.0.1:0",
            "ack": True,
            "max_connections": 4,
            "busy_idle_timeout": "300ms",
        },
        output={"max_shard_age": "100ms"},
    )
    async with running(config) as daemon:
        port = tcp_port(daemon)
        source = daemon.sources["in"]
        assert isinstance(source, TcpSource)
        silent = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(4)]
        reals: list[ByteStream] = []
        try:
            await until(lambda: source.connections == 4)
            await anyio.sleep(0.4)
            for i in range(3):
                # The slots stay full: each new client takes the place of the longest silent.
                reals.append(await anyio.connect_tcp("127.0.0.1", port))
                await reals[i].send(line(i))
                assert await read_line(reals[i], bytearray()) == b"ACK 1\n"
                assert await closed_by_server(silent[i], 1)
                assert not await closed_by_server(silent[3], 0.05)
                assert source.connections == 4
        finally:
            for s in silent + reals:
                await s.aclose()
        evicted = metric(daemon, "tfrecordd_inputs_refused_total", source="in", reason="evicted")
        assert evicted == 3
        refused = {"source": "in", "reason": "max_connections"}
        assert metric(daemon, "tfrecordd_inputs_refused_total", **refused) == 0
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(3), 1)


async def test_connections_still_busy_are_not_cut_and_refusals_are_counted(
    tmp_path: Path,
) -> None:
    config = make_config(
        tmp_path,
        {
            "type": "tcp",
            "listen": "127.0.0.1:0",
            "ack": True,
            "max_connections": 2,
            "busy_idle_timeout": "200ms",
        },
        output={"max_shard_age": "1h"},
    )
    async with running(config) as daemon:
        port = tcp_port(daemon)
        source = daemon.sources["in"]
        assert isinstance(source, TcpSource)
        # One owed an ack (its event waits for a shard), one that just sent an event.
        owed = await anyio.connect_tcp("127.0.0.1", port)
        active = await anyio.connect_tcp("127.0.0.1", port)
        async with owed, active:
            await owed.send(line(0))
            await until(lambda: received(daemon) >= 1)
            await anyio.sleep(0.3)
            await active.send(b"\n" + line(1))
            await until(lambda: received(daemon) >= 2)
            async with await anyio.connect_tcp("127.0.0.1", port) as late:
                assert await closed_by_server(late, 5)
            refused = {"source": "in", "reason": "max_connections"}
            assert metric(daemon, "tfrecordd_inputs_refused_total", **refused) == 1
            assert source.connections == 2
            daemon.request_flush()
            buf = bytearray()
            assert await read_line(owed, buf) == b"ACK 1\n"
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(2), 1)


async def test_blank_lines_do_not_keep_a_connection_open(tmp_path: Path) -> None:
    config = make_config(tmp_path, {"type": "tcp", "listen": "127.0.0.1:0", "idle_timeout": "1s"})
    async with (
        running(config) as daemon,
        await anyio.connect_tcp("127.0.0.1", tcp_port(daemon)) as conn,
    ):
        await conn.send(line(0))
        t0 = time.monotonic()
        closed = False
        for _ in range(50):  # a blank line every 0.1 s, for at most 5 s
            try:
                await conn.send(b"\n")
            except (anyio.BrokenResourceError, OSError):
                closed = True
                break
            if await closed_by_server(conn, 0.1):
                closed = True
                break
        assert closed, "blank lines kept the connection open"
        assert 0.9 <= time.monotonic() - t0 < 2.5
        reason = {"source": "in", "reason": "idle_timeout"}
        assert metric(daemon, "tfrecordd_inputs_refused_total", **reason) == 1
    assert read_ids(tmp_path / "shards") == {0: 1}


async def test_a_trickle_inside_a_frame_gives_its_slot_to_a_new_client(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        {
            "type": "tcp",
            "listen": "127.0.0.1:0",
            "max_connections": 2,
            "read_timeout": "1m",
            "busy_idle_timeout": "500ms",
        },
    )
    async with running(config) as daemon:
        port = tcp_port(daemon)
        tricklers = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(2)]
        cut: list[int] = []

        async def trickle(k: int) -> None:
            for _ in range(100):  # a byte every 0.05 s, for at most 5 s
                try:
                    await tricklers[k].send(b"{")
                except (anyio.BrokenResourceError, OSError):
                    break
                await anyio.sleep(0.05)
            else:
                return
            cut.append(k)

        async with anyio.create_task_group() as tg:
            for k in range(2):
                tg.start_soon(trickle, k)
            await anyio.sleep(0.7)
            async with await anyio.connect_tcp("127.0.0.1", port) as real:
                await real.send(line(0))
                await until(lambda: received(daemon) >= 1)
            with anyio.fail_after(5):
                while not cut:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        for t in tricklers:
            await t.aclose()
        assert metric(daemon, "tfrecordd_inputs_refused_total", source="in", reason="evicted") >= 1
    assert read_ids(tmp_path / "shards") == {0: 1}
    letters = dead_letters(tmp_path / "state")
    assert letters
    assert all("make room" in d["detail"] for d in letters)


async def test_a_read_cut_short_by_a_timeout_loses_no_bytes() -> None:
    # read_timeout and idle_timeout end a read with a cancel scope: one landing just as bytes
    # were read must leave them in the socket, not drop them from the middle of the stream.
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        b.sendall(b'{"id": 1}\n')
        got: bytes | None = None
        with anyio.move_on_after(0):
            got = await recv(a, 1024)
        assert got is None
        assert a.recv(1024) == b'{"id": 1}\n'
