"""Types of the compiled ``tfrecordd._cframe`` (``_cframe.c``); see :mod:`tfrecordd.speedups`."""

from collections.abc import Iterable, Sequence
from typing import Final

from typing_extensions import Buffer

CRC32C_IMPLEMENTATION: Final[str]
"""``"sse4.2"`` where the CPU's CRC32C instruction is used, else ``"portable"`` (tables)."""

def crc32c(data: Buffer, value: int = 0) -> int:
    """CRC32C of ``data`` continued from ``value`` (0..2**32-1), like ``crc32c.crc32c``."""

def _crc32c_portable(data: Buffer, value: int = 0) -> int:
    """:func:`crc32c` by the table-driven code used where the CPU has no CRC32C instruction."""

def record_starts(lengths: Buffer, start: int, /) -> bytes:
    """Where each record starts in a framed stream, as the bytes of an ``array("Q")``, given
    the records' lengths (unsigned 64-bit) and where the first starts."""

def frame_many(records: Iterable[Buffer], /) -> bytes:
    """The records framed as TFRecord back to back, byte for byte ``framing.frame_many``."""

def frame_groups(
    records: Sequence[bytes], groups: Sequence[Sequence[int]], /
) -> list[tuple[bytes, bytes]]:
    """For each group of indexes into ``records``, its records framed as :func:`frame_many`
    frames them, and their lengths as the bytes of an ``array("Q")``. Raises ``TypeError`` for
    a record that is not exactly ``bytes``, ``IndexError`` for an index out of range."""

def check_messages(payloads: Iterable[bytes], sequence: bool) -> list[int]:
    """Indices, ascending, of the payloads not certified as a serialized ``Example``
    (``SequenceExample`` if ``sequence``) that protobuf parses with no unknown field; items that
    are not exactly ``bytes`` are always among them."""

def line_end(data: Buffer, start: int, stop: int, lines: int, /) -> tuple[int, int]:
    """``(end, found)``: ``found`` newlines in ``data[start:stop]``, up to ``lines``; ``end`` is
    just past the last of them when ``found == lines``, else ``stop``."""
