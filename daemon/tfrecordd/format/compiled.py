"""The compiled ``tfrecordd._cframe`` behind typed functions, each with a pure-Python fallback.

The extension is optional (:mod:`tfrecordd.speedups`): where it is not built, or
``TFRECORDD_PURE_PYTHON=1`` turns it off, every function here gives the same result in Python,
only slower. Callers, plugins among them, reach the C code only through these functions, so mypy
checks every call against ``_cframe.pyi``. :data:`COMPILED` tells a caller that has a faster
Python path of its own (one that needs no exact answer) whether to take it instead.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, islice
from typing import Final

import crc32c as _crc32c
from typing_extensions import Buffer

from tfrecordd import speedups

__all__ = [
    "COMPILED",
    "check_messages",
    "crc32c",
    "frame_groups",
    "frame_many",
    "line_end",
    "record_starts",
]

COMPILED: Final[bool] = speedups.load("_cframe") is not None
"""Whether the functions here run in C in this process."""

if COMPILED:
    from tfrecordd import _cframe

_OVERHEAD = 16
"""TFRecord's framing bytes per record (``format.framing.OVERHEAD``, which imports this)."""


crc32c: Final[Callable[[Buffer], int]] = _cframe.crc32c if COMPILED else _crc32c.crc32c
"""CRC32C of a buffer (bound once, not wrapped: it runs twice per record framed)."""


def record_starts(lengths: array[int], start: int) -> bytes:
    """Where each framed record of ``lengths`` (an ``array("Q")``) starts, the first at
    ``start``, as the bytes of an ``array("Q")``."""
    if COMPILED:
        return _cframe.record_starts(lengths, start)
    running = accumulate(map(_OVERHEAD.__add__, lengths), initial=start)
    return array("Q", islice(running, len(lengths))).tobytes()


def frame_many(records: Iterable[Buffer]) -> bytes | None:
    """The records framed as TFRecord back to back, or ``None`` where the extension is not
    built (``format.framing.frame_many`` then frames them in Python)."""
    if COMPILED:
        return _cframe.frame_many(records)
    return None


def frame_groups(
    records: Sequence[bytes], groups: Sequence[Sequence[int]]
) -> list[tuple[bytes, bytes]] | None:
    """Each group of ``records`` framed, with its records' lengths (the bytes of an
    ``array("Q")``), or ``None`` where the extension is not built."""
    if COMPILED:
        return _cframe.frame_groups(records, groups)
    return None


def check_messages(payloads: Sequence[bytes], sequence: bool) -> list[int]:
    """Indices, ascending, of the payloads not certified as a serialized ``Example``
    (``SequenceExample`` if ``sequence``) with no unknown field: those protobuf must judge.
    Without the extension no payload is certified (every index is returned)."""
    if COMPILED:
        return _cframe.check_messages(payloads, sequence)
    return list(range(len(payloads)))


def line_end(data: Buffer, start: int, stop: int, lines: int) -> tuple[int, int]:
    """``(end, found)``: ``found`` newlines in ``data[start:stop]``, up to ``lines``; ``end`` is
    just past the last of them when ``found == lines``, else ``stop``."""
    if COMPILED:
        return _cframe.line_end(data, start, stop, lines)
    buf = data if isinstance(data, bytes | bytearray) else memoryview(data).tobytes()
    found, at = 0, start
    while found < lines:
        nl = buf.find(b"\n", at, stop)
        if nl < 0:
            return stop, found
        at, found = nl + 1, found + 1
    return at, found
