"""Start-up check that the paths a config names cannot lose or loop data, and that every name
the daemon will create there fits the file system.

Each local path the daemon or a source uses has a kind: the daemon's own folders (``state_dir``,
each output directory, each output's staging folder), a source's input (a spool it reads and
empties, read only at its top or, ``recursive``, in every folder below that is neither hidden
nor its own ``done_dir``), a source's output (``done_dir``: files it must never read again), and
a source's socket file. Paths are compared once resolved (symlinks followed, as the daemon
follows them when it opens a folder), and by device and inode where they exist (a bind mount
is the folder it shows).

Two uses of one folder, or one inside another, are refused, except the nestings that are safe
by construction:

- an output directory, or an object-store output's staging folder, inside ``state_dir`` (the
  packaged layout: ``/var/lib/tfrecordd/shards``);
- a source's own ``done_dir`` inside its own spool: the source never reads it (another source's
  ``done_dir`` would be read again by a recursive spool, and emptied);
- a spool or a ``done_dir`` inside a spool that is not read where it sits: a spool read only at
  its top, or a hidden folder of a recursive one. The spool's ``.tfrecordd-*`` folders (claimed
  and rejected files) are its source's alone: nothing else may be in them;
- a socket file directly in ``state_dir`` or a folder of its own below it, under a name the
  daemon does not use there.

Every name the daemon will create, with its longest suffix (a shard's staging and offsets files,
its manifest, the journal's and checkpoint's temporary names, the rotated dead letters), must fit
the file system's name limit (``NAME_MAX``, asked of the folder that holds it, or of its nearest
existing parent) and path limit (``PATH_MAX``); a Unix socket's path must fit ``sun_path``.

:func:`check_paths` names each problem with the config keys involved; the config loader reports
them as config errors (exit 78), so nothing starts, and ``tfrecordd check-config`` prints them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.writer import inprogress_name
from tfrecordd.fsys import is_url, local_path

if TYPE_CHECKING:
    from tfrecordd.config import DaemonConfig

Kind = Literal["state", "output", "staging", "input", "done", "socket"]

SPOOL_FOLDERS = ".tfrecordd-"
"""The prefix of the folders a spool's source keeps in it (``.tfrecordd-claimed``,
``.tfrecordd-rejected``): no other use may be in them."""
CLAIM_FOLDER = ".tfrecordd-claimed"
"""In a spool: the parent of each node's claim folder (``<node_id>/``)."""

STATE_NAMES = frozenset(
    {"journal", "checkpoint.json", "lock", "dead-letters.jsonl", "sources", "staging"}
)
"""Names the daemon creates directly in ``state_dir`` (besides rotated and temporary ones)."""

SHARD_TIME = "20240229T235959.999999Z"
"""A shard name's UTC time, as :class:`tfrecordd.outputs.shards.ShardNamer` writes it."""
SHARD_SEQ_DIGITS = 9
"""Digits of a shard name's sequence number checked for: written with at least six, it grows
past them after a million shards in one run; nine cover a shard a second for thirty years."""
RUN_ID = "f" * 6
"""A shard name's run id: three random bytes in hex."""
MANIFEST_SUFFIX = ".manifest.json"
"""What a manifest's name has in place of its shard's suffix."""
STAGING_DIR = ".unpublished"
"""A local output's staging folder's parent, in the output directory."""
PID_DIGITS = 7
"""Digits of a process id (Linux's largest ``pid_max`` is 4194304), in temporary names."""
SUN_PATH = 108
"""The bytes of a Unix socket's address, its terminating NUL included."""


@dataclass(frozen=True, slots=True)
class _Use:
    key: str
    path: Path
    kind: Kind
    source: int | None = None
    recursive: bool = False
    own_done: Path | None = None
    """For an input: its source's ``done_dir`` when the source moves files there (and so never
    reads it)."""
    renamed_from: str | None = None
    exists: bool = field(default=False, compare=False)


@dataclass(frozen=True, slots=True)
class OutputPaths:
    """One dataset's output: its local paths and naming."""

    key: str
    """The config table of the output (``output``, or ``datasets.NAME``)."""
    directory: Path | None
    """The local output directory, or ``None`` for an object store."""
    staging: Path
    """The node's staging folder, where shards are written before they are published."""
    staging_key: str
    """The key that sets where the staging folder is."""
    prefix: str
    compression: Compression
    manifests: bool


