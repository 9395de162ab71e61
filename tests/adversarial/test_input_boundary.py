"""The boundary around one input: whatever reading or finishing one file, entry or connection
raises refuses that input, is counted, and the rest flows; only a failed fsync stops the daemon.

The failures are injected into our own layers (the format readers, the file reader), any
exception at any point of any format; the cases found in the field (a folder whose name is a
file in ``done_dir``) are built for real.
"""

from __future__ import annotations

import csv
import errno
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import CI_DERANDOMIZED, claimed_files, examples
from tfrecordd.boundary import InputBoundary, refusable
from tfrecordd.errors import DurabilityError, StateInUseError
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.sources import spool_reading
from tfrecordd_plugins.sources.directory import (
    CLAIM_DIR,
    REASONS,
    REJECT_DIR,
    DirectorySource,
    DirectorySourceConfig,
)


def _lines(first: int, n: int) -> bytes:
    return b"".join(json.dumps({"id": i}).encode() + b"\n" for i in range(first, first + n))


def _csv(first: int, n: int) -> bytes:
    return b"id\r\n" + b"".join(f"{i}\r\n".encode() for i in range(first, first + n))


def _ids(ctx: RecordingContext) -> list[int]:
    out = []
    for b in ctx.batches:
        for e in b.expand():
            if e.error is None:
                value = e.value if e.value is not None else json.loads(e.payload)
                out.append(int(value["id"]))
    return out


def _reasons(spool: Path) -> list[dict[str, Any]]:
    path = spool / REJECT_DIR / REASONS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _kept(spool: Path) -> list[Path]:
    folder = spool / REJECT_DIR
    return [p for p in folder.iterdir() if not p.name.startswith(".")] if folder.exists() else []


async def _run(source: DirectorySource, ctx: RecordingContext, seconds: float) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(source.run, ctx)
        await anyio.sleep(seconds)
        tg.cancel_scope.cancel()


_ERRORS = [
    ValueError("bad value"),
    KeyError("k"),
    RuntimeError("boom"),
    csv.Error("new-line character seen in unquoted field"),
    UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
    OSError(errno.EIO, "Input/output error"),
    ZeroDivisionError("division by zero"),
]


@settings(max_examples=examples(30, 300), derandomize=CI_DERANDOMIZED, deadline=None)
@given(
    fmt=st.sampled_from(["jsonl", "csv", "whole-file"]),
    error=st.sampled_from(_ERRORS),
    after=st.integers(0, 6),
    size=st.integers(0, 400),
)
def test_any_error_reading_one_file_sets_that_file_aside_and_the_rest_flows(
    tmp_path_factory: pytest.TempPathFactory,
    fmt: str,
    error: Exception,
    after: int,
    size: int,
) -> None:
    """An exception of any kind, raised by the file reader after any number of reads of one
    file (``bad``), in every format: that file is set aside whole with the error as its reason,
    counted, and the other file is read as usual. Every id is published or in the kept file."""
    spool = tmp_path_factory.mktemp("boundary") / "spool"
    spool.mkdir()
    make = _csv if fmt == "csv" else _lines
    suffix = "csv" if fmt == "csv" else "jsonl"
    (spool / f"bad.{suffix}").write_bytes(make(0, size))
    (spool / f"good.{suffix}").write_bytes(make(10_000, 50))
    calls = {"n": 0}
    real = spool_reading.FileReader.read_into, spool_reading.FileReader.read

    def failing(i: int) -> Any:
        async def wrapper(self: spool_reading.FileReader, *args: Any) -> Any:
            if self.name.endswith(f"-bad.{suffix}"):
                calls["n"] += 1
                if calls["n"] > after:
                    raise error
            return await real[i](self, *args)

        return wrapper

    config = DirectorySourceConfig.model_validate(
        {"name": "spool", "encoder": "e", "path": spool, "poll_interval": 0.01}
        | {"format": fmt, "pattern": f"*.{suffix}", "read_size": 4096}
    )

    async def run() -> RecordingContext:
        source = config.build()
        ctx = RecordingContext(name="spool", node_id="n1", max_batch_events=16)
        source.attach(ctx)
        await source.recover(None, [])
        await _run(source, ctx, 0.3)
        await source.ack([b.token for b in ctx.batches])
        await source.aclose()
        return ctx

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(spool_reading.FileReader, "read_into", failing(0))
        patch.setattr(spool_reading.FileReader, "read", failing(1))
        ctx = anyio.run(run)
    good = [i for i in _ids(ctx) if i >= 10_000] if fmt != "whole-file" else []
    if fmt != "whole-file":
        assert good == list(range(10_000, 10_050)), "the other file did not flow"
    assert not claimed_files(spool)
    if calls["n"] > after:
        assert ctx.refused.get("read_error") == 1
        [kept] = _kept(spool)
        assert kept.read_bytes() == make(0, size), "the refused file was not kept whole"
        [why] = _reasons(spool)
        assert type(error).__name__ in why["reason"]
    else:  # the file was read before the error's turn came
        assert not _kept(spool)


