"""The stream server the ``tcp`` and ``unix`` sources share: accepting connections into a bounded
set of slots, each holding a file descriptor from the daemon's budget, closing idle ones to make
room, surviving failing ``accept()`` calls, routing acks to their connections, and, on a
graceful stop, acking what the drain published before closing.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import socket
import time
from collections.abc import Sequence
from typing import Any, cast

import anyio

from tfrecordd.plugin import (
    Source,
    SourceContext,
    Token,
    describe,
    descriptors,
    refusable,
    token_version,
)
from tfrecordd_plugins.sources.socket.config import StreamSourceConfig
from tfrecordd_plugins.sources.socket.connection import (
    TOKEN_VERSION,
    Connection,
    ConnectionToken,
)
from tfrecordd_plugins.sources.socket.framing import reject_reply

__all__ = ["ACCEPT_BACKLOG", "FINAL_ACK_TIMEOUT", "StreamSource"]

log = logging.getLogger(__package__)

ACCEPT_BACKLOG = 128
"""Connections the kernel queues for a listening socket until they are accepted."""
FINAL_ACK_TIMEOUT = 2.0
"""Seconds the connections kept open through a drain have, together, to take their acks."""


class StreamSource(Source):
    """Accepts connections and reads framed events from each.

    Idle connections cannot starve real clients: one that sends no event (blank lines and
    unfinished frames are none) for ``idle_timeout`` is closed, and while every slot is taken a
    new connection takes the place of the one idle longest, once that one has been idle
    ``busy_idle_timeout``. Every connection holds a file descriptor from the budget
    :mod:`tfrecordd.descriptors` keeps (so clients cannot leave a commit without one), and a
    failing ``accept()`` is retried after a pause; neither can end the daemon. Each connection
    holds at most one unfinished frame, so memory is bounded by ``max_connections`` times
    ``max_frame_bytes`` (plus one read). On a graceful stop the connections stay open through
    the drain: what it publishes is acked, then each connection is closed (its server side shut
    down first, so the acks are not cut off).
    """

    def __init__(self, config: StreamSourceConfig) -> None:
        self.config = config
        self._listener: socket.socket | None = None
        self._conns: dict[int, Connection] = {}
        self._next_id = 0

    @abc.abstractmethod
    def _bind(self) -> socket.socket:
        """A listening, non-blocking socket for ``config``."""

    def _listens_at(self) -> object:
        """Where the source listens, as its config says (``None``: its listening socket is not
        handed over to a successor)."""
        return None

    def take_listener(self, old: Source) -> bool:
        """Take over ``old``'s listening socket if it listens where this source would (a
        reload restarting the source): clients that connect meanwhile wait in its backlog, and
        ``old`` no longer closes it. Whether it did."""
        if (
            type(old) is not type(self)
            or not isinstance(old, StreamSource)
            or old._listener is None
            or self._listens_at() is None
            or old._listens_at() != self._listens_at()
        ):
            return False
        self._listener, old._listener = old._listener, None
        self._took_over(old)
        return True

    def _took_over(self, old: StreamSource) -> None:
        """What else the source takes of ``old`` with its listening socket."""

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
        where = f"source {self.config.name!r} ({self.config.type})"
        # Every token checked before any is acted on, as the other sources do.
        known = [t for t in tokens if isinstance(t, dict)]
        for t in known:
            token_version(t, where, TOKEN_VERSION)
        for t in known:
            token = cast(ConnectionToken, t)
            conn = self._conns.get(token.get("c", -1))
            if conn is not None and int(token["n"]) > conn.acked:
                conn.acked = int(token["n"])
                if not conn.owed():
                    # Waiting for acks is no idleness: the clock starts when they came.
                    conn.active_at = time.monotonic()
                conn.poke()

    async def aclose(self) -> None:
        """Stop listening; write the acks a drain gave to the connections kept open for them
        (within :data:`FINAL_ACK_TIMEOUT`), then close every connection."""
        self._stop_listening()
        conns = list(self._conns.values())
        with anyio.move_on_after(FINAL_ACK_TIMEOUT, shield=True):
            async with anyio.create_task_group() as tg:
                for conn in conns:
                    tg.start_soon(conn.last_words)
        for conn in conns:
            self._close(conn)

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _close(self, conn: Connection) -> None:
        if self._conns.get(conn.id) is conn:
            del self._conns[conn.id]
        if conn.budgeted:
            conn.budgeted = False
            descriptors.release()
        conn.sock.close()

    def _idlest(self) -> Connection | None:
        """The connection idle longest, if one has been idle ``busy_idle_timeout`` (not one
        owed acks, nor one whose frames are on their way to the pipeline)."""
        since = time.monotonic() - self.config.busy_idle_timeout
        best: Connection | None = None
        for conn in self._conns.values():
            if conn.sending or (self.config.ack and conn.owed()) or conn.active_at > since:
                continue
            if best is None or conn.active_at < best.active_at:
                best = conn
        return best

    def _evict(self, ctx: SourceContext, conn: Connection, why: str) -> None:
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
                        ctx.mark_down(f"accept failed: {e}", what="accepting")
                        ctx.count_refused("accept_failed")
                        if (idle := self._idlest()) is not None:
                            self._evict(ctx, idle, "accept failed")
                        await anyio.sleep(backoff.failed())
                        continue
                    if backoff.succeeded():
                        ctx.mark_up(what="accepting")
                    conn = self._admit(ctx, sock, addr)
                    if conn is not None:
                        tg.start_soon(self._serve, ctx, conn)
        finally:
            # New clients are refused at once during the drain: they retry elsewhere or later.
            self._stop_listening()

    def _admit(self, ctx: SourceContext, sock: socket.socket, addr: Any) -> Connection | None:
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
        conn = Connection(
            self._next_id, sock, self._peer(sock, addr), self.config, budgeted=budgeted
        )
        self._conns[conn.id] = conn
        return conn

    async def _serve(self, ctx: SourceContext, conn: Connection) -> None:
        keep = False
        try:
            with conn.scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(conn.write_loop, tg.cancel_scope)
                    clean = await conn.read_loop(ctx)
                    conn.reading = False
                    conn.poke()
                    if not clean or not self.config.ack:
                        tg.cancel_scope.cancel()
            if conn.scope.cancelled_caught:
                why = "connection closed to make room for a new one"
                await conn.emit(ctx, [], conn.deframer.end(why))
        except OSError as e:
            log.debug("%s: connection %s ended: %s", ctx.name, conn.peer, e)
        except anyio.get_cancelled_exc_class():
            # The source is stopping: the drain may still publish frames of this connection,
            # so it stays open until aclose() has written their acks.
            keep = self.config.ack and self._conns.get(conn.id) is conn
            raise
        except Exception as e:
            # The connection's boundary: whatever serving one client raises closes that
            # connection (its unacked frames are resent by the client), never the source.
            if not refusable(e):
                raise
            ctx.count_refused("connection_error")
            log.error("%s: connection %s: %s; closed", ctx.name, conn.peer, describe(e), exc_info=e)
            if self.config.ack:
                with contextlib.suppress(OSError):
                    reply = reject_reply(self.config.framing, conn.seq + 1, "internal error")
                    conn.sock.send(reply)
        finally:
            if not keep:
                self._close(conn)
