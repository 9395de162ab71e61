"""IP sockets for the ``tcp`` and ``udp`` sources: the ``listen`` address (checked as
``host:port``), binding a non-blocking socket to it, and naming a peer in logs and dead letters.
"""

from __future__ import annotations

import socket
from typing import Annotated, Any

from pydantic import AfterValidator

from tfrecordd.plugin import EXIT_CONFIG, ListenError, listen_failure, split_host_port

__all__ = ["ListenAddress", "inet_peer", "inet_socket"]


def _check_listen(value: str) -> str:
    split_host_port(value)
    return value


ListenAddress = Annotated[str, AfterValidator(_check_listen)]
"""A ``host:port`` to listen on (``[::1]:port`` for IPv6)."""


def inet_socket(listen: str, kind: socket.SocketKind, backlog: int | None = None) -> socket.socket:
    """A non-blocking socket of ``kind`` bound to ``listen``, listening with ``backlog`` if
    given (stream sockets); :class:`ListenError` if the address cannot be resolved or bound."""
    host, port = split_host_port(listen)
    try:
        family, _, proto, _, addr = socket.getaddrinfo(
            host, port, type=kind, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise ListenError(listen, f"cannot resolve: {e.strerror}", exit_code=EXIT_CONFIG) from e
    sock = socket.socket(family, kind, proto)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        if backlog is not None:
            sock.listen(backlog)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        why, status = listen_failure(e)
        raise ListenError(listen, f"cannot listen: {why}", exit_code=status) from e
    return sock


def inet_peer(addr: Any) -> str:
    """``host:port`` of a socket address, the host in brackets if it is IPv6."""
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