def _absolute(path: Path | str) -> Path:
    # Symlinks in the existing part are resolved: two names of one directory are one directory.
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def outputs(config: DaemonConfig) -> list[OutputPaths]:
    """The config's outputs (one per dataset), each with where its shards are staged."""
    found = []
    node = config.daemon.node_id
    for name, out in config.datasets.items():
        key = config.dataset_key(name)
        if is_url(out.dir):
            directory, folder = None, _absolute(config.staging_root(name)) / node
            staging_key = f"{key}.staging_dir" if out.staging_dir else "daemon.state_dir"
        else:
            directory = _absolute(local_path(out.dir))
            folder, staging_key = directory / STAGING_DIR / node, f"{key}.dir"
        found.append(
            OutputPaths(
                key, directory, folder, staging_key, out.prefix, out.compression, out.manifests
            )
        )
    return found


def _uses(config: DaemonConfig) -> list[_Use]:
    uses = [_Use("daemon.state_dir", _absolute(config.daemon.state_dir), "state")]
    for o in outputs(config):
        if o.directory is not None:
            uses.append(_Use(f"{o.key}.dir", o.directory, "output"))
        else:
            uses.append(_Use(o.staging_key, o.staging.parent, "staging"))
    for i, source in enumerate(config.sources):
        declared = source.directories()
        moved_to = {d.renamed_from: d for d in declared if d.role == "output" and d.renamed_from}
        for d in declared:
            if d.role == "input":
                done = moved_to.get(d.key)
                uses.append(
                    _Use(
                        f"sources[{i}].{d.key}",
                        _absolute(d.path),
                        "input",
                        i,
                        d.recursive,
                        _absolute(done.path) if done else None,
                    )
                )
            else:
                uses.append(
                    _Use(
                        f"sources[{i}].{d.key}",
                        _absolute(d.path),
                        "done",
                        i,
                        renamed_from=f"sources[{i}].{d.renamed_from}" if d.renamed_from else None,
                    )
                )
        if source.type == "unix" and isinstance(path := getattr(source, "path", None), Path):
            uses.append(_Use(f"sources[{i}].path", _absolute(path), "socket", i))
    return uses


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _relation(inner: Path, outer: Path) -> tuple[str, ...] | None:
    """The parts of ``inner`` below ``outer`` (``()``: the same folder), or ``None`` if it is
    not at or below it. Besides the resolved paths, the device and inode of ``outer`` are
    looked for among ``inner``'s existing ancestors: a bind mount shows one folder at two
    paths."""
    if inner.is_relative_to(outer):
        return inner.relative_to(outer).parts
    target = _identity(outer)
    if target is None:
        return None
    for ancestor in (inner, *inner.parents):
        if _identity(ancestor) == target:
            return inner.relative_to(ancestor).parts
    return None


def _reads(spool: _Use, parts: tuple[str, ...], inner: Path) -> bool:
    """Whether the spool's source reads the files of the folder ``parts`` below it."""
    if not parts:
        return True
    if not spool.recursive or any(p.startswith(".") for p in parts):
        return False
    return spool.own_done is None or _relation(inner, spool.own_done) is None


def _nesting(inner: _Use, outer: _Use, parts: tuple[str, ...]) -> str | None:
    """What goes wrong with ``inner`` at ``parts`` below ``outer`` (``()``: the same path), or
    ``None`` if that nesting is safe."""
    if not parts:
        return _same(inner, outer)
    if outer.kind == "socket":
        return None  # a file: nothing is below it (that it is a file is checked on its own)
    if outer.kind == "input":
        if inner.kind in ("state", "output", "staging"):
            return "the source would read and remove the daemon's own files"
        if parts[0].startswith(SPOOL_FOLDERS):
            return (
                f"{parts[0]} is where the spool's source keeps its claimed and rejected files: "
                "nothing else may be there"
            )
        if inner.kind == "socket":
            return "a socket file in a spool sits among the files producers publish"
        if inner.kind == "done" and inner.path == outer.own_done:
            return None
        if _reads(outer, parts, inner.path):
            if inner.kind == "input":
                return "two sources would take each other's files (it is read recursively)"
            return (
                "the finished files moved there would be read again (it is read recursively), "
                "and removed"
            )
        return None
    if outer.kind == "done":
        if inner.kind == "input":
            return "the source would read finished files again"
        return "finished input files are moved there, under their own sub-folders, and would mix"
    if outer.kind == "state":
        if inner.kind in ("output", "staging"):
            return _reserved(parts, "the daemon's own state")
        if inner.kind == "socket":
            return _reserved(parts, "the daemon's own state", socket=True)
        return "the source's files would sit among the daemon's journal and checkpoint"
    # outer is an output directory or a staging folder: the daemon's alone
    if inner.kind == "state":
        return "the journal and dead letters would sit among the shards"
    return "shards are published and staged there: nothing else may be there"


