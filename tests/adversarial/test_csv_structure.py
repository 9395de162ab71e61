"""CSV files of any bytes: every line-end convention is read, a header that cannot be read has
the file refused whole, and nothing a file holds makes the reader raise.

The property reads generated files (arbitrary bytes, and CSV-ish bytes of quotes, delimiters,
CR, LF, CRLF and byte-order marks) through the directory source and checks them against an
independent scanner, byte by byte: every record is an event or a dead letter at its own
offset, the file's end is reached, or the file is refused whole, with its reason.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import run_source_until
from tfrecordd.plugin import RawBatch
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.sources import csvrecords
from tfrecordd_plugins.sources.directory import DirectorySource, DirectorySourceConfig

pytestmark = pytest.mark.anyio

QUOTE, CR, LF, COMMA = 0x22, 0x0D, 0x0A, 0x2C


def _source(spool: Path, max_line: int = 1024, read_size: int = 4096) -> DirectorySource:
    config = DirectorySourceConfig(
        name="spool",
        type="directory",
        path=spool,
        encoder="e",
        pattern="*.csv",
        format="csv",
        poll_interval=0.02,
        read_size=read_size,
        max_line_bytes=max_line,
    )
    return config.build()


async def _run(source: DirectorySource, ctx: RecordingContext, state: Any = None) -> None:
    await source.recover(state, [])
    await run_source_until(source, ctx, within=30)


async def _read(spool: Path, max_line: int = 1024, read_size: int = 4096) -> list[RawBatch]:
    """The batches the source sends for the one file in ``spool``, all acked."""
    source = _source(spool, max_line, read_size)
    ctx = RecordingContext(name="spool", max_batch_events=7)
    await _run(source, ctx)
    await source.ack([b.token for b in ctx.batches])
    await source.aclose()
    return ctx.batches


def _events(batches: list[RawBatch]) -> list[Any]:
    return [e for b in batches for e in b.expand()]


def _refusal(batches: list[RawBatch]) -> str | None:
    (end,) = [b.token for b in batches if b.token["eof"]]
    why: str | None = end.get("why")
    return why


# -- every line end, as producers' tools write them -------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"id,text\r1,a\r2,b\r",  # Excel's "CSV (Macintosh)": lone CRs
        b"id,text\r1,a\r2,b",
        b"id,text\r\n1,a\r\n2,b\r\n",
        b"id,text\n1,a\n2,b\n",
        b"id,text\r1,a\n2,b\r\n",  # mixed
        b"\xef\xbb\xbfid,text\r1,a\r2,b\r",
        b"id,text\r\r1,a\r\r\n\r2,b\r\r",  # blank lines of every kind
    ],
)
async def test_every_line_end_ends_a_record(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "a.csv").write_bytes(data)
    batches = await _read(tmp_path)
    assert _refusal(batches) is None
    assert [e.value for e in _events(batches)] == [
        {"id": "1", "text": "a"},
        {"id": "2", "text": "b"},
    ]


async def test_a_carriage_return_in_a_quoted_field_is_data(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b'id,text\r1,"a\rb"\r2,"c\r\nd"\r\n3,"e\n"\r')
    events = _events(await _read(tmp_path))
    assert [e.value["text"] for e in events] == ["a\rb", "c\r\nd", "e\n"]


async def test_a_lone_cr_record_over_many_reads(tmp_path: Path) -> None:
    rows = [f"{i},{'x' * 50}" for i in range(400)]
    (tmp_path / "a.csv").write_bytes(("id,text\r" + "\r".join(rows) + "\r").encode())
    events = _events(await _read(tmp_path, read_size=4096))
    assert [e.value["id"] for e in events] == [str(i) for i in range(400)]


# -- a header that cannot be read refuses the file whole ----------------------------------------


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"id," + b"h" * 2000 + b"\n1,2\n", "header row is longer than max_line_bytes (1024)"),
        (b"id," + b"h" * 9000 + b"\n1,2\n", "header row is longer than max_line_bytes (1024)"),
        (b"\n\nid,\xff\n1,2\n", "header row is not UTF-8 text"),
        ("id,text\n1,a\n".encode("utf-16"), "UTF-16 text"),
        ("id,text\n1,a\n".encode("utf-16-le"), "NUL characters"),
        (b"id,,Unnamed: 1\n1,2,3\n", "names 'Unnamed: 1' twice"),
        (b"id,text,id\n1,2,3\n", "names 'id' twice"),
        (b'"id"x,text\n1,2\n', "header row is not a valid CSV record"),
        (b'"id,text\n1,2\n', "header row is not a valid CSV record"),
    ],
)
async def test_a_header_that_cannot_be_read_refuses_the_file(
    tmp_path: Path, data: bytes, reason: str
) -> None:
    (tmp_path / "a.csv").write_bytes(data)
    batches = await _read(tmp_path)
    refusal = _refusal(batches)
    assert refusal is not None
    assert reason in refusal
    assert [e.value for e in _events(batches) if e.error is None] == []


async def test_a_resumed_file_whose_header_cannot_be_read_is_refused(tmp_path: Path) -> None:
    body = "identifier,description\n" + "".join(f"{i},x{i}\n" for i in range(30))
    (tmp_path / "a.csv").write_bytes(body.encode())
    first = _source(tmp_path)
    ctx = RecordingContext(name="spool", max_batch_events=7)
    await first.recover(None, [])
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.run, ctx)
        with anyio.fail_after(30):
            while not ctx.batches:
                await anyio.sleep(0.005)
        tg.cancel_scope.cancel()
    await first.aclose()
    token = ctx.batches[0].token
    assert not token["eof"]
    # The restarted daemon allows shorter lines than the header: it is not read on without it.
    second = _source(tmp_path, max_line=16)
    ctx2 = RecordingContext(name="spool", max_batch_events=100)
    await _run(second, ctx2, second.fold(None, [token]))
    await second.aclose()
    refusal = _refusal(ctx2.batches)
    assert refusal is not None
    assert "longer than max_line_bytes (16)" in refusal
    assert [e.value for e in _events(ctx2.batches) if e.error is None] == []


# -- any bytes: read as the grammar says, or refused whole ----------------------------------------


def _oracle_records(data: bytes) -> list[tuple[int, bytes]]:
    """Each record's start and bytes, one byte at a time: a quote opens a quoted field at a
    field's start; outside quotes LF, CRLF and a lone CR end a record (CRLF's CR is kept in it,
    as the reader keeps it, to be dropped when the record is parsed)."""
    out: list[tuple[int, bytes]] = []
    start, i, n = 0, 0, len(data)
    state = "start"  # start of a field | unquoted | quoted | quote (a quote inside quotes)
    while i < n:
        c = data[i]
        if state == "quoted":
            state = "quote" if c == QUOTE else "quoted"
            i += 1
            continue
        if state == "quote":
            if c == QUOTE:
                state, i = "quoted", i + 1
                continue
            state = "unquoted"
        if c in (LF, CR):
            crlf = c == CR and i + 1 < n and data[i + 1] == LF
            end = i + 1 if crlf else i
            out.append((start, data[start:end]))
            i = end + 1
            start, state = i, "start"
            continue
        if c == QUOTE and state == "start":
            state = "quoted"
        else:
            state = "start" if c == COMMA else "unquoted"
        i += 1
    if start < n:
        out.append((start, data[start:]))
    return out


def _names(record: bytes) -> list[str] | str:
    """A header row's names, or the words of the reason it has none."""
    if record[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "UTF-16"
    try:
        text = record.decode("utf-8").removesuffix("\r")
    except UnicodeDecodeError:
        return "not UTF-8"
    if "\0" in text:
        return "NUL"
    try:
        names = next(csv.reader([text], strict=True))
    except csv.Error:
        return "not a valid CSV record"
    names = [name or f"Unnamed: {i}" for i, name in enumerate(names)]
    if len(set(names)) < len(names):
        return "twice"
    return names


def _expected(data: bytes, max_line: int) -> tuple[list[Any], str | None]:
    """The events (value or error, where) the reader must send, or the refusal it must send."""
    bom = len(csvrecords.BOM) if data.startswith(csvrecords.BOM) else 0
    header: list[str] | None = None
    out: list[Any] = []
    for at, record in _oracle_records(data[bom:]):
        at += bom
        if header is None:
            if len(record) > max_line:
                return [], "longer than max_line_bytes"
            if record.strip() and not record.startswith(b"#TYPE "):
                names = _names(record)
                if isinstance(names, str):
                    return [], names
                header = names
            continue
        if len(record) > max_line:
            out.append(("too long", record[:max_line], at))
        elif record.strip():
            ev = csvrecords.event(record, "", header, ",")
            out.append((ev.value, ev.error, at))
    return out, None


def _seen(batches: list[RawBatch]) -> list[Any]:
    out = []
    for e in _events(batches):
        at = int(e.where.rpartition(":")[2])
        if e.error and "longer than max_line_bytes" in e.error:
            out.append(("too long", e.payload, at))
        elif not (e.error or "").startswith("input rejected"):
            out.append((e.value, e.error, at))
    return out


_PIECES = [b'"', b'""', b",", b"\r", b"\n", b"\r\n", b"a", b"bc", b" ", b"\xef\xbb\xbf"]
_PIECES += [b"\xff", b"\xc3\xa9", b"\x00", b"\xfe\xff", b"x" * 40]
_CSVISH = st.lists(st.sampled_from(_PIECES), max_size=80).map(b"".join)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    head=st.sampled_from([b"", b"id,text\r", b"id,text\n", b"a,b,c\r\n", csvrecords.BOM + b"k\r"]),
    body=st.binary(max_size=300) | _CSVISH,
    max_line=st.integers(16, 120),
)
async def test_any_bytes_are_records_dead_letters_or_a_refusal(
    tmp_path_factory: pytest.TempPathFactory, head: bytes, body: bytes, max_line: int
) -> None:
    data = head + body
    spool = tmp_path_factory.mktemp("spool")
    (spool / "a.csv").write_bytes(data)
    batches = await _read(spool, max_line)  # raises if the reader does
    expected, refusal = _expected(data, max_line)
    got = _refusal(batches)
    if refusal is not None:
        assert got is not None
        assert refusal in got
        return
    assert got is None
    assert _seen(batches) == expected
    (end,) = [b.token for b in batches if b.token["eof"]]
    assert end["o"] == len(data)  # read to the end: no byte left unread


