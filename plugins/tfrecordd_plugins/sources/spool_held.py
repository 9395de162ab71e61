"""The spool's folders the directory source holds open, and the watch that they stay so.

The spool is opened once, at start, and every folder below it is opened relative to a held
descriptor, never following a symlink (``O_NOFOLLOW``): anyone who can write into the spool can
rename the daemon's folders or plant files there. The claim, node, rejected and (inside the
spool) done folders must be real directories owned by the daemon's user (else
:class:`SpoolError`), and the node's claim folder is locked while the source runs. Claims left
directly in ``.tfrecordd-claimed/`` by a version without node folders are adopted, under their
names, by the first daemon to start. :meth:`HeldFolders.check_held` checks, once a second, that
each folder is still the one its path names: one renamed within the spool is put back, any
other change stops the daemon (exit 74). Files are set aside into the rejected folder here,
with their reason recorded (``.reasons.jsonl`` there).
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
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
    write_atomically,
)
from tfrecordd_plugins.sources.spool_folders import (
    DIR_FLAGS,
    SpoolError,
    open_path,
    own_dir,
)
from tfrecordd_plugins.sources.spool_names import (
    CLAIM_DIR,
    NAME_MAX,
    REASONS,
    REJECT_DIR,
    printable,
)

log = logging.getLogger("tfrecordd_plugins.sources.directory")  # the source's one logger

LEFT = "left.json"
"""In the source's state folder: the claims read and published that could not be finished."""
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


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


class HeldFolders:
    """The spool's folders, held open from start (blocking calls: the source runs them in
    worker threads)."""

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
        self.left: set[str] = set()
        self._left_read = False
        """Claims read and published that could not be finished in any way (:meth:`leave`)."""
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
        done = os.path.abspath(self.done_dir)
        if not self._done_inside():
            os.makedirs(done, exist_ok=True)
            return os.open(done, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        *parents, last = os.path.relpath(done, os.path.abspath(self.spool)).split(os.sep)
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
        self._load_left()
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

    def leave(self, claim: str) -> None:
        """Record that ``claim``, read and published, could not be finished in any way and is
        left in the claim folder: :meth:`pending` never offers it again, in this process or the
        next (``left.json`` in the source's own state folder)."""
        if not self._left_read:  # left during recovery, before open_claims read the record
            self.left |= set(self._read_left())
        self.left.add(claim)
        self._save_left()

    def _left_path(self) -> str | None:
        if self._ctx is None:
            return None
        return os.path.join(self._ctx.state_dir, LEFT)

    def _read_left(self) -> list[str]:
        """The claims ``left.json`` names (none without it), its folder made durable first."""
        self._left_read = True
        path = self._left_path()
        if path is None:
            return []
        try:
            # Written by a process killed before its folder's fsync, it is not durable yet.
            self.fs.fsync_dir(os.path.dirname(path))
            with open(path, "rb") as f:
                return [str(n) for n in json.loads(f.read())]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError) as e:
            raise SpoolError(f"{path}: cannot be read ({e}); move it aside and restart") from e

    def _load_left(self) -> None:
        names = self._read_left()
        if not names:
            return
        present = set(os.listdir(self._fds["claims"]))
        self.left = {str(n) for n in names if n in present}
        if len(self.left) != len(names):
            self._save_left()

    def _save_left(self) -> None:
        path = self._left_path()
        if path is None:
            return
        try:
            write_atomically(self.fs, path, json.dumps(sorted(self.left)).encode())
        except OSError as e:
            raise DurabilityError(f"{path}: cannot record the claims left: {e}") from e

    def close(self) -> None:
        """Close the folders (releasing the claim folder's lock)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._node = None

    def _sync(self, fd: int) -> None:
        """fsync a folder; a failure stops the daemon (:class:`DurabilityError`), never retried."""
        try:
            self.fs.fsync_dir_fd(fd)
        except OSError as e:
            raise DurabilityError(f"{self.spool}: fsync of a spool folder failed: {e}") from e

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
            f = os.fdopen(os.open(REASONS, _APPEND_FLAGS, 0o600, dir_fd=rejected), "ab", 0)
        except OSError as e:
            log.error("%s: cannot record why %s was rejected: %s", self.reject_dir, shown, e)
        else:
            with f:
                try:
                    self.fs.write(f, json.dumps(line).encode() + b"\n")
                except OSError as e:  # a full disk, say: the file is kept, its reason is not
                    log.error(
                        "%s: cannot record why %s was rejected: %s", self.reject_dir, shown, e
                    )
                else:
                    try:
                        self.fs.fsync(f)
                    except OSError as e:
                        raise DurabilityError(
                            f"{self.reject_dir}/{REASONS}: fsync failed: {e}"
                        ) from e
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
                f"{path}: {what} was removed, replaced, or moved where the daemon cannot find "
                f"it (out of the spool, or past its first {_FIND_LIMIT:,} folders) while the "
                "daemon ran; stopping "
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
        """Whether ``done_dir`` lies inside the spool (then it is one of the daemon's folders
        there, reached from the spool's descriptor)."""
        rel = os.path.relpath(os.path.abspath(self.done_dir), os.path.abspath(self.spool))
        return not (rel in (".", os.pardir) or rel.startswith(os.pardir + os.sep))


def _same(fd: int, path: str, follow: bool) -> bool:
    """Whether ``path`` still names the folder held open as ``fd``."""
    was = os.fstat(fd)
    try:
        now = os.stat(path, follow_symlinks=follow)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (was.st_dev, was.st_ino)


_FIND_LIMIT = 1_000_000
"""Folders looked through, at most, to find one of the daemon's renamed within the spool."""


def _find_folder(spool: int, ident: tuple[int, int]) -> list[str] | None:
    """The path (components below ``spool``) of the folder whose device and inode are
    ``ident``, or ``None``; never through a symlink, and at most ``_FIND_LIMIT`` folders."""
    queue: deque[list[str]] = deque([[]])
    looked = 0
    while queue and looked < _FIND_LIMIT:
        parts = queue.popleft()
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
