"""Shard manifests: a small JSON sidecar published after each shard.

``part-….tfrecord.gz`` gets ``part-….manifest.json`` (never matched by a ``*.tfrecord*`` glob)
with the record count, each record's offset in the uncompressed record stream (for random
access), the file's size, CRC32C and SHA-256, the compression, a hash of each source's encoder
schema, the time range in which the records were written, and the source positions the shard
covers; in a config with ``[datasets]``, also the shard's dataset, its partition folder
(``partition``, ``""`` for none) and the earliest and latest event time of its records
(``event_time_range``, epoch seconds; ``null`` where unknown: a dataset not partitioned by
event time, or a shard finished by recovery). A shard that recovery finished at its durable
prefix names no positions (they were spread over several commits); one whose publishing
recovery finished names those of the commit that published it. ``tfrecordd verify`` checks a
shard against its manifest when one sits beside it.
"""

from __future__ import annotations

import hashlib
import io
import os
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import crc32c
import orjson

from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.framing import OVERHEAD, extend_record_starts
from tfrecordd.format.reader import iter_records

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

    from tfrecordd.outputs.shards import RecordOffsets

_LENGTHS_AT_ONCE = 1 << 16

VERSION = 1
SUFFIX = ".manifest.json"


def manifest_name(shard_name: str) -> str:
    """The manifest's file name for a shard's file name."""
    for suffix in sorted(SUFFIXES.values(), key=len, reverse=True):
        if shard_name.endswith(suffix):
            return shard_name[: -len(suffix)] + SUFFIX
    return shard_name + SUFFIX


def parts(
    *,
    shard: str,
    compression: str,
    records: int,
    size: int,
    sha256: str,
    crc: int,
    offsets: Iterable[Sequence[int]],
    first_time: float | None,
    last_time: float | None,
    schemas: Mapping[str, str],
    positions: Mapping[str, Any],
    dataset: str | None = None,
    partition: str = "",
    event_times: tuple[float, float] | None = None,
) -> Iterator[bytes]:
    """The manifest document as JSON, in pieces: ``offsets`` come in chunks (each a sequence
    of ints, such as an ``array``) and become the last member, ``record_offsets``, a chunk at
    a time, so a shard of millions of records never has its manifest whole in memory."""
    doc = {
        "version": VERSION,
        "shard": shard,
        "compression": compression,
        "records": records,
        "size": size,
        "sha256": sha256,
        "crc32c": crc,
        "time_range": [first_time, last_time],
        "schemas": dict(schemas),
        "positions": dict(positions),
    }
    if dataset is not None:
        doc["dataset"] = dataset
        doc["partition"] = partition
        doc["event_time_range"] = list(event_times) if event_times is not None else None
    yield orjson.dumps(doc)[:-1] + b',"record_offsets":['
    first = True
    for chunk in offsets:
        if not len(chunk):
            continue
        text = orjson.dumps(chunk.tolist() if isinstance(chunk, array) else list(chunk))
        yield text[1:-1] if first else b"," + text[1:-1]
        first = False
    yield b"]}"


