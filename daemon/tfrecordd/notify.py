"""systemd's readiness protocol (``sd_notify``) without a dependency.

systemd passes ``NOTIFY_SOCKET`` to a ``Type=notify`` service: a path (``/run/systemd/notify``) or
an abstract name (``@...``) of an ``AF_UNIX`` datagram socket. The service sends newline-separated
``KEY=VALUE`` fields to it: ``READY=1`` once it serves, ``WATCHDOG=1`` to prove it is alive,
``STOPPING=1`` when it begins to shut down, ``RELOADING=1`` when a config reload begins (then
``READY=1`` when it ends), ``STATUS=...`` for ``systemctl status``.

Outside systemd (no ``NOTIFY_SOCKET``) every method is a no-op, so the daemon calls them
unconditionally. A failed send is logged once and never raised: losing a notification must not
take the pipeline down.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from types import TracebackType

__all__ = ["SystemdNotifier"]

log = logging.getLogger(__name__)


class SystemdNotifier:
    """Sends ``sd_notify`` messages to the socket named by ``NOTIFY_SOCKET``.

    ``environ`` defaults to ``os.environ``; it is read once, here. Sends are non-blocking datagrams,
    cheap enough to make from the event loop.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address = _parse_address(env.get("NOTIFY_SOCKET", ""))
        self._watchdog_usec = _parse_watchdog(env)
        self._sock: socket.socket | None = None
        self._failed = False

    @property
    def enabled(self) -> bool:
        """Whether messages go anywhere (``NOTIFY_SOCKET`` was set to a usable address)."""
        return self._address is not None

    def ready(self, status: str | None = None) -> bool:
        """Tell systemd start-up is complete (``READY=1``)."""
        return self.notify("READY=1", *_status_field(status))

    def reloading(self, status: str | None = None) -> bool:
        """Tell systemd a config reload begins (``RELOADING=1`` with ``MONOTONIC_USEC``, as
        ``Type=notify-reload`` asks); :meth:`ready` ends it."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *_status_field(status))

    def stopping(self, status: str | None = None) -> bool:
        """Tell systemd the daemon is shutting down (``STOPPING=1``)."""
        return self.notify("STOPPING=1", *_status_field(status))

    def watchdog(self) -> bool:
        """Reset systemd's watchdog timer (``WATCHDOG=1``)."""
        return self.notify("WATCHDOG=1")

    def watchdog_interval(self) -> float | None:
        """Seconds between two :meth:`watchdog` calls: half of systemd's ``WatchdogSec``.

        ``None`` when no watchdog is asked of this process: ``WATCHDOG_USEC`` is unset or invalid,
        ``WATCHDOG_PID`` names another process, or there is no socket to send to.
        """
        if self._watchdog_usec is None or not self.enabled:
            return None
        return self._watchdog_usec / 2_000_000

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` as one message; returns whether it was sent.

        Each field is one ``KEY=VALUE`` line. Nothing is sent and ``False`` is returned when the
        notifier is disabled or the send fails.
        """
        if self._address is None or not fields:
            return False
        message = "\n".join(fields).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(message, self._address)
        except OSError as e:
            # systemd going away (or a full socket buffer) recurs on every ping: say it once.
            level = logging.DEBUG if self._failed else logging.WARNING
            log.log(level, "sd_notify to %r failed: %s", self._address, e)
            self._failed = True
            return False
        return True

    def close(self) -> None:
        """Close the socket; later messages open a new one."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> SystemdNotifier:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _parse_address(value: str) -> str | None:
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value:
        log.warning("NOTIFY_SOCKET=%r is not a unix socket address: not notifying systemd", value)
    return None


def _parse_watchdog(env: Mapping[str, str]) -> int | None:
    pid = env.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec if usec > 0 else None


def _status_field(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    # A newline would end the field and let the text smuggle in other fields.
    return ("STATUS=" + " ".join(text.splitlines()),)
