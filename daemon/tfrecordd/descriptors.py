"""File descriptors kept for the daemon's own files, however many connections clients open.

Every connection a socket source serves holds a descriptor from one budget: ``RLIMIT_NOFILE``
minus :data:`RESERVED`. The reserved descriptors stay for what a commit needs (the shard, the
journal, dead letters, directories to fsync, worker pipes) and for the metrics endpoint's few
connections, so no number of clients can make a commit fail with EMFILE. Accept errors (EMFILE
from elsewhere, ENFILE, ENOBUFS) are survived with :class:`Backoff`.
"""

from __future__ import annotations

import resource

__all__ = ["RESERVED", "Backoff", "release", "reserve_for_shards", "reserved", "scarce", "take"]

RESERVED = 128
"""Descriptors connections may never take: the daemon's own files and the metrics endpoint's
connections (at most ``tfrecordd.metrics.MAX_CONNECTIONS``) use them; and two for each shard the
datasets may hold open at once (:func:`reserve_for_shards`)."""

_held = 0
_shards = 0


def reserve_for_shards(count: int) -> None:
    """Keep two descriptors (the shard, its record offsets) for each of ``count`` shards the
    daemon may hold open at once (the sum of its datasets' ``max_open_shards``)."""
    global _shards
    _shards = 2 * count


def reserved() -> int:
    """The descriptors connections may never take, now."""
    return RESERVED + _shards


def _limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 62 if soft == resource.RLIM_INFINITY else soft


def scarce(fd: int, keep: int | None = None) -> bool:
    """True if a newly opened ``fd`` leaves fewer than ``keep`` descriptors free (default: half
    of :func:`reserved`; they are handed out lowest first, so every one below it is in use)."""
    return fd >= _limit() - (reserved() // 2 if keep is None else keep)


def take(fd: int) -> bool:
    """Count a newly accepted connection's descriptor ``fd`` against the budget; ``False``
    (nothing counted) when the budget is spent or ``fd`` is :func:`scarce`."""
    global _held
    if _held + reserved() >= _limit() or scarce(fd):
        return False
    _held += 1
    return True


def release() -> None:
    """Give back a descriptor counted by :func:`take` (its connection is closed)."""
    global _held
    _held -= 1


class Backoff:
    """Delays between retries of a failing ``accept()``: from 10 ms, doubling, up to 1 s, and
    back to none after a success."""

    __slots__ = ("_delay", "failures")

    def __init__(self) -> None:
        self.failures = 0
        """Failures since the last success."""
        self._delay = 0.0

    def failed(self) -> float:
        """Count a failure; returns how long to wait before the next try."""
        self.failures += 1
        self._delay = min(max(self._delay * 2, 0.01), 1.0)
        return self._delay

    def succeeded(self) -> int:
        """Reset; returns the failures there had been."""
        failures, self.failures, self._delay = self.failures, 0, 0.0
        return failures
