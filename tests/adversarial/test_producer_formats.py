"""What producers' own tools write, read as docs/sources/directory.md's table says: each row of
the table is a case here, the exact bytes the tool writes put in a spool, the outcome checked.

Each file is read by the directory source (``tfrecordd.testing.RecordingContext``) and its
events encoded by an ``example`` encoder, as the daemon does; the outcome is the list of what
each event became: its features, or the reason it was dead-lettered, or the file's refusal.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.support import run_source_until
from tfrecordd.format import proto
from tfrecordd.plugin import RawEvent
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig
from tfrecordd_plugins.sources.directory import DirectorySourceConfig

pytestmark = pytest.mark.anyio

BOM = b"\xef\xbb\xbf"
ROWS = [{"id": 1, "name": "ann"}, {"id": 2, "name": "bo, jr"}]
A = {"id": [1], "name": [b"ann"]}
B = {"id": [2], "name": [b"bo, jr"]}


def _refused(why: str) -> tuple[str, str]:
    return ("refused", why)


def _dead(why: str) -> tuple[str, str]:
    return ("dead letter", why)


def _jsonl(sep: bytes, rows: list[dict[str, Any]] = ROWS) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + sep for r in rows)


CASES: dict[str, tuple[Literal["csv", "jsonl"], bytes, list[Any] | None]] = {
    # -- CSV ---------------------------------------------------------------------------------
    "Excel, CSV UTF-8": (
        "csv",
        BOM + b'id,name\r\n1,ann\r\n2,"bo, jr"\r\n',
        [A, B],
    ),
    "Excel, CSV (Macintosh)": ("csv", b'id,name\r1,ann\r2,"bo, jr"\r', [A, B]),
    "Excel, Unicode Text (UTF-16)": (
        "csv",
        "id\tname\r\n1\tann\r\n".encode("utf-16"),
        [_refused("UTF-16 text")],
    ),
    "LibreOffice Calc": ("csv", b'id,name\n1,ann\n2,"bo, jr"\n', [A, B]),
    "pandas to_csv": ("csv", b',id,name\n0,1,ann\n1,2,"bo, jr"\n', [A, B]),
    "pandas to_csv(index=False)": ("csv", b'id,name\n1,ann\n2,"bo, jr"\n', [A, B]),
    "PowerShell 5.1 Export-Csv -NoTypeInformation": (
        "csv",
        BOM + b'"id","name"\r\n"1","ann"\r\n"2","bo, jr"\r\n',
        [A, B],
    ),
    "PowerShell 5.1 Export-Csv": (
        "csv",
        BOM + b'#TYPE System.Management.Automation.PSCustomObject\r\n"id","name"\r\n"1","ann"\r\n',
        [A],
    ),
    "PowerShell 7 Export-Csv": ("csv", b'"id","name"\r\n"1","ann"\r\n"2","bo, jr"\r\n', [A, B]),
    "Python csv.writer": ("csv", b'id,name\r\n1,ann\r\n2,"bo, jr"\r\n', [A, B]),
    "CSV without a final newline": ("csv", b'id,name\n1,ann\n2,"bo, jr"', [A, B]),
    "CSV header only": ("csv", b"id,name\r\n", []),
    "CSV empty file": ("csv", b"", []),
    "CSV header longer than max_line_bytes": (
        "csv",
        b"id,name," + b"x" * 2000 + b"\n1,ann,\n",
        [_refused("longer than max_line_bytes")],
    ),
    "CSV with a number beyond a double": (
        "csv",
        b"id,name\n1e400,ann\n",
        [_dead("expected int64")],
    ),
    # -- JSON lines --------------------------------------------------------------------------
    "jq -c": ("jsonl", _jsonl(b"\n"), [A, B]),
    "jq (pretty, not JSON lines)": (
        "jsonl",
        b'{\n  "id": 1,\n  "name": "ann"\n}\n',
        [_dead("not valid JSON")] * 4,
    ),
    ".NET / Java logger on Windows (CRLF)": ("jsonl", _jsonl(b"\r\n"), [A, B]),
    ".NET Encoding.UTF8 (a byte-order mark)": (
        "jsonl",
        BOM + _jsonl(b"\r\n"),
        [A, B],
    ),
    "Java logger (LF)": ("jsonl", _jsonl(b"\n"), [A, B]),
    "Python json.dumps, NaN": (
        "jsonl",
        b'{"id": 1, "name": "ann", "score": NaN}\n{"id": 2, "name": "bo, jr"}\n',
        [_dead("not valid JSON"), B],
    ),
    "JSON lines without a final newline": ("jsonl", _jsonl(b"\n")[:-1], [A, B]),
    "JSON lines empty file": ("jsonl", b"", []),
    "JSON lines, UTF-16": ("jsonl", _jsonl(b"\n", ROWS[:1]).decode().encode("utf-16"), None),
    "JSON, big numbers in an unused field": (
        "jsonl",
        b'{"id": 1, "name": "ann", "n": 1e400, "m": ' + b"9" * 310 + b"}\n",
        [A],
    ),
    "JSON, a big number in a feature": ("jsonl", b'{"id": 1e400}\n', [_dead("out of range")]),
}


async def _outcome(
    spool: Path, fmt: Literal["csv", "jsonl"], pattern: str | None = None, **options: Any
) -> list[Any]:
    pattern = pattern or ("*.csv" if fmt == "csv" else "*.jsonl")
    config = DirectorySourceConfig(
        name="spool",
        type="directory",
        path=spool,
        encoder="e",
        pattern=pattern,
        format=fmt,
        poll_interval=0.02,
        max_line_bytes=1024,
        **options,
    )
    source = config.build()
    ctx = RecordingContext(name="spool")
    await source.recover(None, [])
    await run_source_until(source, ctx, within=20)
    await source.aclose()
    encoder = ExampleEncoderConfig.model_validate(
        {"features": {"id": "int64", "name": "bytes"}}
    ).build()
    out: list[Any] = []
    for batch in ctx.batches:
        events: list[RawEvent] = list(batch.events)
        if batch.lines is not None:
            payloads, refused = batch.lines.split()
            events += [RawEvent(p, "") for p in payloads] + refused
        for ev in events:
            if ev.error is not None:
                why = ev.error.removeprefix("input rejected: ")
                out.append(("refused" if batch.token.get("bad") else "dead letter", why))
                continue
            result = encoder.encode_batch([ev])
            if result.failures:
                out.append(("dead letter", result.failures[0].detail))
            else:
                out.append(proto.parse_example(result.records[0]))
    return out


def _matches(got: Any, want: Any) -> bool:
    if isinstance(want, tuple):
        return isinstance(got, tuple) and got[0] == want[0] and want[1] in got[1]
    return bool(got == want)


@pytest.mark.parametrize("case", list(CASES))
async def test_producer_files_are_read_as_the_table_says(tmp_path: Path, case: str) -> None:
    fmt, data, want = CASES[case]
    (tmp_path / f"a.{fmt}").write_bytes(data)
    got = await _outcome(tmp_path, fmt)
    if want is None:  # UTF-16 JSON lines: never a record, every line a dead letter
        assert got
        assert all(g[0] == "dead letter" for g in got)
        return
    assert len(got) == len(want), got
    assert all(_matches(g, w) for g, w in zip(got, want, strict=True)), got


def _zstd_frames(*parts: bytes) -> bytes:
    import zstandard

    return b"".join(zstandard.ZstdCompressor(write_checksum=True).compress(p) for p in parts)


_A, _B = _jsonl(b"\n", ROWS[:1]), _jsonl(b"\n", ROWS[1:])

COMPRESSED: dict[str, tuple[str, bytes, list[Any]]] = {
    "gzip": ("a.jsonl.gz", gzip.compress(_A + _B), [A, B]),
    "gzip members concatenated (cat a.gz b.gz, pigz)": (
        "a.jsonl.gz",
        gzip.compress(_A) + gzip.compress(_B),
        [A, B],
    ),
    "zstd, several frames": ("a.jsonl.zst", _zstd_frames(_A, _B), [A, B]),
    "gzip cut short (the compressor died)": (
        "a.jsonl.gz",
        gzip.compress(_A + _B * 200)[:-30],
        [A, *[B] * 199, _refused("ends inside a gzip member")],  # a prefix, then the refusal
    ),
    "a .gz name on plain text": ("a.jsonl.gz", _A, [_refused("not gzip data")]),
}


@pytest.mark.parametrize("case", list(COMPRESSED))
async def test_compressed_producer_files_are_read_as_the_table_says(
    tmp_path: Path, case: str
) -> None:
    name, data, want = COMPRESSED[case]
    (tmp_path / name).write_bytes(data)
    got = await _outcome(tmp_path, "jsonl", pattern="*.jsonl.*")
    if want and isinstance(want[-1], tuple):
        assert _matches(got[-1], want[-1]), got
        # The lines before the point where the stream could not be read on (a prefix).
        got, want = got[:-1], want[: len(got) - 1]
    assert len(got) == len(want), got
    assert all(_matches(g, w) for g, w in zip(got, want, strict=True)), got


@pytest.mark.parametrize(
    ("case", "data", "frames"),
    [
        ("lines, LF (nc, a logger)", b'{"id":1}\n{"id":2}\n', [b'{"id":1}', b'{"id":2}']),
        ("lines, CRLF (nc -C, .NET WriteLine)", b'{"id":1}\r\n', [b'{"id":1}\r']),
        (
            "length-prefixed, big-endian (Java writeInt, Go binary.BigEndian)",
            b"\0\0\0\2{}",
            [b"{}"],
        ),
    ],
)
def test_socket_framings_of_common_clients(case: str, data: bytes, frames: list[bytes]) -> None:
    """The frames a stream socket makes of what common clients send (a CRLF line keeps its CR,
    which JSON reads as whitespace)."""
    from tfrecordd_plugins.sources.socket.framing import Deframer

    framing = "length-prefixed" if "length" in case else "lines"
    got = Deframer(framing, 4096).feed(data)
    assert [f.payload for f in got] == frames
    assert all(f.error is None for f in got)
    encoder = ExampleEncoderConfig.model_validate({"features": {"id": "int64"}}).build()
    if framing == "lines":
        assert not encoder.encode_batch([RawEvent(f, "") for f in frames]).failures


def test_a_little_endian_length_prefix_is_dead_lettered_not_misread() -> None:
    """.NET's BinaryWriter.Write(int) writes the length little-endian: read big-endian, a
    2-byte frame announces 33,554,432 bytes, over max_frame_bytes: dead-lettered with its size,
    never taken for a record."""
    from tfrecordd_plugins.sources.socket.framing import Deframer

    deframer = Deframer("length-prefixed", 4096)
    assert deframer.feed(b"\2\0\0\0{}") == []
    frame = deframer.end("connection closed")
    assert frame is not None
    assert frame.error is not None
    assert "33554432 bytes is over max_frame_bytes" in frame.error


_EXCEL_1252 = "id,name\r\n1,ann\r\n2,Zoë\r\n".encode("cp1252")


async def test_excel_csv_comma_delimited_is_windows_1252(tmp_path: Path) -> None:
    """Excel's "CSV (Comma delimited)" on Windows writes the system code page: read as UTF-8,
    a row with a non-ASCII letter is dead-lettered saying which setting reads it; with
    ``csv_encoding = "cp1252"`` every row is read."""
    (tmp_path / "a.csv").write_bytes(_EXCEL_1252)
    got = await _outcome(tmp_path, "csv")
    assert got[0] == A
    assert _matches(got[1], _dead('csv_encoding = "cp1252"'))
    other = tmp_path / "cp1252"
    other.mkdir()
    (other / "a.csv").write_bytes(_EXCEL_1252)
    got = await _outcome(other, "csv", csv_encoding="cp1252")
    assert got == [A, {"id": [2], "name": ["Zoë".encode()]}]


@pytest.mark.parametrize(
    ("data", "limit", "want"),
    [
        (b"", 4096, ("event", 0)),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 100, 4096, ("event", 108)),
        (b"x" * 5000, 4096, ("refused", "larger than max_file_bytes (4096)")),
    ],
    ids=["an empty file", "any bytes (a PNG)", "over max_file_bytes"],
)
async def test_whole_files_are_read_as_the_table_says(
    tmp_path: Path, data: bytes, limit: int, want: tuple[str, Any]
) -> None:
    (tmp_path / "a.bin").write_bytes(data)
    config = DirectorySourceConfig.model_validate(
        {"name": "spool", "encoder": "e", "path": tmp_path, "format": "whole-file"}
        | {"pattern": "*.bin", "poll_interval": 0.02, "max_file_bytes": limit}
    )
    source = config.build()
    ctx = RecordingContext(name="spool")
    await source.recover(None, [])
    await run_source_until(source, ctx)
    await source.aclose()
    [event] = [e for b in ctx.batches for e in b.expand()]
    if want[0] == "event":
        assert event.error is None
        assert len(event.payload) == want[1]
        assert event.payload == data
    else:
        assert event.error is not None
        assert want[1] in event.error
        assert ctx.batches[-1].token.get("bad")
