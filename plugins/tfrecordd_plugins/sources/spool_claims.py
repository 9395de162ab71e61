"""Claiming: the spool's folders held open, files claimed into this node's folder, finished or
set aside.

The spool is opened once, at start, and every folder and file below it is opened, listed,
renamed or deleted relative to a held descriptor, never following a symlink (``O_NOFOLLOW``):
anyone who can write into the spool can rename the daemon's folders or plant files there. The
claim, node, rejected and (inside the spool) done folders must be real directories owned by the
daemon's user (else :class:`SpoolError`), and the node's claim folder is locked while the source
runs. :class:`Claims` finds the regular files that match, claims each by renaming it into the
node's folder (the rename decides which daemon gets a file), and, once its records are
published, deletes it, moves it into ``done_dir``, or sets it aside into the rejected folder
with its reason recorded (``.reasons.jsonl`` there); each rename is made durable by fsyncing
the folders it touched. Only regular files are claimed (a symlink, FIFO or device that matches
is counted, logged once and left in place); a claim that cannot be opened, or a name too long to
claim, is set aside once. Claims left directly in ``.tfrecordd-claimed/`` by a version without
node folders are adopted, under their names, by the first daemon to start.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import hashlib
import json
import logging
import os
import signal
import stat
import sys
import time
from collections.abc import Container, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from tfrecordd.plugin import (
    DurabilityError,
    FileSystem,
    SourceContext,
    StateInUseError,
    try_lock,
)
from tfrecordd_plugins.sources.spool_folders import (
    DIR_FLAGS,
    SpoolError,
    open_dir,
    open_path,
    own_dir,
)
from tfrecordd_plugins.sources.spool_names import (
    CLAIM_DIR,
    NAME_MAX,
    REASONS,
    REJECT_DIR,
    TEMP_SUFFIXES,
    claim_name,
    original,
    printable,
    resumed_name,
    valid_key,
)
from tfrecordd_plugins.sources.spool_reading import tail_digest

log = logging.getLogger("tfrecordd_plugins.sources.directory")  # the source's one logger

_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_CHECK_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_F_SETSIG = 10
"""Linux's ``F_SETSIG`` (the :mod:`fcntl` module does not name it)."""
_HELD_FOLDERS = 64
"""Spool folders held open at once while claiming (each is fsynced when closed)."""