def _reserved(parts: tuple[str, ...], what: str, *, socket: bool = False) -> str | None:
    name = parts[0]
    taken = name in STATE_NAMES or name.startswith(("dead-letters.jsonl.", "."))
    if taken and (socket or name != "staging"):
        return f"{name!r} is a name the daemon uses for {what}"
    return None


def _same(a: _Use, b: _Use) -> str:
    kinds = {a.kind, b.kind}
    if kinds == {"input"}:
        return (
            "two sources would take each other's files: on one spool, a daemon's sources share "
            "its node's claim folder (whatever their patterns)"
        )
    if "input" in kinds and "done" in kinds:
        return "finished files would be read again, forever"
    if "input" in kinds:
        return "the source would read and remove the daemon's own files"
    if kinds == {"done"}:
        return "two sources moving finished files into one folder would replace each other's"
    if kinds == {"socket"}:
        return "two sources cannot listen on one socket"
    if "socket" in kinds:
        return "one path cannot be a folder and a socket"
    if "done" in kinds:
        return "finished input files would sit among the daemon's own files"
    if kinds == {"output"}:
        return "two outputs would share one staging folder and mix their shards"
    return "shards would sit beside the journal and dead letters, where shard globs match them"


def _device(path: Path) -> int | None:
    """The file system of ``path``, or of its nearest existing ancestor (it may not exist yet)."""
    for p in (path, *path.parents):
        with contextlib.suppress(OSError):
            return os.stat(p).st_dev
    return None


def _limit(path: Path, name: str, default: int) -> int:
    """A ``pathconf`` limit of the file system of ``path`` (or its nearest existing parent)."""
    for p in (path, *path.parents):
        with contextlib.suppress(OSError, ValueError):
            value = os.pathconf(p, name)
            return value if value > 0 else default
    return default


def name_max(path: Path) -> int:
    """The longest name, in bytes, the file system of ``path`` takes."""
    return _limit(path, "PC_NAME_MAX", 255)


def path_max(path: Path) -> int:
    """The longest path, in bytes with its terminating NUL, the system takes below ``path``."""
    return _limit(path, "PC_PATH_MAX", 4096)


def shard_names(prefix: str, node_id: str, compression: Compression, manifests: bool) -> list[str]:
    """The longest shard name the daemon will publish, and the sidecar names it goes with."""
    seq = "9" * SHARD_SEQ_DIGITS
    shard = f"{prefix}-{SHARD_TIME}-{node_id}-{RUN_ID}-{seq}{SUFFIXES[compression]}"
    names = [shard]
    if manifests:
        names.append(shard[: -len(SUFFIXES[compression])] + MANIFEST_SUFFIX)
    return names


def staged_names(published: list[str]) -> list[str]:
    """The in-progress names under which the daemon writes ``published`` (and each shard's
    record offsets) in its staging folder."""
    staged = [inprogress_name(n) for n in published]
    return [*staged, inprogress_name(f"{published[0]}.offsets")]


def state_names() -> list[str]:
    """The longest names the daemon creates directly in ``state_dir``."""
    pid = "9" * PID_DIGITS
    return [
        "dead-letters.jsonl.1",
        *(f".{name}.{pid}.tmp" for name in ("journal", "checkpoint.json")),
    ]


def _bytes(path: Path | str) -> int:
    return len(os.fsencode(str(path)))


