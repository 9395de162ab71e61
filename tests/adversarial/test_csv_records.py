"""The CSV reader against Python's ``csv`` module: random quoting, embedded newlines, stray
quotes, byte-order marks and limits. Every record is read as ``csv`` reads it, or, when longer
than ``max_line_bytes``, dead-lettered whole; the record after it is always the next real one."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import run_source_until
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.sources import csvrecords
from tfrecordd_plugins.sources.directory import DirectorySource, DirectorySourceConfig

HEADER = ["id", "name", "comment"]
_TEXT = st.text(alphabet=st.sampled_from(list('ab ,"\n\r\té')), max_size=12)
_LONG = st.builds(lambda k, s: s * k, st.integers(20, 400), st.sampled_from(['x\n"', "y,\n", "z"]))


def _render(fields: list[str], style: str, terminator: str) -> str:
    """One record as a producer writes it: quoted where needed (``minimal``), always (``all``),
    or with stray quotes left unquoted inside fields, where ``csv`` reads them as text."""

    def quoted(f: str) -> bool:
        if style == "all" or any(c in f for c in ",\r\n"):
            return True
        return f.startswith('"') if style == "stray" else '"' in f

    return (
        ",".join('"' + f.replace('"', '""') + '"' if quoted(f) else f for f in fields) + terminator
    )


@st.composite
def _files(draw: Any) -> tuple[str, list[list[str]], list[str]]:
    terminator = draw(st.sampled_from(["\n", "\r\n"]))
    rows = draw(st.lists(st.lists(_TEXT | _LONG, min_size=3, max_size=3), max_size=12))
    styles = draw(
        st.lists(
            st.sampled_from(["minimal", "all", "stray"]),
            min_size=len(rows) + 1,
            max_size=len(rows) + 1,
        )
    )
    rendered = [_render(HEADER, styles[0], terminator)]
    rendered += [_render(r, s, terminator) for r, s in zip(rows, styles[1:], strict=False)]
    return "".join(rendered), rows, rendered


def _split_in_chunks(data: bytes, sizes: list[int]) -> list[bytes]:
    """``split`` fed ``data`` a chunk at a time, as the reader is (the unread rest kept)."""
    records: list[bytes] = []
    buf, state, at = b"", csvrecords.State.FIELD_START, 0
    for size in [*sizes, len(data)]:
        chunk, at = data[at : at + max(size, 1)], at + max(size, 1)
        buf += chunk
        found = csvrecords.split(buf, not chunk, state, ord(","))
        records += found.records
        buf = buf[found.consumed :]
        if not chunk:
            break
    return records


@settings(max_examples=400, deadline=None)
@given(_files(), st.lists(st.integers(1, 64), max_size=40))
def test_records_split_where_csv_splits_them(
    file: tuple[str, list[list[str]], list[str]], sizes: list[int]
) -> None:
    text, rows, _ = file
    assert list(csv.reader(io.StringIO(text, newline=""))) == [HEADER, *rows]  # the oracle
    records = _split_in_chunks(text.encode(), sizes)
    parsed = [csvrecords.event(r, "", HEADER, ",").value for r in records[1:]]
    assert parsed == [dict(zip(HEADER, r, strict=True)) for r in rows]


def _source(spool: Path, max_line: int) -> DirectorySource:
    config = DirectorySourceConfig(
        name="spool",
        type="directory",
        path=spool,
        encoder="e",
        pattern="*.csv",
        format="csv",
        poll_interval=0.05,
        read_size=4096,
        max_line_bytes=max_line,
    )
    return config.build()


async def _read_all(spool: Path, max_line: int) -> list[Any]:
    source = _source(spool, max_line)
    ctx = RecordingContext(name="spool", max_batch_events=7)
    await source.recover(None, [])
    await run_source_until(source, ctx, within=30)
    await source.ack([b.token for b in ctx.batches])
    await source.aclose()
    return [e for b in ctx.batches for e in b.expand()]


def _expected(rendered: list[str], rows: list[list[str]], max_line: int) -> list[Any]:
    out: list[Any] = []
    for raw, fields in zip(rendered[1:], rows, strict=True):
        record = raw.encode().removesuffix(b"\n")
        if len(record) > max_line:
            out.append(("too long", record[:max_line]))
        else:
            out.append(dict(zip(HEADER, fields, strict=True)))
    return out


def _seen(events: list[Any]) -> list[Any]:
    return [
        ("too long", e.payload) if e.error and "longer than max_line_bytes" in e.error else e.value
        for e in events
    ]


@pytest.mark.anyio
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(file=_files(), max_line=st.integers(16, 300), bom=st.booleans())
async def test_the_source_reads_each_record_whole_or_dead_letters_it_whole(
    tmp_path_factory: pytest.TempPathFactory,
    file: tuple[str, list[list[str]], list[str]],
    max_line: int,
    bom: bool,
) -> None:
    text, rows, rendered = file
    if len(rendered[0].encode()) > max_line:
        max_line = len(rendered[0].encode())  # the header itself must fit
    spool = tmp_path_factory.mktemp("spool")
    (spool / "a.csv").write_bytes((csvrecords.BOM if bom else b"") + text.encode())
    events = await _read_all(spool, max_line)
    assert _seen(events) == _expected(rendered, rows, max_line)


@pytest.mark.anyio
async def test_a_long_multi_line_quoted_field_is_one_dead_letter(tmp_path: Path) -> None:
    # Over the limit and over several reads: its lines must not become records of their own.
    comment = "".join(f"line {i}, with a comma\n" for i in range(3000))
    text = 'id,name,comment\n1,ann,short\n2,bob,"' + comment + '"\n3,cid,after\n'
    (tmp_path / "a.csv").write_text(text)
    events = await _read_all(tmp_path, 1024)
    assert [e.value for e in events if e.error is None] == [
        {"id": "1", "name": "ann", "comment": "short"},
        {"id": "3", "name": "cid", "comment": "after"},
    ]
    (long,) = [e for e in events if e.error]
    assert "longer than max_line_bytes (1024)" in long.error
    assert long.payload.startswith(b'2,bob,"line 0,')
    first_rows = "id,name,comment\n1,ann,short\n"
    assert long.where == f"a.csv:line 3:{len(first_rows)}"


@pytest.mark.anyio
@pytest.mark.parametrize("header", ["id,name,comment", '"id","name","comment"'])
async def test_a_byte_order_mark_is_not_part_of_the_first_column(
    tmp_path: Path, header: str
) -> None:
    (tmp_path / "a.csv").write_bytes(csvrecords.BOM + f"{header}\r\n1,ann,hi\r\n".encode())
    events = await _read_all(tmp_path, 1024)
    assert [e.value for e in events] == [{"id": "1", "name": "ann", "comment": "hi"}]


@pytest.mark.anyio
async def test_a_resumed_file_with_a_byte_order_mark_keeps_its_header(tmp_path: Path) -> None:
    body = "id,name,comment\n" + "".join(f"{i},n{i},c\n" for i in range(20))
    (tmp_path / "a.csv").write_bytes(csvrecords.BOM + body.encode())
    first = _source(tmp_path, 1024)
    ctx = RecordingContext(name="spool", max_batch_events=7)
    await first.recover(None, [])
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.run, ctx)
        with anyio.fail_after(30):
            while not ctx.batches:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    await first.aclose()  # as a stopped daemon does: its claim folder is free again
    token = ctx.batches[0].token
    assert not token["eof"]
    # A restart after the first batch was committed: resumes past the header, reading it again.
    second = _source(tmp_path, 1024)
    ctx2 = RecordingContext(name="spool", max_batch_events=100)
    await second.recover(second.fold(None, [token]), [])
    await run_source_until(second, ctx2, within=30)
    await second.aclose()
    values = [e.value for b in ctx2.batches for e in b.expand()]
    assert values == [{"id": str(i), "name": f"n{i}", "comment": "c"} for i in range(7, 20)]


@pytest.mark.anyio
@pytest.mark.parametrize("tail", [b"x" * 5000, b'"' + b"y\n" * 3000])
async def test_an_over_long_last_record_without_a_newline_is_dead_lettered(
    tmp_path: Path, tail: bytes
) -> None:
    (tmp_path / "a.csv").write_bytes(b"id,name,comment\n1,ann,hi\n" + tail)
    events = await _read_all(tmp_path, 64)
    assert [e.value for e in events if e.error is None] == [
        {"id": "1", "name": "ann", "comment": "hi"}
    ]
    (long,) = [e for e in events if e.error]
    assert "longer than max_line_bytes (64)" in long.error
    assert long.payload == tail[:64]
