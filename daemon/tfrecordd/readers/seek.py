"""Reading a shard from its n-th record on, skipping the records before it unread.

A shard's manifest gives each record's offset in the uncompressed record stream. An uncompressed
shard is then read from that offset on (one seek); a compressed one is decompressed and the bytes
before the offset discarded, with no record before it framed, checked or handed out. Without a
manifest the records before it are read and counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import closing
from typing import Any, BinaryIO

from tfrecordd.errors import RecordError, TfrecorddError, TruncatedRecordError
from tfrecordd.format.compression import DEFAULT_MAX_DECOMPRESSED_BYTES, Compression
from tfrecordd.format.decompress import open_decompressed
from tfrecordd.format.framing import DEFAULT_MAX_RECORD_BYTES
from tfrecordd.format.reader import iter_records, iter_records_with_offsets
from tfrecordd.readers.layout import Shard, as_shard, manifest_document
from tfrecordd.readers.store import open_file, read_file

_DISCARD = 1 << 20


def _manifest(
    shard: Shard, storage_options: Mapping[str, Any] | None
) -> tuple[list[int], Compression] | None:
    """The record offsets and the compression ``shard``'s manifest gives, if it has one."""
    path = shard.manifest_path
    data = read_file(path, storage_options)
    if data is None:
        return None
    doc = manifest_document(data, path, shard.name)
    offsets = doc.get("record_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != doc.get("records")
        or not all(type(o) is int and o >= 0 for o in offsets)
    ):
        raise TfrecorddError(f"{path}: the manifest's record_offsets are not one offset a record")
    named = doc.get("compression")
    compression = Compression(named) if named in set(Compression) else shard.compression
    return offsets, compression


def record_offsets(
    shard: Shard | str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> list[int] | None:
    """Each record's offset in ``shard``'s uncompressed record stream, from its manifest;
    ``None`` when it has no manifest."""
    found = _manifest(as_shard(shard), storage_options)
    return None if found is None else found[0]


def _discard(stream: BinaryIO, count: int, path: str) -> None:
    left = count
    while left:
        got = len(stream.read(min(left, _DISCARD)))
        if not got:
            raise TruncatedRecordError(
                path,
                count - left,
                f"the stream ends before offset {count}, where the manifest places a record",
            )
        left -= got


def iter_records_from(
    shard: Shard | str | os.PathLike[str],
    start: int = 0,
    *,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_decompressed_bytes: int | None = DEFAULT_MAX_DECOMPRESSED_BYTES,
    storage_options: Mapping[str, Any] | None = None,
) -> Iterator[bytes]:
    """Yield the records of ``shard`` from record ``start`` (counted from 0) on, CRCs verified.

    With a manifest beside the shard, the records before ``start`` are skipped unread (see the
    module's docstring) and the count of records read is checked against the manifest's.
    Raises :class:`~tfrecordd.errors.TfrecorddError` when ``start`` is past the shard's last
    record, and the reader's errors on damage."""
    shard = as_shard(shard)
    if start < 0:
        raise TfrecorddError(f"{shard.path}: record {start}: a position counts from 0")
    limits: dict[str, Any] = {
        "max_record_bytes": max_record_bytes,
        "max_decompressed_bytes": max_decompressed_bytes,
        "storage_options": storage_options,
    }
    if start == 0:
        yield from iter_records(shard.path, **limits)
        return
    manifest = _manifest(shard, storage_options)
    if manifest is None:
        seen = 0
        for record in iter_records(shard.path, **limits):
            seen += 1
            if seen > start:
                yield record
        if seen < start:
            raise TfrecorddError(f"{shard.path}: record {start} is past its {seen} records")
        return
    offsets, compression = manifest
    if start > len(offsets):
        raise TfrecorddError(f"{shard.path}: record {start} is past its {len(offsets)} records")
    if start == len(offsets):
        return
    read = 0
    for record in _from_offset(shard, compression, offsets[start], limits):
        read += 1
        yield record
    if read != len(offsets) - start:
        raise TfrecorddError(
            f"{shard.path}: {start + read} records, its manifest lists {len(offsets)}"
        )


def _from_offset(
    shard: Shard, compression: Compression, offset: int, limits: dict[str, Any]
) -> Iterator[bytes]:
    with closing(open_file(shard.path, limits["storage_options"])) as raw:
        if compression is Compression.NONE:
            size = raw.seek(0, os.SEEK_END)
            if offset >= size:
                raise TruncatedRecordError(
                    shard.path,
                    size,
                    f"the file ends before offset {offset}, where the manifest places a record",
                )
            raw.seek(offset)
            stream = raw
        else:
            stream = open_decompressed(
                raw, compression, path=shard.path, max_bytes=limits["max_decompressed_bytes"]
            )
            _discard(stream, offset, shard.path)
        try:
            for _, record in iter_records_with_offsets(
                stream,
                compression=Compression.NONE,
                max_record_bytes=limits["max_record_bytes"],
                max_decompressed_bytes=None,
            ):
                yield record
        except RecordError as e:
            # Offsets from here are counted from the seek; errors name the stream's own.
            raise type(e)(shard.path, offset + e.offset, e.detail) from None
