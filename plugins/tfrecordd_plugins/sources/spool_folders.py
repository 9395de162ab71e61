"""Folders below the spool, opened relative to a held descriptor without following a symlink.

Anyone who can write into the spool can rename the daemon's folders in it or plant a symlink in
their place, so nothing under the spool is reached by path: each component is opened with
``O_NOFOLLOW`` from its parent's descriptor, and a folder the daemon keeps there must be a real
directory owned by the daemon's user (:class:`SpoolError` otherwise).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from tfrecordd.plugin import EXIT_CONFIG, FileSystem, TfrecorddError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""How every folder below the spool is opened: never through a symlink."""


class SpoolError(TfrecorddError):
    """A folder the source keeps in its spool is not a real directory owned by the daemon's user
    (a symlink or another user's folder in its place): refusing to start is safer than trusting
    it. A restart cannot fix it, hence the configuration error's exit status."""

    exit_code = EXIT_CONFIG


def open_dir(name: str, dir_fd: int) -> int:
    """The folder ``name`` in ``dir_fd``, opened without following a symlink."""
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def open_path(
    base: int,
    parts: Sequence[str],
    *,
    create: bool = False,
    mode: int = 0o777,
    sync: Callable[[int], None] | None = None,
) -> int:
    """The folder at ``parts`` below ``base``, each component opened without following a
    symlink (and created first with ``create``; a folder created is made durable in its parent
    by ``sync``, if given: an fsync of the parent's descriptor)."""
    fd = os.open(".", DIR_FLAGS, dir_fd=base)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass
                else:
                    if sync is not None:
                        sync(fd)
            nxt = open_dir(part, fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def own_dir(fs: FileSystem, parent: int, name: str, shown: str, mode: int = 0o700) -> int:
    """The folder ``name`` in ``parent``, created if missing (``parent`` fsynced through ``fs``),
    and checked to be a real directory owned by this process's user."""
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass
    else:
        fs.fsync_dir_fd(parent)
    try:
        fd = open_dir(name, parent)
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
