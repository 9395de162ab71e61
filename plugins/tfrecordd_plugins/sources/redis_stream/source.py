"""The ``redis-stream`` source: the connection, the consumer group, reading, delivering in
batches, claiming idle entries, and acking (see the package docs for the protocol)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import orjson
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError, ResponseError

from tfrecordd.plugin import (
    Backoff,
    RawBatch,
    RawEvent,
    Source,
    SourceContext,
    SourceLostError,
    Token,
    describe,
    refusable,
)
from tfrecordd.schema.json_values import load_event
from tfrecordd_plugins.sources.redis_stream import ranges
from tfrecordd_plugins.sources.redis_stream.scripts import (
    ACK_CHUNK,
    ACK_LUA,
    CLAIM_LUA,
    FETCH_LUA,
    READ_LUA,
    Entry,
    text,
)

if TYPE_CHECKING:
    from tfrecordd_plugins.sources.redis_stream.config import RedisStreamSourceConfig

log = logging.getLogger("tfrecordd_plugins.sources.redis_stream")

_FIRST_DELAY = 0.1
"""While Redis fails, retries back off from this delay up to ``reconnect_max_delay``."""


def _is_nogroup(e: RedisError) -> bool:
    # From a script, Redis wraps the command's error: NOGROUP is then not at the start.
    return isinstance(e, ResponseError) and "NOGROUP" in str(e)


class RedisStreamSource(Source):
    """Reads a stream through a consumer group; see the package docs for the protocol."""

    def __init__(self, config: RedisStreamSourceConfig) -> None:
        self.config = config
        self._client: Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}
        self._closed = False
        self.inflight = ranges.InFlight()
        """Ranges sent to the pipeline and not yet XACKed: never sent twice by this process."""
        self._committed: ranges.Key | None = None
        """The highest entry ID in a commit of this source (from the journal, then the acks)."""
        self._read_max: ranges.Key | None = None
        """The highest entry ID read as new (``>``) by this process."""
        self._ctx: SourceContext | None = None

    def attach(self, ctx: SourceContext) -> None:
        self._ctx = ctx

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
            self._scripts = {
                name: self._client.register_script(lua)
                for name, lua in (
                    ("read", READ_LUA),
                    ("fetch", FETCH_LUA),
                    ("claim", CLAIM_LUA),
                    ("ack", ACK_LUA),
                )
            }
        return self._client

    async def _cmd(self, *args: Any) -> Any:
        return await self._redis().execute_command(*args)  # type: ignore[no-untyped-call]

    async def _script(self, name: str, *args: Any) -> Any:
        self._redis()
        return await self._scripts[name](keys=[self.config.stream], args=list(args))

    async def aclose(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _ensure_group(self) -> None:
        """Create the group if it is missing and nothing of it was committed or read yet;
        otherwise a missing group stops the source (:class:`SourceLostError`)."""
        cfg = self.config
        try:
            groups = await self._cmd("XINFO", "GROUPS", cfg.stream)
        except ResponseError as e:
            if "no such key" not in str(e).lower():
                raise
            groups = []
        if any(text(dict(_pairs(g)).get("name", b"")) == cfg.group for g in groups):
            return
        if self._committed is not None or self._read_max is not None:
            raise self._lost("does not exist")
        try:
            await self._cmd("XGROUP", "CREATE", cfg.stream, cfg.group, cfg.start_id, "MKSTREAM")
            log.info("redis stream %s: created group %s at %s", cfg.stream, cfg.group, cfg.start_id)
        except ResponseError as e:
            if not str(e).startswith("BUSYGROUP"):
                raise

    def _lost(self, what: str) -> SourceLostError:
        """The error that stops the source when the group is gone or was reset."""
        cfg = self.config
        if self._committed is None:
            resume = (
                f"nothing of it is committed yet: recreate it where it started "
                f"(XGROUP CREATE {cfg.stream} {cfg.group} {cfg.start_id} MKSTREAM)"
            )
        else:
            at = ranges.id_of(self._committed)
            resume = (
                f"the journal's last committed entry is {at}: recreate the group after it with "
                f"XGROUP CREATE {cfg.stream} {cfg.group} {at} MKSTREAM"
            )
            lowest = self.inflight.lowest()
            if lowest is not None and lowest <= self._committed:
                resume += (
                    f" (entries from {ranges.id_of(lowest)} were read and not yet committed: to "
                    f"be sure none is skipped, create it at {ranges.id_of(ranges.before(lowest))} "
                    "instead; committed entries after that are then written again)"
                )
        return SourceLostError(
            f"redis stream {cfg.stream}: consumer group {cfg.group} {what}: reading on would "
            f"write the stream's entries again or skip some, so the source stops. {resume}, "
            "then start tfrecordd again (see 'Consumer group deleted' in "
            "docs/sources/redis-stream.md)"
        )

    # -- acknowledgement ---------------------------------------------------------------------

    @staticmethod
    def compact(tokens: list[Token]) -> list[Token]:
        """One token per range, ranges read back to back merged (see the package docs): a
        shard's positions stay a few ranges, however many entries and batches it holds."""
        spans = [ranges.span_of(t) for token in tokens for t in ranges.read_token(token)]
        return [ranges.token([ranges.item_of(s)]) for s in ranges.merge(spans)]

    @staticmethod
    def fold(state: Any, tokens: Sequence[Token]) -> Any:
        """Keep the highest committed entry ID (``{"last": id}``): where the group resumes if
        it has to be recreated. Every commit was XACKed before it was marked done."""
        last = ranges.key_of(state["last"]) if isinstance(state, dict) and "last" in state else None
        for token in tokens:
            for _, high in ranges.id_ranges(ranges.read_token(token)):
                k = ranges.key_of(high)
                if last is None or k > last:
                    last = k
        return state if last is None else {"last": ranges.id_of(last)}

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        """XACK the entries of commits published before a crash, before anything is read.

        Waits for Redis if it is down: the daemon marks these commits done when this returns,
        and an entry left pending after that would be read and written again."""
        items = self._read_tokens(pending)
        committed = self.fold(state, items)
        if isinstance(committed, dict):
            self._committed = ranges.key_of(committed["last"])
        if items:
            n = await self._ack_tokens(items)
            log.info("redis stream %s: acked %d committed entries", self.config.stream, n)

    async def ack(self, tokens: Sequence[Token]) -> None:
        if not tokens:
            return
        items = self._read_tokens(tokens)
        try:
            await self._ack_tokens(items)
        finally:
            if self._closed:
                # Acks may still come after close (a late redo): that client is not kept.
                await self.aclose()
        for token in items:
            for item in token:
                low, high, joined = ranges.span_of(item)
                self.inflight.discard(low, high, joined)
                if self._committed is None or high > self._committed:
                    self._committed = high

    def _read_tokens(self, tokens: Sequence[Token]) -> list[list[ranges.Item]]:
        """The items of each token, every version checked before any is acted on."""
        where = f"source {self.config.name!r} (redis-stream)"
        return [ranges.read_token(t, where) for t in tokens]

    async def _ack_tokens(self, tokens: list[list[ranges.Item]]) -> int:
        """XACK what the tokens' items cover: single IDs as they are, ranges by what the group has
        pending in them (only the token's entries: see :class:`Entry`). Returns the count."""
        ids: list[str] = []
        spans: list[tuple[str, str]] = []
        for token in tokens:
            for low, high in ranges.id_ranges(token):
                if low == high:
                    ids.append(low)
                else:
                    spans.append((low, high))
        acked = await self._retrying("XACK", lambda: self._xack_ids(ids))
        return acked + await self._retrying("XACK", lambda: self._xack_spans(spans))

    async def _xack_ids(self, ids: list[str]) -> int:
        cfg = self.config
        acked = 0
        while ids:
            acked += int(await self._cmd("XACK", cfg.stream, cfg.group, *ids[:ACK_CHUNK]))
            del ids[:ACK_CHUNK]
        return acked

    async def _xack_spans(self, spans: list[tuple[str, str]]) -> int:
        acked = 0
        while spans:
            flat = [i for span in spans[:ACK_CHUNK] for i in span]
            done, start, n = await self._script("ack", self.config.group, ACK_CHUNK, *flat)
            del spans[: int(done)]
            if start:
                spans[0] = (text(start), spans[0][1])
            acked += int(n)
        return acked

    async def _retrying(self, what: str, call: Callable[[], Awaitable[int]]) -> int:
        """``call`` until Redis takes it, backing off while it fails (the source is down for
        ``acking`` meanwhile); a missing group means nothing is left to acknowledge (its
        pending entries went with it)."""
        cfg = self.config
        backoff = Backoff(_FIRST_DELAY, cfg.reconnect_max_delay)
        while True:
            try:
                n = await call()
            except (RedisError, OSError) as e:
                if not (isinstance(e, RedisError) and _is_nogroup(e)):
                    self._down(f"{what}: {e}", "acking")
                    await anyio.sleep(backoff.next())
                    continue
                log.warning("redis stream %s: group %s is gone", cfg.stream, cfg.group)
                n = 0
            if self._ctx is not None:
                self._ctx.mark_up(what="acking")
            return n

    def _down(self, reason: str, what: str) -> None:
        if self._ctx is None:  # acks before attach (tests): no state to tell
            log.warning("redis stream %s: %s", self.config.stream, reason)
        else:
            self._ctx.mark_down(f"redis stream {self.config.stream}: {reason}", what=what)

    # -- reading -----------------------------------------------------------------------------

    async def run(self, ctx: SourceContext) -> None:
        cfg = self.config
        consumer = cfg.consumer or ctx.node_id
        backoff = Backoff(_FIRST_DELAY, cfg.reconnect_max_delay)
        while True:
            try:
                await self._ensure_group()
                # After start-up or a lost connection: our own pending entries first (those of
                # uncommitted shards, or whose XREADGROUP reply was lost), minus those in flight.
                await self._read_own_pending(ctx, consumer)
                ctx.mark_up()
                backoff.reset()
                next_claim = time.monotonic()
                while True:
                    if time.monotonic() >= next_claim:
                        await self._claim(ctx, consumer)
                        next_claim = time.monotonic() + cfg.claim_interval
                    after = self._read_max
                    entries = await self._read(ctx, consumer, ">", after)
                    if not entries:
                        # Nothing new: no blocking read (it would return entries whole, of any
                        # size), so ask again after `block`.
                        await anyio.sleep(cfg.block)
                        continue
                    self._check_new(entries)
                    await self._deliver(ctx, entries, before=after)
            except (RedisError, OSError) as e:
                if isinstance(e, RedisError) and _is_nogroup(e):
                    raise self._lost("was deleted while tfrecordd read it") from e
                # Logged when it begins, then at most once a minute, and when it ends.
                ctx.mark_down(f"redis stream {cfg.stream}: {e}")
                await anyio.sleep(backoff.next())

    async def _read(
        self, ctx: SourceContext, consumer: str, at: str, after: ranges.Key | None = None
    ) -> list[Entry]:
        """Entries of one XREADGROUP from ``at``, within the batch limits (count and bytes).
        ``after``: with ``>``, the last entry this consumer read as new; the first entry read
        is ``joined`` to it if the group handed out nothing in between."""
        cfg = self.config
        reply = await self._script(
            "read", cfg.group, consumer, at, ctx.max_batch_events, ctx.max_batch_bytes,
            cfg.field, cfg.max_event_bytes, "" if after is None else ranges.id_of(after),
        )  # fmt: skip
        return [Entry.parse(e) for e in reply or []]

    def _check_new(self, entries: list[Entry]) -> None:
        """New entries come after every entry read as new before, or the group was reset
        (deleted and created again, or moved back with XGROUP SETID) under this process."""
        first = ranges.key_of(entries[0].id)
        if self._read_max is not None and first <= self._read_max:
            raise self._lost(
                f"was reset: it handed out {entries[0].id} as new after "
                f"{ranges.id_of(self._read_max)} (deleted and created again, or moved back by "
                "SETID?)"
            )
        self._read_max = ranges.key_of(entries[-1].id)

    async def _read_own_pending(self, ctx: SourceContext, consumer: str) -> None:
        after = "0"
        while entries := await self._read(ctx, consumer, after):
            after = entries[-1].id
            await self._deliver(ctx, entries, exact=False)

    async def _claim(self, ctx: SourceContext, consumer: str) -> None:
        """Take over entries idle for longer than ``claim_idle`` (one pass over the PEL)."""
        cfg = self.config
        idle_ms = max(1, int(cfg.claim_idle * 1000))
        cursor = "0-0"
        while True:
            reply = await self._script(
                "claim", cfg.group, consumer, idle_ms, cursor, ctx.max_batch_events
            )
            cursor = text(reply[0])
            claimed = [text(i) for i in reply[1]]
            fresh = [i for i in claimed if ranges.key_of(i) not in self.inflight]
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
            while fresh:
                reply = await self._script(
                    "fetch", cfg.group, ctx.max_batch_bytes, cfg.field, cfg.max_event_bytes,
                    *fresh,
                )  # fmt: skip
                entries = [Entry.parse(e) for e in reply]
                del fresh[: len(entries)]
                await self._deliver(ctx, entries, exact=False)
            if cursor == "0-0":
                return

    async def _deliver(
        self,
        ctx: SourceContext,
        entries: list[Entry],
        exact: bool = True,
        before: ranges.Key | None = None,
    ) -> None:
        """Send entries in batches within the context's limits. A batch's token is the ID
        ranges it covers: ``[first, last]``, or an ID alone, and with the entry before
        ``first`` when it is ``joined`` to it (``before``: the entry before the first).
        ``exact``: the entries are all the group holds between the first and the last (new
        entries); otherwise a range spans only entries marked ``joined``, and entries in
        flight are left out."""
        if not entries:
            return
        if self.config.id_field is not None:
            events = await anyio.to_thread.run_sync(self._events, entries)
        else:
            events = self._events(entries)
        batch: list[RawEvent] = []
        spans: list[ranges.Span] = []
        size = 0
        chained = False
        prev = before
        for entry, event in zip(entries, events, strict=True):
            key = ranges.key_of(entry.id)
            if not exact and key in self.inflight:
                chained, prev = False, key
                continue
            if chained and (exact or entry.joined):
                spans[-1] = (spans[-1][0], key, spans[-1][2])
            else:
                spans.append((key, key, prev if entry.joined else None))
            chained, prev = True, key
            if event is not None:
                batch.append(event)
                size += len(event.payload)
            else:
                ctx.count_refused("entry_deleted")
            if len(batch) >= ctx.max_batch_events or size >= ctx.max_batch_bytes:
                await self._send(ctx, batch, spans)
                batch, spans, size, chained = [], [], 0, False
        if spans:
            await self._send(ctx, batch, spans)

    async def _send(
        self, ctx: SourceContext, batch: list[RawEvent], spans: list[ranges.Span]
    ) -> None:
        for span in spans:
            self.inflight.add(*span)
        await ctx.send(RawBatch(ctx.name, batch, ranges.token([ranges.item_of(s) for s in spans])))

    def _events(self, entries: list[Entry]) -> list[RawEvent | None]:
        return [self.guarded_event(entry) for entry in entries]

    def guarded_event(self, entry: Entry) -> RawEvent | None:
        """:meth:`event_of` inside the entry's boundary: whatever making its event raises
        dead-letters that entry (its payload kept) and never stops the source."""
        try:
            return self.event_of(entry)
        except Exception as e:
            if not refusable(e):
                raise
            log.error("%s: entry %s: %s", self.config.name, entry.id, describe(e), exc_info=e)
            why = f"unexpected error: {describe(e)}"
            return RawEvent(bytes(entry.payload), f"{self.config.stream}:{entry.id}", error=why)

    def event_of(self, entry: Entry) -> RawEvent | None:
        """The event of one entry; ``None`` for an entry deleted from the stream (its ID is
        still acked, so it leaves the PEL)."""
        cfg = self.config
        if entry.kind == 2:
            return None
        where = f"{cfg.stream}:{entry.id}"
        if entry.kind == 1:
            raw = entry.kept
            kept = {text(raw[i]): text(raw[i + 1]) for i in range(0, len(raw) - 1, 2)}
            return RawEvent(
                orjson.dumps(kept),
                where,
                error=f"entry has no field {cfg.field!r} (fields: {', '.join(kept) or 'none'})",
            )
        payload = entry.payload
        limit = cfg.max_event_bytes
        if entry.length > limit:
            return RawEvent(
                payload[:limit],
                where,
                error=f"event longer than max_event_bytes ({limit}); first bytes kept",
            )
        if cfg.id_field is None:
            return RawEvent(payload, where)
        try:
            value, _ = load_event(payload)  # 1e400 too, as the encoders read it
        except orjson.JSONDecodeError:  # dead-lettered as malformed by the encoder
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
        value[cfg.id_field] = entry.id
        return RawEvent(payload, where, value=value)


def _pairs(flat: Any) -> list[tuple[str, Any]]:
    """``[k1, v1, k2, v2, ...]`` (or a dict, as redis-py may parse it) as pairs, keys as text."""
    if isinstance(flat, dict):
        return [(text(k), v) for k, v in flat.items()]
    return [(text(flat[i]), flat[i + 1]) for i in range(0, len(flat) - 1, 2)]
