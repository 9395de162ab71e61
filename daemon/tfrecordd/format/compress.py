"""The write side of shard compression: :class:`Compressor` and its :class:`Unit`.

A shard is written as a sequence of *compression units*, each ended by :meth:`Compressor.sync`:
a gzip member, a zstd frame (content checksum on, unless stored: see :meth:`Compressor.unit`), or
a raw deflate segment ended by a full flush inside one zlib stream (TensorFlow's ZLIB reader stops
at the end of the first zlib stream, so zlib units cannot be concatenated streams; the compressor
writes the stream's header and its Adler-32 trailer itself). Since no unit refers to another, a
unit can be compressed anywhere, an encode worker included (:meth:`Compressor.unit`), and appended
to a shard's stream as it is. :meth:`Compressor.bound` is the worst-case size of one unit, which
lets the shard writer promise a size cap before it compresses anything.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zstandard
from zlib_ng import zlib_ng

from tfrecordd.format.compression import DEFAULT_LEVELS, ZSTD_MAGIC, Compression

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["PROBE_MIN_BYTES", "Compressor", "Unit"]


def _deflate_bound(n: int) -> int:
    # Compression goes through zlib-ng, whose fastest level uses fixed Huffman codes only (9 bits
    # per literal): its bound is that, plus the stored-block headers a full flush or a fallback to
    # stored blocks may add. zlib's own deflateBound() is smaller, so this bound covers both.
    return n + ((n + 7) >> 3) + ((n + 63) >> 6) + 5


def _zstd_compress_bound(n: int) -> int:
    # ZSTD_COMPRESSBOUND from zstd.h.
    return n + (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0)


_GZIP_WRAPPER = 10 + 8
_ZLIB_WRAPPER = 2 + 4
_ZLIB_FULL_FLUSH = 6  # the empty stored block a full flush appends, with its alignment
_ZLIB_FINAL_BLOCK = 6  # finish()'s empty final block (stored at level 0) after a full flush
_ZSTD_FRAME_HEADER_MAX = 18
_ZSTD_CHECKSUM = 4
_ADLER_BASE = 65521


def _adler32_combine(adler1: int, adler2: int, len2: int) -> int:
    """The Adler-32 of ``a + b`` from those of ``a`` and ``b`` and ``len(b)`` (zlib's
    ``adler32_combine``, which Python does not expose)."""
    rem = len2 % _ADLER_BASE
    sum1 = adler1 & 0xFFFF
    sum2 = (rem * sum1) % _ADLER_BASE
    sum1 += (adler2 & 0xFFFF) + _ADLER_BASE - 1
    sum2 += ((adler1 >> 16) & 0xFFFF) + ((adler2 >> 16) & 0xFFFF) + _ADLER_BASE - rem
    return (sum1 % _ADLER_BASE) | ((sum2 % _ADLER_BASE) << 16)


def _zlib_header(level: int) -> bytes:
    """The two header bytes zlib writes for ``level`` (its FLEVEL bits depend on the level)."""
    c = zlib_ng.compressobj(level, zlib_ng.DEFLATED, 15)
    return (c.compress(b"") + c.flush(zlib_ng.Z_SYNC_FLUSH))[:2]


@dataclass(frozen=True, slots=True)
class Unit:
    """One complete compression unit made away from any stream (:meth:`Compressor.unit`): a gzip
    member, a zstd frame, a raw deflate segment ended by a full flush (zlib), or the bytes as
    they are (none). :meth:`Compressor.append_unit` puts it in a stream."""

    compression: Compression
    data: bytes
    """The compressed bytes."""
    raw_size: int
    """Bytes before compression."""
    adler32: int = 1
    """Adler-32 of the raw bytes (zlib only: the stream's trailer covers every unit)."""

    def __reduce__(self) -> tuple[Any, ...]:
        # A dataclass's own pickling reads its fields() for each instance: a batch's parts
        # cross between processes by the hundred, and this is several times faster.
        return (Unit, (self.compression, self.data, self.raw_size, self.adler32))


_JOIN_BELOW = 16 << 10
"""Pieces of a unit smaller than this on average are joined before they are compressed."""

PROBE_MIN_BYTES = 64 << 10
"""zstd units this large are sampled for compressibility (:meth:`Compressor.unit`)."""

_PROBE_BYTES = 4 << 10
_PROBE_SAVING = 0.03
_PROBE_LEVEL = 1
"""The highest level a sample is compressed at: level 1 entropy-codes as the higher ones do, so
it finds data that only Huffman coding shrinks, in less time."""

_zstd_local = threading.local()


def _zstd_compressor(level: int) -> Any:
    """This thread's zstd compressor for ``level`` (one compressor may not serve two threads at
    once, and making one per unit costs more than small units take to compress)."""
    cache: dict[int, Any] | None = getattr(_zstd_local, "cache", None)
    if cache is None:
        cache = _zstd_local.cache = {}
    cctx = cache.get(level)
    if cctx is None:
        cctx = cache[level] = zstandard.ZstdCompressor(level=level, write_checksum=True)
    return cctx


def incompressible(piece: ReadableBuffer, level: int) -> bool:
    """Whether a sample from the middle of ``piece`` (where a file's headers and tables are not)
    saves less than :data:`_PROBE_SAVING` at ``level`` (or :data:`_PROBE_LEVEL`, if lower)."""
    view = memoryview(piece).cast("B")
    start = max(0, (len(view) - _PROBE_BYTES) // 2)
    sample = view[start : start + _PROBE_BYTES]
    compressed = _zstd_compressor(min(level, _PROBE_LEVEL)).compress(sample)
    return 1 - len(compressed) / len(sample) < _PROBE_SAVING


def _zstd_unit(level: int, pieces: Iterable[ReadableBuffer]) -> Unit:
    parts = list(pieces)
    sizes = [memoryview(p).nbytes for p in parts]
    raw = sum(sizes)
    if not raw:
        return Unit(Compression.ZSTD, b"", 0)
    if raw >= PROBE_MIN_BYTES:
        largest = parts[max(range(len(parts)), key=sizes.__getitem__)]
        if incompressible(largest, level):
            return Unit(Compression.ZSTD, _zstd_stored(parts, raw), raw)
    # One call on one buffer: zstd's streaming API would copy the input into its window first,
    # which costs more than joining the pieces (most units are one piece anyway).
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    return Unit(Compression.ZSTD, _zstd_compressor(level).compress(data), raw)


_ZSTD_BLOCK_MAX = 128 << 10
_ZSTD_WINDOW_128K = 7 << 3  # Window_Descriptor: 2 ** (10 + 7) bytes, no mantissa


def _zstd_stored(parts: list[ReadableBuffer], raw: int) -> bytes:
    """``parts`` (``raw`` bytes in all, at least one) as one zstd frame of raw blocks (RFC 8878,
    3.1.1.2): stored, not compressed.

    The frame carries its content size and a 128 KiB window (raw blocks refer to nothing before
    them), and no content checksum: what it holds is framed records, whose own CRC32Cs every
    reader checks, so a damaged byte is caught all the same.
    """
    large = raw >= 1 << 32
    out: list[ReadableBuffer] = [
        ZSTD_MAGIC + struct.pack("<BB", (3 if large else 2) << 6, _ZSTD_WINDOW_128K),
        raw.to_bytes(8 if large else 4, "little"),
    ]
    left = raw
    room = 0
    for part in parts:
        view = memoryview(part).cast("B")
        start, end = 0, len(view)
        while start < end:
            if not room:
                room = min(_ZSTD_BLOCK_MAX, left)
                left -= room
                # Block_Header: Last_Block, Block_Type 0 (raw), Block_Size.
                out.append(((left == 0) | room << 3).to_bytes(3, "little"))
            take = min(room, end - start)
            out.append(view[start : start + take])
            start += take
            room -= take
    return b"".join(out)


def _joined(parts: list[bytes]) -> bytes:
    """``parts`` joined; the one part itself when the rest are empty (a compressor buffers its
    input and gives most of its output at the end): a unit is not copied once more for nothing."""
    full = [p for p in parts if p]
    return full[0] if len(full) == 1 else b"".join(full)


class Compressor:
    """Incremental compressor that ends compression units on demand.

    Output from :meth:`compress`, :meth:`sync`, :meth:`append_unit` and :meth:`finish`,
    concatenated in call order, is the compressed stream. ``level`` defaults to
    :data:`DEFAULT_LEVELS`. Deflate (gzip, zlib) is zlib-ng's: the same format, and about twice
    zlib's speed at the same level.
    """

    def __init__(self, compression: Compression, level: int | None = None) -> None:
        self.compression = Compression(compression)
        self.level = DEFAULT_LEVELS[self.compression] if level is None else level
        self._unit_open = False
        self._emitted = False
        self._finished = False
        self._deflate: Any = None
        self._zstd_unit: Any = None
        self._zstd: Any = None
        self._adler = 1
        if self.compression in (Compression.GZIP, Compression.ZLIB) and not (-1 <= self.level <= 9):
            raise ValueError(f"{self.compression} level must be in -1..9, got {self.level}")
        if self.compression is Compression.ZSTD:
            self._zstd = zstandard.ZstdCompressor(level=self.level, write_checksum=True)

    def _start(self) -> bytes:
        # A zlib stream's header comes before its first unit; gzip and zstd units carry their own.
        if self._emitted:
            return b""
        self._emitted = True
        return _zlib_header(self.level) if self.compression is Compression.ZLIB else b""

    def compress(self, data: ReadableBuffer) -> bytes:
        """Feed ``data``; returns whatever compressed bytes are ready (possibly none)."""
        if self._finished:
            raise ValueError("compress() after finish()")
        if not memoryview(data).nbytes:
            return b""
        self._unit_open = True
        c = self.compression
        if c is Compression.NONE:
            out = bytes(data)
        elif c is Compression.GZIP:
            if self._deflate is None:
                self._deflate = zlib_ng.compressobj(self.level, zlib_ng.DEFLATED, 31)
            out = self._deflate.compress(data)
        elif c is Compression.ZLIB:
            if self._deflate is None:
                self._deflate = zlib_ng.compressobj(self.level, zlib_ng.DEFLATED, -15)
            self._adler = zlib.adler32(data, self._adler)
            out = self._deflate.compress(data)
            if out:
                out = self._start() + out
        else:
            if self._zstd_unit is None:
                self._zstd_unit = self._zstd.compressobj()
            out = self._zstd_unit.compress(data)
        if out:
            self._emitted = True
        return out

    def sync(self) -> bytes:
        """End the current compression unit; returns its remaining bytes (none if it is empty).

        gzip ends the member (the next :meth:`compress` starts a new one), zstd ends the frame,
        zlib ends its raw deflate segment with a full flush, none has nothing to do.
        """
        if self._finished:
            raise ValueError("sync() after finish()")
        if not self._unit_open:
            return b""
        self._unit_open = False
        c = self.compression
        if c is Compression.GZIP:
            out: bytes = self._deflate.flush(zlib_ng.Z_FINISH)
            self._deflate = None
        elif c is Compression.ZLIB:
            out = self._deflate.flush(zlib_ng.Z_FULL_FLUSH)
            self._deflate = None
            out = self._start() + out
        elif c is Compression.ZSTD:
            out = self._zstd_unit.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
            self._zstd_unit = None
        else:
            out = b""
        if out:
            self._emitted = True
        return out

    @staticmethod
    def unit(compression: Compression, level: int | None, pieces: Iterable[ReadableBuffer]) -> Unit:
        """Compress ``pieces`` (concatenated) into one complete :class:`Unit`, independent of any
        stream: encode workers make these, and the shard's stream appends them unchanged.

        A zstd unit of :data:`PROBE_MIN_BYTES` or more whose largest piece does not compress (a
        sample of it saves under 3%: JPEG and PNG images, say) is stored: a frame of raw blocks,
        which any zstd reader reads, at about the speed of a copy."""
        if Compression(compression) is Compression.ZSTD:
            return _zstd_unit(DEFAULT_LEVELS[Compression.ZSTD] if level is None else level, pieces)
        c = Compressor(compression, level)
        if c.compression is Compression.NONE:
            data = b"".join(pieces)
            return Unit(c.compression, data, len(data))
        # One call on one buffer where the pieces are small: each call releases and takes
        # back the interpreter lock, which a compress thread shares with the daemon's event
        # loop, and joining the many small pieces of a held unit (128 KiB) costs less than the
        # calls it saves. Large pieces (a joined group's parts) are not copied to be joined.
        given = list(pieces)
        sizes = [memoryview(p).nbytes for p in given]
        raw = sum(sizes)
        if len(given) > 1 and raw < _JOIN_BELOW * len(given):
            given = [b"".join(given)]
        data = _joined([*map(c.compress, given), c.sync()])
        if c.compression is Compression.ZLIB and data:
            data = data[2:]  # the stream header: the shard's own stream writes it once
        # compress() kept the Adler-32 of the raw bytes (zlib only; 1, of nothing, otherwise).
        return Unit(c.compression, data, raw, c._adler)

    def append_unit(self, unit: Unit) -> bytes:
        """Append a complete unit made by :meth:`unit`; returns the bytes for the stream.

        The current unit, if any, is ended first (its bytes come first in the result)."""
        if self._finished:
            raise ValueError("append_unit() after finish()")
        if unit.compression is not self.compression:
            raise ValueError(f"a {unit.compression} unit in a {self.compression} stream")
        out = self.sync()
        if not unit.data:
            return out
        if self.compression is Compression.ZLIB:
            out += self._start()
            self._adler = _adler32_combine(self._adler, unit.adler32, unit.raw_size)
        self._emitted = True
        return out + unit.data

    @property
    def adler32(self) -> int:
        """Adler-32 of every raw byte fed so far (zlib only; what :meth:`ending` needs)."""
        return self._adler

    @staticmethod
    def ending(compression: Compression, level: int | None, adler32: int) -> bytes:
        """The bytes that end a non-empty stream cut right after a :meth:`sync`: what
        :meth:`finish` would add there, for a stream of raw bytes whose Adler-32 is ``adler32``.
        Only zlib has any (its final empty block and trailer); gzip members and zstd frames end
        themselves. Recovery uses it to finish a shard from the prefix a crash left."""
        c = Compression(compression)
        if c is not Compression.ZLIB:
            return b""
        lvl = DEFAULT_LEVELS[c] if level is None else level
        final = zlib_ng.compressobj(lvl, zlib_ng.DEFLATED, -15).flush(zlib_ng.Z_FINISH)
        return final + struct.pack(">I", adler32)

    def finish(self) -> bytes:
        """End the stream; returns the last bytes. A stream with no data is still a valid one."""
        if self._finished:
            raise ValueError("finish() called twice")
        c = self.compression
        out = self.sync()
        if c is Compression.ZLIB:
            # The final empty block, then the Adler-32 of everything the stream holds.
            final = zlib_ng.compressobj(self.level, zlib_ng.DEFLATED, -15).flush(zlib_ng.Z_FINISH)
            out += self._start() + final + struct.pack(">I", self._adler)
        elif not self._emitted and c is Compression.GZIP:
            # No data still gets a valid stream: an empty gzip member (as tf.io.TFRecordWriter
            # writes) or an empty zstd frame.
            out = zlib_ng.compressobj(self.level, zlib_ng.DEFLATED, 31).flush(zlib_ng.Z_FINISH)
        elif not self._emitted and c is Compression.ZSTD:
            out = self._zstd.compressobj().flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
        self._finished = True
        return out

    @staticmethod
    def bound(compression: Compression, n: int) -> int:
        """Worst-case bytes one compression unit holding ``n`` raw bytes adds to a file.

        Includes everything the unit may carry: gzip member header and trailer; zstd frame header,
        block headers and content checksum; and for zlib, because its units share one stream, the
        stream header, the full-flush marker, the final empty block and the Adler-32 trailer. So
        ``bytes already written + bound(compression, raw bytes not yet synced)`` is an upper
        bound on the finished file's size.
        """
        if n < 0:
            raise ValueError("n must be >= 0")
        c = Compression(compression)
        if c is Compression.NONE:
            return n
        if c is Compression.GZIP:
            return _deflate_bound(n) + _GZIP_WRAPPER
        if c is Compression.ZLIB:
            return _deflate_bound(n) + _ZLIB_WRAPPER + _ZLIB_FULL_FLUSH + _ZLIB_FINAL_BLOCK
        return _zstd_compress_bound(n) + _ZSTD_FRAME_HEADER_MAX + _ZSTD_CHECKSUM
