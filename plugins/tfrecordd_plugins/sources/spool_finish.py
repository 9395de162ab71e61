"""Finishing a claimed spool file once its records are published: deleted, moved into
``done_dir``, or set aside; and never while it differs from what was read.

A file is finished only if it is still what was read: its size, modification time and the
CRC-32C of the last bytes read (recorded in the token of the batch that carried its end) are
compared at the moment of finishing, under a read lease where the kernel grants one (no
process has it open for writing until it is gone). A file appended to since is renamed to be
read on from its published offset; one cut or rewritten is set aside whole. A finish that
cannot be done as configured is done another way, never retried for ever.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Sequence
from contextlib import suppress

from tfrecordd.plugin import DurabilityError
from tfrecordd_plugins.sources.spool_folders import open_dir, open_path
from tfrecordd_plugins.sources.spool_held import HeldFolders
from tfrecordd_plugins.sources.spool_names import (
    NAME_MAX,
    REJECT_DIR,
    original,
    printable,
    resumed_name,
    valid_key,
)
from tfrecordd_plugins.sources.spool_reading import release_lease, tail_digest, take_lease

log = logging.getLogger("tfrecordd_plugins.sources.directory")  # the source's one logger

_CHECK_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Finishing(HeldFolders):
    """The spool's folders, and the finishing of the files claimed in them."""

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
        part: bool = False,
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
        failed fsync (:class:`DurabilityError`) is raised. ``part``: the reading stopped before
        a last line without its line end; a file found unchanged is renamed to have that line
        read (:meth:`_read_rest`), and finished after."""
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
            self._finish_in(folder, claim, rejected, read, offset, part)
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
        part: bool,
    ) -> None:
        shown = printable(original(claim))
        leased: bool | None = None
        try:
            fd = os.open(claim, _CHECK_FLAGS, dir_fd=folder)
        except FileNotFoundError:
            return
        except OSError as e:
            fd = -1  # a symlink or a FIFO planted under a claim name, say: finished unread
            if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                leased = False  # a writer holds a write lease on it (Samba's oplocks, say)
        try:
            writers = take_lease(fd) if fd >= 0 else leased
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
            if rejected is None and part:
                self._read_rest(folder, claim, shown, offset, read)
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
            self._waiting.discard(claim)
            if claim in self.left:  # finished at last (redone by a recovery, say)
                self.left.discard(claim)
                self._save_left()
        finally:
            if fd >= 0:
                if writers is not None:
                    release_lease(fd)
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
            resumed = resumed_name(claim, offset, check=_check_of(read))
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

    def _read_rest(
        self, folder: int, claim: str, shown: str, offset: int, read: Sequence[int] | None
    ) -> None:
        """A file still and closed whose last line has no line end: renamed so that reading
        takes that line as it is (:func:`.spool_names.resumed_name` with ``final``)."""
        final = resumed_name(claim, offset, final=True, check=_check_of(read))
        try:
            os.rename(claim, final, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError as e:
            reason = f"its last line has no line end and it cannot be renamed to read it ({e})"
            self._finish_otherwise(folder, claim, shown, None, reason)
            return
        self._sync(folder)
        log.info(
            "%s: %s ends without a line end: its last line is read as it is", self.spool, shown
        )

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
        that too, left where it is, and recorded as finished (:meth:`leave`) so that no start
        reads it again (logged, counted)."""
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
            self.leave(claim)
            log.error(
                "%s: %s (%s) cannot be renamed either (%s): left, and recorded as finished "
                "so that no start reads it again",
                self.spool,
                shown,
                reason,
                e,
            )
            return
        self._sync(folder)
        log.error("%s: %s (%s): kept in the claim folder as %s", self.spool, shown, reason, hidden)

    def _done_verb(self) -> str:
        return "deleted" if self.config.on_done == "delete" else "moved into done_dir"

    def _move_done(self, folder: int, claim: str) -> None:
        *parents, name = original(claim).split("/")
        dst = open_path(self._fds["done"], parents, create=True, sync=self._sync)
        try:
            with suppress(FileNotFoundError):
                os.stat(name, dir_fd=dst, follow_symlinks=False)
                name = f"{name}.{claim.split('-', 1)[0]}"
            os.rename(claim, name, src_dir_fd=folder, dst_dir_fd=dst)
            self._sync(dst)
        finally:
            os.close(dst)


def _check_of(read: Sequence[int] | None) -> tuple[int, int] | None:
    """What a resumed read checks the file against (:func:`.spool_names.resumed_name`): its
    size and tail digest as read, if the token recorded them."""
    return (int(read[0]), int(read[2])) if read is not None and len(read) > 2 else None


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
