"""The redis-stream source against a real redis-server: in-process daemons and a bare source."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from redis.asyncio import Redis

from tests.redis_server import RedisServer, write_redis_config
from tests.support import (
    dead_letters,
    metric_sum,
    movie_event,
    read_examples,
    read_ids,
    shard_files,
)
from tfrecordd.config import load_config
from tfrecordd.metrics import Metrics
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.plugin import RawBatch
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.sources.redis_stream import RedisStreamSourceConfig

pytestmark = pytest.mark.anyio

STREAM, GROUP = "events", "tfrecordd"


def metric(m: Metrics, name: str, **labels: str) -> float:
    return metric_sum(m.registry, name, **labels)


async def until(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 30.0) -> None:
    """Poll ``predicate`` (sync or async) until true; fail after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while True:
            result = predicate()
            if await result if inspect.isawaitable(result) else result:
                return
            await anyio.sleep(0.05)


async def xadd(
    r: Redis, payloads: Sequence[bytes | dict[str, Any]], field: str = "data"
) -> list[str]:
    """Add one entry per payload (dicts as JSON) in one pipeline; returns the entry IDs."""
    async with r.pipeline(transaction=False) as pipe:
        for p in payloads:
            pipe.xadd(STREAM, {field: p if isinstance(p, bytes) else orjson.dumps(p)})
        ids = await pipe.execute()
    return [i.decode() for i in ids]


async def pending(r: Redis) -> int:
    return int((await r.xpending(STREAM, GROUP))["pending"])


async def run_until(daemon: Daemon, done: Any, timeout: float = 30.0) -> None:
    """Run ``daemon`` until ``await done()`` is true, then stop it (drain, publish, ack)."""
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        await until(done, timeout)
        daemon.request_stop()


def as_example(event: dict[str, Any]) -> dict[str, list[Any]]:
    """What the movies schema makes of an event, as ``iter_examples`` reads it back."""
    out: dict[str, list[Any]] = {}
    for key, value in event.items():
        values = value if isinstance(value, list) else [value]
        out[key] = [v.encode() if isinstance(v, str) else v for v in values]
    return out


