"""The config keys the stream-socket sources (``tcp`` and ``unix``) share: framing and frame size,
connection slots, timeouts and acks; each transport's config adds where it listens.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from tfrecordd.plugin import Duration, Size, SourceConfig

__all__ = ["StreamSourceConfig"]


class StreamSourceConfig(SourceConfig):
    """Keys shared by the stream-socket sources (``tcp`` and ``unix``)."""

    framing: Literal["lines", "length-prefixed"] = "lines"
    """How the byte stream splits into events: ``lines`` (each ends in ``\\n``; blank lines are
    skipped) or ``length-prefixed`` (a 4-byte big-endian length, then that many bytes)."""
    max_frame_bytes: Size = Field(default=1 << 20, ge=16, le=(1 << 32) - 1)
    """A longer frame is dead-lettered (its first ``max_frame_bytes`` bytes kept) and skipped;
    the connection goes on with the next frame."""
    max_connections: int = Field(default=64, ge=1)
    """Connections served at once. When every slot is taken, a new connection replaces the one
    idle longest if that one has been idle at least ``busy_idle_timeout`` (counted in
    ``tfrecordd_inputs_refused_total{reason="evicted"}``); otherwise the new one is closed as
    soon as it is accepted (``reason="max_connections"``)."""
    idle_timeout: Duration = Field(default=300.0, gt=0)
    """A connection that sends no event for this long is closed (with ``ack = true``, not while
    acks are still owed to it). Blank lines and unfinished frames are no events: they do not
    keep a connection open."""
    busy_idle_timeout: Duration = Field(default=1.0, gt=0)
    """While every slot (or every file descriptor connections may use) is taken, a connection
    idle this long gives its place to a new one, the longest idle first."""
    read_timeout: Duration = Field(default=30.0, gt=0)
    """A frame must arrive whole within this much reading time of its first byte; otherwise
    its bytes are dead-lettered and the connection closed (no slowloris). Time the source
    spends paused by a full pipeline does not count."""
    ack: bool = False
    """Write acks back to clients once their events are durable (see the protocol in the
    module docs); without it the server never writes to a connection."""
    read_size: Size = Field(default=64 << 10, ge=512, le=16 << 20)
    """Bytes read from a connection per read call."""

    delivery: ClassVar[str] = "at-least-once with ack = true, at-most-once without"
