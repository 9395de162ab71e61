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

import contextlib
import logging
import os
import socket
import stat
import struct
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import anyio
import anyio.lowlevel
from pydantic import AfterValidator, BeforeValidator, Field

from tfrecordd.config import split_host_port
from tfrecordd.errors import OutputError
from tfrecordd.plugin import RawBatch, RawEvent, Source, SourceConfig, SourceContext, Token
from tfrecordd.units import Size
from tfrecordd_plugins.sources.socket.config import StreamSourceConfig
from tfrecordd_plugins.sources.socket.server import ACCEPT_BACKLOG, StreamSource

log = logging.getLogger(__name__)


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


class TcpSourceConfig(StreamSourceConfig):
    """``type = "tcp"``: framed events over TCP connections."""

    type: Literal["tcp"] = "tcp"
    listen: Annotated[str, AfterValidator(_check_listen)] = "127.0.0.1:7070"
    """``host:port`` to listen on (``[::1]:7070`` for IPv6; port 0 picks a free port). Loopback
    unless you choose otherwise."""

    def build(self) -> TcpSource:
        return TcpSource(self)


class UnixSourceConfig(StreamSourceConfig):
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


# -- stream sockets ----------------------------------------------------------------------------


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
            sock.listen(ACCEPT_BACKLOG)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        raise OutputError(listen, f"cannot listen: {e.strerror or e}") from e
    return sock


def _inet_peer(addr: Any) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class TcpSource(StreamSource):
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


class UnixSource(StreamSource):
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
            sock.listen(ACCEPT_BACKLOG)
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
