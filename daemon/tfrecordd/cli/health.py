"""The liveness probe behind ``tfrecordd healthcheck`` and the container's ``HEALTHCHECK``.

The daemon's metrics endpoint serves ``/healthz``: 200 while the pipeline is alive, 503 otherwise.
This module asks it, with the standard library only, so the probe starts fast and needs nothing
the daemon does not.
"""

from __future__ import annotations

import http.client
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from tfrecordd.cli import help_of
from tfrecordd.endpoints import HEALTH_URL

__all__ = ["DEFAULT_URL", "check", "main_healthcheck"]

DEFAULT_URL = HEALTH_URL
"""Where the daemon's metrics endpoint serves ``/healthz`` unless configured otherwise."""

_MAX_BODY = 512

# A proxy from the environment (HTTP_PROXY in a container) must not stand between the probe and
# a daemon on the same host.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def check(url: str = DEFAULT_URL, timeout: float = 3.0) -> tuple[bool, str]:
    """Ask ``url`` whether the daemon is alive; returns ``(healthy, reason)``.

    Healthy means an HTTP 200 answer within ``timeout`` seconds. Any other status, a refused or
    timed-out connection, or a URL that is not ``http(s)`` is unhealthy; ``reason`` says which,
    with the start of the body the daemon sent.
    """
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        return False, f"{url}: not an http(s) URL"
    try:
        with _opener.open(url, timeout=timeout) as response:
            status: int = response.status
            body = _text(response.read(_MAX_BODY))
    except urllib.error.HTTPError as e:
        with e:
            return False, f"{url}: HTTP {e.code} {_text(e.read(_MAX_BODY))}".rstrip()
    except urllib.error.URLError as e:
        return False, f"{url}: {e.reason}"
    except (OSError, http.client.HTTPException) as e:
        return False, f"{url}: {e!r}"
    if status != 200:
        return False, f"{url}: HTTP {status} {body}".rstrip()
    return True, f"{url}: HTTP 200 {body}".rstrip()


def main_healthcheck(url: str = DEFAULT_URL, timeout: float = 3.0) -> int:
    """Run :func:`check` and print its reason; returns 0 if healthy, 1 if not (Docker's codes)."""
    healthy, reason = check(url, timeout)
    print(reason, file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


def _text(data: bytes) -> str:
    return " ".join(data.decode("utf-8", "replace").split())


def add_commands(sub: Any) -> None:
    """Register ``healthcheck`` on the CLI's subparsers."""
    p = sub.add_parser("healthcheck", help=help_of("healthcheck"))
    p.add_argument("--url", default=DEFAULT_URL, help=f"default: {DEFAULT_URL}")
    p.add_argument("--timeout", type=float, default=3.0)
    p.set_defaults(func=lambda a: main_healthcheck(a.url, a.timeout))
