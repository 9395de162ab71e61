"""The read side of shard compression: :func:`open_decompressed` and :func:`detect`.

Reading is streaming and strict: :func:`open_decompressed` never holds a whole file in memory and
raises :class:`~tfrecordd.errors.CompressionError` on damaged data, a stream cut short, bytes after
the end of the stream, or output beyond a cap.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import zstandard

from tfrecordd.errors import (
    CompressionError,
    CorruptStreamError,
    DecompressionLimitError,
    TruncatedStreamError,
)
from tfrecordd.format.compression import (
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    GZIP_MAGIC,
    ZSTD_MAGIC,
    Compression,
    compression_from_name,
)
from tfrecordd.format.framing import header_is_valid

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["detect", "open_decompressed"]

_CHUNK = 64 * 1024


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
    if head.startswith(GZIP_MAGIC):
        return Compression.GZIP
    if head.startswith(ZSTD_MAGIC):
        return Compression.ZSTD
    if _looks_zlib(head) and from_name in (None, Compression.ZLIB):
        return Compression.ZLIB
    if from_name is not None:
        return from_name
    return Compression.NONE


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
                if self._pending[0] != GZIP_MAGIC[0] and not self._ended:
                    raise self._error("not gzip data (it does not start as a gzip member does)")
                if self._ended or self._pending[0] != GZIP_MAGIC[0]:
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
