"""The ``unix`` source: the stream server listening on a Unix socket file, which it replaces
only if stale, sets the permissions of, and removes on shutdown only if it is still its own.

The path is watched while the source runs: no client can connect to a socket file once it is
removed (a cleaner of ``/run`` or ``/tmp``, an operator), so a new socket is bound at the path
within :data:`PATH_CHECK_INTERVAL`, the connections being served stay open, and the removal is
counted (``tfrecordd_inputs_refused_total{reason="socket_removed"}``). Another file put at the
path is not the daemon's to remove: the source stops the daemon (:class:`SocketLostError`,
exit 74).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, cast

import anyio
from pydantic import BeforeValidator, Field

from tfrecordd.plugin import EXIT_IO, ListenError, SourceContext, listen_failure
from tfrecordd_plugins.sources.socket.config import StreamSourceConfig
from tfrecordd_plugins.sources.socket.server import ACCEPT_BACKLOG, StreamSource

__all__ = ["PATH_CHECK_INTERVAL", "SocketLostError", "UnixSource", "UnixSourceConfig"]

log = logging.getLogger(__package__)

PATH_CHECK_INTERVAL = 1.0
"""Seconds between two checks that the socket's path still names the socket listening."""


class SocketLostError(ListenError):
    """The socket's path was taken by another file while the source listened: clients no
    longer reach the daemon, and the file is not its to remove."""

    exit_code = EXIT_IO


def _octal(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return int(value.removeprefix("0o"), 8)
        except ValueError:
            raise ValueError(f"expected an octal mode such as '0660', got {value!r}") from None
    return value


class UnixSourceConfig(StreamSourceConfig):
    """``type = "unix"``: framed events over a Unix stream socket."""

    type: Literal["unix"] = "unix"
    path: Path
    """The socket file. A stale one (nobody listening) is replaced at start-up; a live one, or
    a file that is not a socket, stops the start. Removed on shutdown."""
    mode: Annotated[int, BeforeValidator(_octal)] = Field(default=0o660, ge=0, le=0o777)
    """Permissions set on the socket file after it is created (``0o660`` or ``"0660"``):
    connecting needs write permission."""

    sample_config: ClassVar[str] = """\
[[sources]]
name = "unix"
type = "unix"
path = {socket}
mode = "0660"                      # connecting needs write permission on the socket file
framing = "lines"                  # one JSON event per line
encoder = "events"
"""
    sample_try: ClassVar[str] = (
        "printf '%s\\n' '{sample}' | python3 -c 'import socket, sys; "
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "s.sendall(sys.stdin.buffer.read())' {socket}"
    )

    def build(self) -> UnixSource:
        return UnixSource(self)


class UnixSource(StreamSource):
    """Reads framed events from connections to a Unix socket."""

    config: UnixSourceConfig

    def __init__(self, config: UnixSourceConfig) -> None:
        super().__init__(config)
        self._inode: tuple[int, int] | None = None

    def _bind(self) -> socket.socket:
        # The server's accept loop keeps the object it is given: a swappable one, so that the
        # path watch can put a new socket behind it (see _Listener).
        return cast(socket.socket, _Listener(self._listen()))

    def _listen(self) -> socket.socket:
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
            why, status = listen_failure(e)
            raise ListenError(path, f"cannot listen: {why}", exit_code=status) from e
        log.info("%s: listening on %s (unix, mode %o)", self.config.name, path, self.config.mode)
        return sock

    def _listens_at(self) -> object:
        return str(self.config.path)

    def _took_over(self, old: StreamSource) -> None:
        assert isinstance(old, UnixSource)
        # The socket file is this source's now: the old one must not remove it as it closes.
        self._inode, old._inode = old._inode, None
        if self.config.mode != old.config.mode:
            with contextlib.suppress(OSError):
                os.chmod(str(self.config.path), self.config.mode)

    def _peer(self, sock: socket.socket, addr: Any) -> str:
        if hasattr(socket, "SO_PEERCRED"):
            with contextlib.suppress(OSError):
                cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                pid, uid, _ = struct.unpack("3i", cred)
                return f"unix:pid={pid},uid={uid}"
        return "unix"

    async def run(self, ctx: SourceContext) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_path, ctx)
            await super().run(ctx)
            tg.cancel_scope.cancel()

    async def _watch_path(self, ctx: SourceContext) -> None:
        path = str(self.config.path)
        while True:
            await anyio.sleep(PATH_CHECK_INTERVAL)
            listener = cast(_Listener | None, self._listener)
            if listener is None:
                continue
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                st = None
            if st is not None and (st.st_dev, st.st_ino) == self._inode:
                continue
            if st is not None:
                raise SocketLostError(
                    path,
                    "another file was put at the socket's path while the daemon listened: "
                    "clients no longer reach it, and that file is not the daemon's to remove; "
                    "stopping. Remove the file (or set another path) and start again",
                )
            try:
                listener.replace(self._listen())
            except ListenError as e:
                raise SocketLostError(
                    path, f"removed, and cannot be bound again: {e.detail}"
                ) from e
            log.warning(
                "%s: the socket file %s was removed while the daemon listened: bound again",
                ctx.name,
                path,
            )
            ctx.count_refused("socket_removed")

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


class _Listener:
    """The source's listening socket as the accept loop sees it: :meth:`replace` puts a new
    socket behind it, and the one replaced is served until its backlog is empty, then closed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._retired: list[socket.socket] = []

    def fileno(self) -> int:
        return self.sock.fileno() if not self._retired else self._retired[0].fileno()

    def replace(self, sock: socket.socket) -> None:
        old, self.sock = self.sock, sock
        self._retired.append(old)
        # Wakes an accept loop waiting on the old socket (a Unix socket shut down for reading
        # polls readable): its next accept() reaches the new one.
        with contextlib.suppress(OSError):
            old.shutdown(socket.SHUT_RD)

    def accept(self) -> tuple[socket.socket, Any]:
        while self._retired:
            old = self._retired[0]
            try:
                return old.accept()  # a client queued before the path was removed
            except OSError:
                self._retired.pop(0)
                old.close()
        return self.sock.accept()

    def close(self) -> None:
        for sock in (*self._retired, self.sock):
            sock.close()
        self._retired.clear()


def _clear_stale(path: str) -> None:
    """Removes a socket file nobody listens on; refuses a live socket or any other file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ListenError(path, "exists and is not a socket; refusing to replace it")
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
        raise ListenError(path, f"cannot check the existing socket: {e.strerror or e}") from e
    finally:
        probe.close()
    raise ListenError(path, "another process is listening on this socket; refusing to start")
