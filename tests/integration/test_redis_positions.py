"""The redis-stream source's positions against a real redis-server: compact ID ranges in the
journal, tokens of an older release still read, entries of other consumers never acked, and a
consumer group deleted or reset under the daemon."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from redis.asyncio import Redis

from tests.integration.test_redis_source import GROUP, STREAM, pending, run_until, until, xadd
from tests.redis_server import RedisServer, write_redis_config
from tests.support import intent_shards, movie_event, read_ids
from tfrecordd.config import load_config
from tfrecordd.errors import EXIT_UNAVAILABLE, SourceLostError
from tfrecordd.format.framing import iter_framed
from tfrecordd.fsys import LOCAL
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.plugin import RawBatch
from tfrecordd.state.journal import Journal
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.sources.redis_stream import RedisStreamSource, RedisStreamSourceConfig
from tfrecordd_plugins.sources.redis_stream.ranges import read_token

pytestmark = pytest.mark.anyio

QUICK = {"max_shard_age": "200ms"}
"""Shards published at once: entries are acked while the daemon runs."""


def journal_intents(state: Path) -> list[dict[str, Any]]:
    data = (state / "journal").read_bytes()
    records = [orjson.loads(p) for _, p in iter_framed(io.BytesIO(data), "journal")]
    return [rec for rec in records if rec["t"] == "intent"]


def committed_state(state: Path) -> Any:
    journal = Journal(str(state), LOCAL, folds={"events": RedisStreamSource.fold})
    try:
        return journal.recover().states.get("events")
    finally:
        journal.close()


def lost_error(exc: BaseException) -> SourceLostError | None:
    if isinstance(exc, SourceLostError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            if (found := lost_error(sub)) is not None:
                return found
    return None


def all_acked(r: Redis) -> Any:
    """An async predicate: every entry was delivered to a consumer of the group and acked."""

    async def check() -> bool:
        groups = await r.xinfo_groups(STREAM)
        return bool(groups and groups[0]["lag"] == 0 and groups[0]["pending"] == 0)

    return check


async def run_expecting_lost(daemon: Daemon, timeout: float = 30.0) -> SourceLostError:
    with anyio.fail_after(timeout):
        try:
            await daemon.run()
        except BaseException as e:
            found = lost_error(e)
            if found is None:
                raise
            return found
    raise AssertionError("the daemon ran on")


_FILL_LUA = """
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) - 1 do
  redis.call('XADD', KEYS[1], '*', 'data', '{"id":' .. i .. '}')
