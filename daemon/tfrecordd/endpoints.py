"""The metrics endpoint's default address, written once for the daemon, ``init``, ``status`` and
``healthcheck`` (which import nothing heavier than this), and how a ``host:port`` is read."""

from __future__ import annotations

METRICS_LISTEN = "127.0.0.1:9464"
"""``[metrics] listen`` by default: loopback only."""

METRICS_URL = f"http://{METRICS_LISTEN}/metrics"
"""Where ``tfrecordd status`` scrapes by default."""

HEALTH_URL = f"http://{METRICS_LISTEN}/healthz"
"""Where ``tfrecordd healthcheck`` asks by default."""

READY_URL = f"http://{METRICS_LISTEN}/readyz"
"""Where ``tfrecordd healthcheck --ready`` asks by default."""


def split_host_port(value: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"`` → ``("127.0.0.1", 9464)``; ``"[::1]:80"`` → ``("::1", 80)``."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected host:port, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError(f"expected host:port with a host, got {value!r}")
    return host, int(port)


def local_url(listen: str, path: str = "/metrics") -> str:
    """The URL this machine reaches ``[metrics] listen`` at (a wildcard address is asked on
    loopback), with ``path``."""
    host, port = split_host_port(listen)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"
