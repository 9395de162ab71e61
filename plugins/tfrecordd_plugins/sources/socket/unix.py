"""The ``unix`` source: the stream server listening on a Unix socket file, which it replaces
only if stale, sets the permissions of, and removes on shutdown only if it is still its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from tfrecordd.plugin import ListenError
from tfrecordd_plugins.sources.socket.config import StreamSourceConfig
from tfrecordd_plugins.sources.socket.server import ACCEPT_BACKLOG, StreamSource

__all__ = ["UnixSource", "UnixSourceConfig"]

log = logging.getLogger(__package__)


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

    def build(self) -> UnixSource:
        return UnixSource(self)


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
            raise ListenError(path, f"cannot listen: {e.strerror or e}") from e
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
