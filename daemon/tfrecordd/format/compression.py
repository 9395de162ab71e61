"""Stream compression for TFRecord shards: none, gzip, zlib (the three TensorFlow reads) and zstd.

A shard is written as a sequence of *compression units*, each ended by :meth:`Compressor.sync`:
a gzip member, a zstd frame (content checksum on, unless stored: see :meth:`Compressor.unit`), or
a raw deflate segment ended by a full flush inside one zlib stream (TensorFlow's ZLIB reader stops
at the end of the first zlib stream, so zlib units cannot be concatenated streams; the compressor
writes the stream's header and its Adler-32 trailer itself). Since no unit refers to another, a
unit can be compressed anywhere, an encode worker included (:meth:`Compressor.unit`), and appended
to a shard's stream as it is. :meth:`Compressor.bound` is the worst-case size of one unit, which
lets the shard writer promise a size cap before it compresses anything.

Reading is streaming and strict: :func:`open_decompressed` never holds a whole file in memory and
raises :class:`~tfrecordd.errors.CompressionError` on damaged data, a stream cut short, bytes after
the end of the stream, or output beyond a cap.
"""

from __future__ import annotations

import io
import struct
import threading
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, BinaryIO, Final, cast

import zstandard
from zlib_ng import zlib_ng

from tfrecordd.errors import (
    CompressionError,
    CorruptStreamError,
    DecompressionLimitError,
    TruncatedStreamError,
)
from tfrecordd.format.framing import header_is_valid

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer


class Compression(StrEnum):
    """How a TFRecord stream is compressed."""

    NONE = "none"
    GZIP = "gzip"
    ZLIB = "zlib"
    ZSTD = "zstd"


SUFFIXES: Final[Mapping[Compression, str]] = {
    Compression.NONE: ".tfrecord",
    Compression.GZIP: ".tfrecord.gz",
    Compression.ZLIB: ".tfrecord.zz",
    Compression.ZSTD: ".tfrecord.zst",
}
"""File name suffix of a shard in each compression."""

TF_COMPRESSION_TYPE: Final[Mapping[Compression, str | None]] = {
    Compression.NONE: "",
    Compression.GZIP: "GZIP",
    Compression.ZLIB: "ZLIB",
    Compression.ZSTD: None,
}
"""``compression_type`` for ``tf.data.TFRecordDataset``; ``None``: TensorFlow cannot read it."""

DEFAULT_LEVELS: Final[Mapping[Compression, int]] = {
    Compression.NONE: 0,
    Compression.GZIP: 6,
    Compression.ZLIB: 6,
    Compression.ZSTD: 3,
}
"""Level used when none is given."""

DEFAULT_MAX_DECOMPRESSED_BYTES = 64 * 1024**3
"""Default cap on the bytes one compressed file may decompress to."""

_NAME_SUFFIXES: Final[tuple[tuple[str, Compression], ...]] = (
    (".gz", Compression.GZIP),
    (".gzip", Compression.GZIP),
    (".zz", Compression.ZLIB),
    (".zlib", Compression.ZLIB),
    (".zst", Compression.ZSTD),
    (".zstd", Compression.ZSTD),
)
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_CHUNK = 64 * 1024


def compression_from_name(name: str) -> Compression | None:
    """The compression a file name's suffix implies, or ``None`` if it implies none."""
    lower = name.lower()
    for suffix, compression in _NAME_SUFFIXES:
        if lower.endswith(suffix):
            return compression
    return None


def _looks_zlib(head: bytes) -> bool:
    if len(head) < 2:
        return False
    cmf, flg = head[0], head[1]
    return cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf * 256 + flg) % 31 == 0


def detect(head: bytes, name: str = "") -> Compression:
    """Guess how a stream is compressed from its first bytes and, failing that, its name.

    ``head`` should be at least the first 12 bytes (fewer only if the file is shorter). In order:

    1. A valid TFRecord header (length CRC matches: a 1-in-2**32 accident otherwise) means NONE,
       even when the first bytes also happen to look like a magic number: a record length of
       0x8b1f starts with the gzip magic.
    2. The gzip (``1f 8b``) or zstd (``28 b5 2f fd``) magic number.
    3. A zlib header (CM = 8, ``(CMF*256 + FLG) % 31 == 0``). This check is weak (about 1 in 250
       random byte pairs pass), so it loses to a suffix naming another compression.
    4. The suffix of ``name`` (``.gz``, ``.zz``/``.zlib``, ``.zst``/``.zstd``).
    5. NONE: the record reader then reports what is wrong at offset 0.
    """
    from_name = compression_from_name(name)
    if header_is_valid(head):
        return Compression.NONE
    if head.startswith(_GZIP_MAGIC):
        return Compression.GZIP
    if head.startswith(_ZSTD_MAGIC):
        return Compression.ZSTD
    if _looks_zlib(head) and from_name in (None, Compression.ZLIB):
        return Compression.ZLIB
    if from_name is not None:
        return from_name
    return Compression.NONE


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


