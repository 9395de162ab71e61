"""Manifest documents written in pieces: the offsets a chunk at a time."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

import orjson
import pytest

from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.writer import RecordWriter
from tfrecordd.fsys import LOCAL
from tfrecordd.outputs import manifest, shards


def _fields(offsets: Iterable[Sequence[int]]) -> dict[str, Any]:
    return {
        "shard": "part-1.tfrecord.gz",
        "compression": "gzip",
        "records": 3,
        "size": 100,
        "sha256": "0" * 64,
        "crc": 7,
        "offsets": offsets,
        "first_time": 1.5,
        "last_time": 2.5,
        "schemas": {"spool": "abc"},
        "positions": {"spool": [{"f": "a.jsonl", "o": 10, "eof": True}]},
    }


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([], []),
        ([array("Q")], []),
        ([array("Q", [0, 17]), array("Q"), array("Q", [40]), [2**40]], [0, 17, 40, 2**40]),
        ([array("Q", range(0, 50_000, 5)), array("Q", [50_000])], [*range(0, 50_000, 5), 50_000]),
    ],
)
def test_pieces_make_one_document_with_every_offset_in_order(
    chunks: list[Sequence[int]], expected: list[int]
) -> None:
    pieces = list(manifest.parts(**_fields(chunks)))
    doc = orjson.loads(b"".join(pieces))
    assert doc == {
        "version": manifest.VERSION,
        "shard": "part-1.tfrecord.gz",
        "compression": "gzip",
        "records": 3,
        "size": 100,
        "sha256": "0" * 64,
        "crc32c": 7,
        "time_range": [1.5, 2.5],
        "schemas": {"spool": "abc"},
        "positions": {"spool": [{"f": "a.jsonl", "o": 10, "eof": True}]},
        "record_offsets": expected,
    }


def test_offsets_are_read_as_the_pieces_are_taken() -> None:
    """The offsets' chunks are pulled one at a time, as the file is written: none is read
    ahead, so no more than one is formatted in memory at once."""
    pulled: list[int] = []

    def chunks() -> Iterable[array[int]]:
        for i in range(3):
            pulled.append(i)
            yield array("Q", [i])

    pieces = manifest.parts(**_fields(chunks()))
    head = next(pieces)
    assert pulled == []
    first = next(pieces)
    assert pulled == [0]
    rest = list(pieces)
    assert pulled == [0, 1, 2]
    assert orjson.loads(b"".join([head, first, *rest]))["record_offsets"] == [0, 1, 2]


def test_a_scan_into_record_offsets_keeps_a_bounded_part_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a manifest rebuilt at recovery is: the offsets past OFFSETS_IN_MEMORY wait in a file
    # (a stale copy of which, left by a crash, is replaced), and come out as the plain scan's.
    monkeypatch.setattr(shards, "OFFSETS_IN_MEMORY", 100)
    monkeypatch.setattr(manifest, "_LENGTHS_AT_ONCE", 64)
    path = tmp_path / "a.tfrecord.gz"
    with path.open("wb") as f:
        writer = RecordWriter(f.write, Compression.GZIP)
        writer.write_many([b"x" * (i % 37) for i in range(1_000)])
        writer.finish()
    plain = manifest.scan(str(path))
    spill = tmp_path / ".a_tfrecord_gz_offsets.inprogress"
    spill.write_bytes(b"left by a crash")
    offsets = shards.RecordOffsets(LOCAL, str(spill))
    measured = manifest.scan(str(path), offsets)
    offsets.close()
    assert "record_offsets" not in measured
    assert measured == {k: v for k, v in plain.items() if k != "record_offsets"}
    assert measured["records"] == 1_000
    assert offsets.in_memory < 100
    assert spill.stat().st_size == 8 * (1_000 - offsets.in_memory)
    chunks = list(offsets.chunks())
    assert array("Q", [o for c in chunks for o in c]) == plain["record_offsets"]
    offsets.remove()
    assert not spill.exists()


class _Dribble:
    """A stream that hands out at most a few bytes per read, as a network stream may."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    def read(self, n: int = -1) -> bytes:
        n = min(n if n >= 0 else len(self._data), 7)
        out, self._data = bytes(self._data[:n]), self._data[n:]
        return out


@pytest.mark.parametrize("compression", list(Compression))
def test_a_stream_scans_as_the_file_does(tmp_path: Path, compression: Compression) -> None:
    # A manifest rebuilt from an object read back from a store: one pass over a stream.
    path = tmp_path / f"a{SUFFIXES[compression]}"
    with path.open("wb") as f:
        writer = RecordWriter(f.write, compression)
        writer.write_many([b"y" * (i % 53) for i in range(700)])
        writer.finish()
    plain = manifest.scan(str(path))
    stream = cast(BinaryIO, _Dribble(path.read_bytes()))
    streamed = manifest.scan(stream, compression=compression)
    assert streamed == plain
    assert streamed["size"] == path.stat().st_size
