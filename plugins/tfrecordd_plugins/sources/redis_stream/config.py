"""The ``redis-stream`` source's configuration."""

from __future__ import annotations

from typing import ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from tfrecordd.plugin import Duration, Size, SourceConfig
from tfrecordd_plugins.sources.redis_stream.source import RedisStreamSource


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