def _incompressible(piece: ReadableBuffer, level: int) -> bool:
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
        if _incompressible(largest, level):
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
        _ZSTD_MAGIC + struct.pack("<BB", (3 if large else 2) << 6, _ZSTD_WINDOW_128K),
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
        parts: list[bytes] = []
        raw = 0
        for piece in pieces:
            raw += memoryview(piece).nbytes
            parts.append(c.compress(piece))
        parts.append(c.sync())
        data = _joined(parts)
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


class _Source:
    """Compressed input pulled in chunks, tracking the offset of the next unread byte."""

    def __init__(self, fileobj: BinaryIO) -> None:
        self._f = fileobj
        self.offset = 0
        self.eof = False

    def read(self, n: int = _CHUNK) -> bytes:
        if self.eof:
            return b""
        data = self._f.read(n)
        if not data:
            self.eof = True
            return b""
        self.offset += len(data)
        return data


class _Inflater(io.RawIOBase):
    """Streaming gzip (concatenated members) or zlib (one stream) decompression."""

    def __init__(self, fileobj: BinaryIO, gzip: bool, path: str, max_bytes: int | None) -> None:
        self._src = _Source(fileobj)
        self._gzip = gzip
        self._path = path
        self._max = max_bytes
        self._produced = 0
        self._pending = b""
        self._consumed = 0
        self._d: Any = None
        self._ended = False
        if not gzip:
            self._d = zlib.decompressobj(15)

    def readable(self) -> bool:
        return True

    def _error(
        self, detail: str, error: type[CompressionError] = CorruptStreamError
    ) -> CompressionError:
        return error(self._path, self._consumed, detail)

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b).cast("B")
        out = self._produce(len(view))
        view[: len(out)] = out
        return len(out)

    def _produce(self, size: int) -> bytes:
        if size <= 0:
            return b""
        kind = "gzip member" if self._gzip else "zlib stream"
        while True:
            if not self._pending:
                self._pending = self._src.read()
            if self._d is None:
                if not self._pending:
                    return b""
                if self._ended or self._pending[0] != _GZIP_MAGIC[0]:
                    raise self._error("unexpected bytes after the end of the gzip stream")
                self._d = zlib.decompressobj(31)
            elif self._src.eof and self._src.offset == 0:
                return b""  # an empty file: zero records, as TensorFlow reads it
            elif self._ended:
                if self._pending:
                    raise self._error("unexpected bytes after the end of the zlib stream")
                return b""
            data = self._pending
            try:
                out: bytes = self._d.decompress(data, size)
            except zlib.error as e:
                raise self._error(f"{kind} is damaged ({e})") from e
            rest: bytes = self._d.unused_data if self._d.eof else self._d.unconsumed_tail
            self._consumed += len(data) - len(rest)
            self._pending = rest
            if self._d.eof:
                if self._gzip:
                    self._d = None
                else:
                    self._ended = True
            if out:
                self._produced += len(out)
                if self._max is not None and self._produced > self._max:
                    raise self._error(
                        f"decompresses to more than {self._max} bytes", DecompressionLimitError
                    )
                return out
            if self._d is not None and not self._ended and not rest and self._src.eof:
                raise self._error(f"file ends inside a {kind}", TruncatedStreamError)


