"""Socket sources: TCP and Unix stream sockets of framed events, and UDP datagrams.

Stream sockets (``tcp``, ``unix``) carry frames, one event each: lines ending in ``\\n``
(``framing = "lines"``) or a 4-byte big-endian length followed by that many bytes
(``framing = "length-prefixed"``). Frames are numbered per connection from 1. A frame longer
than ``max_frame_bytes`` is dead-lettered with its first bytes and skipped, and the connection
goes on; a frame left unfinished when the connection ends or stalls is dead-lettered too (a cut
line may still be valid JSON, so it is never taken as an event).

With ``ack = true`` the server writes back, on the same connection, the number of the highest
frame whose event is now in a published, durable shard (or, for a rejected frame, in the
durable dead letters): ``ACK <n>\\n`` for lines, an 8-byte big-endian ``n`` for length-prefixed
framing. A rejected frame is also reported at once: ``ERR <n> <reason>\\n``, or ``n`` with the
top bit set. A client that resends what was not acked gets at-least-once delivery; acks are
per connection, so frames sent on a connection that closed before its ack are resent. On a
graceful stop the connections stay open through the drain: what it publishes is acked, then
each connection is closed (its server side shut down first, so the acks are not cut off).

Idle connections cannot starve real clients: one that sends no event (blank lines and
unfinished frames are none) for ``idle_timeout`` is closed, and while every slot is taken a new
connection takes the place of the one idle longest, once that one has been idle
``busy_idle_timeout``. Every connection holds a file descriptor from the budget
:mod:`tfrecordd.descriptors` keeps (so clients cannot leave a commit without one), and a failing
``accept()`` is retried after a pause; neither can end the daemon.

Reading is done on non-blocking sockets directly, never through a buffering transport: while
the pipeline is full a connection is not read at all, and the kernel's TCP window pauses its
client. Each connection holds at most one unfinished frame, so memory is bounded by
``max_connections`` times ``max_frame_bytes`` (plus one read).

UDP (``udp``) cannot be paused: each datagram is one event, read into a local buffer of at
most ``buffer_events`` events and ``buffer_bytes`` bytes that a separate task hands to the
pipeline. What does not fit is dropped and counted (``pipeline_full``), and events still
buffered at shutdown are counted as dropped (``shutdown``).
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import socket
import stat
import struct
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import anyio
import anyio.lowlevel
from pydantic import AfterValidator, BeforeValidator, Field

from tfrecordd import descriptors
from tfrecordd.config import split_host_port
from tfrecordd.errors import OutputError
from tfrecordd.plugin import RawBatch, RawEvent, Source, SourceConfig, SourceContext, Token
from tfrecordd.units import Duration, Size
from tfrecordd_plugins.sources.socket.framing import Deframer, Frame, ack_reply, reject_reply

log = logging.getLogger(__name__)

_MAX_NOTICES = 64
_ACCEPT_BACKLOG = 128
_FINAL_ACK_TIMEOUT = 2.0
"""Seconds the connections kept open through a drain have, together, to take their acks."""


def _octal(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return int(value.removeprefix("0o"), 8)
        except ValueError:
            raise ValueError(f"expected an octal mode such as '0660', got {value!r}") from None
    return value


def _check_listen(value: str) -> str:
    split_host_port(value)
    return value


class _StreamSourceConfig(SourceConfig):
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


class TcpSourceConfig(_StreamSourceConfig):
    """``type = "tcp"``: framed events over TCP connections."""

    type: Literal["tcp"] = "tcp"
    listen: Annotated[str, AfterValidator(_check_listen)] = "127.0.0.1:7070"
    """``host:port`` to listen on (``[::1]:7070`` for IPv6; port 0 picks a free port). Loopback
    unless you choose otherwise."""

    def build(self) -> TcpSource:
        return TcpSource(self)


class UnixSourceConfig(_StreamSourceConfig):
    """``type = "unix"``: framed events over a Unix stream socket."""

    type: Literal["unix"] = "unix"
    path: Path
    """The socket file. A stale one (nobody listening) is replaced at start-up; a live one, or
    a file that is not a socket, stops the start. Removed on shutdown."""
    mode: Annotated[int, BeforeValidator(_octal)] = Field(default=0o660, ge=0, le=0o777)
    """Permissions set on the socket file after it is created (``0o660`` or ``"0660"``):
    connecting needs write permission."""

    def build(self) -> UnixSource:
        return UnixSource(self)


class UdpSourceConfig(SourceConfig):
    """``type = "udp"``: one datagram, one event."""

    type: Literal["udp"] = "udp"
    listen: Annotated[str, AfterValidator(_check_listen)] = "127.0.0.1:7071"
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

    def build(self) -> UdpSource:
        return UdpSource(self)


# -- stream sockets --------------------------------------------------------------------------


@dataclass(eq=False)
class _Conn:
    id: int
    sock: socket.socket
    peer: str
    deframer: Deframer
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

    def poke(self) -> None:
        self.wake.set()

    def owed(self) -> bool:
        return self.acked < self.sent


class _StreamSource(Source):
    """Accepts connections and reads framed events from each; see the module docs."""

    def __init__(self, config: _StreamSourceConfig) -> None:
        self.config = config
        self._listener: socket.socket | None = None
        self._conns: dict[int, _Conn] = {}
        self._next_id = 0

    @abc.abstractmethod
    def _bind(self) -> socket.socket:
        """A listening, non-blocking socket for ``config``."""

    @abc.abstractmethod
    def _peer(self, sock: socket.socket, addr: Any) -> str:
        """How dead letters and logs name the client of an accepted connection."""

    @property
    def connections(self) -> int:
        """Connections being served now."""
        return len(self._conns)

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        """Listen now, so that the daemon reports ready only once clients can connect. Tokens
        of an earlier run name connections that are gone: their clients resend."""
        del state, pending
        if self._listener is None:
            self._listener = self._bind()

    async def ack(self, tokens: Sequence[Token]) -> None:
        if not self.config.ack:
            return
        for t in tokens:
            if not isinstance(t, dict):
                continue
            conn = self._conns.get(t.get("c", -1))
            if conn is not None and int(t["n"]) > conn.acked:
                conn.acked = int(t["n"])
                if not conn.owed():
                    # Waiting for acks is no idleness: the clock starts when they came.
                    conn.active_at = time.monotonic()
                conn.poke()

    async def aclose(self) -> None:
        """Stop listening; write the acks a drain gave to the connections kept open for them
        (within :data:`_FINAL_ACK_TIMEOUT`), then close every connection."""
        self._stop_listening()
        conns = list(self._conns.values())
        with anyio.move_on_after(_FINAL_ACK_TIMEOUT, shield=True):
            async with anyio.create_task_group() as tg:
                for conn in conns:
                    tg.start_soon(self._last_words, conn)
        for conn in conns:
            self._close(conn)

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def _last_words(self, conn: _Conn) -> None:
        """The replies still owed, then a close that does not cut them off: the server's side is
        shut down and what the client still sends is read and dropped (unacked, so it resends
        it) until the client closes too, so the kernel sends no reset ahead of the acks."""
        with contextlib.suppress(OSError):
            self._queue_replies(conn)
            await _flush(conn)
            conn.sock.shutdown(socket.SHUT_WR)
            while await _recv(conn.sock, 1 << 16):
                pass

    def _close(self, conn: _Conn) -> None:
        if self._conns.get(conn.id) is conn:
            del self._conns[conn.id]
        if conn.budgeted:
            conn.budgeted = False
            descriptors.release()
        conn.sock.close()

    def _idlest(self) -> _Conn | None:
        """The connection idle longest, if one has been idle ``busy_idle_timeout`` (not one
        owed acks, nor one whose frames are on their way to the pipeline)."""
        since = time.monotonic() - self.config.busy_idle_timeout
        best: _Conn | None = None
        for conn in self._conns.values():
            if conn.sending or (self.config.ack and conn.owed()) or conn.active_at > since:
                continue
            if best is None or conn.active_at < best.active_at:
                best = conn
        return best

    def _evict(self, ctx: SourceContext, conn: _Conn, why: str) -> None:
        """Close ``conn`` to make room: it leaves the slots at once, and its task ends it."""
        log.debug("%s: connection %s idle; closed to make room (%s)", ctx.name, conn.peer, why)
        ctx.count_refused("evicted")
        del self._conns[conn.id]
        conn.scope.cancel()

    async def run(self, ctx: SourceContext) -> None:
        if self._listener is None:
            self._listener = self._bind()
        listener = self._listener
        backoff = descriptors.Backoff()
        try:
            async with anyio.create_task_group() as tg:
                while True:
                    await anyio.wait_readable(listener)
                    try:
                        sock, addr = listener.accept()
                    except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                        continue
                    except OSError as e:
                        # Out of descriptors, say: the backlog keeps the client while an idle
                        # connection makes room, or until we retry.
                        if not backoff.failures:
                            log.warning("%s: accept failed: %s; retrying", ctx.name, e)
                        ctx.count_refused("accept_failed")
                        if (idle := self._idlest()) is not None:
                            self._evict(ctx, idle, "accept failed")
                        await anyio.sleep(backoff.failed())
                        continue
                    if failures := backoff.succeeded():
                        log.info("%s: accepting again after %d failure(s)", ctx.name, failures)
                    conn = self._admit(ctx, sock, addr)
                    if conn is not None:
                        tg.start_soon(self._serve, ctx, conn)
        finally:
            # New clients are refused at once during the drain: they retry elsewhere or later.
            self._stop_listening()

    def _admit(self, ctx: SourceContext, sock: socket.socket, addr: Any) -> _Conn | None:
        """A connection for ``sock``, making room by closing the idlest one if need be; ``None``
        (``sock`` closed, the refusal counted) if there is no room."""
        budgeted = descriptors.take(sock.fileno())
        full = len(self._conns) >= self.config.max_connections
        if full or not budgeted:
            idle = self._idlest()
            if idle is None:
                ctx.count_refused("max_connections" if full else "descriptors")
                if budgeted:
                    descriptors.release()
                sock.close()
                return None
            self._evict(ctx, idle, "slots full" if full else "few file descriptors left")
            if not budgeted and idle.budgeted:
                # The new connection takes over the closed one's place in the budget.
                idle.budgeted, budgeted = False, True
        sock.setblocking(False)
        self._next_id += 1
        cfg = self.config
        conn = _Conn(
            self._next_id,
            sock,
            self._peer(sock, addr),
            Deframer(cfg.framing, cfg.max_frame_bytes),
            budgeted=budgeted,
        )
        self._conns[conn.id] = conn
        return conn

    async def _serve(self, ctx: SourceContext, conn: _Conn) -> None:
        keep = False
        try:
            with conn.scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._write_loop, conn, tg.cancel_scope)
                    clean = await self._read_loop(ctx, conn)
                    conn.reading = False
                    conn.poke()
                    if not clean or not self.config.ack:
                        tg.cancel_scope.cancel()
            if conn.scope.cancelled_caught:
                why = "connection closed to make room for a new one"
                await self._emit(ctx, conn, [], conn.deframer.end(why))
        except OSError as e:
            log.debug("%s: connection %s ended: %s", ctx.name, conn.peer, e)
        except anyio.get_cancelled_exc_class():
            # The source is stopping: the drain may still publish frames of this connection,
            # so it stays open until aclose() has written their acks.
            keep = self.config.ack and self._conns.get(conn.id) is conn
            raise
        finally:
            if not keep:
                self._close(conn)

    def _queue_replies(self, conn: _Conn) -> None:
        framing = self.config.framing
        while conn.notices:
            n, reason = conn.notices.popleft()
            conn.out += reject_reply(framing, n, reason)
        if conn.acked > conn.told:
            conn.told = conn.acked
            conn.out += ack_reply(framing, conn.told)

    async def _write_loop(self, conn: _Conn, scope: anyio.CancelScope) -> None:
        """Writes notices and acks; after a clean end of input, until every frame is acked."""
        if not self.config.ack:
            return
        while True:
            self._queue_replies(conn)
            if conn.out:
                try:
                    with anyio.fail_after(self.config.read_timeout):
                        await _flush(conn)
                except (OSError, TimeoutError):
                    scope.cancel()
                    return
                continue
            if not conn.reading and not conn.owed():
                scope.cancel()
                return
            await conn.wake.wait()
            conn.wake = anyio.Event()

    async def _read_loop(self, ctx: SourceContext, conn: _Conn) -> bool:
        """Reads frames until the client ends (True) or fails or times out (False)."""
        cfg = self.config
        deframer = conn.deframer
        partial_waited = 0.0
        while True:
            mid = deframer.partial()
            waiting = cfg.ack and conn.owed()
            t0 = time.monotonic()
            if mid:
                timeout = cfg.read_timeout - partial_waited
            elif waiting:
                timeout = cfg.idle_timeout
            else:
                timeout = cfg.idle_timeout - (t0 - conn.active_at)
            data: bytes | None = None
            try:
                with anyio.move_on_after(max(timeout, 0.0)):
                    data = await _recv(conn.sock, cfg.read_size)
            except OSError as e:
                log.info("%s: connection %s failed: %s", ctx.name, conn.peer, e)
                await self._emit(ctx, conn, [], deframer.end(f"connection failed: {e}"))
                return False
            if data is None:
                if mid:
                    why = f"not finished within read_timeout ({cfg.read_timeout:g}s)"
                    log.info("%s: connection %s: frame %s; closing", ctx.name, conn.peer, why)
                    ctx.count_refused("read_timeout")
                    await self._emit(ctx, conn, [], deframer.end(why))
                    return False
                if waiting or time.monotonic() - conn.active_at < cfg.idle_timeout:
                    continue
                log.info("%s: connection %s idle; closing", ctx.name, conn.peer)
                ctx.count_refused("idle_timeout")
                return False
            if not data:
                await self._emit(ctx, conn, [], deframer.end("connection closed"))
                return True
            if mid:
                partial_waited += time.monotonic() - t0
            frames = deframer.feed(data)
            if frames or not deframer.partial():
                partial_waited = 0.0
            await self._emit(ctx, conn, frames, None)

    async def _emit(
        self, ctx: SourceContext, conn: _Conn, frames: list[Frame], last: Frame | None
    ) -> None:
        """Numbers the frames and sends them in batches within the context's limits."""
        if last is not None:
            frames.append(last)
        if not frames:
            return
        events: list[RawEvent] = []
        size = 0
        skip_blank = self.config.framing == "lines"
        conn.sending = True
        try:
            for i, frame in enumerate(frames):
                conn.seq += 1
                where = f"{conn.peer}#{conn.id}:{conn.seq}"
                if frame.error is not None:
                    events.append(RawEvent(frame.payload, where, error=frame.error))
                    if self.config.ack and len(conn.notices) < _MAX_NOTICES:
                        conn.notices.append((conn.seq, frame.error.split(";")[0]))
                        conn.poke()
                elif not (skip_blank and not frame.payload.strip()):
                    events.append(RawEvent(frame.payload, where))
                    size += len(frame.payload)
                    conn.active_at = time.monotonic()
                full = len(events) >= ctx.max_batch_events or size >= ctx.max_batch_bytes
                if full or i == len(frames) - 1:
                    await ctx.send(RawBatch(ctx.name, events, {"c": conn.id, "n": conn.seq}))
                    conn.sent = conn.seq
                    events, size = [], 0
        finally:
            conn.sending = False


