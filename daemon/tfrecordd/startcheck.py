"""What the daemon needs of the machine before it starts: folders it can write, renames that stay
on one file system, inputs that exist, listen addresses nobody else holds.

:mod:`tfrecordd.pathcheck` checks the config's paths against each other (no overlap loses data);
this module checks them against the machine as it is now, for ``tfrecordd check-config`` and at
``tfrecordd run``'s start. A :class:`Problem` stops the daemon (its exit status says why); a
warning is told and the daemon goes on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tfrecordd.endpoints import split_host_port
from tfrecordd.errors import EXIT_CONFIG, EXIT_IN_USE, EXIT_IO, listen_failure
from tfrecordd.pathcheck import CLAIM_FOLDER, outputs

if TYPE_CHECKING:
    from tfrecordd.config import DaemonConfig


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing that stops the daemon: the config key at fault, and the exit status ``run``
    gives for it."""

    key: str
    message: str
    exit_code: int = EXIT_IO

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


def _absolute(path: Path | str) -> Path:
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def writable_folders(config: DaemonConfig) -> list[tuple[str, Path]]:
    """``(key, folder)`` of every local folder the daemon writes in: ``state_dir``, each output
    directory (or object-store output's staging folder), each spool (its files are claimed and
    removed there) and each ``done_dir``."""
    found = [("daemon.state_dir", _absolute(config.daemon.state_dir))]
    for o in outputs(config):
        if o.directory is not None:
            found.append((f"{o.key}.dir", o.directory))
        else:
            found.append((o.staging_key, o.staging.parent))
    for i, source in enumerate(config.sources):
        found += [(f"sources[{i}].{d.key}", _absolute(d.path)) for d in source.directories()]
    return found


def _existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if os.path.lexists(p):
            return p
    return Path("/")


def _why_not_writable(folder: Path) -> str | None:
    """Why the daemon could not create or write in ``folder``, or ``None`` if it can."""
    existing = _existing(folder)
    if existing != folder and not existing.is_dir():
        return f"cannot be created: {existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        try:
            readonly = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        except OSError:
            readonly = False
        why = os.strerror(errno.EROFS) if readonly else os.strerror(errno.EACCES)
        if existing == folder:
            return f"is not writable ({why})"
        return f"cannot be created: {existing} is not writable ({why})"
    return None


def path_problems(config: DaemonConfig) -> list[Problem]:
    """Every folder the daemon writes in that it could not create or write in, and every rename
    it makes that would cross file systems (where both ends exist)."""
    problems = []
    for key, folder in writable_folders(config):
        if (why := _why_not_writable(folder)) is not None:
            problems.append(Problem(key, f"{folder} {why}"))
    for o in outputs(config):
        if o.directory is None:
            continue
        # Shards are written in the output's staging folder and renamed into the output.
        problems += _crossing(f"{o.key}.dir", o.directory, o.staging.parent, "shards are published")
    for i, source in enumerate(config.sources):
        for d in source.directories():
            if d.role == "input":
                claims = _absolute(d.path) / CLAIM_FOLDER
                problems += _crossing(
                    f"sources[{i}].{d.key}", _absolute(d.path), claims, "files are claimed"
                )
    return problems


def _crossing(key: str, a: Path, b: Path, what: str) -> list[Problem]:
    try:
        here, there = os.stat(a).st_dev, os.stat(b).st_dev
    except OSError:
        return []  # created by the daemon, where it is: on one file system
    if here == there:
        return []
    return [
        Problem(
            key,
            f"{b} is on another file system than {a}: {what} by rename, which would fail (EXDEV)",
        )
    ]


def missing_inputs(config: DaemonConfig) -> list[str]:
    """A warning for each spool that does not exist (a mistyped path is created and watched,
    and nothing ever arrives there)."""
    warnings = []
    for i, source in enumerate(config.sources):
        for d in source.directories():
            if d.role == "input" and not _absolute(d.path).exists():
                warnings.append(
                    f"sources[{i}].{d.key}: {_absolute(d.path)} does not exist: it will be "
                    "created and watched (is the path mistyped?)"
                )
    return warnings