@pytest.mark.anyio
async def test_a_fatal_error_is_not_swallowed_by_the_boundary(tmp_path: Path) -> None:
    """A failed fsync (or a second daemon's lock) raised while handling one input stops the
    source: refusing the input would not make it pass."""
    ctx = RecordingContext(name="spool")
    for fatal in (DurabilityError("fsync failed"), StateInUseError("in use")):
        assert not refusable(fatal)
        with pytest.raises(type(fatal)), InputBoundary(ctx, "file x", "read_error"):
            raise fatal
    assert not refusable(ExceptionGroup("g", [ValueError("v"), DurabilityError("d")]))
    assert refusable(ExceptionGroup("g", [ValueError("v"), KeyError("k")]))
    assert ctx.refused == {}


def _move_config(spool: Path) -> DirectorySourceConfig:
    return DirectorySourceConfig.model_validate(
        {"name": "spool", "encoder": "e", "path": spool, "poll_interval": 0.01}
        | {"recursive": True, "on_done": "move"}
    )


@pytest.mark.anyio
async def test_a_folder_named_like_a_file_in_done_dir_is_finished_another_way(
    tmp_path: Path,
) -> None:
    """``recursive`` + ``on_done = "move"``: a producer once wrote ``cam01``, which is now in
    ``done/``; now it writes ``cam01/a.jsonl``. The move cannot be done as configured
    (``done/cam01`` is a file): the file is read, published, and set aside with why; the ack
    does not raise, and the other files are moved as usual."""
    spool = tmp_path / "spool"
    (spool / "done").mkdir(parents=True)
    (spool / "done" / "cam01").write_bytes(_lines(0, 1))
    (spool / "cam01").mkdir()
    (spool / "cam01" / "a.jsonl").write_bytes(_lines(100, 10))
    (spool / "b.jsonl").write_bytes(_lines(200, 10))
    source = _move_config(spool).build()
    ctx = RecordingContext(name="spool", node_id="n1")
    source.attach(ctx)
    await source.recover(None, [])
    await _run(source, ctx, 0.3)
    await source.ack([b.token for b in ctx.batches])
    await source.aclose()
    assert sorted(_ids(ctx)) == list(range(100, 110)) + list(range(200, 210))
    assert (spool / "done" / "b.jsonl").read_bytes() == _lines(200, 10)
    [kept] = _kept(spool)
    assert kept.read_bytes() == _lines(100, 10)
    assert "could not be moved into done_dir" in _reasons(spool)[0]["reason"]
    assert ctx.refused == {"unfinished": 1}
    assert not claimed_files(spool)


