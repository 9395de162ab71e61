"""Redis Streams source: a consumer group read with XREADGROUP, acked with XACK after publish.

Each daemon is one consumer (named after its ``node_id`` unless configured) of a consumer group;
the daemons of a group share a stream, and Redis hands each entry to one of them. An entry
stays in its consumer's pending entries list (PEL) from XREADGROUP until the shard holding its
record is published and durable; only then is it XACKed. A batch's token is the ID ranges it
covers (``[first, last]``, or an ID alone), journalled with the shard: a range never spans an
entry pending in the group outside the batch, so XACKing what the group has pending in it acks
the batch and nothing else. Reads go through Lua scripts that hand out no more than
``max_batch_bytes`` (plus one event cut to ``max_event_bytes``) at a time.

Positions stay flat: :meth:`RedisStreamSource.compact` merges the ranges of a shard's batches
that were read back to back, so a shard of any size read by one consumer is a range or two in
memory and in the journal, not a range per batch. Two ranges ``[a, b]`` and ``[c, d]`` merge
into ``[a, d]`` only if acking it can take nothing else from the group: nothing may be pending
between ``b`` and ``c``, then or later. A range's third ID says so (``[c, d, b]``: ``c`` is
*joined* to ``b``), set by the read scripts inside Redis, atomically with the read:

* entries read as new: ``c`` was handed out by XREADGROUP ``>`` right after ``b``, in the same
  reply or in this consumer's next one with the group's last-delivered-id still ``b`` just
  before it (no consumer of the group was handed anything since ``b``, so no other daemon
  holds an entry in between); for the first entry of a reply, XPENDING must also find nothing
  between ``b`` and ``c`` (what a group moved back could have left there);
* pending and claimed entries (read one at a time): XPENDING finds nothing in the group
  between ``b`` and ``c``. It misses nothing: entries deleted by XDEL or trimmed by XTRIM stay
  in the PEL until acked.

Nothing can become pending there afterwards: XADD only adds IDs above the stream's last one
and XREADGROUP ``>`` only IDs above the last-delivered-id (both ``d`` or more); XCLAIM and
XAUTOCLAIM move entries that are already pending. Only a group moved back (XGROUP SETID, or
deleted and created again) could hand out entries in between again; that
stops the source (:class:`~tfrecordd.errors.SourceLostError`, exit 69) when seen, and is a
replay anyway. So a merged range acks exactly what its parts would. With several daemons in a
group, ranges merge only over the stretches one daemon reads alone: their number grows with
how often the daemons' reads interleave, not with the entries. Tokens of older releases (IDs
alone and ``[first, last]`` ranges) are read and acked as before.

Exactly once, within one daemon:

* a crash before the shard is published leaves the entries in this consumer's PEL; at start-up
  the source reads its own pending entries first (XREADGROUP from ID ``0``) and sends them again;
* a crash after the publish leaves a journal intent whose tokens come back to :meth:`recover`
  as ``pending``: they are XACKed there, before anything is read, so the pending read no longer
  returns them and nothing committed is written twice. ``recover`` waits (retrying with backoff)
  until Redis takes those XACKs, because the daemon marks the intent done when it returns;
* finished commits were XACKed before they were marked done, so ``fold`` keeps only the highest
  committed entry ID: where the group resumes should it be deleted (a deleted or reset group
  stops the source with :class:`~tfrecordd.errors.SourceLostError`, never a silent replay).

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

import bisect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import anyio
import orjson
from pydantic import Field, field_validator
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError, ResponseError

from tfrecordd.plugin import (
    Duration,
    RawBatch,
    RawEvent,
    Size,
    Source,
    SourceConfig,
    SourceContext,
    SourceLostError,
    Token,
)

log = logging.getLogger(__name__)

Key = tuple[int, int]
"""An entry ID as numbers (``"1700000000000-3"`` is ``(1700000000000, 3)``), to compare."""

_ACK_CHUNK = 5000
_KEPT_FIELDS = 16
_KEPT_FIELD_BYTES = 256

# Every read goes through these scripts, so that no reply holds more than the byte budget
# (max_batch_bytes) plus one event: XREADGROUP, XRANGE and XAUTOCLAIM have no byte limit. Inside
# Redis, new entries are measured before they are handed out, pending and claimed ones are read
# one at a time, and each event is cut to max_event_bytes. Each entry comes back as {id, kind
# (0 event, 1 no such field, 2 deleted), event, its whole length, other fields, joined};
# "joined": the group's PEL holds nothing between it and the entry before, so the two can share
# an ID range in a token.
_ENTRY_LUA = """
local function entry(key, group, id, fields, field, max, check, prev)
  local e = {id, 2, '', 0, {}, 0}
  if fields then
    local payload = nil
    for i = 1, #fields, 2 do
      if fields[i] == field then payload = fields[i + 1] end
    end
    if payload then
      e[2] = 0
      e[4] = #payload
      e[3] = string.sub(payload, 1, max)
    else
      e[2] = 1
      local kept = {}
      for i = 1, math.min(#fields, KEPT_ITEMS), 1 do
        kept[i] = string.sub(fields[i], 1, KEPT_BYTES)
      end
      e[5] = kept
    end
  end
  if prev then
    if check == '0' or #redis.call('XPENDING', key, group, '(' .. prev, '(' .. id, 1) == 0 then
      e[6] = 1
    end
  end
  return e
end
local function size(e)
  local n = #e[3] + 64
  for _, v in ipairs(e[5]) do n = n + #v end
  return n
end
""".replace("KEPT_ITEMS", str(2 * _KEPT_FIELDS)).replace("KEPT_BYTES", str(_KEPT_FIELD_BYTES))

_READ_LUA = (
    _ENTRY_LUA
    + """
-- ARGV: group, consumer, start ('>' or an ID), count, budget, field, max_event_bytes, after
-- (with '>': the last entry this consumer read as new, or '')
local key, group, consumer, at = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local count, budget, max = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[7])
local out, used, prev = {}, 0, nil
if at == '>' then
  -- New entries: measured first (XRANGE from where the group stands, a few at a time), then
  -- as many as fit the budget handed out by one XREADGROUP.
  local from = nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    local info = {}
    for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
    if info['name'] == group then from = info['last-delivered-id'] end
  end
  if not from then
    return redis.error_reply('NOGROUP No such consumer group ' .. group .. ' for key ' .. key)
  end
  -- The group handed out nothing since this consumer's last read: the first entry may join
  -- that read's last one (if nothing is pending between them either).
  if ARGV[8] ~= '' and from == ARGV[8] then prev = ARGV[8] end
  local n, step = 0, 16
  while n < count and used < budget do
    local r = redis.call('XRANGE', key, '(' .. from, '+', 'COUNT', math.min(step, count - n))
    if #r == 0 then break end
    for _, raw in ipairs(r) do
      n = n + 1
      from = raw[1]
      for _, v in ipairs(raw[2]) do used = used + #v end
      if used >= budget or n >= count then break end
    end
    step = math.max(1, math.min(128, math.floor((budget - used) * n / math.max(used, 1))))
  end
  if n == 0 then return out end
  local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', n, 'STREAMS', key, '>')
  for i, raw in ipairs(r[1][2]) do
    out[i] = entry(key, group, raw[1], raw[2], ARGV[6], max, i == 1 and '1' or '0', prev)
    prev = raw[1]
  end
  return out
