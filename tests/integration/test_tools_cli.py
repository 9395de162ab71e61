"""The shard tools through the real command line: verify, cat and transcode, good and bad input."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support import run_tfrecordd
from tfrecordd.cli import main
from tfrecordd.cli.tools import output_name
from tfrecordd.errors import EXIT_DATA, EXIT_OK
from tfrecordd.format import proto
from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.framing import OVERHEAD
from tfrecordd.format.reader import iter_records
from tfrecordd.format.writer import open_writer


def _example(text: bytes, n: int) -> bytes:
    msg = proto.Example()
    msg.features.feature["text"].bytes_list.value.append(text)
    msg.features.feature["n"].int64_list.value.append(n)
    data: bytes = msg.SerializeToString()
    return data


RECORDS = [_example(b"hello", 1), _example(b"\xff\xfe", 2), _example("żółw".encode(), 3)]


def _shard(path: Path, compression: Compression, records: list[bytes] = RECORDS) -> Path:
    with open_writer(path, compression) as w:
        for r in records:
            w.write(r)
            w.sync()
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def shards(tmp_path: Path) -> dict[Compression, Path]:
    return {c: _shard(tmp_path / f"part{SUFFIXES[c]}", c) for c in Compression}


def test_verify_sound_files(
    capsys: pytest.CaptureFixture[str], shards: dict[Compression, Path]
) -> None:
    code, out, _ = _run(capsys, "verify", *map(str, shards.values()))
    assert code == EXIT_OK
    for path in shards.values():
        assert f"OK   {path}: 3 records" in out
    assert out.splitlines()[-1] == "total: 12 records in 4 files, 0 bad"


def test_verify_json(capsys: pytest.CaptureFixture[str], shards: dict[Compression, Path]) -> None:
    code, out, _ = _run(capsys, "verify", "--json", str(shards[Compression.ZSTD]))
    doc = json.loads(out)
    assert code == EXIT_OK
    assert doc == {
        "ok": True,
        "files": [{"path": str(shards[Compression.ZSTD]), "ok": True, "records": 3, "error": None}],
        "total_records": 3,
        "bad_files": 0,
        "skipped": [],
    }


def _verify_error(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> dict[str, object]:
    code, out, _ = _run(capsys, "verify", "--json", *extra, str(path))
    doc = json.loads(out)
    assert code != EXIT_OK
    assert doc["ok"] is False
    file = doc["files"][0]
    assert file["path"] == str(path)
    error: dict[str, object] = file["error"]
    return {"code": code, "records": file["records"], **error}


def test_truncated_plain_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _shard(tmp_path / "t.tfrecord", Compression.NONE)
    path.write_bytes(path.read_bytes()[:-5])
    e = _verify_error(capsys, path)
    second_last = sum(len(r) + OVERHEAD for r in RECORDS[:-1])
    assert (e["code"], e["kind"], e["offset"], e["records"]) == (
        EXIT_DATA,
        "truncated",
        second_last,
        2,
    )
    code, out, _ = _run(capsys, "verify", str(path))
    assert code == EXIT_DATA
    assert f"BAD  {path}: truncated record at offset {second_last}" in out


def test_bit_flipped_plain_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _shard(tmp_path / "f.tfrecord", Compression.NONE)
    data = bytearray(path.read_bytes())
    data[len(RECORDS[0]) + OVERHEAD + 14] ^= 0x01
    path.write_bytes(bytes(data))
    e = _verify_error(capsys, path)
    assert (e["code"], e["kind"], e["offset"], e["records"]) == (
        EXIT_DATA,
        "corrupted",
        len(RECORDS[0]) + OVERHEAD,
        1,
    )


def test_bit_flipped_gzip_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _shard(tmp_path / "f.tfrecord.gz", Compression.GZIP)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # inside the last member's length trailer
    path.write_bytes(bytes(data))
    e = _verify_error(capsys, path)
    assert (e["code"], e["kind"]) == (EXIT_DATA, "corrupted compressed stream")


def test_gzip_cut_mid_member(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _shard(tmp_path / "cut.tfrecord.gz", Compression.GZIP)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 10])
    e = _verify_error(capsys, path)
    assert (e["code"], e["kind"], e["records"]) == (EXIT_DATA, "truncated compressed stream", 2)
    assert "inside a gzip member" in str(e["message"])


def test_wrong_magic(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "photo.tfrecord.zst"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    e = _verify_error(capsys, path)
    assert (e["code"], e["kind"], e["offset"]) == (EXIT_DATA, "corrupted compressed stream", 0)


def test_decompression_bomb(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _shard(tmp_path / "bomb.tfrecord.gz", Compression.GZIP, [bytes(32 << 20)])
    assert path.stat().st_size < 100_000
    e = _verify_error(capsys, path, "--max-decompressed-bytes", "4M")
    assert (e["code"], e["kind"]) == (EXIT_DATA, "too large compressed stream")
    code, _, _ = _run(capsys, "verify", "--max-decompressed-bytes", "64M", str(path))
    assert code == EXIT_OK


def test_empty_file_is_sound_and_empty(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "empty.tfrecord.gz"
    path.write_bytes(b"")
    code, out, _ = _run(capsys, "verify", str(path))
    assert code == EXIT_OK
    assert f"OK   {path}: 0 records" in out


def test_directory_and_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "verify", str(tmp_path), str(tmp_path / "missing.tfrecord"))
    assert code != EXIT_OK
    assert f"BAD  {tmp_path}: is a directory, not a TFRecord file" in out
    assert f"BAD  {tmp_path / 'missing.tfrecord'}: no such file" in out
    code, _, err = _run(capsys, "cat", str(tmp_path))
    assert code != EXIT_OK
    assert err == f"tfrecordd: {tmp_path}: is a directory, not a TFRecord file\n"


def test_one_bad_file_among_good_ones(
    capsys: pytest.CaptureFixture[str], shards: dict[Compression, Path], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(b"\0" * 20)
    code, out, _ = _run(capsys, "verify", str(shards[Compression.GZIP]), str(bad))
    assert code == EXIT_DATA
    assert out.splitlines()[-1] == "total: 3 records in 2 files, 1 bad"


def test_cat_prints_examples_as_json_lines(
    capsys: pytest.CaptureFixture[str], shards: dict[Compression, Path]
) -> None:
    code, out, _ = _run(capsys, "cat", str(shards[Compression.ZLIB]))
    assert code == EXIT_OK
    assert [json.loads(line) for line in out.splitlines()] == [
        {"n": [1], "text": ["hello"]},
        {"n": [2], "text": [{"base64": "//4="}]},
        {"n": [3], "text": ["żółw"]},
    ]


def test_cat_json_limit_and_several_files(
    capsys: pytest.CaptureFixture[str], shards: dict[Compression, Path]
) -> None:
    gz, zst = str(shards[Compression.GZIP]), str(shards[Compression.ZSTD])
    code, out, _ = _run(capsys, "cat", "--json", "--limit", "4", gz, zst)
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == EXIT_OK
    assert [(x["path"], x["example"]["n"]) for x in lines] == [
        (gz, [1]),
        (gz, [2]),
        (gz, [3]),
        (zst, [1]),
    ]
    assert lines[1]["offset"] == len(RECORDS[0]) + OVERHEAD


def test_cat_sequence_examples(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    msg = proto.SequenceExample()
    msg.context.feature["id"].int64_list.value.append(7)
    steps = msg.feature_lists.feature_list["tokens"].feature
    steps.add().bytes_list.value.extend([b"a", b"b"])
    steps.add().bytes_list.value.append(b"\x80")
    path = _shard(tmp_path / "seq.tfrecord", Compression.NONE, [msg.SerializeToString()])
    code, out, _ = _run(capsys, "cat", "--sequence", str(path))
    assert code == EXIT_OK
    assert json.loads(out) == {
        "context": {"id": [7]},
        "feature_lists": {"tokens": [["a", "b"], [{"base64": "gA=="}]]},
    }


def test_cat_a_record_that_is_not_an_example(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _shard(tmp_path / "raw.tfrecord", Compression.NONE, [RECORDS[0], b"\xff\xff"])
    code, out, err = _run(capsys, "cat", str(path))
    assert code == EXIT_DATA
    assert len(out.splitlines()) == 1
    assert err.startswith(f"tfrecordd: {path}: record at offset {len(RECORDS[0]) + OVERHEAD}:")


@pytest.mark.parametrize("to", list(Compression))
def test_transcode(
    capsys: pytest.CaptureFixture[str],
    shards: dict[Compression, Path],
    tmp_path: Path,
    to: Compression,
) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    src = shards[Compression.ZSTD]
    code, _, _ = _run(capsys, "transcode", str(src), "--to", to.value, "--out", str(out_dir))
    assert code == EXIT_OK
    dst = out_dir / f"part{SUFFIXES[to]}"
    assert os.listdir(out_dir) == [dst.name]
    assert list(iter_records(dst, compression=to)) == RECORDS

    dst.write_bytes(b"keep me")
    code, _, err = _run(capsys, "transcode", str(src), "--to", to.value, "--out", str(out_dir))
    assert code != EXIT_OK
    assert "refusing to overwrite" in err
    assert dst.read_bytes() == b"keep me"
    assert os.listdir(out_dir) == [dst.name]


def test_transcode_of_a_bad_source_publishes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src = _shard(tmp_path / "cut.tfrecord.gz", Compression.GZIP)
    src.write_bytes(src.read_bytes()[:-4])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, _, err = _run(capsys, "transcode", str(src), "--to", "zstd", "--out", str(out_dir))
    assert code == EXIT_DATA
    assert "truncated compressed stream" in err
    assert os.listdir(out_dir) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("a/part-0001.tfrecord.gz", "part-0001.tfrecord.zst"),
        ("part.tfrecord", "part.tfrecord.zst"),
        ("part.zlib", "part.tfrecord.zst"),
        ("data.bin", "data.bin.tfrecord.zst"),
    ],
)
def test_output_name(source: str, expected: str) -> None:
    assert output_name(source, Compression.ZSTD) == expected


def _subprocess(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_tfrecordd(*argv)


def test_subprocess_verify_reports_a_truncated_gzip_file(tmp_path: Path) -> None:
    path = _shard(tmp_path / "cut.tfrecord.gz", Compression.GZIP)
    path.write_bytes(path.read_bytes()[:-10])
    result = _subprocess("verify", str(path))
    assert result.returncode == EXIT_DATA
    assert f"BAD  {path}: truncated compressed stream" in result.stdout
    assert "Traceback" not in result.stderr


def test_subprocess_cat_of_a_directory(tmp_path: Path) -> None:
    result = _subprocess("cat", str(tmp_path))
    assert result.returncode != EXIT_OK
    assert result.stderr == f"tfrecordd: {tmp_path}: is a directory, not a TFRecord file\n"
