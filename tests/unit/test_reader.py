"""The record reader: sources, detection, and a typed error for every kind of bad input."""

from __future__ import annotations

import gc
import importlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tfrecordd.errors import (
    CorruptRecordError,
    CorruptStreamError,
    DecodeError,
    DecompressionLimitError,
    InputError,
    RecordLimitError,
    TfrecorddError,
    TruncatedRecordError,
    TruncatedStreamError,
)
from tfrecordd.format import proto
from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.framing import OVERHEAD
from tfrecordd.format.reader import (
    iter_examples,
    iter_records,
    iter_records_with_offsets,
    iter_sequence_examples,
)
from tfrecordd.format.writer import RecordWriter, open_writer, pack

# fsspec ships no type information.
fsspec: Any = importlib.import_module("fsspec")

RECORDS = [b"alpha", b"", b"\xff" * 1000, os.urandom(300)]


def _write(path: Path, compression: Compression, records: list[bytes] = RECORDS) -> Path:
    with open_writer(path, compression) as w:
        w.write_many(records[:2])
        w.sync()
        w.write_many(records[2:])
    return path


def _bytes(compression: Compression, records: list[bytes] = RECORDS) -> bytes:
    out = bytearray()
    w = RecordWriter(out.extend, compression)
    w.write_many(records)
    w.finish()
    return bytes(out)


@pytest.mark.parametrize("compression", list(Compression))
def test_local_path_round_trip_with_detection(tmp_path: Path, compression: Compression) -> None:
    path = _write(tmp_path / f"s{SUFFIXES[compression]}", compression)
    assert list(iter_records(path)) == RECORDS
    assert list(iter_records(str(path), compression=compression)) == RECORDS
    # Detection is by content: the name is no help here.
    renamed = path.rename(tmp_path / "no-suffix")
    assert list(iter_records(renamed)) == RECORDS