@pytest.mark.anyio
async def test_a_failing_finish_in_recovery_never_stops_the_start(tmp_path: Path) -> None:
    """The same ack redone by recovery (the daemon died after the commit, before the ack):
    the start goes on, and the file is set aside once, not retried at every start."""
    spool = tmp_path / "spool"
    (spool / "done").mkdir(parents=True)
    (spool / "done" / "cam01").write_bytes(b"x")
    (spool / "cam01").mkdir()
    (spool / "cam01" / "a.jsonl").write_bytes(_lines(0, 5))
    config = _move_config(spool)
    first = config.build()
    ctx = RecordingContext(name="spool", node_id="n1")
    first.attach(ctx)
    await first.recover(None, [])
    await _run(first, ctx, 0.3)
    await first.aclose()
    tokens = [b.token for b in ctx.batches]
    state = DirectorySource.fold(None, tokens)
    for _ in range(2):
        again = config.build()
        ctx2 = RecordingContext(name="spool", node_id="n1")
        again.attach(ctx2)
        await again.recover(state, tokens)  # must not raise
        await _run(again, ctx2, 0.1)
        await again.aclose()
        assert ctx2.batches == []
    [kept] = _kept(spool)
    assert kept.read_bytes() == _lines(0, 5)
    assert len(_reasons(spool)) == 1
    assert not list((spool / CLAIM_DIR / "n1").iterdir())


def test_an_error_making_one_stream_entry_dead_letters_that_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis Streams: whatever making one entry's event raises dead-letters that entry, its
    payload kept and its ID still acked with the batch; the other entries are events."""
    from tfrecordd_plugins.sources.redis_stream.config import RedisStreamSourceConfig
    from tfrecordd_plugins.sources.redis_stream.scripts import Entry
    from tfrecordd_plugins.sources.redis_stream.source import RedisStreamSource

    source = RedisStreamSourceConfig(name="r", encoder="e", stream="s").build()
    assert isinstance(source, RedisStreamSource)
    real = RedisStreamSource.event_of

    def event_of(self: RedisStreamSource, entry: Entry) -> Any:
        if entry.payload == b"bad":
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return real(self, entry)

    monkeypatch.setattr(RedisStreamSource, "event_of", event_of)
    entries = [Entry(f"1-{i}", 0, p, len(p), [], False) for i, p in enumerate([b"{}", b"bad"])]
    good, bad = map(source.guarded_event, entries)
    assert good is not None
    assert good.error is None
    assert bad is not None
    assert bad.payload == b"bad"
    assert bad.where == "s:1-1"
    assert bad.error is not None
    assert "UnicodeDecodeError" in bad.error


@pytest.mark.anyio
async def test_a_pipeline_closed_under_a_send_is_no_inputs_fault(tmp_path: Path) -> None:
    """The daemon stops (for a reason of its own) while a file is being read: the send that
    finds the pipeline closed is not taken for the file's fault: nothing is set aside or
    counted, and the error reaches the daemon."""
    from tfrecordd.boundary import PipelineClosedError

    class Closing(RecordingContext):
        async def send(self, batch: Any) -> None:
            raise PipelineClosedError("closed")

    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "a.jsonl").write_bytes(_lines(0, 50))
    config = DirectorySourceConfig.model_validate(
        {"name": "spool", "encoder": "e", "path": spool, "poll_interval": 0.01}
    )
    source = config.build()
    ctx = Closing(name="spool", node_id="n1")
    source.attach(ctx)
    await source.recover(None, [])
    with pytest.raises(BaseExceptionGroup) as caught:
        await _run(source, ctx, 1.0)
    assert caught.group_contains(PipelineClosedError)
    await source.aclose()
    assert ctx.refused == {}
    assert not _kept(spool)


def test_a_failed_fsync_of_the_reasons_file_stops_the_daemon(tmp_path: Path) -> None:
    """Setting a file aside appends its reason to ``.reasons.jsonl`` and fsyncs it through the
    daemon's file system: a failed fsync is fatal (DurabilityError, exit 74), never logged and
    retried on the same file at the next refusal."""
    from tests.adversarial.spool_steps import SpoolSteps
    from tfrecordd.fsys import FileSystem

    class FailingFsync(FileSystem):
        def fsync(self, f: Any) -> None:
            raise OSError(errno.EIO, "injected EIO")

    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "a.csv").write_bytes("id\n1\n".encode("utf-16"))  # refused whole
    steps = SpoolSteps(spool, format="csv", pattern="*.csv")

    async def run() -> None:
        await steps.start()
        steps.ctx.fs = FailingFsync()
        assert steps.source is not None
        steps.source.attach(steps.ctx)
        await steps.pump()
        steps.commit()
        await steps.ack()

    with pytest.raises(DurabilityError, match="fsync failed"):
        anyio.run(run)


def test_a_claim_that_cannot_be_finished_at_all_is_never_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read and published, the claim can be neither deleted, nor set aside, nor renamed in
    its folder (an immutable file, a file system gone read-only under it): it is left, and
    recorded as finished in the source's state folder, so the next start does not read it
    again from its first byte."""
    import os

    from tests.adversarial.spool_steps import SpoolSteps

    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "a.jsonl").write_bytes(_lines(0, 5))
    steps = SpoolSteps(spool)
    real_unlink, real_rename = os.unlink, os.rename

    def refused(name: Any) -> bool:
        return str(name).endswith("-a.jsonl")

    def unlink(path: Any, *args: Any, **kw: Any) -> None:
        if refused(path):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_unlink(path, *args, **kw)

    def rename(src: Any, dst: Any, *args: Any, **kw: Any) -> None:
        if refused(src):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_rename(src, dst, *args, **kw)

    async def run() -> None:
        await steps.start()
        await steps.pump()
        steps.commit()
        with monkeypatch.context() as patch:
            patch.setattr(os, "unlink", unlink)
            patch.setattr(os, "rename", rename)
            await steps.ack()
        assert steps.ctx.refused == {"unfinished": 1}
        await steps.crash()  # the journal folded the file's end: nothing owes it an ack
        await steps.pump()
        steps.commit()
        assert steps.source is not None
        await steps.source.aclose()

    anyio.run(run)
    published = [json.loads(e.payload)["id"] for b in steps.published for e in b.expand()]
    assert published == list(range(5))
    assert len(list((spool / CLAIM_DIR / "n1").iterdir())) == 1  # left where it was


