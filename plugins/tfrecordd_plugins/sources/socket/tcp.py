"""The ``tcp`` source: the stream server listening on a TCP address."""

from __future__ import annotations

import logging
import socket
from typing import Any, ClassVar, Literal

from tfrecordd_plugins.sources.socket.config import StreamSourceConfig
from tfrecordd_plugins.sources.socket.inet import ListenAddress, inet_peer, inet_socket
from tfrecordd_plugins.sources.socket.server import ACCEPT_BACKLOG, StreamSource

__all__ = ["TcpSource", "TcpSourceConfig"]

log = logging.getLogger(__package__)


class TcpSourceConfig(StreamSourceConfig):
    """``type = "tcp"``: framed events over TCP connections."""

    type: Literal["tcp"] = "tcp"
    listen: ListenAddress = "127.0.0.1:7070"
    """``host:port`` to listen on (``[::1]:7070`` for IPv6; port 0 picks a free port). Loopback
    unless you choose otherwise."""

    sample_config: ClassVar[str] = """\
[[sources]]
name = "tcp"
type = "tcp"
listen = "127.0.0.1:7070"          # loopback; open it wider only behind a firewall
framing = "lines"                  # one JSON event per line
encoder = "events"
"""
    # Python, not nc: Debian's netcat waits for the server to close unless given -N, which the
    # other netcat refuses.
    sample_try: ClassVar[str] = (
        "printf '%s\\n' '{sample}' | python3 -c 'import socket, sys; "
        'socket.create_connection(("127.0.0.1", 7070)).sendall(sys.stdin.buffer.read())\''
    )

    def build(self) -> TcpSource:
        return TcpSource(self)


class TcpSource(StreamSource):
    """Reads framed events from TCP connections."""

    config: TcpSourceConfig

    def __init__(self, config: TcpSourceConfig) -> None:
        super().__init__(config)
        self.address: tuple[str, int] | None = None
        """The bound ``(host, port)`` once listening (the real port when ``listen`` says 0)."""

    def _bind(self) -> socket.socket:
        sock = inet_socket(self.config.listen, socket.SOCK_STREAM, ACCEPT_BACKLOG)
        host, port = sock.getsockname()[:2]
        self.address = (host, port)
        log.info("%s: listening on %s (tcp)", self.config.name, inet_peer(self.address))
        return sock

    def _listens_at(self) -> object:
        return self.config.listen

    def _took_over(self, old: StreamSource) -> None:
        assert isinstance(old, TcpSource)
        self.address = old.address

    def _peer(self, sock: socket.socket, addr: Any) -> str:
        return inet_peer(addr)