def test_offsets_are_positions_in_the_decompressed_stream(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.tfrecord.zst", Compression.ZSTD)
    offsets = [o for o, _ in iter_records_with_offsets(path)]
    expected = [0]
    for r in RECORDS[:-1]:
        expected.append(expected[-1] + len(r) + OVERHEAD)
    assert offsets == expected


def test_open_binary_stream_is_read_and_left_open() -> None:
    stream = io.BytesIO(_bytes(Compression.GZIP))
    assert list(iter_records(stream)) == RECORDS
    assert not stream.closed


def test_fsspec_url(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    with fs.open("/tfrecordd-test/shard.tfrecord.gz", "wb") as f:
        f.write(_bytes(Compression.GZIP))
    try:
        assert list(iter_records("memory://tfrecordd-test/shard.tfrecord.gz")) == RECORDS
        with pytest.raises(InputError, match="directory"):
            list(iter_records("memory://tfrecordd-test"))
        with pytest.raises(InputError, match="no such file"):
            list(iter_records("memory://tfrecordd-test/missing.tfrecord"))
    finally:
        fs.rm("/tfrecordd-test", recursive=True)


def test_file_url_is_a_local_path(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.tfrecord", Compression.NONE)
    assert list(iter_records(f"file://{path}")) == RECORDS


@pytest.mark.parametrize("suffix", [".tfrecord", ".tfrecord.gz", ".tfrecord.zz", ".tfrecord.zst"])
def test_empty_file_has_zero_records(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"empty{suffix}"
    path.write_bytes(b"")
    assert list(iter_records(path)) == []


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file") as info:
        list(iter_records(tmp_path / "nope.tfrecord"))
    assert info.value.path == str(tmp_path / "nope.tfrecord")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        list(iter_records(tmp_path))


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.tfrecord"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        list(iter_records(fifo))


def test_wrong_magic_for_the_suffix(tmp_path: Path) -> None:
    path = tmp_path / "image.tfrecord.gz"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(100))
    with pytest.raises(CorruptStreamError):
        list(iter_records(path))


def test_not_a_tfrecord_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"just some text, long enough for a header\n")
    with pytest.raises(CorruptRecordError, match="not a TFRecord") as info:
        list(iter_records(path))
    assert info.value.offset == 0


def test_truncated_and_corrupted_plain_files(tmp_path: Path) -> None:
    data = _bytes(Compression.NONE)
    path = tmp_path / "s.tfrecord"
    path.write_bytes(data[:-3])
    with pytest.raises(TruncatedRecordError):
        list(iter_records(path))
    flipped = bytearray(data)
    flipped[len(RECORDS[0]) + OVERHEAD + 5] ^= 0x40
    path.write_bytes(bytes(flipped))
    records = iter_records(path)
    assert next(records) == RECORDS[0]
    with pytest.raises(CorruptRecordError) as info:
        next(records)
    assert info.value.offset == len(RECORDS[0]) + OVERHEAD


def test_damage_to_a_stored_zstd_unit_is_caught_by_the_record_crcs(tmp_path: Path) -> None:
    # A unit that does not compress is stored without zstd's content checksum (its records
    # carry their own CRCs): a flip anywhere in it, headers included, must fail the read or
    # change nothing that is read.
    records = [os.urandom(70_000), os.urandom(90_000)]
    packed = pack(records, Compression.ZSTD)
    out = io.BytesIO()
    writer = RecordWriter(out.write, Compression.ZSTD)
    writer.write(b"first")
    writer.write_packed(packed)
    writer.finish()
    data = out.getvalue()
    path = tmp_path / "s.tfrecord.zst"
    path.write_bytes(data)
    assert list(iter_records(path)) == [b"first", *records]
    start = data.index(packed.unit.data)
    frame_header = 10
    headers = [start + frame_header, start + frame_header + 3 + (128 << 10)]
    positions = [*range(start, start + frame_header)]
    positions += [h + i for h in headers for i in range(3)]
    positions += range(start, start + len(packed.unit.data), 997)
    undetected = 0
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 0x10
        path.write_bytes(bytes(flipped))
        try:
            read = list(iter_records(path))
        except TfrecorddError:
            continue
        # Header bits a decoder must ignore, or a larger window than the frame needs.
        assert pos - start in (4, 5), pos - start
        assert read == [b"first", *records]
        undetected += 1
    assert undetected < 4, undetected


def test_gzip_cut_mid_member(tmp_path: Path) -> None:
    path = tmp_path / "s.tfrecord.gz"
    path.write_bytes(_bytes(Compression.GZIP)[:-20])
    with pytest.raises(TruncatedStreamError, match="inside a gzip member"):
        list(iter_records(path))


def test_limits_are_passed_through(tmp_path: Path) -> None:
    path = _write(tmp_path / "big.tfrecord.zst", Compression.ZSTD, [bytes(2 << 20)])
    with pytest.raises(DecompressionLimitError):
        list(iter_records(path, max_decompressed_bytes=1 << 20))
    with pytest.raises(RecordLimitError, match="over the limit"):
        list(iter_records(path, max_record_bytes=1 << 20))
    assert len(next(iter_records(path))) == 2 << 20


def _example(**features: list[bytes] | list[int] | list[float]) -> bytes:
    msg = proto.Example()
    for name, values in features.items():
        feature = msg.features.feature[name]
        if values and isinstance(values[0], bytes):
            feature.bytes_list.value.extend(values)
        elif values and isinstance(values[0], int):
            feature.int64_list.value.extend(values)
        else:
            feature.float_list.value.extend(values)
    data: bytes = msg.SerializeToString()
    return data


def test_iter_examples(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "ex.tfrecord.gz",
        Compression.GZIP,
        [_example(text=[b"hi"], ids=[1, 2]), _example(score=[0.5])],
    )
    assert list(iter_examples(path)) == [{"text": [b"hi"], "ids": [1, 2]}, {"score": [0.5]}]


def test_iter_sequence_examples(tmp_path: Path) -> None:
    msg = proto.SequenceExample()
    msg.context.feature["user"].bytes_list.value.append(b"u1")
    steps = msg.feature_lists.feature_list["clicks"].feature
    steps.add().int64_list.value.extend([1, 2])
    steps.add().int64_list.value.append(3)
    path = _write(tmp_path / "seq.tfrecord", Compression.NONE, [msg.SerializeToString()])
    assert list(iter_sequence_examples(path)) == [({"user": [b"u1"]}, {"clicks": [[1, 2], [3]]})]


def test_a_record_that_is_not_an_example(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.tfrecord", Compression.NONE, [_example(a=[1]), b"\xff\xff\xff"])
    examples = iter_examples(path)
    assert next(examples) == {"a": [1]}
    with pytest.raises(DecodeError, match=r"x\.tfrecord: record at offset \d+"):
        next(examples)


def test_an_abandoned_iterator_closes_its_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.tfrecord.gz", Compression.GZIP)
    before = len(os.listdir("/proc/self/fd"))
    records: Iterator[bytes] = iter_records(path)
    next(records)
    assert len(os.listdir("/proc/self/fd")) == before + 1
    del records
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before
