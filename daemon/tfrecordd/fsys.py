"""The few file-system operations the commit protocol depends on, behind one swappable object.

The shard writer, the journal and the publishing tools do their durable file work through a
:class:`FileSystem`. Production uses :data:`LOCAL`; tests swap in a subclass that injects errors
(EIO on fsync, ENOSPC on write) or simulates a power cut.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterable
from typing import BinaryIO


class FileSystem:
    """Durable local file operations: exclusive create, checked writes, fsyncs, atomic publish."""

    def create_exclusive(self, path: str) -> BinaryIO:
        """Create ``path`` for writing; fail if it exists or is a symlink (O_EXCL, O_NOFOLLOW)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o644)
        return os.fdopen(fd, "wb", buffering=0)

    def open_append(self, path: str) -> tuple[BinaryIO, bool]:
        """Open ``path`` for appending, creating it if missing (never through a symlink, and
        only a regular file).
        Returns the file and whether it was created: a new file's directory entry is durable
        only after :meth:`fsync_dir` of its directory."""
        # O_NONBLOCK: a FIFO put in its place fails to open instead of blocking.
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
            created = False
        except FileNotFoundError:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o640)
            created = True
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", path)
        return os.fdopen(fd, "ab", buffering=0), created

    def open_existing(self, path: str) -> BinaryIO:
        """Open the regular file ``path`` for writing where it stands (never through a
        symlink; nothing is cut)."""
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", path)
        return os.fdopen(fd, "wb", buffering=0)

    def truncate(self, f: BinaryIO, size: int) -> None:
        """Cut ``f`` to ``size`` bytes; what is written next goes there."""
        os.ftruncate(f.fileno(), size)
        f.seek(size)

    def write(self, f: BinaryIO, data: bytes | memoryview) -> None:
        """Write all of ``data``, retrying short writes."""
        view = memoryview(data)
        while view:
            n = f.write(view)
            if n is None:  # pragma: no cover - only non-blocking files return None
                raise OSError(errno.EAGAIN, "write would block")
            view = view[n:]

    def fsync(self, f: BinaryIO) -> None:
        """Flush ``f`` to stable storage. A failure is final for this file: never retry it."""
        f.flush()
        os.fsync(f.fileno())

    def close(self, f: BinaryIO) -> None:
        """Close ``f``; errors propagate (a failed close may mean lost data)."""
        f.close()

    def fsync_dir(self, path: str) -> None:
        """Make the entries of directory ``path`` (creations, renames, removals) durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def fsync_dir_fd(self, fd: int) -> None:
        """:meth:`fsync_dir` of a directory held open as ``fd`` (opened relative to another
        without following symlinks, say)."""
        os.fsync(fd)

    def publish(self, src: str, dst: str) -> None:
        """Atomically give ``src`` the name ``dst``; ``FileExistsError`` if ``dst`` exists.

        ``link`` + ``unlink`` never replaces an existing file; where hard links are not supported,
        falls back to ``rename`` after checking that ``dst`` is absent.
        """
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            if os.path.lexists(dst):
                raise FileExistsError(errno.EEXIST, "already published", dst) from e
            os.rename(src, dst)
            return
        os.unlink(src)

    def replace(self, src: str, dst: str) -> None:
        """Atomically rename ``src`` over ``dst`` (for files tfrecordd owns: checkpoints)."""
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        """Remove ``path`` if it exists."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def try_lock(fd: int) -> bool:
    """Take the exclusive ``flock`` on the open file ``fd`` without waiting; ``False`` if another
    open file (another daemon) holds it. Closing ``fd`` releases it, and so does the end of the
    process, however it ends."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return False
    return True


LOCAL = FileSystem()
"""The real local file system."""


LOCAL_SCHEMES = ("file", "local")
"""URL schemes that name the local file system (fsspec's two names for it)."""


def is_url(location: str) -> bool:
    """Whether ``location`` names a non-local fsspec file system (``s3://``, ``gs://``...):
    plain paths and ``file://`` / ``local://`` URLs are local."""
    scheme, sep, _ = location.partition("://")
    return bool(sep) and scheme not in LOCAL_SCHEMES


def local_path(location: str) -> str:
    """The path a local ``location`` names: ``file:///x`` and ``local:///x`` are ``/x``."""
    scheme, sep, rest = location.partition("://")
    return rest if sep and scheme in LOCAL_SCHEMES else location


def read_nofollow(path: str) -> bytes:
    """The whole content of the regular file ``path``, opened without following a symlink
    (``OSError`` ``ELOOP`` if it is one, ``EINVAL`` if it is not a regular file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def write_file(fs: FileSystem, path: str, parts: Iterable[bytes], *, fsync: bool) -> None:
    """Create ``path`` afresh (removing a copy a crash left) holding ``parts``, fsync it if asked,
    and close it. If writing fails the file is removed: a part-written copy would hold on to the
    space a full disk needs back."""
    fs.remove(path)
    f = fs.create_exclusive(path)
    try:
        try:
            for part in parts:
                fs.write(f, part)
            if fsync:
                fs.fsync(f)
        finally:
            fs.close(f)
    except BaseException:
        fs.remove(path)
        raise


def write_atomically(fs: FileSystem, path: str, data: bytes) -> None:
    """Write a small file so that readers see either the old content or all of ``data``."""
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    write_file(fs, tmp, [data], fsync=True)
    fs.replace(tmp, path)
    fs.fsync_dir(directory)


def sync_folders(fs: FileSystem, root: str, path: str) -> None:
    """Make durable the folders from ``root`` down to ``path``'s own, as far as they exist: each
    is fsynced, and with it its entries (the next folder down, ``path`` itself).

    Call it before acting on a state file found at start: a process killed between a write and
    its fsync (a :func:`write_atomically` before its folder's fsync, a ``mkdir`` before its
    parent's) leaves it readable and not durable, and a later power cut would take it while
    keeping what was done on its word."""
    root = os.path.abspath(root)
    folder = os.path.dirname(os.path.abspath(path))
    levels = [folder]
    while folder != root and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
        levels.append(folder)
    if folder != root:  # not under root: its own folder only
        levels = levels[:1]
    for level in reversed(levels):
        if not os.path.isdir(level):
            return
        fs.fsync_dir(level)
