"""fsync, write and close errors (EIO) are fatal: the shard is discarded, nothing is acked, the
daemon stops with an error, no fsync is retried on the same file, and a restart loses nothing.

Faults are injected through the daemon's :class:`~tfrecordd.fsys.FileSystem`: a subclass that
raises ``OSError(EIO)`` on the n-th call of one operation on one kind of file, and counts every
call per file.
"""

from __future__ import annotations

import argparse
import errno
import os
from collections import Counter
from pathlib import Path
from typing import BinaryIO

import anyio
import pytest

from tests.reliability.harness import count_ids
from tests.support import claimed_files, movie_event, spool_file, write_config
from tfrecordd.cli import service
from tfrecordd.config import load_config
from tfrecordd.errors import EXIT_IO, DurabilityError, find_error
from tfrecordd.fsys import FileSystem
from tfrecordd.pipeline.runtime import Daemon

pytestmark = pytest.mark.anyio

EVENTS = 300


def _kind(path: str) -> str:
    name = os.path.basename(path)
    if name == "journal":
        return "journal"
    if name.startswith("dead-letters"):
        return "dead-letters"
    if name.endswith("_manifest_json.inprogress") or name.endswith(".manifest.json"):
        return "manifest"
    if name.endswith(".inprogress"):
        return "shard"
    if os.path.isdir(path):
        return "dir"
    return "other"


class FaultyFs(FileSystem):
    """Raises EIO on the ``nth`` ``op`` on a file of kind ``kind``; counts calls per file."""

    def __init__(self, op: str, kind: str, nth: int) -> None:
        self.op, self.kind, self.nth = op, kind, nth
        self.calls: Counter[tuple[str, str]] = Counter()
        self.seen = 0
        self.failed: str | None = None
        self.after_fault: list[tuple[str, str]] = []

    def _call(self, op: str, path: str) -> None:
        if self.failed is not None:
            self.after_fault.append((op, path))
        self.calls[op, path] += 1
        if op == self.op and _kind(path) == self.kind and self.failed is None:
            self.seen += 1
            if self.seen == self.nth:
                self.failed = path
                raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    @staticmethod
    def _path(f: BinaryIO) -> str:
        return os.readlink(f"/proc/self/fd/{f.fileno()}")

    def write(self, f: BinaryIO, data: bytes | memoryview) -> None:
        self._call("write", self._path(f))
        super().write(f, data)

    def fsync(self, f: BinaryIO) -> None:
        self._call("fsync", self._path(f))
        super().fsync(f)

    def close(self, f: BinaryIO) -> None:
        path = self._path(f)
        super().close(f)  # the file is closed either way, as a failing close(2) does
        self._call("close", path)

    def fsync_dir(self, path: str) -> None:
        self._call("fsync", path)
        super().fsync_dir(path)


FAULTS = [
    ("fsync", "shard", 1),
    ("fsync", "shard", 3),
    ("write", "shard", 2),
    ("close", "shard", 2),
    ("fsync", "journal", 1),
    ("fsync", "journal", 4),
    ("write", "journal", 3),
    ("fsync", "dead-letters", 1),
    ("fsync", "dir", 2),
    ("fsync", "manifest", 2),
]


def _config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path,
        output={"max_shard_records": 40, "max_shard_age": "100ms", "compression": "gzip"},
        daemon={"max_batch_events": 20},
        source={"poll_interval": "20ms"},
    )


def _spool(tmp_path: Path) -> None:
    lines: list[object] = []
    for i in range(EVENTS):
        lines.append(movie_event(i))
        if i % 50 == 49:
            lines.append("{broken")
    spool_file(tmp_path / "spool", "a.jsonl", lines)  # type: ignore[arg-type]


def _claimed_or_spooled(tmp_path: Path) -> list[str]:
    spool = tmp_path / "spool"
    names = [p.name for p in spool.glob("*.jsonl")]
    return names + [p.name for p in claimed_files(spool)]


@pytest.mark.parametrize(("op", "kind", "nth"), FAULTS)
async def test_io_error_is_fatal_and_nothing_is_lost(
    tmp_path: Path, op: str, kind: str, nth: int
) -> None:
    cfg = load_config(_config(tmp_path))
    _spool(tmp_path)
    fs = FaultyFs(op, kind, nth)
    daemon = Daemon(cfg, fs=fs, handle_signals=False)
    with anyio.fail_after(30), pytest.raises(BaseException) as caught:  # noqa: PT011
        await daemon.run()
    assert find_error(caught.value).__class__ is DurabilityError, caught.value
    assert fs.failed is not None, "the fault was injected"
    # Never retried: after the failure, no fsync (or anything else) touches that file again.
    assert [c for c in fs.after_fault if c[1] == fs.failed and c[0] == "fsync"] == []
    # Nothing acked: the spool file is still there. The failed commit's shards stay in progress
    # for the restart to decide on from the journal: published if its intent is in it,
    # discarded if not (a manifest whose write failed after its shard was published is rebuilt
    # from the shard); so does the shard the commit before kept open, if it made it durable.
    assert _claimed_or_spooled(tmp_path), "the spool file was acked after an I/O error"
    out = tmp_path / "shards"
    left = [p.name for p in out.rglob(".*.inprogress")]
    assert len(left) <= 2, left
    # Restart on a healthy file system: everything arrives, once.
    daemon = Daemon(cfg, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        with anyio.fail_after(30):
            while _claimed_or_spooled(tmp_path):
                await anyio.sleep(0.05)
        daemon.request_stop()
    ids, problems = count_ids(out)
    assert problems == []
    assert ids == dict.fromkeys(range(EVENTS), 1)
    assert list(out.rglob(".*.inprogress")) == []
    shards = sorted(out.glob("*.tfrecord.gz"))
    assert len(sorted(out.glob("*.manifest.json"))) == len(shards)


def test_cli_exits_non_zero_on_an_fsync_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tfrecordd run`` maps the error to exit code 74 (EX_IOERR); the daemon's own file system
    is the process-wide default, so the fault is patched in for this one call."""
    cfg = _config(tmp_path)
    _spool(tmp_path)

    def failing_fsync(self: FileSystem, f: BinaryIO) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(FileSystem, "fsync", failing_fsync)
    args = argparse.Namespace(config=str(cfg), log_format=None, log_level=None)
    assert service.cmd_run(args) == EXIT_IO
    assert _claimed_or_spooled(tmp_path)
    # At most the shard whose fsync failed stays in progress, for the next start to discard.
    assert len(list((tmp_path / "shards").rglob(".*.inprogress"))) <= 1
