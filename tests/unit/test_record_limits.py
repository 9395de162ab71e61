"""Record limits: a record over the reader's limit is reported as such (never as corrupted), the
daemon reads back whatever it wrote, and source limits are checked with their encoder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfrecordd.cli import main
from tfrecordd.config import parse_config
from tfrecordd.errors import ConfigError, CorruptRecordError, RecordLimitError
from tfrecordd.format.compression import Compression
from tfrecordd.format.framing import DEFAULT_MAX_RECORD_BYTES, frame
from tfrecordd.format.reader import iter_records
from tfrecordd.format.writer import RecordWriter
from tfrecordd.outputs import manifest
from tfrecordd.plugin import Registry

BIG = DEFAULT_MAX_RECORD_BYTES + 1024
"""Just over the reader's default limit (256 MiB)."""


def shard(path: Path, records: list[bytes], compression: Compression = Compression.NONE) -> Path:
    with path.open("wb") as f:
        writer = RecordWriter(f.write, compression)
        writer.write_many(records)
        writer.finish()
    return path


def test_a_record_over_the_limit_is_oversized_not_corrupted(tmp_path: Path) -> None:
    path = shard(tmp_path / "a.tfrecord", [b"x" * 100, b"y" * 1000])
    with pytest.raises(RecordLimitError) as caught:
        list(iter_records(path, max_record_bytes=999))
    e = caught.value
    assert not isinstance(e, CorruptRecordError)
    assert (e.kind, e.offset) == ("oversized", 116)
    assert "over the limit of 999 bytes" in str(e)
    assert "--max-record-bytes" in str(e)
    assert "max_record_bytes=" in str(e)
    assert [len(r) for r in iter_records(path, max_record_bytes=1000)] == [100, 1000]
    # A damaged length is still corrupted, whatever the limit.
    damaged = bytearray(path.read_bytes())
    damaged[116] ^= 1
    (tmp_path / "b.tfrecord").write_bytes(bytes(damaged))
    with pytest.raises(CorruptRecordError, match="length CRC mismatch"):
        list(iter_records(tmp_path / "b.tfrecord", max_record_bytes=100))


def test_verify_names_the_limit_and_how_to_raise_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(shard(tmp_path / "a.tfrecord.gz", [b"z" * 5000], Compression.GZIP))
    assert main(["verify", "--max-record-bytes", "4k", path]) == 65
    out = capsys.readouterr().out
    assert "oversized record at offset 0" in out
    assert "--max-record-bytes" in out
    assert "corrupted" not in out
    assert main(["verify", "--json", "--max-record-bytes", "4k", path]) == 65
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    assert entry["error"]["kind"] == "oversized"
    assert main(["verify", "--max-record-bytes", "5000", path]) == 0


def test_a_record_over_256_mib_verifies_with_the_limit_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = shard(tmp_path / "big.tfrecord", [b"a", bytes(BIG), b"b"])
    records = [len(r) for r in iter_records(path, max_record_bytes=BIG)]
    assert records == [1, BIG, 1]
    # With a manifest beside it, as the daemon publishes one: verify checks it with its limits.
    manifest_path = tmp_path / manifest.manifest_name(path.name)
    measured = manifest.scan(str(path))
    doc = {k: v for k, v in measured.items() if k != "record_offsets"}
    doc["record_offsets"] = measured["record_offsets"].tolist()
    manifest_path.write_text(json.dumps(doc))
    assert main(["verify", str(path)]) == 65
    out = capsys.readouterr().out
    assert "oversized record at offset 17" in out
    assert "corrupted" not in out
    assert main(["verify", "--max-record-bytes", "300M", str(path)]) == 0
    assert "OK" in capsys.readouterr().out


def test_the_daemon_scans_back_any_record_it_wrote(tmp_path: Path) -> None:
    """Recovery rebuilds a lost manifest by scanning the shard: a record over the reader's
    default limit must not stop it (it did, at every start: exit 65)."""
    for compression in (Compression.NONE, Compression.GZIP):
        path = shard(tmp_path / f"big.tfrecord{compression.value}", [bytes(BIG)], compression)
        measured = manifest.scan(str(path))
        assert measured["records"] == 1
        assert list(measured["record_offsets"]) == [0]
        assert measured["size"] == path.stat().st_size
        # Tools pass their limits, and are stopped by them.
        with pytest.raises(RecordLimitError):
            manifest.scan(str(path), max_record_bytes=DEFAULT_MAX_RECORD_BYTES)
        path.unlink()
    assert len(frame(b"")) == 16


# --- limits that interact, checked at config time -------------------------------------------


def config(source: dict[str, object], encoder: dict[str, object]) -> dict[str, object]:
    return {
        "daemon": {"state_dir": "/tmp/state"},
        "output": {"dir": "/tmp/out"},
        "sources": [{"name": "in", "encoder": "e"} | source],
        "encoders": {"e": encoder},
    }


REGISTRY = Registry.from_entry_points()
WHOLE = {"type": "directory", "path": "/tmp/spool", "format": "whole-file"}
LINES = {"type": "directory", "path": "/tmp/spool"}
REDIS = {"type": "redis-stream", "url": "redis://127.0.0.1/0", "stream": "s", "group": "g"}
EXAMPLE = {"type": "example", "features": {"id": "int64"}}


@pytest.mark.parametrize(
    ("source", "encoder", "key"),
    [
        (WHOLE | {"max_file_bytes": "3GiB"}, {"type": "passthrough"}, "max_file_bytes"),
        (WHOLE | {"max_file_bytes": "2GiB"}, {"type": "image"}, "max_file_bytes"),
        (LINES | {"max_line_bytes": "4GiB"}, {"type": "passthrough"}, "max_line_bytes"),
        (REDIS | {"max_event_bytes": "3GiB"}, {"type": "passthrough"}, "max_event_bytes"),
    ],
)
def test_an_event_limit_past_what_readers_parse_is_a_config_error(
    source: dict[str, object], encoder: dict[str, object], key: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config(source, encoder), REGISTRY)
    (error,) = caught.value.errors
    assert error.startswith(f"sources[0].{key}: ")
    assert "2 GiB" in error
    assert str(encoder["type"]) in error


@pytest.mark.parametrize(
    ("source", "encoder"),
    [
        (WHOLE | {"max_file_bytes": "2047MiB"}, {"type": "passthrough"}),
        (WHOLE | {"max_file_bytes": "3GiB"}, EXAMPLE),  # the record is not the event
        (LINES | {"max_file_bytes": "3GiB"}, {"type": "passthrough"}),  # not whole files
        (REDIS | {"max_event_bytes": "1GiB"}, {"type": "passthrough"}),
    ],
)
def test_limits_that_fit_pass(source: dict[str, object], encoder: dict[str, object]) -> None:
    parse_config(config(source, encoder), REGISTRY)