class _ZstdFrameChecker(io.RawIOBase):
    """Pass-through reader that follows zstd frame and block headers.

    python-zstandard's stream reader treats a stream cut mid-frame as a clean end, so this layer
    knows where every frame ends and raises when the file stops inside one or has bytes that do
    not start a frame. Only headers are parsed; block contents are skipped over.
    """

    _MAGIC = 0xFD2FB528

    def __init__(self, fileobj: BinaryIO, path: str) -> None:
        self._src = _Source(fileobj)
        self._path = path
        self._buf = bytearray()  # header bytes collected so far for the current state
        self._need = 4
        self._skip = 0
        self._state = "magic"
        self._checksum = False
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b).cast("B")
        data = self._src.read(len(view))
        if not data:
            if self._state != "magic" or self._buf or self._skip:
                raise TruncatedStreamError(self._path, self._pos, "file ends inside a zstd frame")
            return 0
        self._scan(data)
        view[: len(data)] = data
        return len(data)

    def _scan(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                self._pos += step
                if not self._skip and self._state == "skip-body":
                    self._state = "magic"
                    self._need = 4
                continue
            take = min(self._need - len(self._buf), n - i)
            self._buf += data[i : i + take]
            i += take
            self._pos += take
            if len(self._buf) == self._need:
                self._advance()

    @property
    def position(self) -> int:
        """Bytes of the compressed file read so far."""
        return self._pos

    def _fail(self, detail: str) -> CompressionError:
        return CorruptStreamError(self._path, self._pos - len(self._buf), detail)

    def _advance(self) -> None:
        buf = bytes(self._buf)
        self._buf.clear()
        state = self._state
        if state == "magic":
            (magic,) = struct.unpack("<I", buf)
            if magic == self._MAGIC:
                self._state, self._need = "fhd", 1
            elif magic & 0xFFFFFFF0 == 0x184D2A50:
                self._state, self._need = "skip-size", 4
            else:
                self._pos -= 4
                raise self._fail("bytes that do not start a zstd frame")
        elif state == "fhd":
            fhd = buf[0]
            if fhd & 0x08:
                raise self._fail("reserved bit set in a zstd frame header")
            single_segment = (fhd >> 5) & 1
            fcs = (1 if single_segment else 0, 2, 4, 8)[fhd >> 6]
            did = (0, 1, 2, 4)[fhd & 3]
            self._checksum = bool(fhd & 0x04)
            rest = (0 if single_segment else 1) + did + fcs
            self._state, self._need = "frame-header", rest
        elif state == "frame-header":
            self._block_header()
        elif state == "block-header":
            header = buf[0] | buf[1] << 8 | buf[2] << 16
            last, block_type, size = header & 1, (header >> 1) & 3, header >> 3
            if block_type == 3:
                raise self._fail("reserved zstd block type")
            body = 1 if block_type == 1 else size
            if last:
                self._state, self._need = ("checksum", 4) if self._checksum else ("magic", 4)
            else:
                self._block_header()
            self._skip = body
        elif state == "checksum":
            self._state, self._need = "magic", 4
        elif state == "skip-size":
            (size,) = struct.unpack("<I", buf)
            self._state, self._need = "skip-body", 4
            self._skip = size
            if not size:
                self._state = "magic"

    def _block_header(self) -> None:
        self._state, self._need = "block-header", 3


class _Capped(io.RawIOBase):
    """Wraps a zstd stream reader: converts its errors and enforces the output cap."""

    def __init__(self, checker: _ZstdFrameChecker, path: str, max_bytes: int | None) -> None:
        self._checker = checker
        self._reader = zstandard.ZstdDecompressor().stream_reader(
            cast(BinaryIO, checker), read_size=_CHUNK, read_across_frames=True, closefd=False
        )
        self._path = path
        self._max = max_bytes
        self._produced = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b).cast("B")
        try:
            data: bytes = self._reader.read(len(view))
        except zstandard.ZstdError as e:
            raise CorruptStreamError(
                self._path, self._checker.position, f"zstd frame is damaged ({e})"
            ) from e
        self._produced += len(data)
        if self._max is not None and self._produced > self._max:
            raise DecompressionLimitError(
                self._path, self._checker.position, f"decompresses to more than {self._max} bytes"
            )
        view[: len(data)] = data
        return len(data)


def open_decompressed(
    fileobj: BinaryIO,
    compression: Compression,
    *,
    path: str,
    max_bytes: int | None = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> BinaryIO:
    """A streaming reader of the decompressed bytes of ``fileobj``.

    Concatenated gzip members and zstd frames (including skippable frames) are read as one stream.
    ``path`` names the file in errors. Reading raises
    :class:`~tfrecordd.errors.CompressionError`, whose offset is the position reached in the
    compressed file, when the data is damaged, ends inside a member or frame, is followed by bytes
    that are not another member or frame, or decompresses to more than ``max_bytes``
    (``None``: no cap). ``fileobj`` is not closed by closing the returned reader.
    """
    c = Compression(compression)
    if c is Compression.NONE:
        return fileobj
    raw: io.RawIOBase
    if c is Compression.ZSTD:
        raw = _Capped(_ZstdFrameChecker(fileobj, path), path, max_bytes)
    else:
        raw = _Inflater(fileobj, c is Compression.GZIP, path, max_bytes)
    return io.BufferedReader(raw, buffer_size=_CHUNK)