end
"""


async def test_positions_of_a_big_shard_are_a_few_ranges(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    n = 50_000
    cfg = write_redis_config(
        tmp_path,
        redis_server.url,
        output={"max_shard_age": "10m", "max_shard_bytes": "1GiB", "compression": "none"},
        features={"id": "int64"},
    )
    r = Redis.from_url(redis_server.url)
    try:
        await r.xgroup_create(STREAM, GROUP, "0", mkstream=True)
        for start in range(0, n, 50_000):
            await r.eval(_FILL_LUA, 1, STREAM, start, start + 50_000)
        daemon = Daemon(load_config(cfg), handle_signals=False)
        source = daemon.sources["events"]
        assert isinstance(source, RedisStreamSource)

        held: list[int] = []

        async def all_read() -> bool:
            # What the open shard's positions hold in memory, in the daemon and in the source.
            held.append(sum(map(len, daemon.write.unit.tokens.values())))
            held.append(len(source.inflight))
            # Every entry sent into the pipeline, not only read from Redis: one read but still
            # in the source at the stop stays pending (rightly) and the check below would fail.
            sent = daemon.metrics.registry.get_sample_value(
                "tfrecordd_events_received_total", {"source": "events"}
            )
            return (sent or 0) >= n

        # The shard is published (and its entries acked) by the drain.
        await run_until(daemon, all_read, timeout=180)
        assert await all_acked(r)()
    finally:
        await r.aclose()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(n), 1)
    intents = [i for i in journal_intents(tmp_path / "state") if intent_shards(i)]
    assert len(intents) == 1, "one shard holds every entry"
    tokens = intents[0]["positions"]["events"]
    size = len(orjson.dumps(intents[0]["positions"]))
    # 50 batches (of max_batch_events = 1000) read back to back by one consumer: their
    # ranges merge into a few, whatever the shard's size (not one ID per entry: 0.9 MB; not
    # one range per batch: 2.2 KB).
    assert len(tokens) <= 3, tokens
    assert all(len(read_token(t)) == 1 and isinstance(read_token(t)[0], list) for t in tokens)
    assert size < 256, f"{size} bytes of positions for {n} entries"
    assert max(held) <= 3, f"up to {max(held)} ranges held for the open shard"
    assert len(source.inflight) == 0


async def test_entries_pending_for_another_consumer_are_never_acked(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    cfg = write_redis_config(tmp_path, redis_server.url, output=QUICK)
    r = Redis.from_url(redis_server.url)
    try:
        await r.xgroup_create(STREAM, GROUP, "0", mkstream=True)
        ids = await xadd(r, [movie_event(i) for i in range(100)])
        # This daemon's consumer ("test") was handed all of them, then another consumer took
        # every other one: the two PELs interleave.
        await r.xreadgroup(GROUP, "test", {STREAM: ">"}, count=100)
        theirs: list[Any] = ids[1::2]
        await r.xclaim(STREAM, GROUP, "other", 0, theirs)
        daemon = Daemon(load_config(cfg), handle_signals=False)

        async def ours_acked() -> bool:
            info = await r.xpending(STREAM, GROUP)
            return bool(info["pending"] == 50)

        await run_until(daemon, ours_acked)
        left: list[Any] = await r.xpending_range(STREAM, GROUP, "-", "+", 200)
    finally:
        await r.aclose()
    assert sorted(p["message_id"].decode() for p in left) == sorted(theirs)
    assert {p["consumer"].decode() for p in left} == {"other"}
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(0, 100, 2), 1)


async def test_tokens_of_an_older_release_are_acked_and_folded(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    cfg = write_redis_config(tmp_path, redis_server.url, output=QUICK)
    state = tmp_path / "state"
    r = Redis.from_url(redis_server.url)
    try:
        await r.xgroup_create(STREAM, GROUP, "0", mkstream=True)
        ids = await xadd(r, [movie_event(i) for i in range(300)])
        await r.xreadgroup(GROUP, "test", {STREAM: ">"}, count=150)
        # What an older release left: a finished commit and one whose acks were not done,
        # their tokens lists of entry IDs (the first 150 entries, read as "test").
        journal = Journal(str(state), LOCAL, folds={"events": RedisStreamSource.fold})
        journal.recover()
        done = journal.next_intent({"events": [ids[0:50], ids[50:100]]})
        journal.write_intent(done)
        await r.xack(STREAM, GROUP, *ids[0:100])
        journal.write_done(done.seq)
        journal.write_intent(journal.next_intent({"events": [ids[100:150]]}))
        journal.close()
        assert committed_state(state) == {"last": ids[99]}

        daemon = Daemon(load_config(cfg), handle_signals=False)
        await run_until(daemon, all_acked(r))
    finally:
        await r.aclose()
    # The old commit's entries were acked at start-up, before anything was read: not written.
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(150, 300), 1)
    assert committed_state(state) == {"last": ids[-1]}


async def test_a_group_deleted_while_running_stops_the_source_without_a_replay(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    cfg = write_redis_config(tmp_path, redis_server.url, output=QUICK)
    r = Redis.from_url(redis_server.url)
    try:
        ids = await xadd(r, [movie_event(i) for i in range(500)])
        daemon = Daemon(load_config(cfg), handle_signals=False)

        async def destroy_when_done() -> None:
            await until(all_acked(r))
            await r.xgroup_destroy(STREAM, GROUP)
            await xadd(r, [movie_event(i) for i in range(500, 600)])

        async with anyio.create_task_group() as tg:
            tg.start_soon(destroy_when_done)
            error = await run_expecting_lost(daemon)
        assert error.exit_code == EXIT_UNAVAILABLE
        assert "was deleted while tfrecordd read it" in str(error)
        assert read_ids(tmp_path / "shards") == dict.fromkeys(range(500), 1)
        assert committed_state(tmp_path / "state") == {"last": ids[-1]}

        # At the next start the group is still missing: no silent re-creation at "0".
        error = await run_expecting_lost(Daemon(load_config(cfg), handle_signals=False))
        assert f"XGROUP CREATE {STREAM} {GROUP} {ids[-1]} MKSTREAM" in str(error)
        assert await r.xinfo_groups(STREAM) == []
    finally:
        await r.aclose()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(500), 1)


async def test_a_group_reset_under_the_daemon_stops_the_source(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    cfg = write_redis_config(tmp_path, redis_server.url, output=QUICK)
    r = Redis.from_url(redis_server.url)
    try:
        await xadd(r, [movie_event(i) for i in range(300)])
        daemon = Daemon(load_config(cfg), handle_signals=False)

        async def reset_when_done() -> None:
            await until(all_acked(r))
            # Deleted and created again between two reads: no NOGROUP is ever seen.
            async with r.pipeline(transaction=True) as pipe:
                pipe.xgroup_destroy(STREAM, GROUP)
                pipe.xgroup_create(STREAM, GROUP, "0")
                await pipe.execute()

        async with anyio.create_task_group() as tg:
            tg.start_soon(reset_when_done)
            error = await run_expecting_lost(daemon)
        assert "was reset" in str(error)
    finally:
        await r.aclose()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(300), 1)


async def test_a_missing_group_is_created_when_nothing_was_committed(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    cfg = write_redis_config(tmp_path, redis_server.url, output=QUICK)
    r = Redis.from_url(redis_server.url)
    try:
        await xadd(r, [movie_event(i) for i in range(50)])
        daemon = Daemon(load_config(cfg), handle_signals=False)
        await run_until(daemon, all_acked(r))
    finally:
        await r.aclose()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(50), 1)


async def test_claimed_entries_between_entries_in_flight_get_ranges_of_their_own(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    cfg = write_redis_config(
        tmp_path,
        redis_server.url,
        source={"claim_idle": "500ms", "claim_interval": "100ms"},
    )
    r = Redis.from_url(redis_server.url)
    try:
        await r.xgroup_create(STREAM, GROUP, "0", mkstream=True)
        ids = await xadd(r, [movie_event(i) for i in range(60)])
        # A dead consumer holds every entry, this daemon's consumer every third: at start-up
        # the daemon rereads its own (they stay in its open shard), then claims the dead one's,
        # which lie between them.
        await r.xreadgroup(GROUP, "dead", {STREAM: ">"}, count=60)
        ours: list[Any] = ids[0::3]
        await r.xclaim(STREAM, GROUP, "test", 0, ours)
        daemon = Daemon(load_config(cfg), handle_signals=False)

        def all_sent() -> bool:
            received = daemon.metrics.registry.get_sample_value(
                "tfrecordd_events_received_total", {"source": "events"}
            )
            return received == 60

        await run_until(daemon, all_sent)
        assert await all_acked(r)()
    finally:
        await r.aclose()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(60), 1)
    spans = [
        (t, t) if isinstance(t, str) else (t[0], t[1])
        for intent in journal_intents(tmp_path / "state")
        for token in intent["positions"].get("events", [])
        for t in read_token(token)
    ]
    keys = [_k(i) for i in ids]
    covered = [[i for i, k in enumerate(keys) if _k(low) <= k <= _k(high)] for low, high in spans]
    assert sorted(i for c in covered for i in c) == list(range(60)), "disjoint, and all of them"


def _k(entry_id: str) -> tuple[int, ...]:
    return tuple(map(int, entry_id.split("-")))


class _Interleaved(RecordingContext):
    """After each batch the source sends, another consumer of the group reads ``theirs``
    entries as new (``0``: it reads nothing): the two consumers' reads interleave."""

    def __init__(self, r: Redis, theirs: int) -> None:
        super().__init__(name="events", max_batch_events=10)
        self.r, self.theirs = r, theirs

    async def send(self, batch: RawBatch) -> None:
        self.batches.append(batch)
        if self.theirs:
            await self.r.xreadgroup(GROUP, "other", {STREAM: ">"}, count=self.theirs)


