"""One client connection of a stream-socket source: reading its frames into numbered batches for
the pipeline (under the read and idle timeouts), and writing acks and rejections back to it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

import anyio
import anyio.lowlevel

from tfrecordd.plugin import RawBatch, RawEvent, SourceContext
from tfrecordd_plugins.sources.socket.config import StreamSourceConfig
from tfrecordd_plugins.sources.socket.framing import Deframer, Frame, ack_reply, reject_reply

__all__ = ["Connection", "recv"]

# One logger for every module of the socket sources, named as before they were split.
log = logging.getLogger(__package__)

_MAX_NOTICES = 64

TOKEN_VERSION = 1
"""The version of the tokens this release writes, and the newest it reads."""


class ConnectionToken(TypedDict):
    """A batch's position: the frames of one connection up to a sequence number."""

    v: NotRequired[int]
    """The token's version; absent in tokens of releases before tokens had versions (1)."""
    c: int
    """The connection's number in this process."""
    n: int
    """The sequence number of the batch's last frame."""


@dataclass(eq=False)
class Connection:
    """A served connection's socket and state.

    Frames are numbered from 1. With ``ack = true`` the connection is written the number of the
    highest frame whose event is now in a published, durable shard (or, for a rejected frame,
    in the durable dead letters), and a rejected frame is also reported at once (see
    :mod:`.framing` for the replies). A client that resends what was not acked gets
    at-least-once delivery; acks are per connection, so frames sent on a connection that closed
    before its ack are resent. Reading is done on the non-blocking socket directly, never
    through a buffering transport: while the pipeline is full the connection is not read at
    all, and the kernel's TCP window pauses its client.
    """

    id: int
    sock: socket.socket
    peer: str
    config: StreamSourceConfig
    deframer: Deframer = field(init=False)
    active_at: float = field(default_factory=time.monotonic)
    """When the connection was accepted or last sent an event (blank lines do not count)."""
    seq: int = 0
    """Frames received so far (the number of the last one)."""
    sent: int = 0
    """The last frame handed to the pipeline."""
    acked: int = 0
    """The last frame known to be durable."""
    told: int = 0
    """The last ack written to the client (or waiting in ``out``)."""
    notices: deque[tuple[int, str]] = field(default_factory=deque)
    """Rejected frames not yet reported to the client: number and reason."""
    out: bytearray = field(default_factory=bytearray)
    """Replies not yet written whole."""
    reading: bool = True
    sending: bool = False
    """Frames of this connection are on their way to the pipeline (perhaps waiting for room)."""
    budgeted: bool = False
    """Its descriptor counts against :mod:`tfrecordd.descriptors`' budget."""
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    wake: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self.deframer = Deframer(self.config.framing, self.config.max_frame_bytes)

    def poke(self) -> None:
        self.wake.set()

    def owed(self) -> bool:
        return self.acked < self.sent

    def queue_replies(self) -> None:
        """Puts the notices and the ack not yet written in ``out``."""
        framing = self.config.framing
        while self.notices:
            n, reason = self.notices.popleft()
            self.out += reject_reply(framing, n, reason)
        if self.acked > self.told:
            self.told = self.acked
            self.out += ack_reply(framing, self.told)

    async def flush(self) -> None:
        """Write ``out`` whole; what is written leaves it at once (a cancelled flush resumes
        where it stopped, never repeating nor cutting a reply)."""
        while self.out:
            try:
                del self.out[: self.sock.send(self.out)]
            except (BlockingIOError, InterruptedError):
                await anyio.wait_writable(self.sock)

    async def write_loop(self, scope: anyio.CancelScope) -> None:
        """Writes notices and acks; after a clean end of input, until every frame is acked."""
        if not self.config.ack:
            return
        while True:
            self.queue_replies()
            if self.out:
                try:
                    with anyio.fail_after(self.config.read_timeout):
                        await self.flush()
                except (OSError, TimeoutError):
                    scope.cancel()
                    return
                continue
            if not self.reading and not self.owed():
                scope.cancel()
                return
            await self.wake.wait()
            self.wake = anyio.Event()

    async def last_words(self) -> None:
        """The replies still owed, then a close that does not cut them off: the server's side is
        shut down and what the client still sends is read and dropped (unacked, so it resends
        it) until the client closes too, so the kernel sends no reset ahead of the acks."""
        with contextlib.suppress(OSError):
            self.queue_replies()
            await self.flush()
            self.sock.shutdown(socket.SHUT_WR)
            while await recv(self.sock, 1 << 16):
                pass

    async def read_loop(self, ctx: SourceContext) -> bool:
        """Reads frames until the client ends (True) or fails or times out (False)."""
        cfg = self.config
        deframer = self.deframer
        partial_waited = 0.0
        while True:
            mid = deframer.partial()
            waiting = cfg.ack and self.owed()
            t0 = time.monotonic()
            if mid:
                timeout = cfg.read_timeout - partial_waited
            elif waiting:
                timeout = cfg.idle_timeout
            else:
                timeout = cfg.idle_timeout - (t0 - self.active_at)
            data: bytes | None = None
            try:
                with anyio.move_on_after(max(timeout, 0.0)):
                    data = await recv(self.sock, cfg.read_size)
            except OSError as e:
                log.info("%s: connection %s failed: %s", ctx.name, self.peer, e)
                await self.emit(ctx, [], deframer.end(f"connection failed: {e}"))
                return False
            if data is None:
                if mid:
                    why = f"not finished within read_timeout ({cfg.read_timeout:g}s)"
                    log.info("%s: connection %s: frame %s; closing", ctx.name, self.peer, why)
                    ctx.count_refused("read_timeout")
                    await self.emit(ctx, [], deframer.end(why))
                    return False
                if waiting or time.monotonic() - self.active_at < cfg.idle_timeout:
                    continue
                log.info("%s: connection %s idle; closing", ctx.name, self.peer)
                ctx.count_refused("idle_timeout")
                return False
            if not data:
                await self.emit(ctx, [], deframer.end("connection closed"))
                return True
            if mid:
                partial_waited += time.monotonic() - t0
            frames = deframer.feed(data)
            if frames or not deframer.partial():
                partial_waited = 0.0
            await self.emit(ctx, frames, None)

    async def emit(self, ctx: SourceContext, frames: list[Frame], last: Frame | None) -> None:
        """Numbers the frames and sends them in batches within the context's limits."""
        if last is not None:
            frames.append(last)
        if not frames:
            return
        events: list[RawEvent] = []
        size = 0
        skip_blank = self.config.framing == "lines"
        self.sending = True
        try:
            for i, frame in enumerate(frames):
                self.seq += 1
                where = f"{self.peer}#{self.id}:{self.seq}"
                if frame.error is not None:
                    events.append(RawEvent(frame.payload, where, error=frame.error))
                    if self.config.ack and len(self.notices) < _MAX_NOTICES:
                        self.notices.append((self.seq, frame.error.split(";")[0]))
                        self.poke()
                elif not (skip_blank and not frame.payload.strip()):
                    events.append(RawEvent(frame.payload, where))
                    size += len(frame.payload)
                    self.active_at = time.monotonic()
                full = len(events) >= ctx.max_batch_events or size >= ctx.max_batch_bytes
                if full or i == len(frames) - 1:
                    token: ConnectionToken = {"v": TOKEN_VERSION, "c": self.id, "n": self.seq}
                    await ctx.send(RawBatch(ctx.name, events, token))
                    self.sent = self.seq
                    events, size = [], 0
        finally:
            self.sending = False


async def recv(sock: socket.socket, size: int) -> bytes:
    """Up to ``size`` bytes from the non-blocking ``sock`` (``b""`` at its end), waiting for
    them; a cancellation leaves unread bytes in the socket, never dropping any."""
    # A client that always has data ready must not starve the other tasks. The checkpoint comes
    # first: a cancellation after recv() would drop bytes read from the middle of the stream.
    await anyio.lowlevel.checkpoint()
    while True:
        try:
            return sock.recv(size)
        except (BlockingIOError, InterruptedError):
            await anyio.wait_readable(sock)
