"""One daemon per ``state_dir``: an exclusive ``flock`` held on ``state_dir/lock`` while it runs;
and one per node id on an output: a ``flock`` on the node's staging folder (the spool source
takes the same kind of lock on its node's claim folder, with :func:`try_lock`).

Two daemons on one ``state_dir`` would share a journal and discard each other's in-progress
shards. The lock is taken before recovery reads anything and released when the process ends,
however it ends (the kernel drops a dead process's locks), so a daemon killed with SIGKILL
never leaves a stale lock behind. The lock file holds the holder's PID, for the error message.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os

from tfrecordd.errors import EXIT_IO, StateInUseError, TfrecorddError
from tfrecordd.fsys import try_lock

LOCK = "lock"


class StateLockError(TfrecorddError):
    """The lock file cannot be opened (a symlink planted in its place, permissions, I/O)."""

    exit_code = EXIT_IO


def acquire(state_dir: str) -> int:
    """Lock ``state_dir`` for this process; returns the lock's descriptor (close it to release).

    Raises :class:`StateInUseError` if another process holds it."""
    path = os.path.join(state_dir, LOCK)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    except OSError as e:
        raise StateLockError(f"cannot open the lock file {path}: {e.strerror or e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = _holder(fd)
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        raise StateInUseError(
            f"state_dir {state_dir} is in use by another tfrecordd"
            f"{f' (pid {holder})' if holder else ''}: one daemon per state_dir; stop that one"
            " or give this one a state_dir of its own"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def acquire_folder(path: str, node_id: str) -> int:
    """Lock node ``node_id``'s staging folder ``path`` for this process; returns the folder's
    descriptor (close it to release). Two daemons with one ``node_id`` on one output, each with
    its own ``state_dir``, would discard each other's in-progress shards at recovery: the second
    gets :class:`StateInUseError`."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not try_lock(fd):
            raise StateInUseError(
                f"node_id {node_id} is in use by another tfrecordd writing to {path}: node ids"
                " must be unique among the daemons sharing an output"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def holder(state_dir: str) -> str | None:
    """Who holds the lock on ``state_dir`` now: the holder's PID as its lock file says it
    (``""`` if it says none), or ``None`` if no process holds it. Reads only: the lock file is
    neither created nor written, so a ``state check`` beside a running daemon changes nothing."""
    path = os.path.join(state_dir, LOCK)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None  # no lock file: no daemon ever started here, none runs now
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            return _holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def held_by_other(state_dir: str) -> bool:
    """Whether a live process (another daemon) holds the lock on ``state_dir`` now."""
    try:
        fd = acquire(state_dir)
    except StateInUseError:
        return True
    except StateLockError:
        return False
    os.close(fd)
    return False


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return ""
