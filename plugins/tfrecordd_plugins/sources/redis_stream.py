"""Redis Streams source: a consumer group read with XREADGROUP, acked with XACK after publish.

Each daemon is one consumer (named after its ``node_id`` unless configured) of a consumer group;
the daemons of a group share a stream, and Redis hands each entry to one of them. An entry
stays in its consumer's pending entries list (PEL) from XREADGROUP until the shard holding its
record is published and durable; only then is it XACKed. A batch's token is the list of its entry
IDs, journalled with the shard.

Exactly once, within one daemon:

* a crash before the shard is published leaves the entries in this consumer's PEL; at start-up
  the source reads its own pending entries first (XREADGROUP from ID ``0``) and sends them again;
* a crash after the publish leaves a journal intent whose tokens come back to :meth:`recover`
  as ``pending``: they are XACKed there, before anything is read, so the pending read no longer
  returns them and nothing committed is written twice. ``recover`` waits (retrying with backoff)
  until Redis takes those XACKs, because the daemon marks the intent done when it returns;
* finished commits were XACKed before they were marked done, so ``fold`` keeps no state.

Across daemons, entries left pending by a consumer that died are taken over with XAUTOCLAIM
once they have been idle for ``claim_idle``. Redis cannot tell a dead consumer from a slow one,
so ``claim_idle`` must exceed the longest time any daemon of the group may hold an entry between
reading and XACKing it: above ``2 * output.max_shard_age + daemon.drain_timeout`` of each
daemon. A daemon that dies between publishing a shard and XACKing its entries, and is not back
within ``claim_idle``, lets another daemon write those entries again: that window (one commit,
between the directory fsync and XACK) is the limit of the guarantee. Redis itself must keep
what it acknowledged (``appendonly yes``, ``appendfsync always``) for XACKs and entries to
survive a Redis crash.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import anyio
import orjson
from pydantic import Field, field_validator
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from tfrecordd.plugin import RawBatch, RawEvent, Source, SourceConfig, SourceContext, Token
from tfrecordd.units import Duration, Size

log = logging.getLogger(__name__)

Entry = tuple[str, dict[bytes, bytes] | None]
"""A stream entry: its ID and its fields (``None`` once the entry was deleted from the stream)."""

_ACK_CHUNK = 5000


class RedisStreamSourceConfig(SourceConfig):
    """``type = "redis-stream"``: entries of a Redis stream, read through a consumer group."""

    type: Literal["redis-stream"] = "redis-stream"
    url: str = "redis://127.0.0.1:6379/0"
    """The Redis server: ``redis://[user:password@]host:port/db``, ``rediss://`` for TLS, or
    ``unix:///path/to/redis.sock``."""
    stream: str = Field(min_length=1)
    """The stream key to read."""
    group: str = Field(default="tfrecordd", min_length=1)
    """The consumer group; created (with the stream, if missing) at ``start_id`` when absent."""
    start_id: str = Field(default="0", pattern=r"^(\$|\d+(-\d+)?)$")
    """Where a newly created group starts: ``"0"`` reads the stream from its first entry,
    ``"$"`` only entries added after the group was created. An existing group keeps its place."""
    consumer: str | None = Field(default=None, min_length=1)
    """This daemon's consumer name in the group; default: the daemon's ``node_id``. Each daemon
    of a group needs its own, and keeps it across restarts (its pending entries are found by it)."""
    field: str = Field(default="data", min_length=1)
    """The entry field that holds the event (one JSON value). An entry without it is
    dead-lettered; its other fields are kept in the dead letter."""
    id_field: str | None = Field(default=None, min_length=1)
    """If set, the entry ID (``"1700000000000-0"``) is added to the event under this key, so the
    encoder can write it as a feature. The payload must then be a JSON object that lacks the key;
    any other payload is dead-lettered with the reason."""
    max_event_bytes: Size = Field(default=1 << 20, ge=16)
    """A longer payload is dead-lettered (its first ``max_event_bytes`` bytes kept)."""
    claim_idle: Duration = Field(default=1800.0, gt=0)
    """Entries pending in the group for longer than this (their consumer died) are claimed by
    this daemon with XAUTOCLAIM. Must exceed the longest time any daemon of the group holds an
    entry before XACKing it: keep it above ``2 * output.max_shard_age + daemon.drain_timeout``
    of every daemon in the group (the default, 30m, suits the defaults 10m and 30s). A shorter
    one can take entries from a live daemon and write them twice."""
    claim_interval: Duration = Field(default=60.0, gt=0)
    """How often to look for entries to claim."""
    block: Duration = Field(default=1.0, gt=0, le=60)
    """How long one XREADGROUP waits for new entries; short, so claims and stops stay prompt."""
    timeout: Duration = Field(default=10.0, gt=0)
    """Connect timeout, and how much longer than ``block`` a command may take before the
    connection counts as lost."""
    reconnect_max_delay: Duration = Field(default=10.0, gt=0)
    """While Redis is unreachable, retries back off from 100ms up to this delay."""

    delivery: ClassVar[str] = "exactly-once"

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        scheme = urlsplit(v).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got {v!r}")
        return v

    def build(self) -> RedisStreamSource:
        return RedisStreamSource(self)


