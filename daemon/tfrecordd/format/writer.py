"""Writing TFRecord streams: framing plus compression, into any byte sink.

:class:`RecordWriter` is what the daemon's shard writer drives; it neither opens, fsyncs nor closes
files. :func:`pack` frames and compresses a batch into a :class:`Packed` unit anywhere (an encode
worker, say) for :meth:`RecordWriter.write_packed` to append unchanged; :func:`frame` frames a
batch too small to be worth a unit of its own, for the writer to compress with the writes it
holds. :func:`open_writer` is the convenience for tools and tests: a local file published
atomically, under the same no-partial-file rule as shards.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import zstandard

from tfrecordd.format.compress import Compressor, Unit
from tfrecordd.format.compression import Compression
from tfrecordd.format.framing import frame_many, frame_parts, framed_size, iter_framed
from tfrecordd.fsys import LOCAL, FileSystem

HOLD_BYTES = 128 << 10
"""Framed bytes of writes gathered before they are compressed, as one unit of their own
(:meth:`RecordWriter.write_many`): units this large compress within about 5% of one long stream
(the deflate window is 32 KiB; 256 KiB would save 2.5% more, at twice the memory of each open
shard), and an open writer keeps no compressor between them."""

_LARGE_RECORD = 64 << 10
"""Records this large on average are compressed piece by piece rather than joined first."""


def _framed(records: Sequence[bytes]) -> tuple[list[bytes], int]:
    """The framed bytes of ``records`` as pieces to compress, and their total size: one joined
    piece, or header/record/footer pieces when records are large (sparing a copy of each)."""
    size = framed_size(records)
    if size >= _LARGE_RECORD * len(records):
        return frame_parts(records), size
    return [frame_many(records)], size


@dataclass(frozen=True, slots=True)
class Packed:
    """Records framed and compressed into one complete compression unit, away from any stream."""

    unit: Unit
    lengths: array[int]
    """Each record's length, in order (what shard manifests' offsets are made from)."""

    def __reduce__(self) -> tuple[Any, ...]:
        # A dataclass's own pickling reads its fields() for each instance: a batch's parts
        # cross between processes by the hundred, and this is several times faster.
        return (Packed, (self.unit, self.lengths))

    @property
    def records(self) -> int:
        """How many records the unit holds."""
        return len(self.lengths)


@dataclass(frozen=True, slots=True)
class Framed:
    """Units :func:`frame` made, in order, written as one (:meth:`RecordWriter.write_packed`):
    held by the writer as they are, where joining them would copy every record once more."""

    units: tuple[Packed, ...]

    @property
    def records(self) -> int:
        """How many records the units hold."""
        return sum(u.records for u in self.units)

    @property
    def raw_size(self) -> int:
        """Framed bytes in all."""
        return sum(u.unit.raw_size for u in self.units)


def pack(records: Sequence[bytes], compression: Compression, level: int | None = None) -> Packed:
    """Frame and compress ``records`` into one unit that any stream of ``compression`` can
    append (:meth:`RecordWriter.write_packed`)."""
    pieces, _ = _framed(records)
    return Packed(Compressor.unit(compression, level, pieces), array("Q", map(len, records)))


def frame(records: Sequence[bytes]) -> Packed:
    """Frame ``records`` into one uncompressed unit (no compression): records framed where they
    are encoded cross to the writer as one buffer rather than one object each, and a stream of
    any compression takes them into the writes it holds (:meth:`RecordWriter.write_packed`)."""
    data = frame_many(records)
    return Packed(Unit(Compression.NONE, data, len(data)), array("Q", map(len, records)))


def unpack(packed: Packed) -> list[bytes]:
    """The records of a unit :func:`pack` made (for the rare record that must leave its
    batch: a late one, dead-lettered)."""
    data = packed.unit.data
    c = packed.unit.compression
    if c is Compression.GZIP:
        raw = gzip.decompress(data)
    elif c is Compression.ZLIB:
        raw = zlib.decompressobj(-15).decompress(data)  # a raw deflate segment: no header
    elif c is Compression.ZSTD:
        raw = b"".join(_zstd_frames(data))
    else:
        raw = data
    return [record for _, record in iter_framed(io.BytesIO(raw), "unit")]


def _zstd_frames(data: bytes) -> Iterator[bytes]:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    while chunk := reader.read(1 << 20):
        yield chunk


IN_FLIGHT_UNITS = 1
"""Units one writer may have compressing in its executor at once; one more waits for the
oldest (the write side's memory stays bounded whatever the compressors' pace)."""


class RecordWriter:
    """Frames records, compresses them, and hands the compressed bytes to ``sink``.

    ``sink`` is called only with non-empty ``bytes``, in stream order, from the thread that
    calls the writer. Records may sit in the writer until :meth:`sync` or :meth:`finish`.
    With an ``executor``, held writes are compressed there (:meth:`write_many`) while the
    caller goes on; their bytes reach the sink, in order, at :meth:`collect`, :meth:`sync`,
    :meth:`write_packed` and :meth:`finish`.
    """

    def __init__(
        self,
        sink: Callable[[bytes], object],
        compression: Compression = Compression.GZIP,
        *,
        level: int | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.compression = Compression(compression)
        self._sink = sink
        self._compressor = Compressor(self.compression, level)
        self._passthrough = self.compression is Compression.NONE
        self._executor = executor
        self._records = 0
        self._raw_bytes = 0
        self._file_bytes = 0
        self._pending_raw = 0
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._in_flight: deque[Future[Unit]] = deque()
        self._in_flight_bound = 0

    @property
    def records(self) -> int:
        """Records written so far."""
        return self._records

    @property
    def raw_bytes(self) -> int:
        """Framed, uncompressed bytes written so far."""
        return self._raw_bytes

    @property
    def file_bytes(self) -> int:
        """Compressed bytes handed to the sink so far."""
        return self._file_bytes

    @property
    def pending_raw(self) -> int:
        """Raw bytes fed since the last sync whose compressed form may not have reached the sink.

        Always 0 without compression."""
        return self._pending_raw

    def pending_bound(self, incoming: int = 0) -> int:
        """The most bytes the sink may yet receive, through the next :meth:`sync` and
        :meth:`finish`, for what was fed and ``incoming`` raw bytes more: ``file_bytes`` plus
        this bounds the stream's size then."""
        held = Compressor.bound(self.compression, self._held_bytes + incoming)
        return self._in_flight_bound + held

    def _emit(self, data: bytes) -> None:
        if data:
            self._sink(data)
            self._file_bytes += len(data)

    def write(self, record: bytes) -> None:
        """Write one record."""
        self.write_many((record,))

    def write_many(self, records: Sequence[bytes]) -> None:
        """Write several records, framed together (large records piece by piece, sparing a copy
        of each). Writes are held until :data:`HOLD_BYTES` gather (or the unit ends), then
        compressed at once into a unit of their own: a compressor called for a few kilobytes at
        a time, on a state that has left the cache since its last call, runs several times
        slower; and no compressor's state (about 0.3 MiB for deflate) stays between units, so a
        dataset with many shards open at once holds little more than their held bytes."""
        if not records:
            return
        pieces, size = _framed(records)
        self._hold(pieces, size, len(records))

    def _hold(self, pieces: list[bytes], size: int, count: int) -> None:
        self._records += count
        self._raw_bytes += size
        if self._passthrough:
            for piece in pieces:
                self._emit(self._compressor.compress(piece))
            return
        self._pending_raw += size
        self._held += pieces
        self._held_bytes += size
        if self._held_bytes >= HOLD_BYTES:
            self._release()

    def _release(self) -> None:
        """Compress what the writes held into one unit for the stream: here, or in the
        executor (its bytes then follow at :meth:`collect`)."""
        if not self._held:
            return
        held, size = self._held, self._held_bytes
        self._held, self._held_bytes = [], 0
        level = self._compressor.level
        if self._executor is None:
            self._append(Compressor.unit(self.compression, level, held))
            return
        while len(self._in_flight) >= IN_FLIGHT_UNITS:
            self._collect_one()
        self._in_flight.append(
            self._executor.submit(Compressor.unit, self.compression, level, held)
        )
        self._in_flight_bound += Compressor.bound(self.compression, size)

    def _append(self, unit: Unit) -> None:
        self._emit(self._compressor.append_unit(unit))
        self._pending_raw -= unit.raw_size

    def _collect_one(self) -> None:
        unit = self._in_flight.popleft().result()
        self._in_flight_bound -= Compressor.bound(self.compression, unit.raw_size)
        self._append(unit)

    def collect(self, *, wait: bool = False) -> None:
        """Hand the sink the bytes of the units compressed in the executor: those done (every
        one, with ``wait``), in order."""
        while self._in_flight and (wait or self._in_flight[0].done()):
            self._collect_one()

    def _drain(self) -> None:
        self._release()
        self.collect(wait=True)

    def write_packed(self, packed: Packed | Framed) -> None:
        """Append records :func:`pack` framed and compressed (after everything written before),
        or records :func:`frame` framed (one unit, or several as :class:`Framed`), held as
        :meth:`write_many` holds them."""
        if isinstance(packed, Framed):
            if any(u.unit.compression is not Compression.NONE for u in packed.units):
                raise ValueError("Framed holds units of framed records only")
            if self._passthrough:
                for one in packed.units:
                    self.write_packed(one)
                return
            pieces = [u.unit.data for u in packed.units if u.unit.data]
            self._hold(pieces, packed.raw_size, packed.records)
            return
        unit = packed.unit
        if unit.compression is not self.compression and unit.compression is Compression.NONE:
            if unit.data:
                self._hold([unit.data], unit.raw_size, packed.records)
            return
        self._drain()
        self._emit(self._compressor.append_unit(packed.unit))
        self._records += packed.records
        self._raw_bytes += packed.unit.raw_size

    def sync(self) -> None:
        """End the current compression unit and push every pending byte to the sink."""
        self._drain()
        self._emit(self._compressor.sync())
        self._pending_raw = 0

    def checkpoint(self) -> int:
        """End the current compression unit (:meth:`sync`) and return the Adler-32 of the raw
        stream so far: with the byte count, all it takes to end the stream at this point
        later (:meth:`Compressor.ending <tfrecordd.format.compress.Compressor.ending>`)."""
        self.sync()
        return self._compressor.adler32

    def finish(self) -> None:
        """End the stream. The sink's file is left for the caller to fsync and close."""
        self._drain()
        self._emit(self._compressor.finish())
        self._pending_raw = 0


