"""A second daemon on the same ``state_dir`` (an operator's slip) is refused, never run beside
the first: one journal, one set of in-progress shards, one owner. So is a second daemon with the
same ``node_id`` on one output (its staging folder) or on one spool (its claim folder)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import anyio
import pytest

from tests.support import (
    DaemonProcess,
    assert_exactly_once,
    movie_event,
    read_ids,
    run_clean_until,
    run_tfrecordd,
    shard_files,
    spool_file,
    wait_for,
    write_config,
)
from tfrecordd.config import load_config
from tfrecordd.errors import EXIT_IN_USE, StateInUseError
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.state import statelock
from tfrecordd_plugins.sources.directory import CLAIM_DIR


def _spool_drained(root: Path) -> bool:
    spool = root / "spool"
    left = [p for p in spool.iterdir() if p.is_file() and not p.name.startswith(".")]
    return not left


def _claims_done(root: Path) -> bool:
    claims = root / "spool" / CLAIM_DIR
    return not claims.exists() or not any(p.is_file() for p in claims.rglob("*"))


def _finish_claims(root: Path) -> None:
    """Restart the daemon under ``root`` until it has finished any claim left: a file claimed
    but not yet read when SIGTERM came is read by this start, and its claim is removed only once
    the shard holding it is published, so this start publishes shards at once."""
    config = write_config(root, output={"max_shard_age": "100ms"})
    run_clean_until(config, lambda: _claims_done(root))


def _run_second(config: Path) -> subprocess.CompletedProcess[str]:
    return run_tfrecordd("run", "--config", str(config), timeout=60)


def test_second_daemon_on_a_running_state_dir_exits_and_the_first_loses_nothing(
    tmp_path: Path,
) -> None:
    # A long age and a big cap: the first daemon holds its records in an open shard while the
    # second one tries to start (before the lock, the second discarded that shard at recovery).
    config = write_config(tmp_path, output={"max_shard_age": "10m"})
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(500)])
    first = DaemonProcess(config)
    try:
        first.wait_started(90)
        wait_for(lambda: _spool_drained(tmp_path), 90)
        second = _run_second(config)
        assert second.returncode == EXIT_IN_USE, second.stdout + second.stderr
        said = second.stdout + second.stderr
        assert "in use by another tfrecordd" in said
        assert f"pid {first.proc.pid}" in said
        assert first.proc.poll() is None, first.output()
        spool_file(tmp_path / "spool", "b.jsonl", [movie_event(i) for i in range(500, 1000)])
        wait_for(lambda: _spool_drained(tmp_path), 90)
        assert first.stop() == 0, first.output()
    finally:
        first.kill()
    _finish_claims(tmp_path)
    ids = read_ids(tmp_path / "shards")
    assert set(ids) == set(range(1000))
    assert set(ids.values()) == {1}


def test_a_killed_daemon_leaves_no_stale_lock(tmp_path: Path) -> None:
    # Shards by age in 200 ms: the claims are done once the shard is published (at the default
    # age of a minute, the test waited that minute).
    config = write_config(tmp_path, output={"max_shard_age": "200ms"})
    first = DaemonProcess(config)
    try:
        first.wait_started(90)
    finally:
        first.kill()  # SIGKILL: no cleanup runs; the kernel drops the lock with the process
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(100)])
    second = DaemonProcess(config)
    try:
        second.wait_started(90)
        # Claimed is not read: a file still in the claim folder at the stop waits for the
        # next start, and the shards below would lack it.
        wait_for(lambda: _spool_drained(tmp_path) and _claims_done(tmp_path), 90)
        assert second.stop() == 0, second.output()
    finally:
        second.kill()
    assert set(read_ids(tmp_path / "shards")) == set(range(100))


@pytest.mark.anyio
async def test_two_daemons_in_one_process_share_no_state_dir(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    first = Daemon(config, handle_signals=False)
    second = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(first.run)
        with (
            anyio.fail_after(30),
            pytest.raises(StateInUseError, match="in use by another tfrecordd"),
        ):
            await second.run()
        first.request_stop()
    # Released when the first stopped: a third starts.
    third = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(third.run)
        third.request_stop()


def test_a_symlink_planted_as_the_lock_file_is_not_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (state / statelock.LOCK).symlink_to(victim)
    with pytest.raises(statelock.StateLockError, match="cannot open the lock file"):
        statelock.acquire(str(state))
    assert victim.read_text() == "precious\n"


def test_held_by_other_tells_a_live_holder_from_none(tmp_path: Path) -> None:
    assert not statelock.held_by_other(str(tmp_path))
    fd = statelock.acquire(str(tmp_path))
    try:
        # Another open file description, as another process would have.
        assert statelock.held_by_other(str(tmp_path))
        assert (tmp_path / statelock.LOCK).read_text().strip() == str(os.getpid())
    finally:
        os.close(fd)
    assert not statelock.held_by_other(str(tmp_path))


def test_a_second_daemon_with_the_same_node_id_on_one_output_exits(tmp_path: Path) -> None:
    """Its own ``state_dir``, but the first one's ``node_id`` and output: before the node lock,
    its recovery discarded the first one's open shard as its own leftover."""
    a, b = tmp_path / "a", tmp_path / "b"
    config_a = write_config(a, output={"max_shard_age": "10m"})
    config_b = write_config(b, output={"dir": a / "shards"})
    spool_file(a / "spool", "a.jsonl", [movie_event(i) for i in range(300)])
    first = DaemonProcess(config_a)
    try:
        first.wait_started(90)
        wait_for(lambda: _spool_drained(a), 90)
        second = _run_second(config_b)
        assert second.returncode == EXIT_IN_USE, second.stdout + second.stderr
        assert "node_id test is in use" in second.stdout + second.stderr
        assert first.stop() == 0, first.output()
    finally:
        first.kill()
    _finish_claims(a)
    ids = read_ids(a / "shards")
    assert set(ids) == set(range(300))
    assert set(ids.values()) == {1}


