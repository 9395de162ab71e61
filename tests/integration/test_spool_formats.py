"""Spool-directory formats: CSV, whole files with folder labels, gzip/zstd inputs, rejects."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import claimed_files, run_source_until, spool_file
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.sources.directory import (
    CLAIM_DIR,
    REJECT_DIR,
    DirectorySource,
    DirectorySourceConfig,
)

pytestmark = pytest.mark.anyio


def make(spool: Path, **options: Any) -> DirectorySource:
    config = DirectorySourceConfig(
        name="spool", type="directory", path=spool, encoder="e", poll_interval=0.05, **options
    )
    return config.build()


async def run_until_files_done(
    source: DirectorySource, files: int, ctx: RecordingContext | None = None
) -> RecordingContext:
    """Run the source until it sent the end of ``files`` files; ack everything; stop."""
    ctx = ctx or RecordingContext(name="spool", max_batch_events=50)
    await source.recover(None, [])
    async with anyio.create_task_group() as tg:
        tg.start_soon(source.run, ctx)
        with anyio.fail_after(20):
            while sum(1 for b in ctx.batches if b.token["eof"]) < files:
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    await source.ack([b.token for b in ctx.batches])
    await source.aclose()
    return ctx


def good(ctx: RecordingContext) -> list[Any]:
    return [e for b in ctx.batches for e in b.expand() if e.error is None]


def bad(ctx: RecordingContext) -> list[Any]:
    return [e for b in ctx.batches for e in b.expand() if e.error is not None]


async def test_csv_rows_with_quotes_spanning_lines(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    text = 'user,age,comment\nann,31,"likes ""quotes"", and\nnewlines"\n\nbob,40,plain\nbad,row\n'
    (spool / "a.csv").write_text(text)
    ctx = await run_until_files_done(make(spool, pattern="*.csv", format="csv"), 1)
    rows = [e.value for e in good(ctx)]
    assert rows == [
        {"user": "ann", "age": "31", "comment": 'likes "quotes", and\nnewlines'},
        {"user": "bob", "age": "40", "comment": "plain"},
    ]
    assert all(e.format == "csv" for e in good(ctx))
    [wrong] = bad(ctx)
    assert wrong.payload == b"bad,row"
    assert "2 fields, the header 3" in wrong.error
    assert {p.name for p in spool.iterdir()} == {CLAIM_DIR, REJECT_DIR}
    assert not claimed_files(spool)


@pytest.mark.parametrize("rows", [60, 70, 0])
async def test_a_csv_files_last_batch_carries_its_end(tmp_path: Path, rows: int) -> None:
    """No batch of its own for a CSV file's end, even when its records end on a batch boundary
    (60 rows in batches of 30); a file with only its header still sends its end."""
    spool = tmp_path / "spool"
    spool.mkdir()
    body = "k,v\n" + "".join(f"{i},{'x' * 90}\n" for i in range(rows)) + "\n"
    (spool / "a.csv").write_text(body)
    source = make(spool, pattern="*.csv", format="csv", read_size=4096)  # two or more reads
    ctx = RecordingContext(name="spool", max_batch_events=30)
    ctx = await run_until_files_done(source, 1, ctx)
    sizes = [len(b.events) for b in ctx.batches]
    assert sizes == ([30] * (rows // 30) + ([rows % 30] if rows % 30 else []) or [0])
    assert [b.token["eof"] for b in ctx.batches] == [False] * (len(sizes) - 1) + [True]
    assert ctx.batches[-1].token["o"] == len(body)
    assert [e.value["k"] for e in good(ctx)] == [str(i) for i in range(rows)]


async def test_csv_resumes_past_the_header(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "a.csv").write_text("k,v\n" + "".join(f"{i},x{i}\n" for i in range(100)))
    first = make(spool, pattern="*.csv", format="csv")
    ctx = RecordingContext(name="spool", max_batch_events=30)
    await first.recover(None, [])
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.run, ctx)
        with anyio.fail_after(10):
            while len(ctx.batches) < 2:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    await first.aclose()  # as a stopped daemon does: its claim folder is free again
    committed = ctx.batches[1].token
    assert not committed["eof"]
    # A new daemon resumes from the committed offset of the second batch.
    second = make(spool, pattern="*.csv", format="csv")
    ctx2 = RecordingContext(name="spool", max_batch_events=30)
    await second.recover(DirectorySource.fold(None, [ctx.batches[0].token, committed]), [])
    await run_source_until(second, ctx2, within=10)
    await second.aclose()
    seen = [e.value["k"] for e in good(ctx)[:60]] + [e.value["k"] for e in good(ctx2)]
    assert seen == [str(i) for i in range(100)]


async def test_whole_files_with_folder_labels(tmp_path: Path) -> None:
    spool = tmp_path / "images"
    for label, n in (("cats", 2), ("dogs", 3)):
        (spool / label).mkdir(parents=True)
        for i in range(n):
            (spool / label / f"{i}.jpg").write_bytes(f"{label}-{i}".encode() * 100)
    (spool / "dogs" / "big.jpg").write_bytes(b"x" * 5000)
    (spool / "cats" / ".hidden.jpg").write_bytes(b"no")
    source = make(spool, pattern="*.jpg", format="whole-file", recursive=True, max_file_bytes=4096)
    ctx = await run_until_files_done(source, 6)
    got = sorted((e.value["label"], e.value["filename"], e.payload) for e in good(ctx))
    assert got == sorted(
        (label, f"{i}.jpg", f"{label}-{i}".encode() * 100)
        for label, n in (("cats", 2), ("dogs", 3))
        for i in range(n)
    )
    assert all(e.format == "file" for e in good(ctx))
    [rejected] = bad(ctx)
    assert "max_file_bytes" in rejected.error
    assert [p.name.split("-", 1)[1] for p in (spool / REJECT_DIR).glob("[!.]*")] == [
        "dogs%2Fbig.jpg"
    ]
    assert (spool / "cats" / ".hidden.jpg").exists()
    assert [p.name for p in (spool / "cats").iterdir()] == [".hidden.jpg"]


async def test_gzip_and_zstd_inputs(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    lines = [f'{{"id": {i}}}'.encode() for i in range(300)]
    body = b"\n".join(lines) + b"\n"
    # Two gzip members, as a producer appending compressed chunks would write.
    (spool / "a.jsonl.gz").write_bytes(gzip.compress(body[:1000]) + gzip.compress(body[1000:]))
    (spool / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(body))
    ctx = await run_until_files_done(make(spool, pattern="*.jsonl.*"), 2)
    assert sorted(e.payload for e in good(ctx)) == sorted(lines * 2)
    assert not bad(ctx)


@pytest.mark.parametrize("ending", [b"\n", b""], ids=["newline", "no-final-newline"])
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
async def test_a_files_last_batch_carries_its_end(
    tmp_path: Path, suffix: str, ending: bytes
) -> None:
    """No batch of its own for a file's end: the batch with the last lines says it (a batch with
    no events would cost a commit of its own). Three read chunks, so the end is found by a read
    after the one that brought the last lines."""
    spool = tmp_path / "spool"
    spool.mkdir()
    lines = [b'{"id": %d, "pad": "%s"}' % (i, b"x" * 40) for i in range(180)]
    body = b"\n".join(lines) + ending
    assert 2 * 4096 < len(body) < 3 * 4096
    (spool / f"a{suffix}").write_bytes(gzip.compress(body) if suffix.endswith(".gz") else body)
    source = make(spool, pattern="a.jsonl*", read_size=4096)
    ctx = await run_until_files_done(source, 1, RecordingContext(name="spool", max_batch_events=30))
    batches = ctx.batches
    assert [b.token["eof"] for b in batches] == [False] * (len(batches) - 1) + [True]
    assert all(b.lines is not None and b.expand() for b in batches)
    assert batches[-1].token["o"] == len(body)
    assert [e.payload for e in good(ctx)] == lines
    offsets = [int(e.where.rsplit(":", 1)[1]) for e in good(ctx)]
    assert offsets == [sum(len(x) + 1 for x in lines[:i]) for i in range(len(lines))]


async def test_a_file_of_whole_read_chunks_ends_once(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    line = b'{"pad": "' + b"x" * 1012 + b'"}'
    assert len(line) + 1 == 1024
    (spool / "a.jsonl").write_bytes((line + b"\n") * 8)
    source = make(spool, read_size=4096)
    ctx = await run_until_files_done(source, 1, RecordingContext(name="spool", max_batch_events=3))
    assert [e.payload for e in good(ctx)] == [line] * 8
    # Two reads of four lines each: the first read's short tail is completed from the second;
    # the last batch ends the file.
    assert [len(b.expand()) for b in ctx.batches] == [3, 3, 2]
    assert [b.token["eof"] for b in ctx.batches] == [False, False, True]
    assert ctx.batches[-1].token["o"] == 8 * 1024


async def test_lines_before_damage_are_delivered_before_the_reject(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    head = b"".join(b'{"id": %d}\n' % i for i in range(3000))
    whole = gzip.compress(head + bytes(range(256)) * 4000, compresslevel=1)
    (spool / "cut.jsonl.gz").write_bytes(whole[: len(whole) - 1000])
    source = make(spool, pattern="*.jsonl.gz", read_size=4096)
    ctx = await run_until_files_done(source, 1)
    payloads = [e.payload for e in good(ctx)]
    assert payloads[:3000] == head.splitlines()
    last = ctx.batches[-1].token
    assert last["eof"]
    assert last["bad"]
    assert [b.token["o"] for b in ctx.batches] == sorted(b.token["o"] for b in ctx.batches)


async def test_decompression_bomb_and_damage_are_rejected(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    bomb = zstandard.ZstdCompressor().compress(b"\n" * (8 << 20))
    (spool / "bomb.jsonl.zst").write_bytes(bomb)
    good_part = b"".join(f'{{"id": {i}}}\n'.encode() for i in range(50))
    cut = gzip.compress(good_part + b'{"id": 999}\n' * 1000)
    (spool / "cut.jsonl.gz").write_bytes(cut[: len(cut) // 2])
    source = make(spool, pattern="*.jsonl.*", max_decompressed_bytes=1 << 20)
    ctx = await run_until_files_done(source, 2)
    reasons = sorted(e.error for e in bad(ctx))
    assert len(reasons) == 2
    assert all(r.startswith("input rejected:") for r in reasons)
    assert sorted(p.name.split("-", 1)[1] for p in (spool / REJECT_DIR).glob("[!.]*")) == [
        "bomb.jsonl.zst",
        "cut.jsonl.gz",
    ]
    assert not claimed_files(spool)


async def test_on_done_move_keeps_relative_paths(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    (spool / "day1").mkdir(parents=True)
    spool_file(spool / "day1", "a.jsonl", ['{"id": 1}'])
    source = make(spool, recursive=True, on_done="move")
    await run_until_files_done(source, 1)
    assert (spool / "done" / "day1" / "a.jsonl").read_text() == '{"id": 1}\n'


async def test_csv_spool_through_the_daemon(tmp_path: Path) -> None:
    """CSV text fields converted by the schema's types; a bad field dead-lettered by name."""
    from tests.support import dead_letters, write_config
    from tfrecordd.config import load_config
    from tfrecordd.format.reader import iter_examples
    from tfrecordd.pipeline.runtime import Daemon

    cfg = write_config(
        tmp_path,
        source={"pattern": "*.csv", "format": "csv"},
        features={"id": "int64", "user": "bytes", "price": "float"},
    )
    (tmp_path / "spool" / "a.csv").write_text(
        'id,user,price\n1,ann,9.5\n2,"bob, jr.",1e2\n3,cy,cheap\n4,dee,\n'
    )
    daemon = Daemon(load_config(cfg), handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        with anyio.fail_after(20):
            while (tmp_path / "spool" / "a.csv").exists() or not claimed_files(tmp_path / "spool"):
                await anyio.sleep(0.02)
            while (
                daemon.metrics.registry.get_sample_value(
                    "tfrecordd_events_received_total", {"source": "spool"}
                )
                != 4
            ):
                await anyio.sleep(0.02)
        daemon.request_stop()
    examples = [
        ex for p in sorted((tmp_path / "shards").glob("*.tfrecord.gz")) for ex in iter_examples(p)
    ]
    assert examples == [
        {"id": [1], "user": [b"ann"], "price": [9.5]},
        {"id": [2], "user": [b"bob, jr."], "price": [100.0]},
        {"id": [4], "user": [b"dee"]},
    ]
    [letter] = dead_letters(tmp_path / "state")
    assert "'price'" in letter["detail"]
    assert letter["raw"] == "3,cy,cheap"


def _expected_lines(body: bytes, start: int, max_line: int) -> list[tuple[bytes, int, bool]]:
    """``(payload, offset, good)`` of every event in ``body[start:]`` (``start`` a line's start):
    a line longer than ``max_line`` is refused with its first ``max_line`` bytes, a blank one is
    no event."""
    out = []
    at = start
    for line in body[start:].split(b"\n"):
        if len(line) > max_line:
            out.append((line[:max_line], at, False))
        elif line and not line.isspace():
            out.append((line, at, True))
        at += len(line) + 1
    return out


def _events(ctx: RecordingContext) -> list[tuple[bytes, int, bool]]:
    return [
        (e.payload, int(e.where.rsplit(":", 1)[1]), e.error is None)
        for b in ctx.batches
        for e in b.expand()
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from([0, 1, 30, 999, 1000, 1001, 2500, 4095, 4096, 4097, 9000]), max_size=30
    ),
    st.booleans(),
    st.integers(0, 100),
)
def test_lines_come_out_once_across_reads_long_lines_and_resumes(
    lengths: list[int], newline_at_end: bool, resume: int
) -> None:
    """Every line of a JSON-lines file is one event with its offset, whatever the read
    boundaries (4 KiB reads) and overlong lines (over 1000 bytes) do; a source resumed at any
    batch's committed offset sends exactly the events after it."""
    body = b"\n".join(b"%d" % i + b"x" * n for i, n in enumerate(lengths))
    body += b"\n" if newline_at_end and body else b""

    async def read(spool: Path, state: dict[str, int] | None) -> RecordingContext:
        source = make(spool, read_size=4096, max_line_bytes=1000)
        await source.recover(state, [])
        ctx = RecordingContext(name="spool", max_batch_events=3)
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, ctx)
            with anyio.fail_after(20):
                while not any(b.token["eof"] for b in ctx.batches):
                    await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
        await source.aclose()  # the next read of the spool is another daemon's
        return ctx

    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp)
        (spool / "a.jsonl").write_bytes(body)
        ctx = anyio.run(read, spool, None)
        assert _events(ctx) == _expected_lines(body, 0, 1000)
        tokens = [b.token for b in ctx.batches]
        assert [t["eof"] for t in tokens] == [False] * (len(tokens) - 1) + [True]
        assert tokens[-1]["o"] == len(body)
        # Resumed from a committed offset (the file stays claimed: nothing was acked).
        token = tokens[resume % len(tokens)]
        again = anyio.run(read, spool, {token["f"]: token["o"]})
        assert _events(again) == _expected_lines(body, token["o"], 1000)
        assert again.batches[-1].token["o"] == len(body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(0, 700), min_size=1, max_size=120),
    st.sampled_from([4096, 5000, 8192]),
    st.integers(1, 40),
    st.integers(100, 12000),
    st.booleans(),
)
def test_every_batch_of_a_file_but_its_last_is_full_whatever_the_reads(
    lengths: list[int], read_size: int, max_events: int, max_bytes: int, newline_at_end: bool
) -> None:
    """A file's batches are cut by ``max_batch_events`` and ``max_batch_bytes`` alone, not by
    where a read ends: each but the last holds ``max_events`` lines, or the next line would take
    it past ``max_bytes``; none goes past either cap (unless it is one line); every line is
    there once, in order, with its offset."""
    body = b"\n".join(b"%d" % i + b"x" * n for i, n in enumerate(lengths))
    body += b"\n" if newline_at_end else b""

    async def read(spool: Path) -> RecordingContext:
        source = make(spool, read_size=read_size, max_line_bytes=1000)
        ctx = RecordingContext(name="spool", max_batch_events=max_events, max_batch_bytes=max_bytes)
        return await run_until_files_done(source, 1, ctx)

    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp)
        (spool / "a.jsonl").write_bytes(body)
        ctx = anyio.run(read, spool)
    assert _events(ctx) == _expected_lines(body, 0, 1000)
    datas = [b.lines.data for b in ctx.batches if b.lines is not None]
    assert len(datas) == len(ctx.batches)
    assert b"".join(datas) == body
    for i, data in enumerate(datas):
        lines = data.splitlines(keepends=True)
        assert len(lines) <= max_events
        assert len(data) <= max_bytes or len(lines) == 1
        if i + 1 < len(datas):
            following = datas[i + 1].splitlines(keepends=True)[0]
            assert len(lines) == max_events or len(data) + len(following) > max_bytes, (i, datas)
