"""The ``udp`` source: one datagram, one event, through a bounded buffer (a datagram source
cannot be paused, so what does not fit is dropped and counted).
"""

from __future__ import annotations

import logging
import socket
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import anyio
import anyio.lowlevel
from pydantic import Field

from tfrecordd.plugin import RawBatch, RawEvent, Size, Source, SourceConfig, SourceContext, Token
from tfrecordd_plugins.sources.socket.inet import ListenAddress, inet_peer, inet_socket

__all__ = ["UdpSource", "UdpSourceConfig"]

log = logging.getLogger(__package__)


class UdpSourceConfig(SourceConfig):
    """``type = "udp"``: one datagram, one event."""

    type: Literal["udp"] = "udp"
    listen: ListenAddress = "127.0.0.1:7071"
    """``host:port`` to listen on (``[::1]:7071`` for IPv6; port 0 picks a free port). Loopback
    unless you choose otherwise."""
    max_frame_bytes: Size = Field(default=65507, ge=16, le=65535)
    """A longer datagram is dead-lettered with its first ``max_frame_bytes`` bytes."""
    buffer_events: int = Field(default=10000, ge=1)
    """The most datagrams held while the pipeline is full; further ones are dropped and counted
    in ``tfrecordd_events_dropped_total{reason="pipeline_full"}``."""
    buffer_bytes: Size = Field(default=8 << 20, ge=65536)
    """The most payload bytes held while the pipeline is full (the same drop rule)."""
    receive_buffer: Size | None = None
    """The kernel's receive buffer for the socket (``SO_RCVBUF``); default: the system's."""

    delivery: ClassVar[str] = "at-most-once (drops counted)"
    sample_config: ClassVar[str] = """\
[[sources]]
name = "udp"
type = "udp"
listen = "127.0.0.1:7071"          # loopback; one datagram is one JSON event
encoder = "events"
"""
    sample_try: ClassVar[str] = (
        "printf '%s' '{sample}' | python3 -c 'import socket, sys; "
        "socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
        '.sendto(sys.stdin.buffer.read(), ("127.0.0.1", 7071))\''
    )

    def build(self) -> UdpSource:
        return UdpSource(self)


class UdpSource(Source):
    """Reads datagrams into a bounded buffer and hands them on.

    UDP cannot be paused: each datagram is one event, read into a local buffer of at most
    ``buffer_events`` events and ``buffer_bytes`` bytes that a separate task hands to the
    pipeline. What does not fit is dropped and counted (``pipeline_full``), and events still
    buffered at shutdown are counted as dropped (``shutdown``).
    """

    def __init__(self, config: UdpSourceConfig) -> None:
        self.config = config
        self._sock: socket.socket | None = None
        self.address: tuple[str, int] | None = None
        """The bound ``(host, port)`` once listening (the real port when ``listen`` says 0)."""
        self._pending: deque[RawEvent] = deque()
        self._pending_bytes = 0
        self._ready = anyio.Event()
        self._count = 0
        self._successor: UdpSource | None = None
        """The instance that took the socket over (a reload), and takes the buffer as this one
        stops."""

    def _bind(self) -> socket.socket:
        sock = inet_socket(self.config.listen, socket.SOCK_DGRAM)
        if self.config.receive_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.config.receive_buffer)
        host, port = sock.getsockname()[:2]
        self.address = (host, port)
        log.info("%s: listening on %s (udp)", self.config.name, inet_peer(self.address))
        return sock

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        """Listen now, so that the daemon reports ready only once datagrams are received."""
        del state, pending
        if self._sock is None:
            self._sock = self._bind()

    def take_listener(self, old: Source) -> bool:
        """Take over ``old``'s socket if it listens where this source would (a reload
        restarting the source): datagrams sent meanwhile wait in the socket's buffer, and those
        ``old`` holds when it stops come to this one. Whether it did."""
        if not isinstance(old, UdpSource) or old._sock is None:
            return False
        if old.config.listen != self.config.listen:
            return False
        self._sock, old._sock = old._sock, None
        self.address = old.address
        if self.config.receive_buffer and self.config.receive_buffer != old.config.receive_buffer:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.config.receive_buffer)
        self._count = old._count
        old._successor = self
        return True

    async def ack(self, tokens: Sequence[Token]) -> None:
        """Nothing to do: datagrams cannot be acknowledged."""
        del tokens

    async def aclose(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def run(self, ctx: SourceContext) -> None:
        if self._sock is None:
            self._sock = self._bind()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._forward, ctx)
                await self._receive(ctx, self._sock)
        finally:
            if self._pending and self._successor is not None:
                # Older than what it buffers meanwhile: they go first.
                self._successor._pending.extendleft(reversed(self._pending))
                self._successor._pending_bytes += self._pending_bytes
                self._successor._ready.set()
            elif self._pending:
                ctx.count_dropped("shutdown", len(self._pending))
            self._pending.clear()
            self._pending_bytes = 0

    async def _receive(self, ctx: SourceContext, sock: socket.socket) -> None:
        cfg = self.config
        limit = cfg.max_frame_bytes
        while True:
            await anyio.wait_readable(sock)
            dropped = 0
            for _ in range(1024):  # then let the forwarder run
                try:
                    data, addr = sock.recvfrom(limit + 1)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as e:  # an ICMP error reported on the socket, say
                    log.debug("%s: recvfrom: %s", ctx.name, e)
                    continue
                self._count += 1
                if (
                    len(self._pending) >= cfg.buffer_events
                    or self._pending_bytes + len(data) > cfg.buffer_bytes
                ):
                    dropped += 1
                    continue
                where = f"{inet_peer(addr)}#{self._count}"
                if len(data) > limit:
                    ev = RawEvent(
                        data[:limit],
                        where,
                        error=f"datagram over max_frame_bytes ({limit}); first bytes kept",
                    )
                else:
                    ev = RawEvent(data, where)
                self._pending.append(ev)
                self._pending_bytes += len(ev.payload)
            if dropped:
                ctx.count_dropped("pipeline_full", dropped)
            if self._pending:
                self._ready.set()
            await anyio.lowlevel.checkpoint()

    async def _forward(self, ctx: SourceContext) -> None:
        while True:
            await self._ready.wait()
            self._ready = anyio.Event()
            while self._pending:
                events: list[RawEvent] = []
                size = 0
                while (
                    self._pending
                    and len(events) < ctx.max_batch_events
                    and size < ctx.max_batch_bytes
                ):
                    ev = self._pending.popleft()
                    events.append(ev)
                    size += len(ev.payload)
                # The events leave the buffer's count only once the pipeline took them.
                try:
                    await ctx.send(RawBatch(ctx.name, events, None))
                except BaseException:
                    self._pending.extendleft(reversed(events))
                    raise
                self._pending_bytes -= size