class ClaimSettings(Protocol):
    """The source settings claiming follows (the directory source's config)."""

    @property
    def name(self) -> str: ...
    @property
    def path(self) -> Path: ...
    @property
    def pattern(self) -> str: ...
    @property
    def recursive(self) -> bool: ...
    @property
    def on_done(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def done_dir(self) -> Path | None: ...


def _close_synced(fs: FileSystem, folders: dict[str, int]) -> None:
    """fsync (a claim renamed out of them must stay out after a power cut) and close."""
    try:
        for fd in folders.values():
            fs.fsync_dir_fd(fd)
    finally:
        for fd in folders.values():
            os.close(fd)
        folders.clear()


class Claims:
    """The spool's folders, held open from start, and the files claimed, finished or set aside
    in them (blocking calls: the source runs them in worker threads)."""

    def __init__(self, config: ClaimSettings) -> None:
        self.config = config
        self.spool = str(config.path)
        self.claim_dir = os.path.join(self.spool, CLAIM_DIR)
        """This daemon's claim folder (``<spool>/.tfrecordd-claimed/<node_id>`` once running)."""
        self.reject_dir = os.path.join(self.spool, REJECT_DIR)
        self.done_dir = str(config.done_dir or os.path.join(self.spool, "done"))
        self.refused: set[str] = set()
        """Spool paths refused (left in place, not looked at again), and claims (``node/claim``)
        whose open failed in a way that may pass (logged once)."""
        self._stuck: set[str] = set()
        """Claim names that could neither be read nor moved aside: not tried again by this
        process."""
        self._waiting: set[str] = set()
        """Claims read to their end that a writer still holds open (logged once)."""
        self._node: str | None = None
        self._fds: dict[str, int] = {}
        """Folders held open since start: ``spool``, ``root`` (the claim folders' parent),
        ``claims`` (this node's), ``rejected``, ``done``."""
        self.seen: dict[str, tuple[int, int]] = {}
        """Size and modification time of each new claim when it was found."""
        self._own: set[tuple[int, int]] = set()
        """The daemon's own folders (device, inode): never read as spool folders."""
        self.fs = FileSystem()
        """Every fsync of the spool's folders goes through it: the daemon's, once attached."""
        self._ctx: SourceContext | None = None

    def attach(self, ctx: SourceContext) -> None:
        """Use the daemon's file system and crash points (``Source.attach``)."""
        self.fs = ctx.fs
        self._ctx = ctx

    def _crash_point(self, point: str) -> None:
        if self._ctx is not None:
            self._ctx.crash_point(point)

    @property
    def node(self) -> str | None:
        """The node whose claim folder is open (and locked), once :meth:`open_claims` ran."""
        return self._node

    @property
    def claims_fd(self) -> int:
        """This node's claim folder (after :meth:`open_claims`)."""
        return self._fds["claims"]

    def open(self) -> None:
        """Open the spool (following the configured path once) and the daemon's folders in it
        (never following a symlink), and check that they are the daemon's."""
        if "spool" in self._fds:
            return
        fds = self._fds
        try:
            os.makedirs(self.spool, exist_ok=True)
            fds["spool"] = os.open(self.spool, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fds["root"] = own_dir(self.fs, fds["spool"], CLAIM_DIR, self.claim_dir)
            fds["rejected"] = own_dir(self.fs, fds["spool"], REJECT_DIR, self.reject_dir)
            own = [fds["root"], fds["rejected"]]
            if self.config.on_done == "move":
                fds["done"] = self._open_done()
                own.append(fds["done"])
            else:
                # Only to leave it out of a recursive scan: one that cannot be opened is none.
                with suppress(OSError):
                    own.append(fds.setdefault("done-id", os.open(self.done_dir, DIR_FLAGS)))
        except BaseException:
            self.close()
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
        parent = open_path(self._fds["spool"], parents, create=True)
        try:
            return own_dir(self.fs, parent, last, done, 0o777)
        finally:
            os.close(parent)

    def open_claims(self, node: str) -> None:
        """This node's claim folder, locked (an exclusive ``flock`` held until :meth:`close`):
        a second daemon with the same ``node_id`` on this spool would resume the first one's
        claims as its own. Claims left directly in the claim root by a version without node
        folders are then moved into it (keeping their names, so their committed offsets still
        apply)."""
        self.open()
        if self._node == node:
            return
        if node in (".", ".."):
            raise SpoolError(f"node_id {node!r} cannot name a claim folder")
        root = self._fds["root"]
        self.claim_dir = os.path.join(self.spool, CLAIM_DIR, node)
        claims = own_dir(self.fs, root, node, self.claim_dir)
        try:
            if not try_lock(claims):
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
        # Never scanned as a spool folder, even renamed out of the claim root by a producer.
        held = os.fstat(claims)
        self._own.add((held.st_dev, held.st_ino))
        with os.scandir(root) as entries:
            legacy = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
        for name in legacy:
            with suppress(FileNotFoundError):  # another daemon adopted it first
                os.rename(name, name, src_dir_fd=root, dst_dir_fd=self._fds["claims"])
                log.info("%s: adopted %s from the claim folder's old layout", self.spool, name)
        if legacy:
            self.fs.fsync_dir_fd(self._fds["claims"])
            self.fs.fsync_dir_fd(root)

    def close(self) -> None:
        """Close the folders (releasing the claim folder's lock)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._node = None

    def _folder(self, key: str) -> tuple[int, str, bool]:
        """The folder holding the file a token names, the file's name, and whether the folder
        was opened for this call (and must be closed)."""
        node, _, name = key.rpartition("/")
        if not node:
            return self._fds["root"], name, False
        if node == self._node:
            return self._fds["claims"], name, False
        return open_dir(node, self._fds["root"]), name, True

    def finish(
        self,
        key: str,
        rejected: str | None,
        read: Sequence[int] | None = None,
        offset: int = 0,
    ) -> None:
        """Delete the claimed file ``key`` (``node/claim``) whose records are all published, or
        move it into ``done_dir``, or (``rejected``: why) into the rejected folder; durably.
        Idempotent: a file already gone is done.

        ``read`` is the file's size and modification time when its end was read (``offset`` in
        its decompressed stream). The file is checked against it at the moment of finishing,
        under a read lease where the kernel grants one (so no process has it open for writing
        until it is gone): one that changed since, or is still open for writing, is not
        finished but renamed to be read on from ``offset`` (:meth:`_read_on`). A finish that
        cannot be done as configured is done another way (:meth:`_finish_otherwise`); only a
        failed fsync (:class:`DurabilityError`) is raised."""
        if not valid_key(key):
            log.error("%s: a token names %r, not a claim: ignored", self.spool, key)
            return
        self.open()  # acks may come after close (redone, say)
        try:
            folder, claim, opened = self._folder(key)
        except OSError as e:
            if not isinstance(e, FileNotFoundError):
                log.error("%s: cannot open the claim folder of %s: %s", self.spool, key, e)
            return
        try:
            self._finish_in(folder, claim, rejected, read, offset)
        finally:
            if opened:
                os.close(folder)
        self._crash_point("after-spool-ack")

    def _finish_in(
        self,
        folder: int,
        claim: str,
        rejected: str | None,
        read: Sequence[int] | None,
        offset: int,
    ) -> None:
        shown = printable(original(claim))
        try:
            fd = os.open(claim, _CHECK_FLAGS, dir_fd=folder)
        except FileNotFoundError:
            return
        except OSError:
            fd = -1  # a symlink or a FIFO planted under a claim name, say: finished unread
        try:
            writers = _lease(fd) if fd >= 0 else None
            try:
                st = (
                    os.fstat(fd)
                    if fd >= 0
                    else os.stat(claim, dir_fd=folder, follow_symlinks=False)
                )
            except FileNotFoundError:
                return
            if rejected is None and read is not None:
                why = _changed(st, read, writers)
                rewritten = _rewritten(fd, st, read)
                if rewritten:
                    why = "was rewritten after its end was read (the bytes it ended on differ)"
                if why:
                    self._read_on(folder, claim, shown, st, read, offset, why, rewritten)
                    return
            try:
                if rejected is not None:
                    self._set_aside(folder, claim, shown, rejected)
                elif self.config.on_done == "delete":
                    os.unlink(claim, dir_fd=folder)
                else:
                    self._move_done(folder, claim)
            except DurabilityError:
                raise
            except OSError as e:
                self._finish_otherwise(folder, claim, shown, e)
                return
            self._sync(folder)
        finally:
            if fd >= 0:
                if writers is not None:
                    with suppress(OSError):
                        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
                os.close(fd)

    def _read_on(
        self,
        folder: int,
        claim: str,
        shown: str,
        st: os.stat_result,
        read: Sequence[int],
        offset: int,
        why: str,
        rewritten: bool,
    ) -> None:
        """Keep a claim that changed after its end was read: renamed to be read on from
        ``offset`` (:func:`.spool_names.resumed_name`), or, where reading on cannot give what
        the producer meant (a file cut shorter or ``rewritten``, a whole-file event), set aside
        whole."""
        if self._ctx is not None and claim not in self._waiting:
            self._ctx.count_refused("grew_after_publish")
        if st.st_size < read[0]:
            reason = f"cut from {read[0]} to {st.st_size} bytes after it was read and published"
        elif rewritten:
            reason = why
        elif self.config.format == "whole-file":
            reason = f"{why} (a whole-file event was published before the change)"
        else:
            resumed = resumed_name(claim, offset)
            if resumed == claim:
                if claim not in self._waiting:
                    self._waiting.add(claim)
                    log.warning("%s: %s %s: not finished, read on", self.spool, shown, why)
                return
            try:
                os.rename(claim, resumed, src_dir_fd=folder, dst_dir_fd=folder)
            except OSError as e:
                reason = f"{why}, and it cannot be renamed to be read on ({e.strerror})"
            else:
                self._waiting.discard(claim)
                self._sync(folder)
                log.warning(
                    "%s: %s %s: read on from byte %d (producers must write elsewhere and "
                    "rename the finished file into the spool)",
                    self.spool,
                    shown,
                    why,
                    offset,
                )
                return
        self._waiting.discard(claim)
        self._finish_otherwise(folder, claim, shown, None, reason)

    def _finish_otherwise(
        self,
        folder: int,
        claim: str,
        shown: str,
        error: OSError | None,
        reason: str = "",
    ) -> None:
        """A finished claim that cannot be deleted or moved as configured (``error``), or must
        be kept (``reason``): set aside into the rejected folder with why; failing that, renamed
        in its claim folder to a hidden name no scan reads (``.unfinished-<claim>``); failing
        that too, left and not tried again by this process (logged, counted)."""
        if error is not None:
            reason = f"read and published, but could not be {self._done_verb()}: {error}"
        if self._ctx is not None:
            self._ctx.count_refused("unfinished")
        try:
            if self._set_aside(folder, claim, shown, reason):
                log.warning("%s: %s %s: kept in %s", self.spool, shown, reason, REJECT_DIR)
                return
        except DurabilityError:
            raise
        except OSError as e:
            log.error("%s: %s: cannot set it aside either (%s)", self.spool, shown, e)
        hidden = f".unfinished-{claim}"[:NAME_MAX]
        try:
            os.rename(claim, hidden, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError as e:
            self._stuck.add(claim)
            log.error(
                "%s: %s (%s) cannot be renamed either (%s): left", self.spool, shown, reason, e
            )
            return
        self._sync(folder)
        log.error("%s: %s (%s): kept in the claim folder as %s", self.spool, shown, reason, hidden)

    def _done_verb(self) -> str:
        return "deleted" if self.config.on_done == "delete" else "moved into done_dir"

    def _sync(self, fd: int) -> None:
        """fsync a folder; a failure stops the daemon (:class:`DurabilityError`), never retried."""
        try:
            self.fs.fsync_dir_fd(fd)
        except OSError as e:
            raise DurabilityError(f"{self.spool}: fsync of a spool folder failed: {e}") from e

    def _move_done(self, folder: int, claim: str) -> None:
        *parents, name = original(claim).split("/")
        dst = open_path(self._fds["done"], parents, create=True)
        try:
            with suppress(FileNotFoundError):
                os.stat(name, dir_fd=dst, follow_symlinks=False)
                name = f"{name}.{claim.split('-', 1)[0]}"
            os.rename(claim, name, src_dir_fd=folder, dst_dir_fd=dst)
            self._sync(dst)
        finally:
            os.close(dst)

    def _set_aside(
        self, folder: int, name: str, shown: str, reason: str, as_name: str = ""
    ) -> bool:
        """Move ``name`` from ``folder`` into the rejected folder (as ``as_name``, if given; a
        name taken there gets a numbered suffix) and record why; ``False`` if it was gone."""
        target = as_name or name
        rejected = self._fds["rejected"]
        for n in range(1, 1000):
            try:
                os.stat(target, dir_fd=rejected, follow_symlinks=False)
            except FileNotFoundError:
                break
            target = f"{as_name or name}"[: NAME_MAX - 8] + f".{n}"
        try:
            os.rename(name, target, src_dir_fd=folder, dst_dir_fd=rejected)
        except FileNotFoundError:
            return False
        line = {
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "source": self.config.name,
            "file": printable(target),
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
        self._sync(rejected)
        self._sync(folder)
        return True

    def check_held(self) -> None:
        """Every folder held open since start is still the one its path names: the spool, the
        claim folders' parent, this node's claim folder, the rejected folder and ``done_dir``.

        A folder of the daemon's inside the spool that was renamed within it (a producer
        renaming a ``.tfrecordd-*`` folder) is renamed back, counted as ``folder_moved``. One
        deleted, moved out of the spool, replaced by a folder that is not empty, and the spool
        itself or a ``done_dir`` outside it changed at all, stop the daemon
        (:class:`DurabilityError`, exit 74): claims, finished and rejected files would go on
        into a folder nobody sees. A restart makes and reads the ones there now."""
        spool = self.spool
        held = [
            ("spool", spool, "the spool directory", True),
            ("root", os.path.join(spool, CLAIM_DIR), "the claim folder", False),
            ("claims", self.claim_dir, "this node's claim folder", False),
            ("rejected", self.reject_dir, "the rejected folder", False),
            ("done", self.done_dir, "done_dir", not self._done_inside()),
        ]
        for key, path, what, follow in held:
            fd = self._fds.get(key)
            if fd is None or _same(fd, path, follow):
                continue
            if key != "spool" and not follow and self._put_back(key, fd, path):
                log.warning("%s: %s was moved within the spool: put back", path, what)
                if self._ctx is not None:
                    self._ctx.count_refused("folder_moved")
                continue
            raise DurabilityError(
                f"{path}: {what} was removed or replaced while the daemon ran; stopping "
                "(a restart makes and reads the one there now; claims in the old one stay "
                "there)"
            )

    def _put_back(self, key: str, fd: int, path: str) -> bool:
        """Find the held folder ``fd`` in the spool (a bounded walk, no symlink followed) and
        rename it back to ``path``; whether it is there again."""
        held = os.fstat(fd)
        if held.st_nlink == 0:
            return False
        found = _find_folder(self._fds["spool"], (held.st_dev, held.st_ino))
        if found is None:
            return False
        rel = os.path.relpath(path, self.spool).split(os.sep)
        target_parent = self._fds["root"] if key == "claims" else None
        src = open_path(self._fds["spool"], found[:-1])
        try:
            dst = (
                target_parent
                if target_parent is not None
                else open_path(self._fds["spool"], rel[:-1])
            )
            try:
                try:
                    os.rename(found[-1], rel[-1], src_dir_fd=src, dst_dir_fd=dst)
                except OSError:
                    return False
                self._sync(dst)
                self._sync(src)
            finally:
                if dst is not target_parent:
                    os.close(dst)
        finally:
            os.close(src)
        return _same(fd, path, False)

    def _done_inside(self) -> bool:
        rel = os.path.relpath(os.path.abspath(self.done_dir), os.path.abspath(self.spool))
        return not (rel in (".", os.pardir) or rel.startswith(os.pardir + os.sep))

    def pending(self, ctx: SourceContext, skip: Container[str]) -> list[str]:
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
            if key in skip or claim in self._stuck or claim.startswith("."):
                continue
            try:
                claim.encode()
            except UnicodeEncodeError:
                shown = printable(original(claim))
                self.refuse(ctx, folder, claim, shown, "bad_name", "a claim name that is not UTF-8")
                continue
            out.append(claim)
        return out

    def refuse(
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
            self._stuck.add(name)
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
            folders = [("", os.open(".", DIR_FLAGS, dir_fd=self._fds["spool"]))]
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
            log.warning("%s: cannot list %s: %s", ctx.name, printable(rel_dir) or self.spool, e)
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
                        folders.append((rel, open_dir(name, fd)))
                    continue
                if name.endswith(TEMP_SUFFIXES) or not fnmatch.fnmatchcase(
                    name, self.config.pattern
                ):
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:  # gone, or replaced by something that is not a folder
                continue
            if not stat.S_ISREG(st.st_mode):
                if rel not in self.refused:
                    self.refused.add(rel)
                    ctx.count_refused("not_regular_file")
                    log.warning("%s: %s is not a regular file; refused", ctx.name, printable(rel))
                continue
            found.append((st.st_mtime, rel_dir, name, (st.st_size, st.st_mtime_ns)))

    def claim_new(self, ctx: SourceContext) -> list[str]:
        """Rename new files into this node's claim folder: the rename decides which daemon
        gets a file another one is claiming too. A name that cannot become a claim name is
        moved aside, once."""
        claimed: list[str] = []
        claims = self._fds["claims"]
        folders: dict[str, int] = {}
        try:
            for rel_dir, name, seen in self._candidates(ctx):
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if rel in self.refused:
                    continue
                ns = time.time_ns()
                claim = claim_name(ns, rel)
                try:
                    if rel_dir not in folders:
                        if len(folders) >= _HELD_FOLDERS:
                            _close_synced(self.fs, folders)
                        parts = rel_dir.split("/") if rel_dir else []
                        folders[rel_dir] = open_path(self._fds["spool"], parts)
                    size = len(claim.encode())
                    if size > NAME_MAX:
                        raise OSError(errno.ENAMETOOLONG, f"{size} bytes, over {NAME_MAX}")
                    os.rename(name, claim, src_dir_fd=folders[rel_dir], dst_dir_fd=claims)
                except FileNotFoundError:  # gone: claimed by another daemon, say
                    continue
                except OSError as e:
                    self.refused.add(rel)
                    if e.errno == errno.ENAMETOOLONG:
                        digest = hashlib.sha256(os.fsencode(rel)).hexdigest()[:16]
                        reason = f"name too long to claim ({e.strerror})"
                        as_name = f"{ns:020d}-{digest}.name-too-long"
                        self.refuse(
                            ctx,
                            folders[rel_dir],
                            name,
                            printable(rel),
                            "name_too_long",
                            reason,
                            as_name,
                        )
                    else:
                        ctx.count_refused("unclaimable")
                        log.error("%s: cannot claim %s: %s", ctx.name, printable(rel), e)
                    continue
                self._crash_point("after-claim")
                claimed.append(claim)
                self.seen[claim] = seen
            if claimed:
                self.fs.fsync_dir_fd(claims)
        finally:
            _close_synced(self.fs, folders)
        return claimed


def _lease(fd: int) -> bool | None:
    """Take a read lease on ``fd``: ``True`` if taken (no process has the file open for
    writing, and none can open it so until the lease is released), ``False`` if a writer has
    it open, ``None`` where leases are not to be had (another user's file without
    ``CAP_LEASE``, a file system without them, not Linux): then the size and modification time
    are all that is checked. A writer that opens the file while the lease is held waits for its
    release; the kernel tells the holder with ``SIGURG`` (ignored by default) instead of
    ``SIGIO`` (which would end the process)."""
    if sys.platform != "linux":
        return None
    try:
        fcntl.fcntl(fd, _F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EBUSY):
            return False
        return None
    return True


def _same(fd: int, path: str, follow: bool) -> bool:
    """Whether ``path`` still names the folder held open as ``fd``."""
    was = os.fstat(fd)
    try:
        now = os.stat(path, follow_symlinks=follow)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (was.st_dev, was.st_ino)


_FIND_LIMIT = 10_000
"""Folders looked through, at most, to find one of the daemon's renamed within the spool."""


