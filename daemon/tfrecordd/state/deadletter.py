"""The dead-letter file: bad events with their raw bytes, reason, source and position.

One JSON object per line in ``state_dir/dead-letters.jsonl``: ``time``, ``source``, ``where``,
``reason`` (a short category), ``detail``, and the raw bytes as ``raw`` (UTF-8 text) or
``raw_base64``. The file is fsynced before the commit that acknowledges the positions of the
events it holds, so a dead letter is never acknowledged without being durable. Each commit's
intent also records where the file ended at its cut (:meth:`DeadLetters.end`): the dead letters
after it belong to batches that no commit covers, whose events replay after a crash and are
dead-lettered again, so recovery cuts them off first (:func:`cut_uncommitted`), and a dead
letter is written once. A file rotated, moved away or replaced since keeps its lines (they may
then repeat, never go missing). When the file passes its size cap it becomes
``dead-letters.jsonl.1`` (replacing the previous one, whose lines are counted as discarded).

The path is watched like the journal: before each write, before each fsync and at the daemon's
periodic check, it must still name the open file. An operator who removes the file (after
replaying it) or puts another in its place gets a file at the path again at once. The dead
letters written since the last check may have gone to the old file: if it was removed, they are
copied into the new one, so that none is written only to a file nobody can read; if it was
moved away (still linked), they stay in it, where the operator reads them.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import orjson

from tfrecordd.errors import DurabilityError
from tfrecordd.fsys import FileSystem, read_nofollow

NAME = "dead-letters.jsonl"

log = logging.getLogger(__name__)


def dead_letter_error(path: str, e: OSError) -> DurabilityError:
    """The error that stops the daemon when a dead letter cannot be written or synced."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DurabilityError(
            f"{path}: no space left for dead letters (state_dir is full); nothing more is "
            "acknowledged. Free space on its file system and start again: unacknowledged "
            "events replay"
        )
    return DurabilityError(f"{path}: {e.strerror or e}")


def file_end(state_dir: str) -> list[int] | None:
    """Where the dead-letter file in ``state_dir`` ends, as :meth:`DeadLetters.end` says it."""
    try:
        st = os.lstat(os.path.join(state_dir, NAME))
    except FileNotFoundError:
        return []
    except OSError:
        return None  # recovery then cuts nothing: a repeat, never a loss
    return [st.st_dev, st.st_ino, st.st_size]


def cut_uncommitted(fs: FileSystem, state_dir: str, end: Sequence[int]) -> int:
    """Cut the dead-letter file in ``state_dir`` back to ``end`` (from :meth:`DeadLetters.end`
    at the last commit's cut), made durable: the lines after it are those of batches no commit
    covers, which replay. Only the same file is cut (``[]``: there was none, so any file now is
    emptied), and only when it grew; the bytes cut off."""
    path = os.path.join(state_dir, NAME)
    try:
        f = fs.open_existing(path)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    try:
        st = os.fstat(f.fileno())
        dev, ino, size = end or (st.st_dev, st.st_ino, 0)
        if (st.st_dev, st.st_ino) != (dev, ino) or st.st_size <= size:
            return 0
        fs.truncate(f, size)
        fs.fsync(f)
        return st.st_size - size
    finally:
        fs.close(f)


