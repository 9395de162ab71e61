"""``tfrecordd reload`` and ``tfrecordd flush``: signal the daemon running a config.

The daemon is found by its config's ``state_dir``: the process holding the state lock (its PID
is in the lock file, as ``tfrecordd state check`` reports it). ``reload`` sends SIGHUP (the
daemon reads its config file again and applies it) after checking the file here, and, when the
daemon serves metrics, waits for the reload's result; ``flush`` sends SIGUSR1 (the open shards
are published now).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from tfrecordd.cli import help_of
from tfrecordd.config import DaemonConfig, load_config
from tfrecordd.endpoints import local_url
from tfrecordd.errors import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    ConfigError,
)
from tfrecordd.state import statelock

__all__ = ["add_commands", "cmd_flush", "cmd_reload", "daemon_pid"]

RESULTS = ("applied", "unchanged", "failed")

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def add_commands(sub: Any) -> None:
    """Register ``reload`` and ``flush`` on the CLI's subparsers."""
    p = sub.add_parser("reload", help=help_of("reload"))
    p.add_argument("--config", "-c", required=True, help="the config file the daemon runs")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the reload's result on the metrics endpoint (default: 60)",
    )
    p.set_defaults(func=cmd_reload)
    p = sub.add_parser("flush", help=help_of("flush"))
    p.add_argument("--config", "-c", required=True, help="the config file the daemon runs")
    p.set_defaults(func=cmd_flush)


def _fail(message: str, status: int) -> int:
    print(f"tfrecordd: {message}", file=sys.stderr)
    return status


def _load(path: str, command: str) -> DaemonConfig | int:
    try:
        return load_config(path)
    except ConfigError as e:
        for line in e.errors:
            print(f"tfrecordd {command}: {line}", file=sys.stderr)
        note = " (the daemon keeps the config it runs)" if command == "reload" else ""
        return _fail(f"{path}: invalid; nothing was sent{note}", e.exit_code)


def daemon_pid(config: DaemonConfig) -> int | None:
    """The PID of the daemon holding ``config``'s ``state_dir`` now (``None``: none does)."""
    held = statelock.holder(str(config.daemon.state_dir))
    return int(held) if held and held.isdigit() else None


def _send(config: DaemonConfig, signum: signal.Signals) -> int | str:
    """Send ``signum`` to the daemon; its PID, or why it could not be sent."""
    state_dir = config.daemon.state_dir
    pid = daemon_pid(config)
    if pid is None:
        return f"no tfrecordd runs with state_dir {state_dir} (nothing holds its lock)"
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return f"the daemon of state_dir {state_dir} (PID {pid}) has just ended"
    except PermissionError:
        return f"not allowed to signal the daemon (PID {pid}): run as its user or root"
    return pid


def cmd_flush(args: argparse.Namespace) -> int:
    """Send SIGUSR1: the daemon publishes its open shards now."""
    config = _load(args.config, "flush")
    if isinstance(config, int):
        return config
    sent = _send(config, signal.SIGUSR1)
    if isinstance(sent, str):
        return _fail(sent, EXIT_UNAVAILABLE)
    print(f"asked tfrecordd (PID {sent}) to publish its open shards (SIGUSR1)")
    return EXIT_OK


def cmd_reload(args: argparse.Namespace) -> int:
    """Check the config file, send SIGHUP, and wait for the result where metrics tell it."""
    config = _load(args.config, "reload")
    if isinstance(config, int):
        return config
    url = _metrics_url(config)
    before = _reloads(url) if url else None
    sent = _send(config, signal.SIGHUP)
    if isinstance(sent, str):
        return _fail(sent, EXIT_UNAVAILABLE)
    if before is None or url is None:
        print(f"asked tfrecordd (PID {sent}) to reload its config (SIGHUP); its log says how")
        return EXIT_OK
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = _reloads(url)
        if now is None:
            continue
        done = [r for r in RESULTS if now[r] > before[r]]
        if "failed" in done:
            return _fail(
                f"the daemon (PID {sent}) refused the new config and runs the old one: its log "
                "says why (lines 'reload: failed: ...')",
                EXIT_CONFIG,
            )
        if done:
            what = "applied" if "applied" in done else "unchanged: nothing to apply"
            print(f"tfrecordd (PID {sent}) reloaded its config: {what}")
            return EXIT_OK
    return _fail(
        f"sent SIGHUP to the daemon (PID {sent}), but no reload finished within "
        f"{args.timeout:g}s: its log says what it is doing",
        EXIT_FAILURE,
    )


def _metrics_url(config: DaemonConfig) -> str | None:
    return local_url(config.metrics.listen) if config.metrics.enabled else None


def _reloads(url: str) -> dict[str, float] | None:
    """The daemon's reload counters, by result (``None``: the endpoint does not answer)."""
    try:
        with _opener.open(url, timeout=5) as r:
            text = r.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    found = dict.fromkeys(RESULTS, 0.0)
    for m in re.finditer(r'^tfrecordd_config_reloads_total\{result="(\w+)"\} (\S+)$', text, re.M):
        found[m.group(1)] = float(m.group(2))
    return found
