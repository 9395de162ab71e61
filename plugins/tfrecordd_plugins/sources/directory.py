"""Spool-directory source: files claimed, read in batches, removed once their records are published.

Producers write a file under a temporary or hidden name and publish it by renaming it to a name
that matches ``pattern``. The source claims each new file by renaming it into its node's claim
folder, ``<path>/.tfrecordd-claimed/<node_id>/`` (a unique, time-ordered claim name that encodes
the file's path relative to the spool), reads it in batches, and deletes it (or moves it into
``done_dir``) only when every record from it is in a published shard. Each batch's token is
``<node_id>/<claim name>`` and the offset (in the decompressed stream) after its last record, so
a file half-written into shards resumes exactly where the last published shard stopped, after
any crash: delivery is exactly once.

Several daemons may share a spool: the rename into a node's claim folder decides which one gets
a file, and each daemon reads only its own folder, which it locks while it runs (a second daemon
with the same ``node_id`` on the spool stops with :class:`StateInUseError`, exit 75). Claims
left directly in ``.tfrecordd-claimed/`` by a version without node folders are adopted by the
first daemon to start (they keep their names, under which the journal knows their offsets).

Formats: ``jsonl`` (one JSON value per line), ``csv`` (a header row, then one event per record;
quoted fields may span lines) and ``whole-file`` (one file is one event, e.g. an image, with its
file name and the name of its parent folder as a label). Files ending in ``.gz`` or ``.zst`` are
decompressed as they are read, up to ``max_decompressed_bytes``. An input that cannot be read to
its end (a damaged or oversized compressed stream, a file still being written) is dead-lettered
with the reason, and the file is moved into ``<path>/.tfrecordd-rejected/`` rather than deleted.

Anyone who can write into the spool can rename the daemon's folders in it or plant files there,
so nothing under the spool is reached by path: the spool is opened once, at start, and every
folder and file below it is opened, listed, renamed or deleted relative to a held descriptor,
never following a symlink. The claim, node, rejected and (inside the spool) done folders must
be real directories owned by the daemon's user; if one is not, the start fails (exit 78). Only
regular files are read: a symlink, FIFO, device or directory matching the pattern is refused
(counted, logged once, left in place). A file in the claim folder that cannot be opened, or a
name too long to claim, is refused once: counted, logged, and moved into the rejected folder,
its reason appended to ``.reasons.jsonl`` there.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from contextlib import aclosing, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import quote, unquote_to_bytes

import aiofiles
import anyio
from pydantic import Field, field_validator

from tfrecordd import crashpoints, speedups, statelock
from tfrecordd.compression import Compression, open_decompressed
from tfrecordd.errors import EXIT_CONFIG, CompressionError, StateInUseError, TfrecorddError
from tfrecordd.plugin import (
    DirectoryUse,
    Lines,
    RawBatch,
    RawEvent,
    Source,
    SourceConfig,
    SourceContext,
    Token,
)
from tfrecordd.units import Duration, Size
from tfrecordd_plugins.sources import csvrecords

log = logging.getLogger(__name__)

_cframe = speedups.load("_cframe")

CLAIM_DIR = ".tfrecordd-claimed"
REJECT_DIR = ".tfrecordd-rejected"
_TEMP_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".swp", "~")
_SUFFIX_COMPRESSION = {".gz": Compression.GZIP, ".zst": Compression.ZSTD, ".zstd": Compression.ZSTD}
REASONS = ".reasons.jsonl"
"""In the rejected folder: one JSON object per file moved there (its name, path and reason)."""
NAME_MAX = 255
"""The longest file name Linux file systems take, in bytes: a longer claim name is refused."""
GROW_POLLS = 10
"""A file still growing this many poll intervals after it was first read to its end has the
rest refused."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_UNOPENABLE = {
    errno.EACCES,
    errno.EPERM,
    errno.ELOOP,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.ENXIO,
    errno.ENODEV,
    errno.EOPNOTSUPP,
}
"""Why a claimed file cannot be opened that waiting will not change: it is moved aside."""
_HELD_FOLDERS = 64
"""Spool folders held open at once while claiming (each is fsynced when closed)."""


class DirectorySourceConfig(SourceConfig):
    """``type = "directory"``: a spool directory of JSON-lines, CSV or whole files."""

    type: Literal["directory"] = "directory"
    path: Path
    """The spool directory to watch."""
    pattern: str = "*.jsonl"
    """Glob (``fnmatch``) that published files match; dotfiles and temporary names never do."""
    format: Literal["jsonl", "csv", "whole-file"] = "jsonl"
    """How a file splits into events: ``jsonl`` one JSON value per line; ``csv`` a header row,
    then one event per record (header name → text field); ``whole-file`` one event per file."""
    compression: Literal["auto", "none", "gzip", "zstd"] = "auto"
    """Compression of the input files; ``auto``: by suffix (``.gz``, ``.zst``/``.zstd``)."""
    max_decompressed_bytes: Size = Field(default=4 << 30, ge=1)
    """A compressed input that decompresses to more than this is rejected (dead-lettered and
    moved into ``.tfrecordd-rejected/``): the guard against decompression bombs."""
    recursive: bool = False
    """Also look in sub-folders (hidden ones, ``done_dir`` and symlinked folders excepted). With
    ``whole-file``, an event's label is the name of its parent folder (``cats/1.jpg`` → cats)."""
    on_done: Literal["delete", "move"] = "delete"
    """What happens to a file once all its records are published: deleted, or moved."""
    done_dir: Path | None = None
    """Where ``on_done = "move"`` puts finished files; default: ``done/`` inside ``path``."""
    poll_interval: Duration = Field(default=1.0, gt=0)
    """How often to look for new files when idle."""
    max_line_bytes: Size = Field(default=1 << 20, ge=16)
    """A longer line (or CSV record) is dead-lettered with its first ``max_line_bytes`` bytes,
    never split."""
    max_file_bytes: Size = Field(default=64 << 20, ge=1)
    """``whole-file``: a larger file is dead-lettered (its path kept) and moved into
    ``.tfrecordd-rejected/``."""
    csv_delimiter: str = Field(default=",", min_length=1, max_length=1)
    """``csv``: the field delimiter."""
    read_size: Size = Field(default=1 << 20, ge=4096)
    """Bytes read from a file per read call. ``jsonl`` files are read into one buffer the
    source keeps, of ``read_size`` plus ``min(max_line_bytes, read_size)`` bytes."""

    delivery: ClassVar[str] = "exactly-once"

    @field_validator("pattern")
    @classmethod
    def _no_separator(cls, v: str) -> str:
        if "/" in v:
            raise ValueError("pattern matches file names, not paths: use recursive = true")
        return v

    def build(self) -> DirectorySource:
        return DirectorySource(self)

    def directories(self) -> list[DirectoryUse]:
        uses = [DirectoryUse("path", self.path, "input", recursive=self.recursive)]
        if self.on_done == "move":
            done = self.done_dir or self.path / "done"
            uses.append(DirectoryUse("done_dir", done, "output", renamed_from="path"))
        return uses


