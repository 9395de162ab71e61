"""A producer who can write into the spool attacks the daemon's own folders in it.

The documented permissions (the spool group-writable, no sticky bit) let any producer rename the
claim, rejected or done folder away and put a symlink (or a folder of its own) in its place. The
daemon must never follow it: it refuses to start on a folder that is not its own, and while it
runs it keeps using the folders it opened at start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support import (
    claimed_files,
    movie_event,
    read_ids,
    run_daemon_with,
    shard_files,
    spool_file,
    write_config,
)
from tfrecordd.config import load_config
from tfrecordd.errors import EXIT_CONFIG, ConfigError, TfrecorddError, find_error
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd_plugins.sources.directory import CLAIM_DIR, REJECT_DIR, SpoolError


async def _drain(daemon: Daemon, done: Any, timeout: float = 20) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        with anyio.fail_after(timeout):
            while not done():
                await anyio.sleep(0.05)
        daemon.request_stop()


def _first_run(root: Path, **source: Any) -> Path:
    """One clean run, so that the output and state hold a published shard and a journal."""
    cfg = write_config(root, output={"max_shard_age": "100ms"}, source=source)
    spool_file(root / "spool", "first.jsonl", [movie_event(i) for i in range(10)])
    daemon = Daemon(load_config(cfg), handle_signals=False)
    anyio.run(
        _drain, daemon, lambda: not claimed_files(root / "spool") and shard_files(root / "shards")
    )
    assert read_ids(root / "shards") == dict.fromkeys(range(10), 1)
    return cfg


def _start_error(daemon: Daemon) -> TfrecorddError | None:
    """The error a daemon's start ends with, as the command line reports it (exit status)."""

    async def run() -> None:
        with anyio.fail_after(10):
            await daemon.run()

    try:
        anyio.run(run)
    except BaseException as e:  # unwrapped as `tfrecordd run` does
        return find_error(e)
    return None


def _snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}


@pytest.mark.parametrize("target", ["shards", "state"])
@pytest.mark.parametrize("folder", [CLAIM_DIR, f"{CLAIM_DIR}/test", REJECT_DIR, "done"])
def test_a_symlink_in_place_of_a_daemon_folder_stops_the_start(
    tmp_path: Path, folder: str, target: str
) -> None:
    options = {"on_done": "move"} if folder == "done" else {}
    cfg = _first_run(tmp_path, **options)
    spool = tmp_path / "spool"
    before = _snapshot(tmp_path / target)
    (spool / folder).rename(spool / "moved-away")
    (spool / folder).symlink_to(tmp_path / target)
    spool_file(spool, "second.jsonl", [movie_event(i) for i in range(10, 20)])
    error: TfrecorddError | None
    try:
        config = load_config(cfg)
    except ConfigError as e:
        error = e
    else:
        error = _start_error(Daemon(config, handle_signals=False))
    if isinstance(error, ConfigError):
        # A done_dir that now resolves to the output or state directory: the config check
        # refuses it before the source looks.
        assert "sources[0].done_dir" in str(error)
    else:
        assert isinstance(error, SpoolError)
        assert "not a directory" in str(error)
    assert error is not None
    assert error.exit_code == EXIT_CONFIG
    after = _snapshot(tmp_path / target)
    for name, data in before.items():  # nothing of its own was read as input or deleted
        if name != "journal":
            assert after.get(name) == data, name
    assert (spool / "second.jsonl").exists()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(10), 1)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("folder", [CLAIM_DIR, f"{CLAIM_DIR}/test", REJECT_DIR])
def test_a_daemon_folder_owned_by_another_user_stops_the_start(tmp_path: Path, folder: str) -> None:
    cfg = _first_run(tmp_path)
    os.chown(tmp_path / "spool" / folder, 65534, 65534)
    error = _start_error(Daemon(load_config(cfg), handle_signals=False))
    assert isinstance(error, SpoolError)
    assert "owned by uid 65534" in str(error)