end
-- This consumer's pending entries after an ID, one at a time (read only after a restart or a
-- lost connection).
while #out < count and used < budget do
  local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', 1, 'STREAMS', key, at)
  if #r[1][2] == 0 then break end
  local raw = r[1][2][1]
  local e = entry(key, group, raw[1], raw[2], ARGV[6], max, '1', prev)
  out[#out + 1] = e
  at, prev = raw[1], raw[1]
  used = used + size(e)
end
return out
"""
)

_FETCH_LUA = (
    _ENTRY_LUA
    + """
-- ARGV: group, budget, field, max_event_bytes, IDs...
local key, group = KEYS[1], ARGV[1]
local budget, max = tonumber(ARGV[2]), tonumber(ARGV[4])
local out, used, prev = {}, 0, nil
for i = 5, #ARGV do
  if used >= budget then break end
  local r = redis.call('XRANGE', key, ARGV[i], ARGV[i])
  local fields = false
  if #r > 0 then fields = r[1][2] end
  local e = entry(key, group, ARGV[i], fields, ARGV[3], max, '1', prev)
  prev = ARGV[i]
  out[#out + 1] = e
  used = used + size(e)
end
return out
"""
)

# Through a script only because redis-py drops the cursor of a JUSTID reply.
_CLAIM_LUA = """
return redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5],
                  'JUSTID')