# -- the cost of a long record is linear in its length -------------------------------------------


async def test_a_long_record_is_scanned_once(tmp_path: Path, monkeypatch: Any) -> None:
    scanned = 0
    split = csvrecords.split

    def counting(buf: Any, final: bool, state: Any, delimiter: int, at: int = 0) -> Any:
        nonlocal scanned
        scanned += len(buf) - at
        return (
            split(buf, final, state, delimiter, at) if at else split(buf, final, state, delimiter)
        )

    monkeypatch.setattr(csvrecords, "split", counting)
    record = b'1,"' + b"y\n" * (1 << 20) + b'"\n'
    (tmp_path / "a.csv").write_bytes(b"id,text\n" + record + b"2,b\n")
    events = _events(await _read(tmp_path, max_line=4 << 20, read_size=4096))
    # 512 reads of 4 KiB: rescanning the record at each read would scan it 256 times over.
    assert scanned <= 2 * (len(record) + 20)
    # One field of 2 MiB: more than the csv module's own limit, within max_line_bytes.
    assert [e.value["id"] for e in events] == ["1", "2"]


async def test_columns_without_a_name_are_named_as_pandas_reads_them(tmp_path: Path) -> None:
    """pandas' ``to_csv`` writes its index under an empty name; Windows PowerShell's
    ``Export-Csv`` a ``#TYPE`` line first: read as those tools read them back."""
    (tmp_path / "a.csv").write_bytes(b'#TYPE x\r\n,id,,text\r\n0,1,2,"a"\r\n')
    [event] = _events(await _read(tmp_path))
    assert event.value == {"Unnamed: 0": "0", "id": "1", "Unnamed: 2": "2", "text": "a"}
