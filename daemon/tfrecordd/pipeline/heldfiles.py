"""The checks that what the daemon keeps open is still what its path names: the state lock
(locked again at its path if it was removed or replaced) and the staging folders (a moved or
deleted one stops the daemon). :meth:`Daemon.check_held
<tfrecordd.pipeline.runtime.Daemon.check_held>` runs them once a second."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from tfrecordd.errors import DurabilityError, StateInUseError
from tfrecordd.metrics import Metrics
from tfrecordd.outputs.output import Output
from tfrecordd.state import statelock

__all__ = ["changed", "check_staging", "relock_state"]

log = logging.getLogger("tfrecordd")


def relock_state(state_dir: str, fd: int, metrics: Metrics) -> int:
    """The state lock's descriptor: ``fd``, or a new one if the lock file was removed or
    replaced (``fd`` closed then); :class:`DurabilityError` if another daemon took it since."""
    path = os.path.join(state_dir, statelock.LOCK)
    what = changed(fd, path)
    if what is None:
        return fd
    try:
        new = statelock.acquire(state_dir)
    except StateInUseError as e:
        raise DurabilityError(
            f"{path} was {what} while the daemon ran, and another tfrecordd has locked "
            "state_dir since: one daemon per state_dir; stopping"
        ) from e
    os.close(fd)
    log.warning("%s was %s while the daemon ran: locked again", path, what)
    metrics.watch_repairs.labels("state_lock").inc()
    return new


def check_staging(node_locks: Mapping[str, int], outputs: Mapping[str, Output]) -> None:
    """:class:`DurabilityError` if a dataset's staging folder (locked as ``node_locks`` holds)
    was moved or deleted."""
    for name, fd in node_locks.items():
        staging = outputs[name].staging_dir
        what = changed(fd, staging, follow=True)
        if what is not None:
            # Not made again: the open shards are in the old folder, and the node's lock too.
            raise DurabilityError(
                f"{staging}: the staging folder was {what} (dataset {name}) while the "
                "daemon ran (the output directory moved or deleted?); no shard can be "
                "published from it; stopping. Nothing of its open shards was acknowledged "
                "since the last commit: it replays at the next start"
            )


def changed(fd: int, path: str, *, follow: bool = False) -> str | None:
    """``"removed"`` or ``"replaced"`` if ``path`` no longer names the file open as ``fd``."""
    held = os.fstat(fd)
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "removed"
    if (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino):
        return "replaced"
    return None