class SpoolError(TfrecorddError):
    """A folder the source keeps in its spool is not a real directory owned by the daemon's user
    (a symlink or another user's folder in its place): refusing to start is safer than trusting
    it. A restart cannot fix it, hence the configuration error's exit status."""

    exit_code = EXIT_CONFIG


def _open_dir(name: str, dir_fd: int) -> int:
    """The folder ``name`` in ``dir_fd``, opened without following a symlink."""
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _open_path(base: int, parts: Sequence[str], *, create: bool = False, mode: int = 0o777) -> int:
    """The folder at ``parts`` below ``base``, each component opened without following a
    symlink (and created first with ``create``)."""
    fd = os.open(".", _DIR_FLAGS, dir_fd=base)
    try:
        for part in parts:
            if create:
                with suppress(FileExistsError):
                    os.mkdir(part, mode, dir_fd=fd)
            nxt = _open_dir(part, fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _own_dir(parent: int, name: str, shown: str, mode: int = 0o700) -> int:
    """The folder ``name`` in ``parent``, created if missing, and checked to be a real directory
    owned by this process's user."""
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass
    else:
        os.fsync(parent)
    try:
        fd = _open_dir(name, parent)
    except OSError as e:
        raise SpoolError(
            f"{shown} is not a directory ({e.strerror}): a symlink or a file in its place is "
            "refused; move it aside and restart"
        ) from e
    owner = os.fstat(fd).st_uid
    if owner != os.geteuid():
        os.close(fd)
        raise SpoolError(
            f"{shown} is owned by uid {owner}, not by the daemon's user (uid {os.geteuid()}): "
            "move it aside and restart"
        )
    return fd


def _claim_name(ns: int, rel: str) -> str:
    """A claim name: the claim's time, then the spool-relative path with ``%``, ``/``, control
    characters and bytes that are not UTF-8 percent-encoded (so it is valid UTF-8 whatever the
    name was, and a UTF-8 name is not lengthened)."""
    out = [f"{ns:020d}-"]
    for ch in rel:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
            out.append(f"%{code - 0xDC00:02X}")
        elif ch in "%/" or code < 0x20 or code == 0x7F:
            out.append(f"%{code:02X}")
        else:
            out.append(ch)
    return "".join(out)


def _original(claim: str) -> str:
    """The spool-relative path a claim name encodes (the name's bytes, as ``os`` functions take
    them).

    Anyone who can write into the spool can put a file into its claim folder, so a name that
    would not decode to a plain relative path (``..``, an absolute path, empty parts) is kept
    as one path component (quoted again, so not even a name the caller was handed with a ``/``
    in it can leave the folder it is moved into)."""
    encoded = claim.split("-", 1)[-1]
    rel = os.fsdecode(unquote_to_bytes(os.fsencode(encoded)))
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        component = quote(os.fsencode(encoded), safe="")
        return component if component not in ("", ".", "..") else f"_{component}"
    return rel


def _shown(name: str) -> str:
    """``name`` as text for logs, dead letters and events: bytes that are not UTF-8 as ``\\xNN``."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _valid_key(key: str) -> bool:
    """A token's file: ``node/claim`` (or a bare claim of the layout before node folders)."""
    parts = key.split("/")
    return len(parts) <= 2 and all(p not in ("", ".", "..") for p in parts)


class _Rejected(Exception):
    """The rest of the input cannot be read; the file is moved aside."""


class DirectorySource(Source):
    """Reads a spool directory; see the module docs for the protocol."""

    def __init__(self, config: DirectorySourceConfig) -> None:
        self.config = config
        self.spool = str(config.path)
        self.claim_dir = os.path.join(self.spool, CLAIM_DIR)
        """This daemon's claim folder (``<spool>/.tfrecordd-claimed/<node_id>`` once running)."""
        self.reject_dir = os.path.join(self.spool, REJECT_DIR)
        self.done_dir = str(config.done_dir or os.path.join(self.spool, "done"))
        self._spool_name = Path(self.spool).resolve().name
        self.committed: dict[str, int] = {}
        self._sent_eof: set[str] = set()
        self._refused: set[str] = set()
        self._stuck: set[str] = set()
        """Claims that could neither be read nor moved aside: not tried again by this process."""
        self._work = bytearray(_work_size(config))
        self._node: str | None = None
        self._fds: dict[str, int] = {}
        """Folders held open since start: ``spool``, ``root`` (the claim folders' parent),
        ``claims`` (this node's), ``rejected``, ``done``."""
        self._seen: dict[str, tuple[int, int]] = {}
        """Size and modification time of each new claim when it was found."""
        self._own: set[tuple[int, int]] = set()
        """The daemon's own folders (device, inode): never read as spool folders."""

    @staticmethod
    def fold(state: Any, tokens: Sequence[Token]) -> Any:
        """Committed offset per claimed file (``node/claim``); a file whose end is committed is
        gone (with the bare claim name it had before node folders, if it was migrated)."""
        out: dict[str, int] = dict(state or {})
        for t in tokens:
            if t["eof"]:
                out.pop(t["f"], None)
                out.pop(t["f"].rpartition("/")[2], None)
            else:
                out[t["f"]] = max(out.get(t["f"], 0), int(t["o"]))
        return out

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        await anyio.to_thread.run_sync(self._open_dirs)
        for t in pending:
            if t["eof"]:
                await anyio.to_thread.run_sync(self._finish_file, t)
        self.committed = self.fold(state, pending)

    def _open_dirs(self) -> None:
        """Open the spool (following the configured path once) and the daemon's folders in it
        (never following a symlink), and check that they are the daemon's."""
        if "spool" in self._fds:
            return
        fds = self._fds
        try:
            os.makedirs(self.spool, exist_ok=True)
            fds["spool"] = os.open(self.spool, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fds["root"] = _own_dir(fds["spool"], CLAIM_DIR, self.claim_dir)
            fds["rejected"] = _own_dir(fds["spool"], REJECT_DIR, self.reject_dir)
            own = [fds["root"], fds["rejected"]]
            if self.config.on_done == "move":
                fds["done"] = self._open_done()
                own.append(fds["done"])
            else:
                # Only to leave it out of a recursive scan: one that cannot be opened is none.
                with suppress(OSError):
                    own.append(fds.setdefault("done-id", os.open(self.done_dir, _DIR_FLAGS)))
        except BaseException:
            self._close_dirs()
            raise
        self._own = {(st.st_dev, st.st_ino) for st in map(os.fstat, own)}

    def _open_done(self) -> int:
        """``done_dir``: inside the spool, reached from the spool's descriptor without following
        a symlink and checked to be the daemon's; elsewhere (the operator's own path), by path."""
        spool, done = os.path.abspath(self.spool), os.path.abspath(self.done_dir)
        rel = os.path.relpath(done, spool)
        if rel in (".", os.pardir) or rel.startswith(os.pardir + os.sep):
            os.makedirs(done, exist_ok=True)
            return os.open(done, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        *parents, last = rel.split(os.sep)
        parent = _open_path(self._fds["spool"], parents, create=True)
        try:
            return _own_dir(parent, last, done, 0o777)
        finally:
            os.close(parent)

    def _open_claims(self, node: str) -> None:
        """This node's claim folder, locked (an exclusive ``flock`` held until :meth:`aclose`):
        a second daemon with the same ``node_id`` on this spool would resume the first one's
        claims as its own. Claims left directly in the claim root by a version without node
        folders are then moved into it (keeping their names, so their committed offsets still
        apply)."""
        self._open_dirs()
        if self._node == node:
            return
        if node in (".", ".."):
            raise SpoolError(f"node_id {node!r} cannot name a claim folder")
        root = self._fds["root"]
        self.claim_dir = os.path.join(self.spool, CLAIM_DIR, node)
        claims = _own_dir(root, node, self.claim_dir)
        try:
            if not statelock.try_lock(claims):
                raise StateInUseError(
                    f"spool {self.spool}: node_id {node} is in use by another tfrecordd reading "
                    f"this spool (it holds {self.claim_dir}): each daemon sharing a spool needs "
                    "a node_id of its own; stop that daemon or give this one another node_id"
                )
        except BaseException:
            os.close(claims)
            raise
        self._fds["claims"] = claims
        self._node = node
        with os.scandir(root) as entries:
            legacy = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
        for name in legacy:
            with suppress(FileNotFoundError):  # another daemon adopted it first
                os.rename(name, name, src_dir_fd=root, dst_dir_fd=self._fds["claims"])
                log.info("%s: adopted %s from the claim folder's old layout", self.spool, name)
        if legacy:
            _fsync_dir(self._fds["claims"])
            _fsync_dir(root)

    def _close_dirs(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._node = None

    async def aclose(self) -> None:
        self._close_dirs()

    def _folder(self, key: str) -> tuple[int, str, bool]:
        """The folder holding the file a token names, the file's name, and whether the folder
        was opened for this call (and must be closed)."""
        node, _, name = key.rpartition("/")
        if not node:
            return self._fds["root"], name, False
        if node == self._node:
            return self._fds["claims"], name, False
        return _open_dir(node, self._fds["root"]), name, True

    async def ack(self, tokens: Sequence[Token]) -> None:
        for t in tokens:
            if t["eof"]:
                await anyio.to_thread.run_sync(self._finish_file, t)
                self._sent_eof.discard(t["f"])
                self.committed.pop(t["f"], None)
            else:
                self.committed[t["f"]] = max(self.committed.get(t["f"], 0), int(t["o"]))

    def _finish_file(self, token: Token) -> None:
        key = token["f"]
        if not _valid_key(key):
            log.error("%s: a token names %r, not a claim: ignored", self.spool, key)
            return
        self._open_dirs()  # acks may come after aclose (redone, say)
        try:
            folder, claim, opened = self._folder(key)
        except FileNotFoundError:
            return
        try:
            try:
                os.stat(claim, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                return
            if token.get("bad"):
                reason = token.get("why") or "input rejected"
                self._set_aside(folder, claim, _shown(_original(claim)), reason)
            elif self.config.on_done == "delete":
                os.unlink(claim, dir_fd=folder)
            else:
                self._move_done(folder, claim)
            _fsync_dir(folder)
        finally:
            if opened:
                os.close(folder)
        crashpoints.reached("after-spool-ack")

    def _move_done(self, folder: int, claim: str) -> None:
        *parents, name = _original(claim).split("/")
        dst = _open_path(self._fds["done"], parents, create=True)
        try:
            with suppress(FileNotFoundError):
                os.stat(name, dir_fd=dst, follow_symlinks=False)
                name = f"{name}.{claim.split('-', 1)[0]}"
            os.rename(claim, name, src_dir_fd=folder, dst_dir_fd=dst)
            _fsync_dir(dst)
        finally:
            os.close(dst)

    def _set_aside(
        self, folder: int, name: str, shown: str, reason: str, as_name: str = ""
    ) -> bool:
        """Move ``name`` from ``folder`` into the rejected folder (as ``as_name``, if given) and
        record why; ``False`` if it was gone."""
        target = as_name or name
        rejected = self._fds["rejected"]
        try:
            os.rename(name, target, src_dir_fd=folder, dst_dir_fd=rejected)
        except FileNotFoundError:
            return False
        line = {
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "source": self.config.name,
            "file": _shown(target),
            "path": shown,
            "reason": reason,
        }
        try:
            fd = os.open(REASONS, _APPEND_FLAGS, 0o600, dir_fd=rejected)
            try:
                os.write(fd, json.dumps(line).encode() + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            log.error("%s: cannot record why %s was rejected: %s", self.reject_dir, shown, e)
        _fsync_dir(rejected)
        _fsync_dir(folder)
        return True

    async def run(self, ctx: SourceContext) -> None:
        await anyio.to_thread.run_sync(self._open_claims, ctx.node_id)
        while True:
            claims = await anyio.to_thread.run_sync(self._pending_claims, ctx)
            claims += await anyio.to_thread.run_sync(self._claim_new, ctx)
            read = False
            for claim in claims:
                read |= await self._read_file(ctx, claim)
            if not read:
                await anyio.to_thread.run_sync(self._check_spool)
                await anyio.sleep(self.config.poll_interval)

    def _check_spool(self) -> None:
        """The spool path still leads to the directory opened at start: one deleted and made
        again, or a symlink pointed elsewhere, is seen by a restart, not silently ignored."""
        held = os.fstat(self._fds["spool"])
        try:
            now = os.stat(self.spool)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            raise TfrecorddError(
                f"{self.spool}: the spool directory was removed or replaced while the daemon "
                "ran; a restart reads the one there now (claims in the old one stay there)"
            )

    def _pending_claims(self, ctx: SourceContext) -> list[str]:
        """This node's claims not yet read to their end (a name that is not UTF-8, which no
        claim made here has, is moved aside)."""
        out = []
        folder = self._fds["claims"]
        try:
            names = os.listdir(folder)
        except OSError as e:
            log.warning("%s: cannot list %s: %s", ctx.name, self.claim_dir, e)
            return []
        for claim in sorted(names):
            key = f"{self._node}/{claim}"
            if key in self._sent_eof or key in self._stuck:
                continue
            try:
                claim.encode()
            except UnicodeEncodeError:
                shown = _shown(_original(claim))
                self._refuse(
                    ctx, folder, claim, shown, "bad_name", "a claim name that is not UTF-8"
                )
                continue
            out.append(claim)
        return out

    def _refuse(
        self,
        ctx: SourceContext,
        folder: int,
        name: str,
        shown: str,
        label: str,
        reason: str,
        as_name: str = "",
    ) -> bool:
        """Move a file that cannot be read into the rejected folder, once: counted, logged with
        ``reason`` (recorded beside it). A file that cannot be moved either is left, and not
        tried again by this process."""
        try:
            moved = self._set_aside(folder, name, shown, reason, as_name)
        except OSError as e:
            self._stuck.add(f"{self._node}/{name}")
            ctx.count_refused(label)
            log.error("%s: %s: %s; cannot move it aside either (%s)", ctx.name, shown, reason, e)
            return False
        if moved:
            ctx.count_refused(label)
            log.warning("%s: %s refused (%s): moved into %s", ctx.name, shown, reason, REJECT_DIR)
        return moved

    def _candidates(self, ctx: SourceContext) -> list[tuple[str, str, tuple[int, int]]]:
        """``(folder, name, (size, modification time))`` of the regular files that match,
        oldest first (folders relative to the spool, ``""`` for the spool itself)."""
        found: list[tuple[float, str, str, tuple[int, int]]] = []
        try:
            folders = [("", os.open(".", _DIR_FLAGS, dir_fd=self._fds["spool"]))]
        except OSError as e:  # out of descriptors, say: looked at again after a poll
            log.warning("%s: cannot list %s: %s", ctx.name, self.spool, e)
            return []
        while folders:
            rel_dir, fd = folders.pop()
            try:
                self._scan(ctx, rel_dir, fd, found, folders)
            finally:
                os.close(fd)
        return [(rel_dir, name, seen) for _, rel_dir, name, seen in sorted(found)]

    def _scan(
        self,
        ctx: SourceContext,
        rel_dir: str,
        fd: int,
        found: list[tuple[float, str, str, tuple[int, int]]],
        folders: list[tuple[str, int]],
    ) -> None:
        try:
            with os.scandir(fd) as it:
                entries = list(it)
        except OSError as e:
            log.warning("%s: cannot list %s: %s", ctx.name, _shown(rel_dir) or self.spool, e)
            return
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            rel = f"{rel_dir}/{name}" if rel_dir else name
            try:
                if self.config.recursive and entry.is_dir(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    if (st.st_dev, st.st_ino) not in self._own:
                        folders.append((rel, _open_dir(name, fd)))
                    continue
                if name.endswith(_TEMP_SUFFIXES) or not fnmatch.fnmatchcase(
                    name, self.config.pattern
                ):
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:  # gone, or replaced by something that is not a folder
                continue
            if not stat.S_ISREG(st.st_mode):
                if rel not in self._refused:
                    self._refused.add(rel)
                    ctx.count_refused("not_regular_file")
                    log.warning("%s: %s is not a regular file; refused", ctx.name, _shown(rel))
                continue
            found.append((st.st_mtime, rel_dir, name, (st.st_size, st.st_mtime_ns)))

    def _claim_new(self, ctx: SourceContext) -> list[str]:
        """Rename new files into this node's claim folder: the rename decides which daemon
        gets a file another one is claiming too. A name that cannot become a claim name is
        moved aside, once."""
        claimed: list[str] = []
        claims = self._fds["claims"]
        folders: dict[str, int] = {}
        try:
            for rel_dir, name, seen in self._candidates(ctx):
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if rel in self._refused:
                    continue
                ns = time.time_ns()
                claim = _claim_name(ns, rel)
                try:
                    if rel_dir not in folders:
                        if len(folders) >= _HELD_FOLDERS:
                            _close_synced(folders)
                        parts = rel_dir.split("/") if rel_dir else []
                        folders[rel_dir] = _open_path(self._fds["spool"], parts)
                    size = len(claim.encode())
                    if size > NAME_MAX:
                        raise OSError(errno.ENAMETOOLONG, f"{size} bytes, over {NAME_MAX}")
                    os.rename(name, claim, src_dir_fd=folders[rel_dir], dst_dir_fd=claims)
                except FileNotFoundError:  # gone: claimed by another daemon, say
                    continue
                except OSError as e:
                    self._refused.add(rel)
                    if e.errno == errno.ENAMETOOLONG:
                        digest = hashlib.sha256(os.fsencode(rel)).hexdigest()[:16]
                        reason = f"name too long to claim ({e.strerror})"
                        as_name = f"{ns:020d}-{digest}.name-too-long"
                        self._refuse(
                            ctx,
                            folders[rel_dir],
                            name,
                            _shown(rel),
                            "name_too_long",
                            reason,
                            as_name,
                        )
                    else:
                        ctx.count_refused("unclaimable")
                        log.error("%s: cannot claim %s: %s", ctx.name, _shown(rel), e)
                    continue
                crashpoints.reached("after-claim")
                claimed.append(claim)
                self._seen[claim] = seen
            if claimed:
                _fsync_dir(claims)
        finally:
            _close_synced(folders)
        return claimed

    def _compression(self, name: str) -> Compression:
        if self.config.compression != "auto":
            return Compression(self.config.compression)
        return _SUFFIX_COMPRESSION.get(os.path.splitext(name)[1], Compression.NONE)

    def _reader(self, key: str, rel: str) -> _Reader:
        return _Reader(
            self._fds["claims"], key.rpartition("/")[2], self._compression(rel), self.config
        )

    async def _read_file(self, ctx: SourceContext, claim: str) -> bool:
        """Read one claim to its end; whether it was read (not refused, not failing)."""
        key = f"{self._node}/{claim}"
        # A claim adopted from the layout before node folders has its offsets under its name.
        start = max(self.committed.get(key, 0), self.committed.get(claim, 0))
        rel = _shown(_original(claim))
        reader = self._reader(key, rel)
        reader.seen = self._seen.pop(claim, None)
        try:
            # Shielded, like the close below: an open finishing in its thread after a cancel
            # would leave its file object to the garbage collector.
            with anyio.CancelScope(shield=True):
                await reader.open()
        except FileNotFoundError:
            return False
        except (OSError, _Rejected) as e:
            if isinstance(e, OSError) and e.errno not in _UNOPENABLE:
                # Out of descriptors, an I/O error...: may pass, so tried again after a poll.
                if key not in self._refused:
                    self._refused.add(key)
                    log.warning("%s: cannot open %s (will retry): %s", ctx.name, rel, e)
                return False
            denied = isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM)
            label = "unreadable" if denied else "not_regular_file"
            reason = f"cannot be read: {e.strerror if isinstance(e, OSError) else e}"
            if start:
                reason += f" (its first {start} bytes were read and published before)"
            await anyio.to_thread.run_sync(
                self._refuse, ctx, self._fds["claims"], claim, rel, label, reason
            )
            return False
        try:
            if self.config.format == "whole-file":
                await self._read_whole(ctx, key, rel, reader)
            elif self.config.format == "jsonl":
                await self._read_lines(ctx, key, rel, reader, start)
            else:
                await self._read_csv(ctx, key, rel, reader, start)
        finally:
            with anyio.CancelScope(shield=True):
                await reader.close()
            if reader.grew:
                ctx.count_refused("grew_after_publish")
                log.warning(
                    "%s: %s changed after it was published into the spool (producers must "
                    "write elsewhere and rename): read on while it grew",
                    ctx.name,
                    rel,
                )
        self._sent_eof.add(key)
        return True

    async def _read_whole(self, ctx: SourceContext, claim: str, rel: str, reader: _Reader) -> None:
        limit = self.config.max_file_bytes
        data = b""
        try:
            async for chunk in reader.chunks(0):
                data += chunk
                if len(data) > limit:
                    raise _Rejected(f"file larger than max_file_bytes ({limit})")
        except _Rejected as e:
            await self._reject(ctx, claim, rel, str(e), len(data))
            return
        parts = Path(rel).parts
        label = parts[-2] if len(parts) > 1 else self._spool_name
        value = {"filename": parts[-1], "label": label, "path": rel}
        event = RawEvent(data, rel, value=value, format="file")
        await ctx.send(RawBatch(ctx.name, [event], _token(claim, len(data), True)))

    async def _reject(
        self, ctx: SourceContext, claim: str, rel: str, reason: str, offset: int
    ) -> None:
        log.warning("%s: %s rejected: %s", ctx.name, rel, reason)
        event = RawEvent(b"", f"{rel}:{offset}", error=f"input rejected: {reason}")
        await ctx.send(RawBatch(ctx.name, [event], _token(claim, offset, True, bad=reason)))

    async def _read_lines(
        self, ctx: SourceContext, claim: str, rel: str, reader: _Reader, offset: int
    ) -> None:
        """Send the file's JSON lines from ``offset`` as :class:`Lines` batches of whole lines.

        Only whole buffers are handled here (a search for the last newline, a count of them): the
        lines are split where they are encoded. A line that outgrows ``max_line_bytes`` before
        its newline arrives is skipped as it is read, its first bytes kept for the dead letter.

        The file is read into one buffer, the source's own, over and over: a new buffer per read
        is fresh memory the kernel faults in page by page (with 64 MiB reads, a tenth of the
        daemon's CPU went to those faults). Only the batches are copied out of it.

        A buffer's last batch waits for the next read: when that read finds the end of the file,
        the batch carries the file's end, instead of a batch of its own after it (which would
        cost a commit of its own when it arrives between two shards).
        """
        max_line, read_size = self.config.max_line_bytes, self.config.read_size
        max_events, max_bytes = ctx.max_batch_events, ctx.max_batch_bytes
        work = self._work
        kept = 0  # bytes at work[:kept] (a line's start), from stream position `offset`
        head: bytes | None = None  # first bytes of an overlong line still being skipped
        head_at = 0
        eof = False
        lines = False  # whether the last buffer held whole lines: if not, the end goes alone
        held: tuple[Lines, int] | None = None  # the last batch cut, and the offset after it

        async def send_held(last: bool) -> None:
            nonlocal held
            if held is not None:
                batch, end = held
                held = None
                await ctx.send(RawBatch(ctx.name, [], _token(claim, end, last), batch))

        try:
            await reader.seek(offset)
            while not eof:
                if len(work) < kept + read_size:
                    # A new buffer, never a resize: a view of the old one may still be held by
                    # the thread that read into it.
                    grown = bytearray(kept + read_size)
                    grown[:kept] = work[:kept]
                    work = self._work = grown
                with memoryview(work) as view:
                    got = await reader.read_into(view[kept : kept + read_size])
                eof = not got
                if held is not None and eof and not kept and head is None:
                    await send_held(True)
                    return
                await send_held(False)
                n, at = kept + got, 0  # work[at:n] is unread, from stream position `offset`
                if head is not None:
                    nl = work.find(b"\n", 0, n)
                    if nl < 0 and not eof:
                        offset, kept = offset + n, 0
                        continue
                    at = nl + 1 if nl >= 0 else n
                    offset += at
                    event = _too_long(rel, head_at, head, max_line)
                    last = eof and at == n
                    await ctx.send(RawBatch(ctx.name, [event], _token(claim, offset, last)))
                    head = None
                    if last:
                        return
                whole = n if eof else work.rfind(b"\n", at, n) + 1 or at
                lines = whole > at
                start = at
                with memoryview(work) as view:
                    for end in _cuts(work, start, whole, max_events, max_bytes):
                        await send_held(False)
                        batch = Lines(bytes(view[start:end]), rel, offset + start - at, max_line)
                        held = batch, offset + end - at
                        start = end
                if eof:
                    await send_held(True)
                offset, kept = offset + whole - at, n - whole
                work[:kept] = work[whole:n]
                if kept > max_line:
                    head, head_at = bytes(work[:max_line]), offset
                    offset, kept = offset + kept, 0
        except _Rejected as e:
            await send_held(False)
            await self._reject(ctx, claim, rel, str(e), offset)
            return
        finally:
            if len(work) > _work_size(self.config):
                # A line longer than a read grew it: back to its usual size for the next file.
                self._work = bytearray(_work_size(self.config))
        if not lines:
            await ctx.send(RawBatch(ctx.name, [], _token(claim, offset, True)))

    async def _read_csv(
        self, ctx: SourceContext, claim: str, rel: str, reader: _Reader, offset: int
    ) -> None:
        """Send the file's CSV records from ``offset`` in batches whose tokens sit on record
        ends (the header row first, or read again when resuming past it). A record longer than
        ``max_line_bytes`` is dead-lettered whole (its first bytes kept) while the scanner reads
        on through it, so the next record starts exactly where the long one ends."""
        cfg = self.config
        header = await self._csv_header(claim, rel) if offset > 0 else None
        max_line = cfg.max_line_bytes
        max_events, max_bytes = ctx.max_batch_events, ctx.max_batch_bytes
        delimiter = cfg.csv_delimiter
        events: list[RawEvent] = []
        batch_bytes = 0
        buf = b""  # unread bytes, starting at stream position `offset`
        head: bytes | None = None  # first bytes of an overlong record still being skipped
        head_at = 0
        state = csvrecords.State.FIELD_START  # the scanner's, at buf[0]
        # The last full batch waits for the next one: if none comes, it carries the file's end
        # (as the JSON-lines reader's last batch does), not an empty batch of its own.
        held: RawBatch | None = None
        try:
            async with aclosing(reader.chunks(offset)) as chunks:
                while True:
                    chunk = await anext(chunks, b"")
                    buf += chunk
                    if offset == 0 and header is None:
                        if len(buf) < len(csvrecords.BOM) and chunk:
                            continue
                        if buf.startswith(csvrecords.BOM):
                            buf, offset = buf[len(csvrecords.BOM) :], len(csvrecords.BOM)
                    found = csvrecords.split(buf, not chunk, state, ord(delimiter))
                    at = offset
                    for record, nxt in zip(found.records, found.ends, strict=True):
                        n = len(record)
                        if head is not None:
                            events.append(_too_long(rel, head_at, head, max_line))
                            head = None
                        elif n > max_line:
                            events.append(_too_long(rel, at, record[:max_line], max_line))
                        elif not n or record.isspace():
                            pass
                        elif header is None:
                            header = csvrecords.row(record, delimiter)
                        else:
                            events.append(
                                csvrecords.event(record, f"{rel}:{at}", header, delimiter)
                            )
                            batch_bytes += n
                        at = offset + nxt
                        if len(events) >= max_events or batch_bytes >= max_bytes:
                            if held is not None:
                                await ctx.send(held)
                            held = RawBatch(ctx.name, events, _token(claim, at, False))
                            events, batch_bytes = [], 0
                    buf, offset = buf[found.consumed :], offset + found.consumed
                    state = csvrecords.State.FIELD_START if found.records else state
                    if not chunk:
                        if head is not None:  # the input ended inside the over-long record
                            events.append(_too_long(rel, head_at, head, max_line))
                        break
                    if len(buf) > max_line:
                        # Over-long: keep its first bytes for the dead letter and drop the rest,
                        # carrying the scanner's state across so its end is found exactly.
                        if head is None:
                            head, head_at = buf[:max_line], offset
                        state = found.state
                        offset, buf = offset + len(buf), b""
        except _Rejected as e:
            if held is not None:
                await ctx.send(held)
            if events:
                await ctx.send(RawBatch(ctx.name, events, _token(claim, offset, False)))
            await self._reject(ctx, claim, rel, str(e), offset)
            return
        if held is not None and not events:
            events, held = held.events, None
        if held is not None:
            await ctx.send(held)
        await ctx.send(RawBatch(ctx.name, events, _token(claim, offset, True)))

    async def _csv_header(self, claim: str, rel: str) -> list[str] | None:
        """The header row of a CSV file being resumed past its start."""
        reader = self._reader(claim, rel)
        with anyio.CancelScope(shield=True):
            await reader.open()
        delimiter = ord(self.config.csv_delimiter)
        try:
            buf = b""
            final = False
            async with aclosing(reader.chunks(0)) as chunks:
                while not final:
                    chunk = await anext(chunks, b"")
                    buf += chunk
                    final = not chunk
                    start = len(csvrecords.BOM) if buf.startswith(csvrecords.BOM) else 0
                    found = csvrecords.split(
                        buf[start:], final, csvrecords.State.FIELD_START, delimiter
                    )
                    for record in found.records:
                        if record.strip():
                            return csvrecords.row(record, self.config.csv_delimiter)
            return None
        finally:
            with anyio.CancelScope(shield=True):
                await reader.close()


class _Reader:
    """Decompressed bytes of one claimed file, read without blocking the event loop.

    A file that changes after it was opened (a producer still writing into a published file)
    is noticed at the end of what was read, by its size and modification time: a plain file is
    read on while it grows (until it has been still for a poll interval, for at most
    ``GROW_POLLS`` poll intervals); a compressed one, or one that keeps growing, has the rest
    refused (:class:`_Rejected`), so the file is moved aside rather than deleted with a tail
    nobody read."""

    def __init__(
        self, folder: int, name: str, compression: Compression, config: DirectorySourceConfig
    ):
        self.folder = folder
        self.name = name
        self.compression = compression
        self.config = config
        self.grew = False
        """Whether the file changed after it was opened (or ``seen``)."""
        self.seen: tuple[int, int] | None = None
        """The file's size and modification time when it was claimed, if known: a change
        since then is noticed too."""
        self._plain: Any = None
        self._raw: Any = None
        self._stream: Any = None
        self._at_end = False
        self._fd = -1
        self._pos = 0  # of a plain file: where the next read starts
        self._seen = (0, 0)  # size and modification time at the last look
        self._grew_at = 0.0
        self._still = False  # looked again after a poll interval: nothing changed

    def _opener(self, name: str, flags: int) -> int:
        return os.open(name, flags | _FILE_FLAGS, dir_fd=self.folder)

    async def open(self) -> None:
        if self.compression is Compression.NONE:
            self._plain = await aiofiles.open(self.name, "rb", opener=self._opener)
            fd = self._plain.fileno()
        else:
            self._raw = await anyio.to_thread.run_sync(self._open_raw)
            fd = self._raw.fileno()
            self._stream = open_decompressed(
                self._raw,
                self.compression,
                path=self.name,
                max_bytes=self.config.max_decompressed_bytes,
            )
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            await self.close()
            raise _Rejected("not a regular file")
        self._fd = fd
        self._seen = self.seen or (st.st_size, st.st_mtime_ns)

    def _open_raw(self) -> Any:
        return open(self.name, "rb", buffering=0, opener=self._opener)

    async def seek(self, offset: int) -> None:
        """Read from ``offset`` (in the decompressed stream) on; a compressed stream is read up
        to it."""
        self._at_end = False
        if self._plain is not None:
            if offset:
                await self._plain.seek(offset)
            self._pos = offset
            return
        size = self.config.read_size
        while offset > 0:
            skipped = await self._decompressed(min(size, offset))
            if not skipped:
                self._at_end = True
                return
            offset -= len(skipped)

    async def read(self) -> bytes:
        """The next bytes, up to ``read_size``; ``b""`` at the end."""
        size = self.config.read_size
        while True:
            if not self._at_end:
                if self._plain is None:
                    chunk = await self._decompressed(size)
                else:
                    chunk = await self._plain.read(size)
                    self._pos += len(chunk)
                # A read returns less than asked only at the end of the file: no trip to a
                # thread to hear that again.
                self._at_end = len(chunk) < size
                if chunk:
                    return chunk
            if not await self._more():
                return b""
            self._at_end = False

    async def read_into(self, target: memoryview) -> int:
        """Read the next bytes into ``target``; how many (``0`` at the end)."""
        while True:
            if not self._at_end:
                if self._plain is None:
                    chunk = await self._decompressed(len(target))
                    got = len(chunk)
                    target[:got] = chunk
                else:
                    got = await self._plain.readinto(target)
                    self._pos += got
                self._at_end = got < len(target)
                if got:
                    return got
            if not await self._more():
                return 0
            self._at_end = False

    async def _more(self) -> bool:
        """At the end of what was read: whether the file grew since, so reading goes on."""
        while True:
            st = os.fstat(self._fd)
            now = (st.st_size, st.st_mtime_ns)
            if now == self._seen:
                if not self.grew or self._still:
                    return False
                # It changed before: let a writer that is still at it show itself.
                await anyio.sleep(self.config.poll_interval)
                self._still = True
                continue
            self._seen, self._still = now, False
            if not self.grew:
                self.grew, self._grew_at = True, time.monotonic()
            if self._plain is None:
                raise _Rejected(
                    "the file changed while it was read (published before it was complete); "
                    "the rest is not read"
                )
            if st.st_size < self._pos:
                raise _Rejected(f"the file was cut to {st.st_size} bytes while it was read")
            if time.monotonic() - self._grew_at > GROW_POLLS * self.config.poll_interval:
                raise _Rejected(
                    f"still being written {GROW_POLLS} poll intervals after it was read to its "
                    f"end; the rest, from byte {self._pos}, is not read"
                )
            if st.st_size > self._pos:
                return True

    async def chunks(self, offset: int) -> AsyncGenerator[bytes, None]:
        """The bytes from ``offset`` (in the decompressed stream) to the end."""
        await self.seek(offset)
        while chunk := await self.read():
            yield chunk

    async def _decompressed(self, size: int) -> bytes:
        try:
            chunk: bytes = await anyio.to_thread.run_sync(self._stream.read, size)
        except CompressionError as e:
            raise _Rejected(e.detail) from e
        return chunk

    async def close(self) -> None:
        if self._plain is not None:
            await self._plain.close()
            self._plain = None
        if self._raw is not None:
            await anyio.to_thread.run_sync(self._raw.close)
            self._raw = self._stream = None


def _work_size(config: DirectorySourceConfig) -> int:
    """The read buffer's size: a read, after the start of a line left from the read before."""
    return config.read_size + min(config.max_line_bytes, config.read_size)


def _cuts(
    buf: bytes | bytearray, start: int, whole: int, max_events: int, max_bytes: int
) -> Iterator[int]:
    """Where the batches of ``buf[start:whole]`` (whole lines) end: each holds
    ``max_events`` lines (the last may hold fewer) and, unless one line is longer, at most
    ``max_bytes`` bytes. Exact counts matter: a shard's record cap is filled by whole batches.
    One at a time: the source sends each batch (and lets the event loop run) before the next."""
    per_line = 0  # bytes per line in the batch before: where to look for this one's end
    while start < whole:
        bound = whole
        if bound - start > max_bytes:
            bound = (
                buf.rfind(b"\n", start, start + max_bytes) + 1
                or buf.find(b"\n", start + max_bytes, whole) + 1
                or whole
            )
        if _cframe is not None:
            end, _ = _cframe.line_end(buf, start, bound, max_events)
            yield end
            start = end
            continue
        end = bound
        # Counting newlines up to the end of a large buffer for every batch would cost more than
        # the batches: look about as far as the batch before suggests.
        if per_line and end - start > (reach := per_line * max_events * 5 // 4):
            end = buf.rfind(b"\n", start, start + reach) + 1 or bound
        lines = buf.count(b"\n", start, end) + (buf[end - 1] != 10)
        if lines > max_events:
            guess = start + (end - start) * max_events // lines
            end = buf.rfind(b"\n", start, guess) + 1 or buf.find(b"\n", start, end) + 1
            lines = buf.count(b"\n", start, end)
            while lines > max_events:
                end = buf.rfind(b"\n", start, end - 1) + 1
                lines -= 1
        while lines < max_events and end < bound:
            end = buf.find(b"\n", end, bound) + 1 or bound
            lines += 1
        yield end
        per_line = (end - start) // lines + 1
        start = end


def _token(claim: str, offset: int, eof: bool, *, bad: str = "") -> Token:
    token: dict[str, Any] = {"f": claim, "o": offset, "eof": eof}
    if bad:
        token["bad"] = True
        token["why"] = bad
    return token


def _too_long(rel: str, at: int, head: bytes, limit: int) -> RawEvent:
    return RawEvent(
        head, f"{rel}:{at}", error=f"record longer than max_line_bytes ({limit}); first bytes kept"
    )


def _fsync_dir(fd: int) -> None:
    os.fsync(fd)


def _close_synced(folders: dict[str, int]) -> None:
    """fsync (a claim renamed out of them must stay out after a power cut) and close."""
    try:
        for fd in folders.values():
            _fsync_dir(fd)
    finally:
        for fd in folders.values():
            os.close(fd)
        folders.clear()