def _fits(key: str, path: Path, what: str) -> list[str]:
    """The name and path limits, checked for the path ``path`` the daemon will create."""
    errors = []
    longest = max(path.parts[1:], key=lambda p: _bytes(p), default="")
    limit = name_max(path.parent)
    if _bytes(longest) > limit:
        errors.append(
            f"{key}: {what} {path} has the name {longest!r} of {_bytes(longest)} bytes, "
            f"over the {limit} bytes a name may have on its file system (NAME_MAX)"
        )
    limit = path_max(path.parent)
    if _bytes(path) >= limit:
        errors.append(
            f"{key}: {what} {path} is {_bytes(path)} bytes long, over the {limit - 1} a path may "
            "have (PATH_MAX)"
        )
    return errors


def check_names(config: DaemonConfig) -> list[str]:
    """Every name the config makes the daemon create that its file system would refuse."""
    errors: list[str] = []
    node = config.daemon.node_id
    state = _absolute(config.daemon.state_dir)
    for name in state_names():
        errors += _fits("daemon.state_dir", state / name, "the state file")
    for i, source in enumerate(config.sources):
        errors += _fits(
            f"daemon.state_dir and sources[{i}].name",
            state / "sources" / source.name,
            "the source state",
        )
    for o in outputs(config):
        published = shard_names(o.prefix, node, o.compression, o.manifests)
        keys = f"{o.key}.prefix and daemon.node_id"
        if o.directory is not None:
            for name in published:
                errors += _fits(keys, o.directory / name, f"the {o.key}'s shard")
        for name in staged_names(published):
            errors += _fits(keys, o.staging / name, f"the {o.key}'s in-progress file")
    for i, source in enumerate(config.sources):
        for d in source.directories():
            errors += _fits(f"sources[{i}].{d.key}", _absolute(d.path), "the folder")
            if d.role == "input":
                claims = _absolute(d.path) / CLAIM_FOLDER / node
                errors += _fits(f"daemon.node_id and sources[{i}].{d.key}", claims, "the claims")
        path = getattr(source, "path", None)
        if source.type == "unix" and isinstance(path, Path) and _bytes(path) >= SUN_PATH:
            errors.append(
                f"sources[{i}].path: the socket path {path} is {_bytes(path)} bytes, over "
                f"the {SUN_PATH - 1} a Unix socket's address may have: use a shorter one"
            )
    return list(dict.fromkeys(errors))


def _not_a_folder(path: Path) -> bool:
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:  # absent, or a name too long to look up (reported with the names)
        return False


def _named_first(inner: _Use, a: int, outer: _Use, b: int) -> bool:
    """Which of two uses of one path a message names first: not the spool (the thing put
    there is the mistake), else the later key."""
    if (inner.kind == "input") != (outer.kind == "input"):
        return outer.kind == "input"
    return a > b


def check_paths(config: DaemonConfig) -> list[str]:
    """Every overlap of the config's paths that would lose or loop data, and every name the
    daemon would create that does not fit, as messages naming the keys involved."""
    uses = _uses(config)
    errors: list[str] = []
    for use in uses:
        if use.kind != "socket" and _not_a_folder(use.path):
            errors.append(f"{use.key}: {use.path} exists and is not a directory")
    reported: set[frozenset[int]] = set()
    for a, inner in enumerate(uses):
        for b, outer in enumerate(uses):
            pair = frozenset((a, b))
            if a == b or pair in reported:
                continue
            parts = _relation(inner.path, outer.path)
            if parts is None or (not parts and not _named_first(inner, a, outer, b)):
                continue
            why = _nesting(inner, outer, parts)
            if why is None:
                continue
            reported.add(pair)
            if not parts:
                errors.append(
                    f"{inner.key}: is the same directory as {outer.key} ({outer.path}): {why}"
                )
            else:
                how = " (recursive)" if outer.kind == "input" and outer.recursive else ""
                errors.append(
                    f"{inner.key}: {inner.path} is inside {outer.key}{how} ({outer.path}): {why}"
                )
    by_key = {u.key: u for u in uses}
    for use in uses:
        origin = by_key.get(use.renamed_from or "")
        if origin is None:
            continue
        here, there = _device(use.path), _device(origin.path)
        if here is not None and there is not None and here != there:
            errors.append(
                f"{use.key}: {use.path} is on another file system than {origin.key}"
                f" ({origin.path}): files are moved there by rename, which would fail (EXDEV)"
            )
    return errors + check_names(config)
