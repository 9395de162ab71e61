"""The spool's folders the daemon holds open are watched: each one renamed out of the spool,
deleted or replaced while the daemon runs (busy reading a stream of files, or idle) stops it
within seconds with exit 74, naming the folder; one of its own folders renamed within the spool
is put back. Before, a claim or rejected folder renamed away went on receiving files nobody
saw, and a replaced spool was noticed only between files."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from pathlib import Path

import anyio
import pytest

from tests.support import movie_event, read_ids, run_daemon_with, spool_file, write_config
from tfrecordd.config import load_config
from tfrecordd.errors import EXIT_IO, find_error
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd_plugins.sources.directory import CLAIM_DIR, REJECT_DIR, WATCH_INTERVAL

_FOLDERS = {
    "spool": "",
    "claim folder": CLAIM_DIR,
    "node folder": f"{CLAIM_DIR}/test",
    "rejected folder": REJECT_DIR,
    "done_dir": "done",
}


def _remove_tree(target: Path) -> None:
    """Delete ``target`` while the producer and the daemon still write into it: a single
    ``rmtree`` fails when a file appears after its listing (``ENOTEMPTY``) or one it listed is
    renamed away first, so it is repeated, bounded, until the folder is gone."""
    for _ in range(100):
        shutil.rmtree(target, ignore_errors=True)
        if not os.path.lexists(target):
            return
    raise AssertionError(f"{target} could not be deleted")


@pytest.mark.parametrize("how", ["renamed", "deleted"])
@pytest.mark.parametrize("traffic", [True, False], ids=["busy", "idle"])
@pytest.mark.parametrize("folder", sorted(_FOLDERS))
def test_a_held_spool_folder_changed_stops_the_daemon_with_exit_74(
    tmp_path: Path, folder: str, traffic: bool, how: str
) -> None:
    cfg = write_config(
        tmp_path,
        output={"max_shard_age": "100ms"},
        source={"on_done": "move", "poll_interval": "50ms"},
    )
    spool = tmp_path / "spool"
    daemon = Daemon(load_config(cfg), handle_signals=False)
    stop = threading.Event()

    def produce() -> None:
        n = 0
        while not stop.is_set() and n < 2000:
            with contextlib.suppress(OSError):  # the spool itself was deleted
                spool_file(spool, f"f{n}.jsonl", [movie_event(i) for i in range(n * 5, n * 5 + 5)])
            n += 1
            time.sleep(0.01)

    writer = threading.Thread(target=produce)
    took: list[float] = []

    async def body() -> None:
        if traffic:
            writer.start()
        await anyio.sleep(0.3)
        target = spool / _FOLDERS[folder]
        start = time.monotonic()
        if how == "renamed":
            os.rename(target, tmp_path / "moved-away")
        else:
            _remove_tree(target)
        os.makedirs(target, exist_ok=True)
        try:
            await anyio.sleep(8 * WATCH_INTERVAL)  # the error ends the daemon before
        finally:
            took.append(time.monotonic() - start)
        daemon.request_stop()

    try:
        raised = run_daemon_with(daemon, body)
        error = find_error(raised) if raised is not None else None
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
    assert error is not None, f"{folder} {how}: the daemon went on ({raised!r})"
    assert error.exit_code == EXIT_IO
    assert "was removed, replaced, or moved" in str(error)
    assert took[0] < 4 * WATCH_INTERVAL


@pytest.mark.parametrize("folder", ["claim folder", "node folder", "rejected folder", "done_dir"])
def test_a_folder_renamed_within_the_spool_is_put_back_and_nothing_is_lost(
    tmp_path: Path, folder: str
) -> None:
    cfg = write_config(
        tmp_path,
        output={"max_shard_age": "100ms"},
        source={"on_done": "move", "poll_interval": "50ms", "recursive": True},
    )
    spool = tmp_path / "spool"
    daemon = Daemon(load_config(cfg), handle_signals=False)
    target = spool / _FOLDERS[folder]

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            for n in range(20):
                spool_file(spool, f"f{n}.jsonl", [movie_event(i) for i in range(n * 5, n * 5 + 5)])
            await anyio.sleep(0.2)
            os.rename(target, spool / "renamed")
            for n in range(20, 40):
                spool_file(spool, f"f{n}.jsonl", [movie_event(i) for i in range(n * 5, n * 5 + 5)])
            with anyio.fail_after(4 * WATCH_INTERVAL):
                while not target.is_dir() or (spool / "renamed").exists():
                    await anyio.sleep(0.05)
            with anyio.fail_after(20):
                while len(read_ids(tmp_path / "shards")) < 200 or list(spool.glob("*.jsonl")):
                    await anyio.sleep(0.05)
            await anyio.sleep(0.5)
            daemon.request_stop()

    anyio.run(run)
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(200), 1)
    refused = daemon.metrics.registry.get_sample_value(
        "tfrecordd_inputs_refused_total", {"source": "spool", "reason": "folder_moved"}
    )
    assert refused == 1