async def test_config_as_documented_writes_each_event_once(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    events = [movie_event(i) for i in range(700)]
    cfg = write_redis_config(tmp_path, redis_server.url, daemon={"max_batch_events": 64})
    daemon = Daemon(load_config(cfg), handle_signals=False)
    async with Redis.from_url(redis_server.url) as r:
        await xadd(r, events[:300])

        async def all_acked() -> bool:
            received = metric(daemon.metrics, "tfrecordd_events_received_total", source="events")
            return received == len(events) and await pending(r) == 0

        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            await xadd(r, events[300:])
            with anyio.fail_after(30):
                while not await all_acked():
                    daemon.request_flush()
                    await anyio.sleep(0.1)
            daemon.request_stop()
        assert await pending(r) == 0
    got = sorted(read_examples(tmp_path / "shards"), key=lambda ex: int(ex["id"][0]))
    want = [as_example(e) for e in events]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for key in w:
            assert g[key] == pytest.approx(w[key]), key
    assert metric(daemon.metrics, "tfrecordd_events_acked_total", source="events") == 700


async def test_no_xack_before_publish(tmp_path: Path, redis_server: RedisServer) -> None:
    cfg = write_redis_config(tmp_path, redis_server.url, output={"max_shard_age": "1h"})
    daemon = Daemon(load_config(cfg), handle_signals=False)
    out = tmp_path / "shards"
    async with Redis.from_url(redis_server.url) as r, anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        await xadd(r, [movie_event(i) for i in range(50)])
        await until(lambda: metric(daemon.metrics, "tfrecordd_open_shard_records") == 50)
        await anyio.sleep(0.5)
        assert shard_files(out) == []
        assert await pending(r) == 50, "entries stay pending while their shard is open"
        daemon.request_flush()
        await until(lambda: _acked(r), 10)
        assert len(shard_files(out)) == 1
        daemon.request_stop()
    assert read_ids(out) == dict.fromkeys(range(50), 1)


async def test_bad_entries_are_dead_lettered_with_reasons_then_acked(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    cfg = write_redis_config(
        tmp_path,
        redis_server.url,
        source={"id_field": "stream_id", "max_event_bytes": 4096},
        features={"id": "int64", "stream_id": "bytes"},
    )
    daemon = Daemon(load_config(cfg), handle_signals=False)
    async with Redis.from_url(redis_server.url) as r:
        good = await xadd(r, [{"id": i} for i in range(20)])
        no_field = await xadd(r, [b'{"id": 100}'], field="body")
        not_json = await xadd(r, [b"{not json"])
        not_object = await xadd(r, [b"[1, 2]"])
        has_key = await xadd(r, [{"id": 101, "stream_id": "mine"}])
        too_long = await xadd(r, [b'{"id": 102, "pad": "' + b"x" * 5000 + b'"}'])
        wrong_type = await xadd(r, [{"id": "one"}])

        async def acked() -> bool:
            received = metric(daemon.metrics, "tfrecordd_events_received_total", source="events")
            return received == 26 and await pending(r) == 0

        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            with anyio.fail_after(30):
                while not await acked():
                    daemon.request_flush()
                    await anyio.sleep(0.1)
            daemon.request_stop()
    examples = list(read_examples(tmp_path / "shards"))
    assert sorted((int(e["id"][0]), e["stream_id"][0].decode()) for e in examples) == [
        (i, good[i]) for i in range(20)
    ]
    letters = {d["where"]: d for d in dead_letters(tmp_path / "state")}
    assert len(letters) == 6
    assert all(d["source"] == "events" for d in letters.values())

    def letter(ids: list[str]) -> dict[str, Any]:
        return letters[f"{STREAM}:{ids[0]}"]

    assert letter(no_field)["reason"] == "rejected"
    assert "no field 'data'" in letter(no_field)["detail"]
    assert orjson.loads(letter(no_field)["raw"]) == {"body": '{"id": 100}'}
    assert letter(not_json)["reason"] == "malformed"
    assert letter(not_json)["raw"] == "{not json"
    assert letter(not_object)["reason"] == "rejected"
    assert "JSON list, not an object" in letter(not_object)["detail"]
    assert "already has the key 'stream_id'" in letter(has_key)["detail"]
    assert "max_event_bytes (4096)" in letter(too_long)["detail"]
    assert len(letter(too_long)["raw"]) == 4096
    assert letter(wrong_type)["reason"] == "schema"


async def test_own_pending_entries_are_read_first_and_written_once(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Entries this consumer read before it died (never published) are written at start-up."""
    cfg = write_redis_config(tmp_path, redis_server.url)
    async with Redis.from_url(redis_server.url) as r:
        await r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        ids = await xadd(r, [movie_event(i) for i in range(30)])
        # A previous life of consumer "test" (the node id) read 20 entries and died.
        await r.xreadgroup(GROUP, "test", {STREAM: ">"}, count=20)
        # Two of them are deleted from the stream meanwhile: nothing to write, still to ack.
        await r.xdel(STREAM, ids[0], ids[1])
        await xadd(r, [movie_event(i) for i in range(30, 40)])
        assert await pending(r) == 20
        daemon = Daemon(load_config(cfg), handle_signals=False)

        async def done() -> bool:
            received = metric(daemon.metrics, "tfrecordd_events_received_total", source="events")
            return received >= 38

        await run_until(daemon, done)
        assert await pending(r) == 0
        assert await r.xpending_range(STREAM, GROUP, "-", "+", 10) == []
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(2, 40), 1)
    refused = "tfrecordd_inputs_refused_total"
    assert metric(daemon.metrics, refused, source="events", reason="entry_deleted") == 2


async def test_recover_acks_committed_entries_once_redis_is_back(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The daemon marks a redone commit done when ``recover`` returns: it must wait for Redis."""
    async with Redis.from_url(redis_server.url) as r:
        await r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        ids = await xadd(r, [movie_event(i) for i in range(5)])
        await r.xreadgroup(GROUP, "test", {STREAM: ">"})
    await anyio.to_thread.run_sync(lambda: redis_server.stop(save=True))
    config = RedisStreamSourceConfig(
        name="events", url=redis_server.url, stream=STREAM, encoder="movies", timeout=1
    )
    source = config.build()
    returned = anyio.Event()

    async def recover() -> None:
        await source.recover(None, [ids[:3], ids[3:4]])
        returned.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(recover)
            await anyio.sleep(1.0)
            assert not returned.is_set(), "recover returned while Redis was down"
            await anyio.to_thread.run_sync(redis_server.start)
            with anyio.fail_after(10):
                await returned.wait()
    finally:
        await source.aclose()
    async with Redis.from_url(redis_server.url) as r:
        left = await r.xpending_range(STREAM, GROUP, "-", "+", 10)
    assert [_text(e["message_id"]) for e in left] == ids[4:]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def test_entries_of_a_dead_consumer_are_claimed_after_claim_idle(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    async with Redis.from_url(redis_server.url) as r:
        await r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        await xadd(r, [movie_event(i) for i in range(60)])
        await r.xreadgroup(GROUP, "ghost", {STREAM: ">"}, count=25)
        await xadd(r, [movie_event(i) for i in range(60, 80)])

        # With the default claim_idle (30m), the ghost's entries are left alone.
        cfg = write_redis_config(tmp_path / "a", redis_server.url)
        daemon = Daemon(load_config(cfg), handle_signals=False)

        async def rest_done() -> bool:
            return metric(daemon.metrics, "tfrecordd_events_received_total", source="events") >= 55

        await run_until(daemon, rest_done)
        await anyio.sleep(0.3)
        assert metric(daemon.metrics, "tfrecordd_events_received_total", source="events") == 55
        owners = {e["consumer"] for e in await r.xpending_range(STREAM, GROUP, "-", "+", 100)}
        assert (await pending(r), owners) == (25, {b"ghost"})

        cfg = write_redis_config(
            tmp_path / "b",
            redis_server.url,
            source={"claim_idle": "300ms", "claim_interval": "100ms"},
            daemon={"node_id": "heir"},
        )
        heir = Daemon(load_config(cfg), handle_signals=False)

        async def claimed() -> bool:
            return metric(heir.metrics, "tfrecordd_events_received_total", source="events") >= 25

        await run_until(heir, claimed)
        assert await pending(r) == 0
    first, second = read_ids(tmp_path / "a" / "shards"), read_ids(tmp_path / "b" / "shards")
    assert set(first) == set(range(25, 80))
    assert second == dict.fromkeys(range(25), 1)


async def test_reading_pauses_while_send_waits(redis_server: RedisServer) -> None:
    """Backpressure: nothing more is read from the stream while the pipeline is full."""

    class Stuck(RecordingContext):
        async def send(self, batch: RawBatch) -> None:
            self.batches.append(batch)
            await anyio.sleep_forever()

    config = RedisStreamSourceConfig(
        name="events", url=redis_server.url, stream=STREAM, encoder="movies", block=0.05
    )
    source = config.build()
    ctx = Stuck(name="events", max_batch_events=10)
    async with Redis.from_url(redis_server.url) as r:
        await xadd(r, [movie_event(i) for i in range(100)])
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(source.run, ctx)
                await anyio.sleep(1.0)
                tg.cancel_scope.cancel()
        finally:
            await source.aclose()
        assert [len(b.events) for b in ctx.batches] == [10]
        assert await pending(r) == 10
        info = await r.xinfo_groups(STREAM)
        assert info[0]["lag"] == 90


async def test_redis_outage_is_retried_with_backoff(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = write_redis_config(tmp_path, redis_server.url, output={"max_shard_age": "200ms"})
    daemon = Daemon(load_config(cfg), handle_signals=False)
    caplog.set_level(logging.INFO, "tfrecordd.plugin")
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        async with Redis.from_url(redis_server.url) as r:
            await xadd(r, [movie_event(i) for i in range(20)])
            await until(lambda: len(read_ids(tmp_path / "shards")) == 20)
            await until(lambda: _acked(r))
        await anyio.to_thread.run_sync(lambda: redis_server.stop(save=True))
        await anyio.sleep(3.0)
        retries = daemon.source_states()[0].reconnects
        # Backoff from 100ms doubles: about 5 attempts in 3s, not a spin.
        assert 2 <= retries <= 8, retries
        await anyio.to_thread.run_sync(redis_server.start)
        async with Redis.from_url(redis_server.url) as r:
            await xadd(r, [movie_event(i) for i in range(20, 40)])
            await until(lambda: len(read_ids(tmp_path / "shards")) == 40)
            await until(lambda: _acked(r))
        daemon.request_stop()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(40), 1)
    assert any("reading works again" in m for m in caplog.messages)


async def _acked(r: Redis) -> bool:
    return await pending(r) == 0


def test_the_documented_config_loads_as_written(tmp_path: Path) -> None:
    doc = (Path(__file__).parents[2] / "docs" / "sources" / "redis-stream.md").read_text()
    snippet = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "tfrecordd.toml"
    path.write_text(
        f'[output]\ndir = "{tmp_path}"\n{snippet}\n'
        '[encoders.movies]\ntype = "example"\n[encoders.movies.features]\nid = "int64"\n'
    )
    (source,) = load_config(path).sources
    assert isinstance(source, RedisStreamSourceConfig)
    assert (source.url, source.stream, source.group, source.field) == (
        "redis://127.0.0.1:6379/0",
        "events",
        "tfrecordd",
        "data",
    )
    assert (source.consumer, source.start_id, source.claim_idle) == (None, "0", 1800.0)
