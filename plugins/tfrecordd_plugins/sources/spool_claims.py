"""Claiming: files claimed into this node's folder, and claims not yet read.

:class:`Claims` finds the regular files that match, claims each by renaming it into the node's
folder (the rename decides which daemon gets a file), and hands the source the claims it has not
read to their end; finishing them is :mod:`.spool_finish`'s, and the folders are
:mod:`.spool_held`'s. Each rename is made durable by fsyncing the folders it touched. Only
regular files are claimed (a symlink, FIFO or device that matches is counted, logged once and
left in place); a claim that cannot be opened, or a name too long to claim, is set aside once.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import logging
import os
import stat
import time
from collections.abc import Container

from tfrecordd.plugin import FileSystem, SourceContext
from tfrecordd_plugins.sources.spool_finish import Finishing
from tfrecordd_plugins.sources.spool_folders import DIR_FLAGS, open_dir, open_path
from tfrecordd_plugins.sources.spool_held import ClaimSettings
from tfrecordd_plugins.sources.spool_names import (
    NAME_MAX,
    REJECT_DIR,
    TEMP_SUFFIXES,
    claim_name,
    original,
    printable,
)

__all__ = ["ClaimSettings", "Claims"]

log = logging.getLogger("tfrecordd_plugins.sources.directory")  # the source's one logger

_HELD_FOLDERS = 64
"""Spool folders held open at once while claiming (each is fsynced when closed)."""


def _close_synced(fs: FileSystem, folders: dict[str, int]) -> None:
    """fsync (a claim renamed out of them must stay out after a power cut) and close."""
    try:
        for fd in folders.values():
            fs.fsync_dir_fd(fd)
    finally:
        for fd in folders.values():
            os.close(fd)
        folders.clear()


class Claims(Finishing):
    """The spool's folders, held open from start, and the files claimed, finished or set aside
    in them (blocking calls: the source runs them in worker threads)."""

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
            if key in skip or claim in self._stuck or claim in self.left or claim[0] == ".":
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
            ctx.mark_down(f"cannot list {self.spool}: {e}")
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
            if not rel_dir:  # the spool itself: the source reads nothing until it can
                ctx.mark_down(f"cannot list {self.spool}: {e}")
            else:
                log.warning("%s: cannot list %s: %s", ctx.name, printable(rel_dir), e)
            return
        if not rel_dir:
            ctx.mark_up()
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