def listen_addresses(config: DaemonConfig) -> list[tuple[str, str, socket.SocketKind]]:
    """``(key, host:port, kind)`` of every address the daemon listens on."""
    found = []
    if config.metrics.enabled:
        found.append(("metrics.listen", config.metrics.listen, socket.SOCK_STREAM))
    for i, source in enumerate(config.sources):
        listen = getattr(source, "listen", None)
        if isinstance(listen, str):
            kind = socket.SOCK_DGRAM if source.type == "udp" else socket.SOCK_STREAM
            found.append((f"sources[{i}].listen", listen, kind))
    return found


def listen_key(config: DaemonConfig, address: str) -> str | None:
    """The key that configures the listen address ``address`` (as an error names it)."""
    for key, listen, _ in listen_addresses(config):
        if listen == address:
            return key
    for i, source in enumerate(config.sources):
        if str(getattr(source, "path", None)) == address and source.type == "unix":
            return f"sources[{i}].path"
    return None


def busy_ports(config: DaemonConfig) -> list[Problem]:
    """Each listen address another process holds now (tried by binding it, then closing)."""
    problems = []
    for key, listen, kind in listen_addresses(config):
        try:
            host, port = split_host_port(listen)
        except ValueError:
            continue
        if port == 0:
            continue
        if (fails := _bind_fails(host, port, kind)) is not None:
            why, status = fails
            problems.append(Problem(key, f"{listen}: {why}", status))
    return problems


def _bind_fails(host: str, port: int, kind: socket.SocketKind) -> tuple[str, int] | None:
    """Why binding ``host:port`` fails now, and ``run``'s exit status for it; ``None`` if it
    binds."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=kind, flags=socket.AI_PASSIVE)
    except OSError as e:
        return f"the host does not resolve ({e.strerror or e})", EXIT_CONFIG
    for family, socktype, proto, _, addr in infos:
        with contextlib.closing(socket.socket(family, socktype, proto)) as sock:
            if kind == socket.SOCK_STREAM:
                # as the daemon binds: a port whose old connections wait out TIME_WAIT is free
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(addr)
            except OSError as e:
                if e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                    return listen_failure(e)
                return None
    return None


_IO_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})


def _leaves(e: BaseException) -> list[BaseException]:
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in _leaves(sub)]
    return [e]


def _raised_in(e: BaseException, module_file: str) -> bool:
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == module_file:
            return True
        tb = tb.tb_next
    return False


def explain(e: BaseException, config: DaemonConfig) -> Problem | None:
    """The start-up failure behind ``e`` (an error or a task group's exception group) as one
    problem naming its config key: a listen address in use (75) or a folder the daemon cannot
    write in (74); ``None`` if ``e`` is none of these (a bug: it shows as a traceback)."""
    from tfrecordd import metrics  # the metrics server: which error is its own

    for leaf in _leaves(e):
        if not isinstance(leaf, OSError):
            continue
        if config.metrics.enabled and _raised_in(leaf, metrics.__file__):
            if leaf.errno == errno.EADDRINUSE:
                return Problem(
                    "metrics.listen",
                    f"{config.metrics.listen}: address already in use (by another process)",
                    EXIT_IN_USE,
                )
            # Not an address of this machine, a host that does not resolve: the config's.
            why = "not an address of this machine" if leaf.errno == errno.EADDRNOTAVAIL else ""
            return Problem(
                "metrics.listen",
                f"{config.metrics.listen}: {why or leaf.strerror or leaf}",
                EXIT_CONFIG,
            )
        if leaf.errno in _IO_ERRNOS and isinstance(leaf.filename, str | bytes):
            path = _absolute(os.fsdecode(leaf.filename))
            # the innermost folder: an output inside state_dir is the output's
            holders = [(k, f) for k, f in writable_folders(config) if path.is_relative_to(f)]
            if holders:
                key, _ = max(holders, key=lambda h: len(h[1].parts))
                return Problem(key, f"{path}: {leaf.strerror or leaf}")
    return None