@pytest.mark.parametrize("on_done", ["delete", "move"])
def test_a_failed_folder_fsync_while_finishing_stops_the_daemon(
    tmp_path: Path, on_done: str
) -> None:
    """DESIGN invariant 5 through the input boundary: the fsync of a spool folder after a
    finish (the claim folder, or a folder made in ``done_dir`` for a file of a sub-folder)
    fails: the ack raises DurabilityError (exit 74); the boundary neither takes it for the
    file's fault nor finishes the file another way."""
    from tests.adversarial.spool_steps import SpoolSteps
    from tfrecordd.fsys import FileSystem

    class FailingDirFsync(FileSystem):
        def fsync_dir_fd(self, fd: int) -> None:
            raise OSError(errno.EIO, "injected EIO")

    spool = tmp_path / "spool"
    (spool / "cam01").mkdir(parents=True)
    (spool / "cam01" / "a.jsonl").write_bytes(_lines(0, 3))
    steps = SpoolSteps(spool, recursive=True, on_done=on_done)

    async def run() -> None:
        await steps.start()
        await steps.pump()
        steps.commit()
        steps.ctx.fs = FailingDirFsync()
        assert steps.source is not None
        steps.source.attach(steps.ctx)
        await steps.ack()

    with pytest.raises(DurabilityError, match="fsync"):
        anyio.run(run)
    assert steps.ctx.refused == {}
    assert not _kept(spool)