def _same_node_on_one_spool(tmp_path: Path, age_a: str = "10m") -> tuple[Path, Path, Path]:
    """Two configs with one ``node_id`` (``test``) and one spool, each with its own output and
    ``state_dir`` (the first one's shards published after ``age_a``); and the spool."""
    a, b = tmp_path / "a", tmp_path / "b"
    config_a = write_config(a, output={"max_shard_age": age_a})
    config_b = write_config(b, output={"max_shard_age": "100ms"}, source={"path": a / "spool"})
    return config_a, config_b, a / "spool"


def _exit_status(daemon: DaemonProcess, timeout: float = 60) -> int:
    wait_for(lambda: daemon.proc.poll() is not None, timeout)
    return daemon.wait()


def test_a_second_daemon_with_the_same_node_id_on_one_spool_exits(tmp_path: Path) -> None:
    """Its own ``state_dir`` and output, but the first one's ``node_id`` and spool: before the
    claim folder's lock, it resumed the first one's claims (still there until the first one's
    open shard is published) as its own, and both wrote their events."""
    config_a, config_b, spool = _same_node_on_one_spool(tmp_path)
    spool_file(spool, "a.jsonl", [movie_event(i) for i in range(300)])
    first = DaemonProcess(config_a)
    try:
        first.wait_started(90)
        wait_for(lambda: _spool_drained(tmp_path / "a"), 90)
        second = DaemonProcess(config_b)
        try:
            status = _exit_status(second)
        finally:
            second.kill()
        said = second.output()
        assert status == EXIT_IN_USE, said
        assert f"spool {spool}: node_id test is in use by another tfrecordd" in said
        assert "each daemon sharing a spool needs a node_id of its own" in said
        assert first.proc.poll() is None, first.output()
        spool_file(spool, "b.jsonl", [movie_event(i) for i in range(300, 600)])
        wait_for(lambda: _spool_drained(tmp_path / "a"), 90)
        assert first.stop() == 0, first.output()
    finally:
        first.kill()
    # Released when the first one stopped: it restarts, and finishes any claim left.
    _finish_claims(tmp_path / "a")
    assert_exactly_once(tmp_path / "a" / "shards", set(range(600)))
    assert not shard_files(tmp_path / "b" / "shards")


def test_the_claim_folder_lock_goes_with_its_holder(tmp_path: Path) -> None:
    """A SIGKILLed holder leaves no stale lock on the claim folder, and one that stops releases
    it: the daemon with the same ``node_id`` and another ``state_dir`` starts after either."""
    config_a, config_b, spool = _same_node_on_one_spool(tmp_path, "100ms")
    root = tmp_path / "a"

    def done() -> bool:
        return _spool_drained(root) and _claims_done(root)

    spool_file(spool, "a.jsonl", [movie_event(i) for i in range(100)])
    first = DaemonProcess(config_a)
    try:
        first.wait_started(90)
        wait_for(done, 90)  # its source has run: it holds the claim folder
    finally:
        first.kill()
    spool_file(spool, "b.jsonl", [movie_event(i) for i in range(100, 200)])
    run_clean_until(config_b, done)
    spool_file(spool, "c.jsonl", [movie_event(i) for i in range(200, 300)])
    run_clean_until(config_a, done)
    assert_exactly_once(root / "shards", set(range(100)) | set(range(200, 300)))
    assert_exactly_once(tmp_path / "b" / "shards", set(range(100, 200)))


@pytest.mark.anyio
async def test_two_daemons_in_one_process_share_no_claim_folder(tmp_path: Path) -> None:
    """The claim folder's lock is taken per open folder, so it holds between two daemons in one
    process too, and is released when the source closes (not only when the process ends)."""
    config_a, config_b, spool = _same_node_on_one_spool(tmp_path)
    root = tmp_path / "a"
    spool_file(spool, "a.jsonl", [movie_event(i) for i in range(50)])
    first = Daemon(load_config(config_a), handle_signals=False)
    second = Daemon(load_config(config_b), handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(first.run)
        with anyio.fail_after(30):
            while not _spool_drained(root):  # the first one's source holds the claim folder
                await anyio.sleep(0.05)
        with anyio.fail_after(30), pytest.raises(BaseExceptionGroup) as raised:
            await second.run()
        assert raised.group_contains(StateInUseError, match="node_id test is in use")
        first.request_stop()
    spool_file(spool, "b.jsonl", [movie_event(i) for i in range(50, 100)])
    third = Daemon(load_config(config_b), handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(third.run)
        with anyio.fail_after(30):
            while not (_spool_drained(root) and _claims_done(root)):
                await anyio.sleep(0.05)
        third.request_stop()
    assert_exactly_once(root / "shards", set(range(50)))
    assert_exactly_once(tmp_path / "b" / "shards", set(range(50, 100)))