async def _read_interleaved(url: str, r: Redis, theirs: int, n: int) -> list[Any]:
    """Run a bare source until the group has handed out all ``n`` entries; its tokens."""
    source = RedisStreamSourceConfig(
        name="events", url=url, stream=STREAM, encoder="movies", block=0.05
    ).build()
    ctx = _Interleaved(r, theirs)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, ctx)
            await until(lambda: _lag(r, 0))
            tg.cancel_scope.cancel()
        tokens = [b.token for b in ctx.batches]
        await source.ack(source.compact(tokens))
    finally:
        await source.aclose()
    return tokens


async def _lag(r: Redis, lag: int) -> bool:
    groups = await r.xinfo_groups(STREAM)
    return bool(groups and groups[0]["lag"] == lag)


async def test_ranges_read_back_to_back_merge_and_ack_the_same_entries(
    redis_server: RedisServer,
) -> None:
    async with Redis.from_url(redis_server.url) as r:
        await r.xgroup_create(STREAM, GROUP, "0", mkstream=True)
        await xadd(r, [movie_event(i) for i in range(500)])
        tokens = await _read_interleaved(redis_server.url, r, 0, 500)
        assert len(tokens) == 50
        merged = RedisStreamSource.compact(tokens)
        assert len(merged) == 1, merged
        assert await pending(r) == 0


async def test_a_merged_range_never_acks_entries_another_consumer_read_between(
    redis_server: RedisServer,
) -> None:
    async with Redis.from_url(redis_server.url) as r:
        await r.xgroup_create(STREAM, GROUP, "0", mkstream=True)
        ids = await xadd(r, [movie_event(i) for i in range(300)])
        tokens = await _read_interleaved(redis_server.url, r, 5, 300)
        left: list[Any] = await r.xpending_range(STREAM, GROUP, "-", "+", 1000)
    theirs = {p["message_id"].decode() for p in left}
    assert {p["consumer"].decode() for p in left} == {"other"}
    # The other consumer read between most of this one's batches; only its entries are left.
    assert len(theirs) >= 50
    # Every range this consumer's tokens hold stops where the other consumer's reads began.
    merged = RedisStreamSource.compact(tokens)
    keys = sorted(ids, key=_k)
    for item in (t for token in merged for t in read_token(token)):
        low, high = (item, item) if isinstance(item, str) else (item[0], item[1])
        inside = {i for i in keys if _k(low) <= _k(i) <= _k(high)}
        assert not inside & theirs, (item, sorted(inside & theirs)[:3])