def _whole_lines(f: BinaryIO) -> int:
    """Cut a line left unfinished by a crash off the end of the open file ``f``; its new size.
    Dead letters not yet synced belong to unacknowledged events, which are read and
    dead-lettered again after the restart."""
    size = end = os.fstat(f.fileno()).st_size
    if not size:
        return 0
    fd = os.open(f"/proc/self/fd/{f.fileno()}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        while end > 0:
            start = max(0, end - 65536)
            block = os.pread(fd, end - start, start)
            at = block.rfind(b"\n")
            if at >= 0:
                end = start + at + 1
                break
            end = start
    finally:
        os.close(fd)
    if end != size:
        os.ftruncate(f.fileno(), end)
    return end


class DeadLetters:
    """Appends dead letters; :meth:`sync` makes them durable. Safe to call from several threads
    (a commit syncs while the next batches' dead letters are written)."""

    def __init__(
        self,
        state_dir: str,
        fs: FileSystem,
        max_bytes: int,
        *,
        fsync: bool = True,
        on_repair: Callable[[], None] | None = None,
    ):
        self.path = os.path.join(state_dir, NAME)
        self.on_repair = on_repair
        """Called each time the file was found removed or replaced and made again."""
        self.fs = fs
        self.max_bytes = max_bytes
        self.fsync_enabled = fsync
        self._file: BinaryIO | None = None
        self._size = 0
        self._lines = 0
        self._dirty = False
        self._created = False
        self._failed = False
        self._identity: tuple[int, int] | None = None
        self._unchecked: list[bytes] = []
        """Lines written since the path was last seen to name the open file: they may be in a
        file removed from under the daemon, and are copied into the one made in its place."""
        self._lock = threading.RLock()

    def _open(self) -> BinaryIO:
        if self._failed:
            raise OSError(errno.EIO, "the dead-letter file failed an fsync earlier", self.path)
        if self._file is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._file, self._created = self.fs.open_append(self.path)
            st = os.fstat(self._file.fileno())
            self._identity = (st.st_dev, st.st_ino)
            self._size = _whole_lines(self._file)
            self._lines = 0
        return self._file

    def check(self) -> None:
        """Make sure the path still names the file being written: a file removed or replaced
        since the last check is made again (or the new one opened), and the dead letters
        written since the last check are copied into it. Raises :class:`DurabilityError` if no
        file can be had at the path (``state_dir`` removed, a symlink or FIFO put there)."""
        with self._lock:
            try:
                self._check()
            except OSError as e:
                raise dead_letter_error(self.path, e) from e

    def _check(self) -> None:
        if self._file is None:
            return  # the next write opens whatever the path names then
        held = os.fstat(self._file.fileno())
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) == self._identity:
            if held.st_size < self._size:
                # Emptied in place (``: > dead-letters.jsonl``): appends land at its new end.
                self._size = held.st_size
            self._unchecked.clear()
            return
        self._reopen("removed" if st is None else "replaced")

    def _reopen(self, what: str) -> None:
        if self._failed:
            raise OSError(errno.EIO, "the dead-letter file failed an fsync earlier", self.path)
        old, self._file = self._file, None
        assert old is not None
        # A file still linked somewhere (moved away to be replayed) keeps its lines where the
        # operator reads them; only those of a file removed are copied, or they would be lost.
        try:
            linked = os.fstat(old.fileno()).st_nlink > 0
            if linked and self._unchecked and self.fsync_enabled:
                self.fs.fsync(old)  # their events may be acknowledged once this returns
        finally:
            with contextlib.suppress(OSError):
                old.close()
        # Not through _open: a state_dir removed is not made again here (the journal's check
        # stops the daemon on it).
        self._file, self._created = self.fs.open_append(self.path)
        st = os.fstat(self._file.fileno())
        self._identity = (st.st_dev, st.st_ino)
        self._size = _whole_lines(self._file)
        copied = b"".join(self._unchecked)
        if copied and not linked:
            try:
                self.fs.write(self._file, copied)
            except OSError:
                self._undo_partial(self._file)
                raise
            self._size += len(copied)
            self._dirty = True
        log.warning(
            "%s was %s while the daemon ran: writing to a new file at its path (%d dead "
            "letter(s) written since the last check %s)",
            self.path,
            what,
            len(self._unchecked),
            "left in the file moved away" if linked else "copied into it",
        )
        if linked:
            self._unchecked.clear()
        if self.on_repair is not None:
            self.on_repair()

    def write(self, source: str, where: str, reason: str, detail: str, raw: bytes) -> int:
        """Append one dead letter; returns the number of older dead letters discarded by rotation
        (an estimate for a file left by an earlier run)."""
        entry: dict[str, Any] = {
            "time": time.time(),
            "source": source,
            "where": where,
            "reason": reason,
            "detail": detail,
        }
        try:
            entry["raw"] = raw.decode("utf-8")
        except UnicodeDecodeError:
            entry["raw_base64"] = base64.b64encode(raw).decode("ascii")
        line = orjson.dumps(entry) + b"\n"
        discarded = 0
        with self._lock:
            try:
                self._check()
                f = self._open()
                if self._size and self._size + len(line) > self.max_bytes:
                    discarded = self._rotate()
                    f = self._open()
            except OSError as e:
                raise dead_letter_error(self.path, e) from e
            try:
                self.fs.write(f, line)
            except OSError as e:
                self._undo_partial(f)
                raise dead_letter_error(self.path, e) from e
            self._size += len(line)
            self._lines += 1
            self._dirty = True
            self._unchecked.append(line)
        return discarded

    def _undo_partial(self, f: BinaryIO) -> None:
        """Cut a line written in part (a full disk) back off: the file holds whole lines only.
        If even that fails, the file is never written again."""
        try:
            os.ftruncate(f.fileno(), self._size)
        except OSError:
            self._failed = True

    def _rotate(self) -> int:
        old = self.path + ".1"
        discarded = 0
        with contextlib.suppress(FileNotFoundError):
            discarded = read_nofollow(old).count(b"\n")
        self.sync()
        assert self._file is not None
        self._file.close()
        self._file = None
        os.replace(self.path, old)
        if self.fsync_enabled:
            self.fs.fsync_dir(os.path.dirname(self.path))
        return discarded

    def end(self) -> list[int] | None:
        """Where the dead letters written so far end: ``[device, inode, size]`` of the file,
        ``[]`` if there is none (``None``: not known). A commit's intent records it at the
        commit's cut."""
        with self._lock:
            if self._file is not None and self._identity is not None:
                return [*self._identity, self._size]
        return file_end(os.path.dirname(self.path))

    def sync(self) -> None:
        """Make every dead letter written so far durable. A failed fsync is final: the file is
        never fsynced again (what it held may be gone), and later writes fail."""
        with self._lock:
            if self._dirty and self._file is not None:
                # What is acknowledged after this returns must be in the file the path names.
                try:
                    self._check()
                except OSError as e:
                    raise dead_letter_error(self.path, e) from e
                self._dirty = False
                if self.fsync_enabled:
                    try:
                        self.fs.fsync(self._file)
                        if self._created:
                            self.fs.fsync_dir(os.path.dirname(self.path))
                            self._created = False
                    except OSError:
                        self._failed = True
                        raise

    def close(self) -> None:
        """Sync (unless an fsync failed before) and close."""
        with self._lock:
            try:
                if not self._failed:
                    self.sync()
            finally:
                if self._file is not None:
                    f, self._file = self._file, None
                    with contextlib.suppress(OSError):
                        f.close()