class _Measured(io.RawIOBase):
    """A stream read through once, its bytes counted and digested as they pass."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.sha256 = hashlib.sha256()
        self.crc = 0
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b).cast("B")
        data = self._stream.read(len(view))
        n = len(data)
        view[:n] = data
        self.sha256.update(data)
        self.crc = crc32c.crc32c(data, self.crc)
        self.size += n
        return n

    def drain(self) -> None:
        """Measure whatever the record reader left unread (nothing, for a sound shard)."""
        while self.read(1 << 20):
            pass


_NO_LIMIT = 2**64
"""A record length no TFRecord header can exceed."""


def scan(
    path: str | BinaryIO,
    offsets: RecordOffsets | None = None,
    *,
    compression: Compression | None = None,
    max_record_bytes: int | None = None,
    max_decompressed_bytes: int | None = None,
) -> dict[str, Any]:
    """Size, digests, record count and offsets measured from a shard file, or from a stream
    (an object read back from a store: read once, in chunks, never whole in memory). The
    offsets go to ``offsets`` when given (which keeps only a bounded part of them in memory;
    the result then has no ``record_offsets``), else into the result's ``record_offsets``
    (an ``array``). ``compression``: the shard's, detected when ``None``.

    By default no record length and no decompressed size is too large: the daemon scans its own
    shards (at recovery, to rebuild a manifest lost to a crash), and must read back whatever it
    wrote, or it would fail the same way at every start. The length CRC is checked before a
    record is read, so a damaged length is still found before anything is allocated. Tools
    reading other files pass the reader's limits."""
    limits: dict[str, Any] = {
        "max_record_bytes": _NO_LIMIT if max_record_bytes is None else max_record_bytes,
        "max_decompressed_bytes": max_decompressed_bytes,
    }
    if not isinstance(path, str):
        return _scan_stream(path, offsets, compression, limits)
    digest = hashlib.sha256()
    crc = 0
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            crc = crc32c.crc32c(chunk, crc)
            size += len(chunk)
    measured = _scan_records(iter_records(path, compression=compression, **limits), offsets)
    return {"size": size, "sha256": digest.hexdigest(), "crc32c": crc} | measured


def _scan_stream(
    stream: BinaryIO,
    offsets: RecordOffsets | None,
    compression: Compression | None,
    limits: dict[str, Any],
) -> dict[str, Any]:
    measured = _Measured(stream)
    records = _scan_records(
        iter_records(cast(BinaryIO, measured), compression=compression, **limits), offsets
    )
    measured.drain()
    sums = {"size": measured.size, "sha256": measured.sha256.hexdigest(), "crc32c": measured.crc}
    return sums | records


def _scan_records(records: Iterable[bytes], offsets: RecordOffsets | None) -> dict[str, Any]:
    kept: array[int] = array("Q")
    lengths: array[int] = array("Q")
    at = count = 0

    def flush() -> None:
        nonlocal at
        if offsets is not None:
            offsets.extend(lengths, at)
        else:
            extend_record_starts(kept, lengths, at)
        at += sum(lengths) + OVERHEAD * len(lengths)
        del lengths[:]

    for record in records:
        lengths.append(len(record))
        count += 1
        if len(lengths) >= _LENGTHS_AT_ONCE:
            flush()
    flush()
    measured: dict[str, Any] = {"records": count}
    if offsets is None:
        measured["record_offsets"] = kept
    return measured


def check(
    shard_path: str,
    manifest_path: str | None = None,
    *,
    max_record_bytes: int | None = None,
    max_decompressed_bytes: int | None = None,
) -> list[str]:
    """Differences between a shard and its manifest (empty when they agree); the limits are
    :func:`scan`'s."""
    manifest_path = manifest_path or os.path.join(
        os.path.dirname(shard_path), manifest_name(os.path.basename(shard_path))
    )
    with open(manifest_path, "rb") as f:
        doc = orjson.loads(f.read())
    measured = scan(
        shard_path,
        max_record_bytes=max_record_bytes,
        max_decompressed_bytes=max_decompressed_bytes,
    )
    problems = [
        f"{key}: manifest says {doc.get(key)!r}, the shard has {value!r}"
        for key, value in measured.items()
        if key != "record_offsets" and doc.get(key) != value
    ]
    if not _same_offsets(doc.get("record_offsets"), measured["record_offsets"]):
        problems.append("record_offsets: the manifest's offsets differ from the shard's records")
    return problems


def _same_offsets(listed: Any, measured: array[int]) -> bool:
    if not isinstance(listed, list) or len(listed) != len(measured):
        return False
    try:
        return array("Q", listed) == measured
    except (TypeError, OverflowError):  # not all non-negative ints
        return False