def test_a_claim_folder_swapped_for_a_symlink_while_running_is_not_followed(
    tmp_path: Path,
) -> None:
    """The daemon runs; a producer renames the claim folder away and puts a symlink to the
    output in its place. New files are still claimed into the real folder (wherever it went)
    and read once; nothing appears in or disappears from the output but shards."""
    cfg = write_config(tmp_path, output={"max_shard_age": "100ms"})
    spool = tmp_path / "spool"
    out = tmp_path / "shards"
    daemon = Daemon(load_config(cfg), handle_signals=False)
    moved = spool / "moved-away"

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            spool_file(spool, "a.jsonl", [movie_event(i) for i in range(10)])
            with anyio.fail_after(20):
                while not shard_files(out) or claimed_files(spool):
                    await anyio.sleep(0.05)
            published = set(shard_files(out))
            (spool / CLAIM_DIR).rename(moved)
            (spool / CLAIM_DIR).symlink_to(out)
            for n in range(1, 4):
                spool_file(spool, f"b{n}.jsonl", [movie_event(10 * n + i) for i in range(10)])
            with anyio.fail_after(20):
                while any(spool.glob("b*.jsonl")) or any((moved / "test").iterdir()):
                    await anyio.sleep(0.05)
                while len(read_ids(out)) < 40:
                    await anyio.sleep(0.05)
            assert published <= set(shard_files(out)), "a published shard was deleted"
            daemon.request_stop()

    anyio.run(run)
    assert read_ids(out) == dict.fromkeys(range(40), 1)
    assert all(p.name.startswith(("part-", ".")) for p in out.iterdir()), list(out.iterdir())


def test_a_recursive_spool_never_reads_the_daemons_own_folders(tmp_path: Path) -> None:
    """With ``recursive = true``, a producer renames the claim and rejected folders to visible
    names: they are still the daemon's, never scanned as spool folders (a claimed file would
    be claimed again and read twice), and put back under their names within seconds."""
    cfg = write_config(tmp_path, output={"max_shard_age": "100ms"}, source={"recursive": True})
    spool = tmp_path / "spool"
    claims = spool / CLAIM_DIR / "test"
    claims.mkdir(parents=True, mode=0o700)
    # A claim left by an earlier run (not read yet), then the folders renamed to visible names.
    spool_file(claims, f"{1:020d}-old.jsonl", [movie_event(i) for i in range(10)])
    (spool / REJECT_DIR).mkdir(mode=0o700)
    daemon = Daemon(load_config(cfg), handle_signals=False)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            (spool / CLAIM_DIR).rename(spool / "visible")
            (spool / REJECT_DIR).rename(spool / "visible-rejected")
            spool_file(spool, "new.jsonl", [movie_event(i) for i in range(10, 20)])
            with anyio.fail_after(20):
                while len(read_ids(tmp_path / "shards")) < 20:
                    await anyio.sleep(0.05)
            await anyio.sleep(1)  # more polls: nothing may be read twice
            daemon.request_stop()

    anyio.run(run)
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(20), 1)
    # The daemon's watch put its folders back under their names.
    assert not (spool / "visible").exists()
    assert not (spool / "visible-rejected").exists()
    assert (spool / CLAIM_DIR / "test").is_dir()
    assert (spool / REJECT_DIR).is_dir()


def test_a_symlink_named_like_done_dir_is_harmless_when_files_are_deleted(tmp_path: Path) -> None:
    """``on_done = "delete"`` never uses ``done/``: a symlink there (to the output) neither stops
    the start nor is followed by a recursive scan."""
    cfg = write_config(tmp_path, output={"max_shard_age": "100ms"}, source={"recursive": True})
    spool = tmp_path / "spool"
    (tmp_path / "shards").mkdir()
    (spool / "done").symlink_to(tmp_path / "shards")
    spool_file(spool, "a.jsonl", [movie_event(i) for i in range(10)])
    daemon = Daemon(load_config(cfg), handle_signals=False)
    anyio.run(_drain, daemon, lambda: not (spool / "a.jsonl").exists() and not claimed_files(spool))
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(10), 1)


def test_a_spool_replaced_while_running_stops_the_source_with_a_clear_error(
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, output={"max_shard_age": "100ms"})
    spool = tmp_path / "spool"
    daemon = Daemon(load_config(cfg), handle_signals=False)

    async def body() -> None:
        spool.rename(tmp_path / "old-spool")
        spool.mkdir()
        await anyio.sleep(20)  # the error ends the daemon long before
        daemon.request_stop()

    raised = run_daemon_with(daemon, body)
    error = find_error(raised) if raised is not None else None
    assert error is not None
    assert "was removed, replaced, or moved" in str(error)
