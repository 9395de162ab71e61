"""TensorFlow and tfrecordd read each other's TFRecord files, in every compression both know."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tfrecordd.cli import main
from tfrecordd.errors import EXIT_DATA, EXIT_OK
from tfrecordd.format.compression import SUFFIXES, TF_COMPRESSION_TYPE, Compression
from tfrecordd.format.reader import iter_records
from tfrecordd.format.writer import open_writer, pack

pytestmark = pytest.mark.tensorflow

TF_READABLE = [Compression.NONE, Compression.GZIP, Compression.ZLIB]
RECORDS = [
    b"",
    b"short",
    os.urandom(5000),
    b"z" * 70_000,
    *(os.urandom(n) for n in range(0, 64, 7)),
]


@pytest.fixture(scope="module")
def tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return pytest.importorskip("tensorflow")


def _tf_read(tf: Any, path: Path, compression: Compression) -> list[bytes]:
    dataset = tf.data.TFRecordDataset(str(path), compression_type=TF_COMPRESSION_TYPE[compression])
    return [t.numpy() for t in dataset]


def _tf_write(tf: Any, path: Path, compression: Compression) -> Path:
    options = tf.io.TFRecordOptions(compression_type=TF_COMPRESSION_TYPE[compression])
    with tf.io.TFRecordWriter(str(path), options) as w:
        for r in RECORDS:
            w.write(r)
    return path


@pytest.mark.parametrize("compression", TF_READABLE)
def test_tensorflow_reads_our_files_with_many_sync_points(
    tf: Any, tmp_path: Path, compression: Compression
) -> None:
    path = tmp_path / f"ours{SUFFIXES[compression]}"
    with open_writer(path, compression) as w:
        for i, r in enumerate(RECORDS):
            w.write(r)
            if i % 3 == 0:
                w.sync()  # gzip: a new member; zlib: a full flush
        w.write_many(RECORDS)
    assert _tf_read(tf, path, compression) == RECORDS + RECORDS


@pytest.mark.parametrize("compression", TF_READABLE)
def test_tensorflow_reads_packed_units_then_a_running_unit_as_one_stream(
    tf: Any, tmp_path: Path, compression: Compression
) -> None:
    # What the daemon's shards hold: batches compressed where they were encoded, appended whole,
    # then records compressed by the shard's own stream (test_daemon_tensorflow runs a daemon).
    records = [b"record %d" % i for i in range(2510)]
    path = tmp_path / f"mixed{SUFFIXES[compression]}"
    with open_writer(path, compression) as w:
        for start in (0, 1000, 2000):
            w.write_packed(pack(records[start : min(start + 1000, 2500)], compression))
        w.write_many(records[2500:])
    assert _tf_read(tf, path, compression) == records
    assert list(iter_records(path)) == records


@pytest.mark.parametrize("compression", TF_READABLE)
def test_tensorflow_reads_our_empty_files(
    tf: Any, tmp_path: Path, compression: Compression
) -> None:
    path = tmp_path / f"empty{SUFFIXES[compression]}"
    with open_writer(path, compression):
        pass
    assert _tf_read(tf, path, compression) == []


@pytest.mark.parametrize("compression", TF_READABLE)
def test_we_read_and_verify_tensorflow_files(
    tf: Any, tmp_path: Path, compression: Compression, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _tf_write(tf, tmp_path / f"tf{SUFFIXES[compression]}", compression)
    assert list(iter_records(path)) == RECORDS
    assert main(["verify", str(path)]) == EXIT_OK
    assert f"{len(RECORDS)} records" in capsys.readouterr().out


@pytest.mark.parametrize("compression", TF_READABLE)
def test_damaged_tensorflow_files_are_reported(
    tf: Any, tmp_path: Path, compression: Compression, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _tf_write(tf, tmp_path / f"tf{SUFFIXES[compression]}", compression).read_bytes()
    truncated = tmp_path / f"truncated{SUFFIXES[compression]}"
    truncated.write_bytes(data[: len(data) - 100])
    flipped = tmp_path / f"flipped{SUFFIXES[compression]}"
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0x04
    flipped.write_bytes(bytes(damaged))

    assert main(["verify", "--json", str(truncated), str(flipped)]) == EXIT_DATA
    files = json.loads(capsys.readouterr().out)["files"]
    assert files[0]["error"]["kind"].startswith("truncated")
    assert files[1]["error"]["kind"].startswith("corrupted")
    # TensorFlow agrees that neither file is sound.
    for path in (truncated, flipped):
        with pytest.raises(tf.errors.DataLossError):
            _tf_read(tf, path, compression)


def test_from_generator_feeds_tf_data(tf: Any, tmp_path: Path) -> None:
    path = tmp_path / f"gen{SUFFIXES[Compression.ZSTD]}"
    with open_writer(path, Compression.ZSTD) as w:
        w.write_many(RECORDS)
    dataset = tf.data.Dataset.from_generator(
        lambda: iter_records(path), output_signature=tf.TensorSpec(shape=(), dtype=tf.string)
    )
    assert [t.numpy() for t in dataset] == RECORDS
    assert [t.numpy() for t in dataset] == RECORDS  # each pass opens the file afresh


def test_verify_is_stricter_than_tensorflow_about_a_lost_gzip_trailer(
    tf: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _tf_write(tf, tmp_path / "tf.tfrecord.gz", Compression.GZIP).read_bytes()
    cut = tmp_path / "no-trailer.tfrecord.gz"
    cut.write_bytes(data[:-8])  # the CRC32 and length trailer, nothing else
    # TensorFlow returns every record and never checks the trailer; verify calls the file cut short.
    assert _tf_read(tf, cut, Compression.GZIP) == RECORDS
    assert main(["verify", str(cut)]) == EXIT_DATA
    assert "truncated compressed stream" in capsys.readouterr().out