class _Backoff:
    """Exponential delays, from 100ms up to a cap; ``reset`` after a success."""

    def __init__(self, cap: float) -> None:
        self.cap = cap
        self.delay = 0.0

    def next(self) -> float:
        self.delay = min(self.cap, max(0.1, self.delay * 2))
        return self.delay

    def reset(self) -> None:
        self.delay = 0.0


def _is_nogroup(e: RedisError) -> bool:
    return isinstance(e, ResponseError) and str(e).startswith("NOGROUP")


class RedisStreamSource(Source):
    """Reads a stream through a consumer group; see the module docs for the protocol."""

    def __init__(self, config: RedisStreamSourceConfig) -> None:
        self.config = config
        self._client: Redis | None = None
        self._closed = False
        self._field = config.field.encode()
        self._inflight: set[str] = set()
        """IDs sent to the pipeline and not yet XACKed: never sent twice by this process."""

    # -- connection --------------------------------------------------------------------------

    def _redis(self) -> Redis:
        if self._client is None:
            cfg = self.config
            # No retries inside the client: a retried XREADGROUP whose first reply was lost would
            # hide entries in our PEL; the source's own loop reconnects and rereads the PEL.
            self._client = Redis.from_url(
                cfg.url,
                socket_connect_timeout=cfg.timeout,
                socket_timeout=cfg.block + cfg.timeout,
                retry=Retry(NoBackoff(), 0),
                decode_responses=False,
            )
        return self._client

    async def _cmd(self, *args: Any) -> Any:
        return await self._redis().execute_command(*args)  # type: ignore[no-untyped-call]

    async def aclose(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _ensure_group(self) -> None:
        cfg = self.config
        try:
            await self._cmd("XGROUP", "CREATE", cfg.stream, cfg.group, cfg.start_id, "MKSTREAM")
            log.info("redis stream %s: created group %s at %s", cfg.stream, cfg.group, cfg.start_id)
        except ResponseError as e:
            if not str(e).startswith("BUSYGROUP"):
                raise

    # -- acknowledgement ---------------------------------------------------------------------

    @staticmethod
    def fold(state: Any, tokens: Sequence[Token]) -> Any:
        """Nothing to keep: a commit is marked done only after its entries were XACKed."""
        del state, tokens
        return None

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        """XACK the entries of commits published before a crash, before anything is read.

        Waits for Redis if it is down: the daemon marks these commits done when this returns,
        and an entry left pending after that would be read and written again."""
        del state
        ids = [i for token in pending for i in token]
        if ids:
            await self._xack(ids)
            log.info("redis stream %s: acked %d committed entries", self.config.stream, len(ids))

    async def ack(self, tokens: Sequence[Token]) -> None:
        ids = [i for token in tokens for i in token]
        if not ids:
            return
        try:
            await self._xack(ids)
        finally:
            if self._closed:
                # Acks may still come after close (a late redo): that client is not kept.
                await self.aclose()
        self._inflight.difference_update(ids)

    async def _xack(self, ids: list[str]) -> None:
        """XACK every ID, retrying with backoff until Redis has taken them all."""
        cfg = self.config
        backoff = _Backoff(cfg.reconnect_max_delay)
        done = 0
        while done < len(ids):
            chunk = ids[done : done + _ACK_CHUNK]
            try:
                await self._cmd("XACK", cfg.stream, cfg.group, *chunk)
            except (RedisError, OSError) as e:
                if isinstance(e, RedisError) and _is_nogroup(e):
                    # The group (or stream) is gone, and with it every pending entry.
                    log.warning("redis stream %s: group %s is gone", cfg.stream, cfg.group)
                    return
                delay = backoff.next()
                log.warning(
                    "redis stream %s: XACK failed (%s); retrying in %.1fs", cfg.stream, e, delay
                )
                await anyio.sleep(delay)
                continue
            backoff.reset()
            done += len(chunk)

    # -- reading -----------------------------------------------------------------------------

    async def run(self, ctx: SourceContext) -> None:
        cfg = self.config
        consumer = cfg.consumer or ctx.node_id
        backoff = _Backoff(cfg.reconnect_max_delay)
        down_since: float | None = None
        while True:
            try:
                await self._ensure_group()
                # After start-up or a lost connection: our own pending entries first (those of
                # uncommitted shards, or whose XREADGROUP reply was lost), minus those in flight.
                await self._read_own_pending(ctx, consumer)
                if down_since is not None:
                    log.info(
                        "redis stream %s: reconnected after %.1fs",
                        cfg.stream,
                        time.monotonic() - down_since,
                    )
                    down_since = None
                backoff.reset()
                next_claim = time.monotonic()
                while True:
                    if time.monotonic() >= next_claim:
                        await self._claim(ctx, consumer)
                        next_claim = time.monotonic() + cfg.claim_interval
                    reply = await self._cmd(
                        "XREADGROUP", "GROUP", cfg.group, consumer,
                        "COUNT", ctx.max_batch_events, "BLOCK", max(1, int(cfg.block * 1000)),
                        "STREAMS", cfg.stream, ">",
                    )  # fmt: skip
                    await self._deliver(ctx, _entries(reply))
            except (RedisError, OSError) as e:
                if isinstance(e, RedisError) and _is_nogroup(e):
                    log.warning(
                        "redis stream %s: group %s vanished; recreating", cfg.stream, cfg.group
                    )
                if down_since is None:
                    down_since = time.monotonic()
                delay = backoff.next()
                log.warning("redis stream %s: %s; retrying in %.1fs", cfg.stream, e, delay)
                await anyio.sleep(delay)

    async def _read_own_pending(self, ctx: SourceContext, consumer: str) -> None:
        cfg = self.config
        after = "0"
        while True:
            reply = await self._cmd(
                "XREADGROUP", "GROUP", cfg.group, consumer,
                "COUNT", ctx.max_batch_events, "STREAMS", cfg.stream, after,
            )  # fmt: skip
            entries = _entries(reply)
            if not entries:
                return
            after = entries[-1][0]
            await self._deliver(ctx, [e for e in entries if e[0] not in self._inflight])

    async def _claim(self, ctx: SourceContext, consumer: str) -> None:
        """Take over entries idle for longer than ``claim_idle`` (one pass over the PEL)."""
        cfg = self.config
        idle_ms = max(1, int(cfg.claim_idle * 1000))
        cursor = "0-0"
        while True:
            reply = await self._cmd(
                "XAUTOCLAIM", cfg.stream, cfg.group, consumer, idle_ms, cursor,
                "COUNT", ctx.max_batch_events,
            )  # fmt: skip
            cursor = _text(reply[0])
            claimed = [_entry(e) for e in reply[1]]
            fresh = [e for e in claimed if e[0] not in self._inflight]
            if len(fresh) < len(claimed):
                log.warning(
                    "redis stream %s: %d entries of this daemon were idle for over claim_idle "
                    "(%.0fs) before being acked; other daemons may have taken some: raise "
                    "claim_idle above the longest publish delay",
                    cfg.stream,
                    len(claimed) - len(fresh),
                    cfg.claim_idle,
                )
            if fresh:
                log.info("redis stream %s: claimed %d idle entries", cfg.stream, len(fresh))
                await self._deliver(ctx, fresh)
            if cursor == "0-0":
                return

    async def _deliver(self, ctx: SourceContext, entries: list[Entry]) -> None:
        """Send entries in batches within the context's limits; each batch's token is its IDs."""
        if not entries:
            return
        if self.config.id_field is not None:
            events = await anyio.to_thread.run_sync(self._events, entries)
        else:
            events = self._events(entries)
        batch: list[RawEvent] = []
        ids: list[str] = []
        size = 0
        for (entry_id, _), event in zip(entries, events, strict=True):
            ids.append(entry_id)
            self._inflight.add(entry_id)
            if event is not None:
                batch.append(event)
                size += len(event.payload)
            else:
                ctx.count_refused("entry_deleted")
            if len(batch) >= ctx.max_batch_events or size >= ctx.max_batch_bytes:
                await ctx.send(RawBatch(ctx.name, batch, ids))
                batch, ids, size = [], [], 0
        if ids:
            await ctx.send(RawBatch(ctx.name, batch, ids))

    def _events(self, entries: list[Entry]) -> list[RawEvent | None]:
        return [self._event(entry_id, fields) for entry_id, fields in entries]

    def _event(self, entry_id: str, fields: dict[bytes, bytes] | None) -> RawEvent | None:
        """The event of one entry; ``None`` for an entry deleted from the stream (its ID is
        still acked, so it leaves the PEL)."""
        cfg = self.config
        if fields is None:
            return None
        where = f"{cfg.stream}:{entry_id}"
        payload = fields.get(self._field)
        if payload is None:
            kept = {_text(k): _text(v)[:256] for k, v in list(fields.items())[:16]}
            return RawEvent(
                orjson.dumps(kept),
                where,
                error=f"entry has no field {cfg.field!r} (fields: {', '.join(kept) or 'none'})",
            )
        limit = cfg.max_event_bytes
        if len(payload) > limit:
            return RawEvent(
                payload[:limit],
                where,
                error=f"event longer than max_event_bytes ({limit}); first bytes kept",
            )
        if cfg.id_field is None:
            return RawEvent(payload, where)
        try:
            value = orjson.loads(payload)
        except orjson.JSONDecodeError:
            # The encoder parses it again and dead-letters it as malformed, like any bad JSON.
            return RawEvent(payload, where)
        if not isinstance(value, dict):
            return RawEvent(
                payload,
                where,
                error=f"payload is a JSON {type(value).__name__}, not an object: "
                f"id_field {cfg.id_field!r} needs an object to hold the entry ID",
            )
        if cfg.id_field in value:
            return RawEvent(
                payload,
                where,
                error=f"payload already has the key {cfg.id_field!r} that id_field would set",
            )
        value[cfg.id_field] = entry_id
        return RawEvent(payload, where, value=value)


def _text(b: bytes | str) -> str:
    return b if isinstance(b, str) else b.decode("utf-8", "backslashreplace")


def _entry(raw: Any) -> Entry:
    entry_id, fields = raw
    # XADD needs at least one field: no fields (redis-py parses nil as {}) means deleted.
    return _text(entry_id), fields if isinstance(fields, dict) and fields else None


def _entries(reply: Any) -> list[Entry]:
    """The entries of an XREADGROUP reply on one stream (empty on timeout)."""
    if not reply:
        return []
    return [_entry(e) for e in reply[0][1]]