async def _recv(sock: socket.socket, size: int) -> bytes:
    # A client that always has data ready must not starve the other tasks. The checkpoint comes
    # first: a cancellation after recv() would drop bytes read from the middle of the stream.
    await anyio.lowlevel.checkpoint()
    while True:
        try:
            return sock.recv(size)
        except (BlockingIOError, InterruptedError):
            await anyio.wait_readable(sock)


async def _flush(conn: _Conn) -> None:
    """Write ``conn.out`` whole; what is written leaves it at once (a cancelled flush resumes
    where it stopped, never repeating nor cutting a reply)."""
    while conn.out:
        try:
            del conn.out[: conn.sock.send(conn.out)]
        except (BlockingIOError, InterruptedError):
            await anyio.wait_writable(conn.sock)


def _inet_socket(listen: str, kind: socket.SocketKind) -> socket.socket:
    host, port = split_host_port(listen)
    try:
        family, _, proto, _, addr = socket.getaddrinfo(
            host, port, type=kind, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise OutputError(listen, f"cannot resolve: {e.strerror}") from e
    sock = socket.socket(family, kind, proto)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        if kind == socket.SOCK_STREAM:
            sock.listen(_ACCEPT_BACKLOG)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        raise OutputError(listen, f"cannot listen: {e.strerror or e}") from e
    return sock


def _inet_peer(addr: Any) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class TcpSource(_StreamSource):
    """Reads framed events from TCP connections."""

    config: TcpSourceConfig

    def __init__(self, config: TcpSourceConfig) -> None:
        super().__init__(config)
        self.address: tuple[str, int] | None = None
        """The bound ``(host, port)`` once listening (the real port when ``listen`` says 0)."""

    def _bind(self) -> socket.socket:
        sock = _inet_socket(self.config.listen, socket.SOCK_STREAM)
        host, port = sock.getsockname()[:2]
        self.address = (host, port)
        log.info("%s: listening on %s (tcp)", self.config.name, _inet_peer(self.address))
        return sock

    def _peer(self, sock: socket.socket, addr: Any) -> str:
        return _inet_peer(addr)


class UnixSource(_StreamSource):
    """Reads framed events from connections to a Unix socket."""

    config: UnixSourceConfig

    def __init__(self, config: UnixSourceConfig) -> None:
        super().__init__(config)
        self._inode: tuple[int, int] | None = None

    def _bind(self) -> socket.socket:
        path = str(self.config.path)
        _clear_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, self.config.mode)
            st = os.stat(path)
            self._inode = (st.st_dev, st.st_ino)
            sock.listen(_ACCEPT_BACKLOG)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            raise OutputError(path, f"cannot listen: {e.strerror or e}") from e
        log.info("%s: listening on %s (unix, mode %o)", self.config.name, path, self.config.mode)
        return sock

    def _peer(self, sock: socket.socket, addr: Any) -> str:
        if hasattr(socket, "SO_PEERCRED"):
            with contextlib.suppress(OSError):
                cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                pid, uid, _ = struct.unpack("3i", cred)
                return f"unix:pid={pid},uid={uid}"
        return "unix"

    async def aclose(self) -> None:
        await super().aclose()
        if self._inode is not None:
            path = str(self.config.path)
            try:
                st = os.lstat(path)
                # Only remove the socket we created, not one a successor bound in its place.
                if (st.st_dev, st.st_ino) == self._inode:
                    os.unlink(path)
            except FileNotFoundError:
                pass
            self._inode = None


