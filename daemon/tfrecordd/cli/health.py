"""The probes behind ``tfrecordd healthcheck`` and the container's ``HEALTHCHECK``.

The daemon's metrics endpoint serves ``/healthz``: 200 while the pipeline is alive, 503 otherwise;
and ``/readyz``: 200 while it is alive and every source serves, 503 otherwise, with a JSON body
saying which source is not and why (``healthcheck --ready`` asks it; ``status`` reads it). This
module asks them with the standard library only, so the probe starts fast and needs nothing the
daemon does not.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from tfrecordd.cli import help_of
from tfrecordd.endpoints import HEALTH_URL, READY_URL

__all__ = [
    "DEFAULT_URL",
    "check",
    "describe_state",
    "main_healthcheck",
    "readiness",
    "source_state",
]

DEFAULT_URL = HEALTH_URL
"""Where the daemon's metrics endpoint serves ``/healthz`` unless configured otherwise."""

_MAX_BODY = 512
_MAX_READY = 1 << 20

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


def readiness(url: str = READY_URL, timeout: float = 3.0) -> dict[str, Any] | None:
    """``/readyz``'s JSON answer at ``url`` (whether 200 or 503), or ``None`` if there is none
    (the daemon cannot be reached, or is older than ``/readyz``)."""
    try:
        with _opener.open(url, timeout=timeout) as response:
            body = response.read(_MAX_READY)
    except urllib.error.HTTPError as e:
        with e:
            body = e.read(_MAX_READY) if e.code == 503 else b""
    except (OSError, http.client.HTTPException, ValueError):
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def source_state(ready: dict[str, Any] | None) -> dict[str, Any]:
    """One source's state in a :func:`readiness` answer, as ``status`` shows it: ``up`` (``None``
    when unknown), ``since``, ``reason`` (each thing down, and why), ``reconnects``,
    ``last_error``."""
    r = ready or {}
    down = r.get("down") or {}
    why = "; ".join(f"{what}: {d.get('reason', '?')}" for what, d in sorted(down.items()))
    return {
        "up": None if ready is None else not why,
        "since": r.get("since"),
        "reason": why or None,
        "reconnects": int(r.get("reconnects", 0)),
        "last_error": r.get("last_error") or None,
    }


def describe_state(state: dict[str, Any], now: float) -> str:
    """A :func:`source_state` in words, as of ``now`` (Unix time)."""
    tries = f"{state['reconnects']} reconnect attempt" + ("" if state["reconnects"] == 1 else "s")
    if state["up"] is None:
        return "-"
    if state["up"]:
        last = f", last error: {state['last_error']}" if state["last_error"] else ""
        return f"up ({tries}{last})" if state["reconnects"] or last else "up"
    since = state["since"]
    when = ""
    if since:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
        when = f" for {max(now - since, 0.0):.0f}s (since {at})"
    return f"DOWN{when}, {tries}: {state['reason'] or 'no reason given'}"


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
    p.add_argument(
        "--url", default=None, help=f"default: {DEFAULT_URL}, or {READY_URL} with --ready"
    )
    p.add_argument(
        "--ready",
        action="store_true",
        help="ask /readyz: healthy, and every source serves (a readiness probe)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="unhealthy if no answer within this (default: %(default)s)",
    )
    p.set_defaults(
        func=lambda a: main_healthcheck(a.url or (READY_URL if a.ready else DEFAULT_URL), a.timeout)
    )