def _find_folder(spool: int, ident: tuple[int, int]) -> list[str] | None:
    """The path (components below ``spool``) of the folder whose device and inode are
    ``ident``, or ``None``; never through a symlink, and at most ``_FIND_LIMIT`` folders."""
    queue: list[list[str]] = [[]]
    looked = 0
    while queue and looked < _FIND_LIMIT:
        parts = queue.pop(0)
        looked += 1
        try:
            fd = open_path(spool, parts)
        except OSError:
            continue
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    try:
                        if not entry.is_dir(follow_symlinks=False):
                            continue
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) == ident:
                        return [*parts, entry.name]
                    queue.append([*parts, entry.name])
        except OSError:
            continue
        finally:
            os.close(fd)
    return None


def _rewritten(fd: int, st: os.stat_result, read: Sequence[int]) -> bool:
    """Whether the bytes the reading ended on (``read``: size, modification time and
    :func:`.spool_reading.tail_digest` then) are gone from a file at least that long: a file
    rewritten, not appended to (one of the same size, too, within the file system's timestamp
    granularity)."""
    if len(read) < 3 or fd < 0 or st.st_size < read[0]:
        return False
    return tail_digest(fd, int(read[0])) != int(read[2])


def _changed(st: os.stat_result, read: Sequence[int], writers: bool | None) -> str:
    """Why a claim is not finished as it is: what changed since its end was read (``read``:
    size and modification time then), or a writer that still has it open; ``""`` if neither."""
    size, mtime = int(read[0]), int(read[1])
    if st.st_size != size:
        return f"changed after its end was read ({size} bytes then, {st.st_size} now)"
    if st.st_mtime_ns != mtime:
        return "was modified after its end was read"
    if writers is False:
        return "is still open for writing"
    return ""
