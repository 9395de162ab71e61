"""Start-up check that the directories a config names cannot lose or loop data.

Each local directory the daemon or a source uses has a role: the daemon's own (the output, the
state and staging directories), a source's input (a spool it reads and empties), or a source's
output (``done_dir``: files it must never read again). Some overlaps make the daemon eat its own
shards, read finished files forever, or fail every ack with EXDEV after the data was published.
:func:`check_paths` names each such overlap with the config keys involved; the config loader
reports them as config errors (exit 78), so nothing starts.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tfrecordd.fsys import is_url, local_path

if TYPE_CHECKING:
    from tfrecordd.config import DaemonConfig

Role = Literal["daemon", "input", "output"]


@dataclass(frozen=True, slots=True)
class _Use:
    key: str
    path: Path
    role: Role
    recursive: bool = False
    renamed_from: str | None = None


def _absolute(path: Path | str) -> Path:
    # Symlinks in the existing part are resolved: two names of one directory are one directory.
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _uses(config: DaemonConfig) -> list[_Use]:
    uses = [_Use("daemon.state_dir", _absolute(config.daemon.state_dir), "daemon")]
    location = config.output.dir
    if is_url(location):
        staging = config.output.staging_dir or Path(config.daemon.state_dir) / "staging"
        uses.append(_Use("output.staging_dir", _absolute(staging), "daemon"))
    else:
        local = local_path(location)
        uses.append(_Use("output.dir", _absolute(local), "daemon"))
    for i, source in enumerate(config.sources):
        for d in source.directories():
            uses.append(
                _Use(
                    f"sources[{i}].{d.key}",
                    _absolute(d.path),
                    d.role,
                    d.recursive,
                    f"sources[{i}].{d.renamed_from}" if d.renamed_from else None,
                )
            )
    return uses


def _inside(path: Path, parent: Path) -> bool:
    return path != parent and path.is_relative_to(parent)


def _device(path: Path) -> int | None:
    """The file system of ``path``, or of its nearest existing ancestor (it may not exist yet)."""
    for p in (path, *path.parents):
        with contextlib.suppress(OSError):
            return os.stat(p).st_dev
    return None


def _conflict(use: _Use, other: _Use) -> str | None:
    """What goes wrong when ``use`` and ``other`` overlap as they do, or ``None``."""
    same = use.path == other.path
    if use.role == "input":
        if other.role == "daemon" and (same or _inside(other.path, use.path)):
            return "the source would read and remove the daemon's own files"
        if other.role == "output" and same:
            return "finished files would be read again, forever"
        if other.role == "input" and (same or (use.recursive and _inside(other.path, use.path))):
            return "two sources would take each other's files"
    if use.role == "output" and other.role == "daemon" and same:
        return "finished input files would sit among the daemon's own files"
    if use.role == "daemon" and other.role == "daemon" and same:
        return "shards would sit beside the journal and dead letters, where shard globs match them"
    return None


def check_paths(config: DaemonConfig) -> list[str]:
    """Every overlap of the config's directories that would lose or loop data, as messages."""
    uses = _uses(config)
    errors: list[str] = []
    reported: set[frozenset[str]] = set()
    for use in uses:
        if use.path.exists() and not use.path.is_dir():
            errors.append(f"{use.key}: {use.path} exists and is not a directory")
        for other in uses:
            pair = frozenset((use.key, other.key))
            if other is use or pair in reported:
                continue
            why = _conflict(use, other)
            if why is None:
                continue
            reported.add(pair)
            if use.path == other.path:
                errors.append(
                    f"{other.key}: is the same directory as {use.key} ({use.path}): {why}"
                )
            else:
                errors.append(f"{other.key}: {other.path} is inside {use.key} ({use.path}): {why}")
    by_key = {u.key: u for u in uses}
    for use in uses:
        source = by_key.get(use.renamed_from or "")
        if source is None:
            continue
        here, there = _device(use.path), _device(source.path)
        if here is not None and there is not None and here != there:
            errors.append(
                f"{use.key}: {use.path} is on another file system than {source.key}"
                f" ({source.path}): files are moved there by rename, which would fail (EXDEV)"
            )
    return errors
