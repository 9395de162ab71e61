"""Reading TFRecord files: local paths, fsspec URLs or open binary streams, CRCs always verified.

The iterators are plain generators, so they fit ``tf.data.Dataset.from_generator`` and a PyTorch
``IterableDataset`` alike. The file is opened on the first ``next()`` and closed when the iterator
is exhausted, closed, or collected. Every failure is a :class:`~tfrecordd.errors.TfrecorddError`:
:class:`~tfrecordd.errors.InputError` (missing, directory, not a regular file),
:class:`~tfrecordd.errors.CompressionError`, :class:`~tfrecordd.errors.TruncatedRecordError` or
:class:`~tfrecordd.errors.CorruptRecordError`, and :class:`~tfrecordd.errors.DecodeError` from the
example iterators.

Limits: a record over ``max_record_bytes`` (256 MiB by default) raises
:class:`~tfrecordd.errors.RecordLimitError` (its length CRC matched: the record may be sound),
a stream decompressing past ``max_decompressed_bytes`` a
:class:`~tfrecordd.errors.CompressionError`.

Stricter than ``tf.data.TFRecordDataset`` on purpose, so damage is never read as a shorter file:
a stream ending inside a record's header or with stray bytes after the last record (TensorFlow
stops there silently) is a :class:`~tfrecordd.errors.TruncatedRecordError`; a zlib file holding
a second zlib stream or trailing bytes (TensorFlow reads the first stream and drops the rest) is
a :class:`~tfrecordd.errors.CompressionError`.
"""

from __future__ import annotations

import importlib
import io
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar, cast

from tfrecordd.errors import DecodeError, InputError
from tfrecordd.format import proto
from tfrecordd.format.compression import DEFAULT_MAX_DECOMPRESSED_BYTES, Compression
from tfrecordd.format.decompress import detect, open_decompressed
from tfrecordd.format.framing import DEFAULT_MAX_RECORD_BYTES, HEADER_SIZE, iter_framed
from tfrecordd.fsys import is_url, local_path

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

Source = str | os.PathLike[str] | BinaryIO
"""A local path, an fsspec URL (``s3://…``, ``memory://…``) or a readable binary stream."""


_T = TypeVar("_T")


class _Prefixed(io.RawIOBase):
    """``head`` followed by the rest of ``stream``: lets detection peek at any stream."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self._head = memoryview(head)
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b).cast("B")
        if self._head:
            n = min(len(view), len(self._head))
            view[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._stream.read(len(view))
        view[: len(data)] = data
        return len(data)


def _name(source: Source) -> str:
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else "<stream>"


def _open_local(path: str) -> BinaryIO:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror}") from e
    if stat.S_ISDIR(st.st_mode):
        raise InputError(path, "is a directory, not a TFRecord file")
    if not stat.S_ISREG(st.st_mode):
        # Opening a FIFO or a device could block forever or never end.
        raise InputError(path, "not a regular file")
    try:
        return open(path, "rb")
    except OSError as e:
        raise InputError(path, f"cannot open: {e.strerror}") from e


def _open_url(url: str, storage_options: Mapping[str, Any] | None) -> BinaryIO:
    # fsspec ships no type information; imported by name so its absence of stubs is not an error.
    fsspec: Any = importlib.import_module("fsspec")
    try:
        fs, fs_path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        if fs.isdir(fs_path):
            raise InputError(url, "is a directory, not a TFRecord file")
        return cast(BinaryIO, fs.open(fs_path, "rb"))
    except FileNotFoundError:
        raise InputError(url, "no such file") from None
    except (OSError, ValueError, ImportError) as e:
        raise InputError(url, f"cannot open: {e}") from e


def _read_head(stream: BinaryIO) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < HEADER_SIZE:
        piece = stream.read(HEADER_SIZE - got)
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


def iter_records_with_offsets(
    source: Source,
    *,
    compression: Compression | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_decompressed_bytes: int | None = DEFAULT_MAX_DECOMPRESSED_BYTES,
    storage_options: Mapping[str, Any] | None = None,
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, record)`` for every record of ``source``, CRCs verified.

    ``offset`` is the record's position in the decompressed stream. ``compression`` is detected
    from the first bytes and the name when ``None`` (see
    :func:`tfrecordd.format.decompress.detect`).
    ``max_record_bytes`` caps one record's length; ``max_decompressed_bytes`` caps the whole
    decompressed stream (``None``: no cap). ``storage_options`` go to fsspec for URLs. A stream
    passed in is read from its current position and not closed.
    """
    name = _name(source)
    with ExitStack() as stack:
        if isinstance(source, str | os.PathLike):
            path = os.fspath(source)
            if is_url(path):
                stream = _open_url(path, storage_options)
            else:
                stream = _open_local(local_path(path))
            stack.callback(stream.close)
        else:
            stream = source
        head = _read_head(stream)
        if compression is None:
            compression = detect(head, name)
        raw = io.BufferedReader(_Prefixed(head, stream), buffer_size=64 * 1024)
        data = open_decompressed(
            cast(BinaryIO, raw),
            Compression(compression),
            path=name,
            max_bytes=max_decompressed_bytes,
        )
        yield from iter_framed(data, name, max_record_bytes=max_record_bytes)


def iter_records(
    source: Source,
    *,
    compression: Compression | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_decompressed_bytes: int | None = DEFAULT_MAX_DECOMPRESSED_BYTES,
    storage_options: Mapping[str, Any] | None = None,
) -> Iterator[bytes]:
    """Yield every record of ``source`` as bytes; see :func:`iter_records_with_offsets`."""
    for _, record in iter_records_with_offsets(
        source,
        compression=compression,
        max_record_bytes=max_record_bytes,
        max_decompressed_bytes=max_decompressed_bytes,
        storage_options=storage_options,
    ):
        yield record


def iter_examples(
    source: Source,
    *,
    compression: Compression | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_decompressed_bytes: int | None = DEFAULT_MAX_DECOMPRESSED_BYTES,
    storage_options: Mapping[str, Any] | None = None,
) -> Iterator[dict[str, proto.FeatureValues]]:
    """Yield every record parsed as an ``Example``: ``{feature name: list of values}``."""
    return _parsed(
        proto.parse_example,
        source,
        compression=compression,
        max_record_bytes=max_record_bytes,
        max_decompressed_bytes=max_decompressed_bytes,
        storage_options=storage_options,
    )


def iter_sequence_examples(
    source: Source,
    *,
    compression: Compression | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_decompressed_bytes: int | None = DEFAULT_MAX_DECOMPRESSED_BYTES,
    storage_options: Mapping[str, Any] | None = None,
) -> Iterator[tuple[dict[str, proto.FeatureValues], dict[str, list[proto.FeatureValues]]]]:
    """Yield every record parsed as a ``SequenceExample``: ``(context, feature_lists)``."""
    return _parsed(
        proto.parse_sequence_example,
        source,
        compression=compression,
        max_record_bytes=max_record_bytes,
        max_decompressed_bytes=max_decompressed_bytes,
        storage_options=storage_options,
    )


def _parsed(parse: Callable[[bytes], _T], source: Source, **options: Any) -> Iterator[_T]:
    for offset, record in iter_records_with_offsets(source, **options):
        try:
            parsed = parse(record)
        except DecodeError as e:
            raise DecodeError(f"{_name(source)}: record at offset {offset}: {e}") from e
        yield parsed