INPROGRESS_SUFFIX = ".inprogress"


def inprogress_name(name: str) -> str:
    """The name a file to be published as ``name`` has while it is written: hidden, each ``.``
    of ``name`` made ``_``, then ``.inprogress``. It ends in none of the suffixes a reader globs
    for (``*.tfrecord*``, ``*.gz``, ``*.json``): TensorFlow's and fsspec's globs do not skip
    hidden files."""
    return f".{name.replace('.', '_')}{INPROGRESS_SUFFIX}"


@contextmanager
def open_writer(
    path: str | os.PathLike[str],
    compression: Compression,
    *,
    level: int | None = None,
    fs: FileSystem = LOCAL,
) -> Iterator[RecordWriter]:
    """Write a TFRecord file that appears at ``path`` complete, durable and at once.

    Records go to :func:`inprogress_name` in the same directory, created exclusively. When the block
    ends normally the stream is finished, the file fsynced and closed, published under ``path``
    without replacing anything (``FileExistsError`` if ``path`` exists), and the directory fsynced.
    When the block raises, the in-progress file is removed and nothing is published.
    """
    final = os.path.abspath(os.fspath(path))
    if os.path.lexists(final):
        raise FileExistsError(errno.EEXIST, "refusing to overwrite", final)
    tmp = os.path.join(os.path.dirname(final), inprogress_name(os.path.basename(final)))
    f = fs.create_exclusive(tmp)
    closed = False
    try:
        writer = RecordWriter(lambda data: fs.write(f, data), compression, level=level)
        yield writer
        writer.finish()
        fs.fsync(f)
        closed = True
        fs.close(f)
        fs.publish(tmp, final)
    except BaseException:
        if not closed:
            f.close()
        fs.remove(tmp)
        raise
    fs.fsync_dir(os.path.dirname(final))
