"""How the C library's allocator treats the daemon's batch buffers (glibc only).

Every batch allocates and frees the same few large buffers: its lines (up to ``max_batch_bytes``),
their copy in an encode worker, the compressed unit. glibc gives an allocation of 128 KiB or more
pages of its own (``mmap``) and returns them when freed, or, once its threshold has moved up,
trims them off the heap's top; either way the next batch's buffer is fresh memory, and each of its
pages faults in on first touch. Measured in an encode worker, those faults cost about 5% of its
CPU. :func:`tune` keeps such buffers on the heap and lets the heap keep a bounded amount of freed
memory (:data:`TRIM_THRESHOLD` plus :data:`TOP_PAD`) for the next batch; the peak memory stays
what the pipeline's depth makes it.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TOP_PAD", "TRIM_THRESHOLD", "tune"]

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

TRIM_THRESHOLD = 32 << 20
"""Freed memory at the heap's top that is kept, rather than returned to the system."""
TOP_PAD = 16 << 20
"""Room added to each growth of the heap, so that a batch's buffers do not grow it each time."""
MMAP_THRESHOLD = 16 << 20
"""Allocations this large or larger still get pages of their own (a whole-file event, say)."""

ENVIRONMENT = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")
"""The variables by which an operator sets these thresholds (:func:`tune` then leaves them)."""


def tune() -> bool:
    """Set the allocator's thresholds for this process; ``False`` (nothing changed) where the C
    library is not glibc, or where the environment already sets them (``MALLOC_*_`` or
    ``GLIBC_TUNABLES``: an operator's choice stands)."""
    if not sys.platform.startswith("linux") or os.environ.get("GLIBC_TUNABLES"):
        return False
    if any(name in os.environ for name in ENVIRONMENT):
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):
            return False
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    settings = (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (_M_TOP_PAD, TOP_PAD),
    )
    return all(mallopt(param, value) == 1 for param, value in settings)