def _clear_stale(path: str) -> None:
    """Removes a socket file nobody listens on; refuses a live socket or any other file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OutputError(path, "exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        log.info("%s: removing a stale socket (nobody listens on it)", path)
        os.unlink(path)
        return
    except FileNotFoundError:
        return
    except BlockingIOError:
        pass  # the listener's backlog is full: it is alive
    except OSError as e:
        raise OutputError(path, f"cannot check the existing socket: {e.strerror or e}") from e
    finally:
        probe.close()
    raise OutputError(path, "another process is listening on this socket; refusing to start")


# -- datagrams -------------------------------------------------------------------------------


class UdpSource(Source):
    """Reads datagrams into a bounded buffer and hands them on; see the module docs."""

    def __init__(self, config: UdpSourceConfig) -> None:
        self.config = config
        self._sock: socket.socket | None = None
        self.address: tuple[str, int] | None = None
        """The bound ``(host, port)`` once listening (the real port when ``listen`` says 0)."""
        self._pending: deque[RawEvent] = deque()
        self._pending_bytes = 0
        self._ready = anyio.Event()
        self._count = 0

    def _bind(self) -> socket.socket:
        sock = _inet_socket(self.config.listen, socket.SOCK_DGRAM)
        if self.config.receive_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.config.receive_buffer)
        host, port = sock.getsockname()[:2]
        self.address = (host, port)
        log.info("%s: listening on %s (udp)", self.config.name, _inet_peer(self.address))
        return sock

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        """Listen now, so that the daemon reports ready only once datagrams are received."""
        del state, pending
        if self._sock is None:
            self._sock = self._bind()

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
            if self._pending:
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
                where = f"{_inet_peer(addr)}#{self._count}"
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


__all__ = [
    "TcpSource",
    "TcpSourceConfig",
    "UdpSource",
    "UdpSourceConfig",
    "UnixSource",
    "UnixSourceConfig",
]
