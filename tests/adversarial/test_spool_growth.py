"""A producer that keeps appending to a file it published into the spool: nothing it wrote is
deleted unread.

The daemon finishes a file (deletes it, or moves it into ``done_dir``) only if it is still
exactly what was read: the size and modification time its end was read at, and, where the
kernel grants a read lease, no writer holding it open. A file that changed is renamed to be
read on from where its published records end. The model test below generates producers that
append at any moment between the daemon's steps (reading, committing, acking, a crash), and
the threaded test a writer racing a running daemon; both check every line arrives exactly once.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.adversarial.spool_steps import SpoolSteps
from tests.support import CI_DERANDOMIZED, claimed_files, examples, read_ids, write_config
from tfrecordd.config import load_config
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd_plugins.sources.directory import (
    CLAIM_DIR,
    REJECT_DIR,
)


def _lines(first: int, n: int) -> bytes:
    return b"".join(json.dumps({"id": i}).encode() + b"\n" for i in range(first, first + n))


def _ids(batches: Sequence[Any]) -> list[int]:
    out: list[int] = []
    for b in batches:
        for e in b.expand():
            if e.error is None:
                out.append(json.loads(e.payload)["id"])
    return out


_STEP = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 40)),
    st.tuples(st.sampled_from(["pump", "commit", "ack", "crash", "close"]), st.just(0)),
)


@settings(max_examples=examples(40, 400), derandomize=CI_DERANDOMIZED, deadline=None)
@given(
    steps=st.lists(_STEP, min_size=1, max_size=24),
    on_done=st.sampled_from(["delete", "move"]),
    first=st.integers(0, 30),
)
def test_a_producer_appending_at_any_moment_loses_nothing(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int]], on_done: str, first: int
) -> None:
    """A producer publishes a file and keeps its descriptor, appending whole lines between any
    two of the daemon's steps (read, commit, ack, crash) until it closes it. Every line ends up
    published exactly once, and the file is finished only once it is read to its real end."""
    spool = tmp_path_factory.mktemp("growth") / "spool"
    spool.mkdir()

    async def run() -> tuple[list[int], int]:
        model = SpoolSteps(spool, on_done=on_done)
        await model.start()
        tmp = spool / ".f.tmp"
        writer = tmp.open("ab")
        writer.write(_lines(0, first))
        writer.flush()
        os.rename(tmp, spool / "f.jsonl")
        written = first
        try:
            for action, n in steps:
                if action == "append" and not writer.closed:
                    writer.write(_lines(written, n))
                    writer.flush()
                    written += n
                elif action == "close":
                    writer.close()
                elif action == "pump":
                    await model.pump()
                elif action == "commit":
                    model.commit()
                elif action == "ack":
                    await model.ack()
                elif action == "crash":
                    await model.crash()
            writer.close()
            for _ in range(20):  # the producer is done: the daemon catches up and finishes
                await model.pump()
                model.commit()
                await model.ack()
                if not claimed_files(spool) and not list(spool.glob("*.jsonl")):
                    break
            assert model.source is not None
            await model.source.aclose()
        finally:
            writer.close()
        return _ids(model.published), written

    published, written = anyio.run(run)
    counts = Counter(published)
    assert sorted(counts) == list(range(written)), "lines lost"
    assert max(counts.values(), default=1) == 1, "lines written twice"
    assert not claimed_files(spool)
    rejected = spool / REJECT_DIR
    assert not rejected.exists() or not [p for p in rejected.iterdir() if p.name[0] != "."]
    if on_done == "move":
        [done] = list((spool / "done").iterdir())
        assert done.read_bytes() == _lines(0, written)


@pytest.mark.anyio
async def test_appends_after_the_end_was_read_are_read_on_not_deleted(tmp_path: Path) -> None:
    """The case found by hand: the file is read to its end, the producer appends (and closes
    it) before that end is published; the ack reads the tail on instead of deleting it."""
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "f.jsonl").write_bytes(_lines(0, 200))
    model = SpoolSteps(spool)
    await model.start()
    await model.pump()
    [claim] = list((spool / CLAIM_DIR / "n1").iterdir())
    with claim.open("ab") as f:
        f.write(_lines(200, 2900))
    model.commit()
    await model.ack()
    assert claimed_files(spool), "the grown file was finished with its tail unread"
    await model.pump()
    model.commit()
    await model.ack()
    assert _ids(model.published) == list(range(3100))
    assert not claimed_files(spool)
    assert model.ctx.refused == {"grew_after_publish": 1}


@pytest.mark.anyio
async def test_a_file_still_open_for_writing_is_not_finished(tmp_path: Path) -> None:
    """A writer that holds the file open without writing: the daemon has read and published
    all of it, but does not delete it while the writer could still add to it (a read lease
    tells); once the writer appends and closes, the rest is read and the file finished."""
    spool = tmp_path / "spool"
    spool.mkdir()
    path = spool / "f.jsonl"
    path.write_bytes(_lines(0, 10))
    writer = path.open("ab")
    try:
        model = SpoolSteps(spool)
        await model.start()
        await model.pump()
        model.commit()
        await model.ack()
        assert claimed_files(spool), "finished while a writer still held it open"
        writer.write(_lines(10, 5))
    finally:
        writer.close()
    await model.rounds()
    assert _ids(model.published) == list(range(15))
    assert not claimed_files(spool)


@pytest.mark.anyio
async def test_a_file_cut_after_it_was_read_is_kept(tmp_path: Path) -> None:
    """A producer that truncates and rewrites a published file after its end was read: what
    is there now is not what was published, so it is kept (set aside), never deleted."""
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "f.jsonl").write_bytes(_lines(0, 50))
    model = SpoolSteps(spool)
    await model.start()
    await model.pump()
    [claim] = list((spool / CLAIM_DIR / "n1").iterdir())
    claim.write_bytes(_lines(1000, 3))
    model.commit()
    await model.ack()
    [kept] = [p for p in (spool / REJECT_DIR).iterdir() if not p.name.startswith(".")]
    assert kept.read_bytes() == _lines(1000, 3)
    assert not claimed_files(spool)


def test_a_racing_writer_against_the_running_daemon_loses_nothing(tmp_path: Path) -> None:
    """The daemon itself, shards published every 100 ms, while a producer that renamed its
    file in keeps appending at random moments (seeded) for about two seconds: every line is in
    a shard exactly once, and the spool is empty at the end."""
    spool = tmp_path / "spool"
    rng = random.Random(23)
    written = [0]
    stop = threading.Event()

    def produce() -> None:
        tmp = spool / ".f.tmp"
        with tmp.open("ab") as out:
            out.write(_lines(0, 100))
            out.flush()
            written[0] = 100
            os.rename(tmp, spool / "f.jsonl")
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and written[0] < 20_000:
                n = rng.randint(1, 60)
                out.write(_lines(written[0], n))
                out.flush()
                written[0] += n
                time.sleep(rng.choice([0.0, 0.001, 0.01, 0.05, 0.15]))
        stop.set()

    cfg = write_config(  # makes the spool
        tmp_path,
        output={"max_shard_age": "100ms"},
        source={"poll_interval": "50ms"},
        features={"id": {"type": "int64"}},
    )
    daemon = Daemon(load_config(cfg), handle_signals=False)
    writer = threading.Thread(target=produce)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            writer.start()
            with anyio.fail_after(30):
                while not stop.is_set() or claimed_files(spool) or list(spool.glob("*.jsonl")):
                    await anyio.sleep(0.05)
            await anyio.sleep(0.3)
            daemon.request_stop()

    try:
        anyio.run(run)
    finally:
        stop.set()
        writer.join()
    ids = read_ids(tmp_path / "shards")
    assert sorted(ids) == list(range(written[0]))
    assert max(ids.values()) == 1


@pytest.mark.anyio
async def test_a_file_rewritten_to_the_same_size_is_kept(tmp_path: Path) -> None:
    """Found by the model: a producer cuts the file it holds open and writes as many bytes
    again, within the file system's timestamp granularity (same size, same modification time
    here, set back by hand). The bytes the reading ended on are gone: the file is kept whole,
    not deleted as if it were what was read."""
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "f.jsonl").write_bytes(_lines(0, 5))
    model = SpoolSteps(spool)
    await model.start()
    await model.pump()
    [claim] = list((spool / CLAIM_DIR / "n1").iterdir())
    before = claim.stat()
    claim.write_bytes(_lines(5, 5))
    os.utime(claim, ns=(before.st_atime_ns, before.st_mtime_ns))
    model.commit()
    await model.ack()
    [kept] = [p for p in (spool / REJECT_DIR).iterdir() if not p.name.startswith(".")]
    assert kept.read_bytes() == _lines(5, 5)
    assert not claimed_files(spool)


_LEASE_HOLDER = r"""
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_RDWR | os.O_APPEND)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print("leased", flush=True)
sys.stdin.readline()
os.write(fd, b'{"id": 100}\n')
"""


def test_a_file_under_a_writers_lease_is_not_finished(tmp_path: Path) -> None:
    """A writer holding a write lease (as Samba's kernel oplocks do for an SMB client writing
    the file): finishing cannot even open the file without blocking. That is a writer, not a
    planted FIFO: the file is kept, and what the writer adds afterwards is read."""
    import subprocess
    import sys

    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "a.jsonl").write_bytes(_lines(0, 1))
    model = SpoolSteps(spool)

    async def read_and_commit() -> None:
        await model.start()
        await model.pump()
        model.commit()

    async def catch_up() -> None:
        await model.rounds()

    anyio.run(read_and_commit)
    [claim] = list((spool / CLAIM_DIR / "n1").iterdir())
    with subprocess.Popen(
        [sys.executable, "-c", _LEASE_HOLDER, str(claim)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdin is not None
        assert holder.stdout.readline() == "leased\n"
        anyio.run(model.ack)
        assert claimed_files(spool), "finished while a writer held its lease"
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(10) == 0
    anyio.run(catch_up)
    assert _ids(model.published) == [0, 100]
    assert not claimed_files(spool)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_last_line_still_being_written_is_read_whole(tmp_path: Path, fmt: str) -> None:
    """Found in review: a producer whose write is cut mid-line (a buffered logger flushing)
    and completed later. The line without its line end is not read while a writer has the file
    open: the end's token stops before it, and once the writer has completed the line and
    closed the file, the line is read whole: never a fragment as an event."""
    spool = tmp_path / "spool"
    spool.mkdir()
    if fmt == "jsonl":
        first, part, rest = b'{"id": 1}\n', b'{"id": 2, "text": "hel', b'lo"}\n'
    else:
        first, part, rest = b"id,text\n1,a\n", b"2,hel", b"lo\n"
    model = SpoolSteps(spool, format=fmt, pattern=f"*.{fmt}")
    tmp = spool / f".a.{fmt}.tmp"

    async def run() -> None:
        await model.start()
        with tmp.open("ab") as writer:
            writer.write(first + part)
            writer.flush()
            tmp.rename(spool / f"a.{fmt}")
            await model.pump()
            model.commit()
            await model.ack()
            writer.write(rest)
        await model.rounds(4)

    anyio.run(run)
    events = [e for b in model.published for e in b.expand()]
    assert all(e.error is None for e in events)
    texts = [e.payload if e.value is None else e.value["text"].encode() for e in events]
    assert len(texts) == 2
    assert b"hello" in texts[1]
    assert not claimed_files(spool)


@pytest.mark.anyio
async def test_a_file_cut_while_it_waits_to_be_read_on_is_kept(tmp_path: Path) -> None:
    """Found by the long mode of the model: the file was renamed to be read on from byte 105
    (its writer still had it open), then the writer cut it and wrote one line. Reading on from
    105 found a 20-byte file: nothing to read, and the file was finished, the line deleted
    unread. A file that ends before the offset reading resumes from is kept whole."""
    spool = tmp_path / "spool"
    spool.mkdir()
    path = spool / "f.jsonl"
    path.write_bytes(_lines(0, 5))
    writer = path.open("ab")
    try:
        model = SpoolSteps(spool)
        await model.start()
        await model.pump()
        model.commit()
        await model.ack()  # a writer holds it: renamed to be read on
        writer.truncate(0)
        writer.seek(0)
        writer.write(_lines(5, 1))
    finally:
        writer.close()
    await model.rounds()
    [kept] = [p for p in (spool / REJECT_DIR).iterdir() if not p.name.startswith(".")]
    assert kept.read_bytes() == _lines(5, 1)
    assert not claimed_files(spool)


@pytest.mark.anyio
async def test_a_file_rewritten_while_it_waits_to_be_read_on_is_kept(tmp_path: Path) -> None:
    """Found by the long mode of the model: renamed to be read on from its end (its writer
    still had it open), the file was cut by the writer and written again to the same size.
    Reading on found nothing new and the file was finished with the new lines. The name now
    carries the size and tail digest read: a resumed read checks them first."""
    spool = tmp_path / "spool"
    spool.mkdir()
    path = spool / "f.jsonl"
    path.write_bytes(_lines(0, 5))
    writer = path.open("ab")
    try:
        model = SpoolSteps(spool)
        await model.start()
        await model.pump()
        model.commit()
        await model.ack()
        writer.truncate(0)
        writer.seek(0)
        writer.write(_lines(5, 5))  # as many bytes as before
    finally:
        writer.close()
    await model.rounds()
    [kept] = [p for p in (spool / REJECT_DIR).iterdir() if not p.name.startswith(".")]
    assert kept.read_bytes() == _lines(5, 5)
    assert _ids(model.published) == list(range(5))
    assert not claimed_files(spool)