"""

_ACK_LUA = """
-- ARGV: group, limit, then first and last ID of each range. XACKs every entry pending in the
-- group within the ranges, at most about `limit` of them; returns {ranges done, where the next
-- one resumes, count acked}.
local key, group, limit = KEYS[1], ARGV[1], tonumber(ARGV[2])
local done, acked, i = 0, 0, 3
local start = nil
while i < #ARGV do
  local first, last = start or ARGV[i], ARGV[i + 1]
  local p = redis.call('XPENDING', key, group, first, last, limit)
  if #p > 0 then
    local ids = {}
    for j = 1, #p do ids[j] = p[j][1] end
    redis.call('XACK', key, group, unpack(ids))
    acked = acked + #ids
  end
  if #p < limit then
    done, start, i = done + 1, nil, i + 2
  else
    start = '(' .. p[#p][1]
  end
  if acked >= limit then break end
end
return {done, start or '', acked}
"""


class RedisStreamSourceConfig(SourceConfig):
    """``type = "redis-stream"``: entries of a Redis stream, read through a consumer group."""

    type: Literal["redis-stream"] = "redis-stream"
    url: str = "redis://127.0.0.1:6379/0"
    """The Redis server: ``redis://[user:password@]host:port/db``, ``rediss://`` for TLS, or
    ``unix:///path/to/redis.sock``."""
    stream: str = Field(min_length=1)
    """The stream key to read."""
    group: str = Field(default="tfrecordd", min_length=1)
    """The consumer group; created (with the stream, if missing) at ``start_id`` when absent
    and nothing of it is committed yet. A group deleted after this source committed entries
    stops the daemon (exit 69) with the command that recreates it where the journal stands."""
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
    """A longer payload is dead-lettered (its first ``max_event_bytes`` bytes kept); it is cut
    inside Redis, so no more than that of it is ever read."""
    claim_idle: Duration = Field(default=1800.0, gt=0)
    """Entries pending in the group for longer than this (their consumer died) are claimed by
    this daemon with XAUTOCLAIM. Must exceed the longest time any daemon of the group holds an
    entry before XACKing it: keep it above ``2 * output.max_shard_age + daemon.drain_timeout``
    of every daemon in the group (the default, 30m, suits the defaults 10m and 30s). A shorter
    one can take entries from a live daemon and write them twice."""
    claim_interval: Duration = Field(default=60.0, gt=0)
    """How often to look for entries to claim."""
    block: Duration = Field(default=1.0, gt=0, le=60)
    """When the stream has no new entry, how long to wait before asking again. (Reads do not
    block in Redis: a blocking XREADGROUP returns entries whole, whatever their size.)"""
    timeout: Duration = Field(default=10.0, gt=0)
    """Connect timeout, and how much longer than ``block`` a command may take before the
    connection counts as lost."""
    reconnect_max_delay: Duration = Field(default=10.0, gt=0)
    """While Redis is unreachable, retries back off from 100ms up to this delay."""

    delivery: ClassVar[str] = "exactly-once"
    sample_config: ClassVar[str] = """\
[[sources]]
name = "redis"
type = "redis-stream"
url = "redis://127.0.0.1:6379/0"
stream = "events"                  # XADD events * data '{sample}'
group = "tfrecordd"                # the consumer group; created at start if missing
field = "data"                     # the entry field holding the JSON event
encoder = "events"
"""
    sample_try: ClassVar[str] = "redis-cli XADD events '*' data '{sample}'"

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
    # From a script, Redis wraps the command's error: NOGROUP is then not at the start.
    return isinstance(e, ResponseError) and "NOGROUP" in str(e)


def _key(entry_id: str) -> Key:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _id(key: Key) -> str:
    return f"{key[0]}-{key[1]}"


def _before(key: Key) -> Key:
    """The greatest possible entry ID below ``key``."""
    return (key[0], key[1] - 1) if key[1] else (key[0] - 1, 2**64 - 1)


def _after(key: Key) -> Key:
    """The least possible entry ID above ``key``."""
    return (key[0], key[1] + 1) if key[1] < 2**64 - 1 else (key[0] + 1, 0)


Span = tuple[Key, Key, Key | None]
"""A range of a token as numbers: first, last, and the ID it continues (see :func:`_item`)."""


def _span(item: Any) -> Span:
    """An item of a token: an entry ID, ``[first, last]``, or ``[first, last, joined]``."""
    if isinstance(item, str):
        return _key(item), _key(item), None
    return _key(item[0]), _key(item[1]), _key(item[2]) if len(item) > 2 else None


def _item(span: Span) -> str | list[str]:
    """A token's item for a range: ``joined``, when set, is an entry ID before ``first`` with
    nothing pending in the group between the two when ``first`` was read (see the module
    docs): a range ending there may be merged with this one."""
    first, last, joined = span
    if joined is not None:
        return [_id(first), _id(last), _id(joined)]
    return _id(first) if first == last else [_id(first), _id(last)]


def _spans(token: Token) -> list[tuple[str, str]]:
    """The ``(first, last)`` ID ranges of a token: a list whose items are entry IDs or
    ``[first, last]`` ranges, perhaps with a third ID (a token of an older release is a list
    of IDs alone, or of IDs and ``[first, last]`` ranges)."""
    return [(t, t) if isinstance(t, str) else (str(t[0]), str(t[1])) for t in token]


def _merge(spans: list[Span]) -> list[Span]:
    """Ranges in order, merged where that acks nothing more: where they overlap or touch, and
    where one continues the one before (its ``joined`` is that one's last)."""
    out: list[Span] = []
    for span in sorted(spans, key=lambda s: (s[0], s[1])):
        out.append(span)
        # A range that took over a ``joined`` may now continue the one before it too.
        while len(out) > 1 and _continues(out[-2], out[-1]):
            (low, high, before), (first, last, joined) = out[-2], out.pop()
            if first == low and joined is not None and (before is None or joined < before):
                before = joined
            out[-1] = (low, max(high, last), before)
    return out


def _continues(prev: Span, span: Span) -> bool:
    """Whether ``span`` (starting at or after ``prev``) overlaps, touches or continues ``prev``."""
    first, _, joined = span
    high = prev[1]
    return first <= high or first == _after(high) or joined == high


class _InFlight:
    """The ID ranges of the batches sent and not yet acked, disjoint, in order; a range that
    continues the one before it is merged into it, so that they stay few."""

    def __init__(self) -> None:
        self._firsts: list[Key] = []
        self._lasts: list[Key] = []

    def __len__(self) -> int:
        return len(self._firsts)

    def __contains__(self, key: Key) -> bool:
        i = bisect.bisect_right(self._firsts, key) - 1
        return i >= 0 and key <= self._lasts[i]

    def add(self, first: Key, last: Key, joined: Key | None = None) -> None:
        i = bisect.bisect_left(self._firsts, first)
        if i and (joined == self._lasts[i - 1] or first == _after(self._lasts[i - 1])):
            self._lasts[i - 1] = max(self._lasts[i - 1], last)
            return
        self._firsts.insert(i, first)
        self._lasts.insert(i, last)

    def discard(self, first: Key, last: Key, joined: Key | None = None) -> None:
        """Remove ``first`` .. ``last`` (acked), cutting the ranges it overlaps, and what lies
        between ``joined`` and ``first``: nothing of this consumer is there, but a range that
        merged across the two may hold it."""
        if joined is not None:
            first = _after(joined)
        lo = bisect.bisect_left(self._lasts, first)
        hi = bisect.bisect_right(self._firsts, last)
        if lo >= hi:
            return
        kept: list[tuple[Key, Key]] = []
        if self._firsts[lo] < first:
            kept.append((self._firsts[lo], _before(first)))
        if self._lasts[hi - 1] > last:
            kept.append((_after(last), self._lasts[hi - 1]))
        self._firsts[lo:hi] = [k[0] for k in kept]
        self._lasts[lo:hi] = [k[1] for k in kept]

    def lowest(self) -> Key | None:
        return self._firsts[0] if self._firsts else None


@dataclass(slots=True)
class _Entry:
    """A stream entry as the read scripts return it."""

    id: str
    kind: int
    """0: the event is in ``payload``; 1: the entry has no such field; 2: deleted."""
    payload: bytes
    """The event, cut to ``max_event_bytes``."""
    length: int
    """The event's whole length."""
    kept: list[bytes]
    """With kind 1: the entry's first fields (names and values, cut) for the dead letter."""
    joined: bool
    """Nothing is pending in the group between this entry and the one before it."""

    @classmethod
    def parse(cls, raw: Any) -> _Entry:
        entry_id, kind, payload, length, kept, joined = raw
        return cls(
            _text(entry_id), int(kind), bytes(payload), int(length), list(kept), bool(joined)
        )


class RedisStreamSource(Source):
    """Reads a stream through a consumer group; see the module docs for the protocol."""

    def __init__(self, config: RedisStreamSourceConfig) -> None:
        self.config = config
        self._client: Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}
        self._closed = False
        self._inflight = _InFlight()
        """Ranges sent to the pipeline and not yet XACKed: never sent twice by this process."""
        self._committed: Key | None = None
        """The highest entry ID in a commit of this source (from the journal, then the acks)."""
        self._read_max: Key | None = None
        """The highest entry ID read as new (``>``) by this process."""

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
                    ("read", _READ_LUA),
                    ("fetch", _FETCH_LUA),
                    ("claim", _CLAIM_LUA),
                    ("ack", _ACK_LUA),
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
        if any(_text(dict(_pairs(g)).get("name", b"")) == cfg.group for g in groups):
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
            at = _id(self._committed)
            resume = (
                f"the journal's last committed entry is {at}: recreate the group after it with "
                f"XGROUP CREATE {cfg.stream} {cfg.group} {at} MKSTREAM"
            )
            lowest = self._inflight.lowest()
            if lowest is not None and lowest <= self._committed:
                resume += (
                    f" (entries from {_id(lowest)} were read and not yet committed: to be sure "
                    f"none is skipped, create it at {_id(_before(lowest))} instead; committed "
                    "entries after that are then written again)"
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
        """One token per range, ranges read back to back merged (see the module docs): a
        shard's positions stay a few ranges, however many entries and batches it holds."""
        return [[_item(s)] for s in _merge([_span(t) for token in tokens for t in token])]

    @staticmethod
    def fold(state: Any, tokens: Sequence[Token]) -> Any:
        """Keep the highest committed entry ID (``{"last": id}``): where the group resumes if
        it has to be recreated. Every commit was XACKed before it was marked done."""
        last = _key(state["last"]) if isinstance(state, dict) and "last" in state else None
        for token in tokens:
            for _, high in _spans(token):
                k = _key(high)
                if last is None or k > last:
                    last = k
        return state if last is None else {"last": _id(last)}

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        """XACK the entries of commits published before a crash, before anything is read.

        Waits for Redis if it is down: the daemon marks these commits done when this returns,
        and an entry left pending after that would be read and written again."""
        committed = self.fold(state, pending)
        if isinstance(committed, dict):
            self._committed = _key(committed["last"])
        if pending:
            n = await self._ack_tokens(pending)
            log.info("redis stream %s: acked %d committed entries", self.config.stream, n)

    async def ack(self, tokens: Sequence[Token]) -> None:
        if not tokens:
            return
        try:
            await self._ack_tokens(tokens)
        finally:
            if self._closed:
                # Acks may still come after close (a late redo): that client is not kept.
                await self.aclose()
        for token in tokens:
            for item in token:
                low, high, joined = _span(item)
                self._inflight.discard(low, high, joined)
                if self._committed is None or high > self._committed:
                    self._committed = high

    async def _ack_tokens(self, tokens: Sequence[Token]) -> int:
        """XACK what the tokens cover: single IDs as they are, ranges by what the group has
        pending in them (only the token's entries: see :class:`_Entry`). Returns the count."""
        ids: list[str] = []
        spans: list[tuple[str, str]] = []
        for token in tokens:
            for low, high in _spans(token):
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
            acked += int(await self._cmd("XACK", cfg.stream, cfg.group, *ids[:_ACK_CHUNK]))
            del ids[:_ACK_CHUNK]
        return acked

    async def _xack_spans(self, spans: list[tuple[str, str]]) -> int:
        acked = 0
        while spans:
            flat = [i for span in spans[:_ACK_CHUNK] for i in span]
            done, start, n = await self._script("ack", self.config.group, _ACK_CHUNK, *flat)
            del spans[: int(done)]
            if start:
                spans[0] = (_text(start), spans[0][1])
            acked += int(n)
        return acked

    async def _retrying(self, what: str, call: Callable[[], Awaitable[int]]) -> int:
        """``call`` until Redis takes it, backing off while it fails; a missing group means
        nothing is left to acknowledge (its pending entries went with it)."""
        cfg = self.config
        backoff = _Backoff(cfg.reconnect_max_delay)
        while True:
            try:
                return await call()
            except (RedisError, OSError) as e:
                if isinstance(e, RedisError) and _is_nogroup(e):
                    log.warning("redis stream %s: group %s is gone", cfg.stream, cfg.group)
                    return 0
                delay = backoff.next()
                log.warning(
                    "redis stream %s: %s failed (%s); retrying in %.1fs", cfg.stream, what, e, delay
                )
                await anyio.sleep(delay)

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
                if down_since is None:
                    down_since = time.monotonic()
                delay = backoff.next()
                log.warning("redis stream %s: %s; retrying in %.1fs", cfg.stream, e, delay)
                await anyio.sleep(delay)

    async def _read(
        self, ctx: SourceContext, consumer: str, at: str, after: Key | None = None
    ) -> list[_Entry]:
        """Entries of one XREADGROUP from ``at``, within the batch limits (count and bytes).
        ``after``: with ``>``, the last entry this consumer read as new; the first entry read
        is ``joined`` to it if the group handed out nothing in between."""
        cfg = self.config
        reply = await self._script(
            "read", cfg.group, consumer, at, ctx.max_batch_events, ctx.max_batch_bytes,
            cfg.field, cfg.max_event_bytes, "" if after is None else _id(after),
        )  # fmt: skip
        return [_Entry.parse(e) for e in reply or []]

    def _check_new(self, entries: list[_Entry]) -> None:
        """New entries come after every entry read as new before, or the group was reset
        (deleted and created again, or moved back with XGROUP SETID) under this process."""
        first = _key(entries[0].id)
        if self._read_max is not None and first <= self._read_max:
            raise self._lost(
                f"was reset: it handed out {entries[0].id} as new after "
                f"{_id(self._read_max)} (deleted and created again, or moved back by SETID?)"
            )
        self._read_max = _key(entries[-1].id)

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
            cursor = _text(reply[0])
            claimed = [_text(i) for i in reply[1]]
            fresh = [i for i in claimed if _key(i) not in self._inflight]
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
                entries = [_Entry.parse(e) for e in reply]
                del fresh[: len(entries)]
                await self._deliver(ctx, entries, exact=False)
            if cursor == "0-0":
                return

    async def _deliver(
        self,
        ctx: SourceContext,
        entries: list[_Entry],
        exact: bool = True,
        before: Key | None = None,
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
        spans: list[Span] = []
        size = 0
        chained = False
        prev = before
        for entry, event in zip(entries, events, strict=True):
            key = _key(entry.id)
            if not exact and key in self._inflight:
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

    async def _send(self, ctx: SourceContext, batch: list[RawEvent], spans: list[Span]) -> None:
        for span in spans:
            self._inflight.add(*span)
        await ctx.send(RawBatch(ctx.name, batch, [_item(s) for s in spans]))

    def _events(self, entries: list[_Entry]) -> list[RawEvent | None]:
        return [self._event(entry) for entry in entries]

    def _event(self, entry: _Entry) -> RawEvent | None:
        """The event of one entry; ``None`` for an entry deleted from the stream (its ID is
        still acked, so it leaves the PEL)."""
        cfg = self.config
        if entry.kind == 2:
            return None
        where = f"{cfg.stream}:{entry.id}"
        if entry.kind == 1:
            raw = entry.kept
            kept = {_text(raw[i]): _text(raw[i + 1]) for i in range(0, len(raw) - 1, 2)}
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
        value[cfg.id_field] = entry.id
        return RawEvent(payload, where, value=value)


def _text(b: bytes | str) -> str:
    return b if isinstance(b, str) else b.decode("utf-8", "backslashreplace")


def _pairs(flat: Any) -> list[tuple[str, Any]]:
    """``[k1, v1, k2, v2, ...]`` (or a dict, as redis-py may parse it) as pairs, keys as text."""
    if isinstance(flat, dict):
        return [(_text(k), v) for k, v in flat.items()]
    return [(_text(flat[i]), flat[i + 1]) for i in range(0, len(flat) - 1, 2)]
