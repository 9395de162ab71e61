"""Named crash points: a test-only switch that kills the daemon at one step of the commit protocol.

Set ``TFRECORDD_CRASH_AT=<point>`` (or ``<point>:<n>`` to crash on the n-th time the point is
reached) and the process exits at once with status 137, as if killed by SIGKILL: no cleanup, no
flush, no atexit handlers. Unset, :func:`reached` costs one dictionary lookup.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

POINTS = (
    "after-create",
    "mid-write",
    "after-fsync",
    "after-intent",
    "mid-upload",
    "after-publish",
    "after-dir-fsync",
    "after-marker",
    "after-ack",
    "after-done",
)
"""Every crash point the daemon itself passes, in protocol order (``after-marker`` only with
completion markers). ``mid-write`` is passed once for each batch whose records were written to
their shards (after a trip of batches written merged, once for each of them)."""

STATE_POINTS = ("state-staged", "state-committed", "state-step", "state-finished")
"""Every crash point the writing ``tfrecordd state`` commands pass, in order: the new files
written aside, the change committed, each step of it done (``state-step:n`` for the n-th), the
change finished. The daemon never passes them."""

_target: str | None = None
_countdown = 0
_counting = threading.Lock()  # a commit's shards pass their points from several threads


def arm(spec: str | None) -> None:
    """Arm a crash point from a ``point[:n]`` spec (``None`` disarms)."""
    global _target, _countdown
    if not spec:
        _target, _countdown = None, 0
        return
    point, _, n = spec.partition(":")
    _target, _countdown = point, int(n or 1)


def armed() -> str | None:
    """The armed point, if any."""
    return _target


def check_armed(known: Sequence[str]) -> None:
    """Raise ``ValueError`` if the armed point is none of ``known`` (the daemon's and its
    plugins' points): a misspelt point would never crash, and its test would prove nothing."""
    if _target is not None and _target not in known:
        raise ValueError(f"unknown crash point {_target!r} (known: {', '.join(known)})")


def reached(point: str) -> None:
    """Crash here if this point is armed and its count is reached."""
    global _countdown
    if _target != point:
        return
    with _counting:
        _countdown -= 1
        if _countdown <= 0:
            os._exit(137)


arm(os.environ.get("TFRECORDD_CRASH_AT"))
