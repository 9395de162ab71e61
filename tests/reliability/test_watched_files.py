"""Everything the daemon keeps open is watched: a file, folder or socket removed or replaced
under a running daemon is made again at its path or stops the daemon (exit 74), within seconds,
with or without traffic. The daemon runs in this process; each test takes a few seconds."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import pytest

from tests.support import (
    MOVIES_FEATURES,
    movie_event,
    read_ids,
    run_daemon_with,
    spool_drained,
    spool_file,
    write_config,
)
from tfrecordd.config import DaemonConfig, load_config, parse_config
from tfrecordd.errors import EXIT_IO, find_error
from tfrecordd.fsys import FileSystem
from tfrecordd.pipeline.runtime import STATE_CHECK_INTERVAL, Daemon
from tfrecordd.plugin import Registry
from tfrecordd.state import statelock
from tfrecordd.state.deadletter import NAME, DeadLetters

WITHIN = 10 * STATE_CHECK_INTERVAL
"""How long a change may go unnoticed in these tests (the check runs once a second)."""


def _bad(tag: str, n: int) -> list[str]:
    """``n`` lines that are not JSON: each becomes a dead letter whose ``raw`` is the line."""
    return [f"not json {tag}-{i}" for i in range(n)]


def _raws(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["raw"] for line in path.read_text().splitlines()]


async def _until(done: Callable[[], bool], timeout: float = WITHIN) -> None:
    with anyio.fail_after(timeout):
        while not done():
            await anyio.sleep(0.05)


def _exit_status(error: BaseException | None) -> int | None:
    if error is None:
        return None
    found = find_error(error)
    assert found is not None, error
    return found.exit_code


def _metric(daemon: Daemon, name: str, **labels: str) -> float:
    return daemon.metrics.registry.get_sample_value(name, labels) or 0.0


def _message(error: BaseException | None) -> str:
    return str(find_error(error)) if error is not None else ""


# -- dead letters ----------------------------------------------------------------------------


@pytest.mark.parametrize("traffic", [True, False], ids=["with-traffic", "idle"])
def test_dead_letters_written_after_the_file_is_removed_are_in_the_file_at_its_path(
    tmp_path: Path, traffic: bool
) -> None:
    """The README's recipe: replay the dead letters, then remove the file. Every later dead
    letter is in the file at its path — written right after the removal, or after the daemon
    had time to notice it with no event coming."""
    cfg = write_config(tmp_path, output={"max_shard_age": "100ms"})
    spool, path = tmp_path / "spool", tmp_path / "state" / "dead-letters.jsonl"
    daemon = Daemon(load_config(cfg), handle_signals=False)
    before, after = _bad("before", 20), _bad("after", 20)

    async def body() -> None:
        spool_file(spool, "a.jsonl", [*before, *(json.dumps(movie_event(i)) for i in range(5))])
        await _until(lambda: spool_drained(spool))
        assert sorted(_raws(path)) == sorted(before)
        path.unlink()
        if not traffic:
            await _until(path.exists)  # made again by the periodic check, no write needed
        spool_file(spool, "b.jsonl", after)
        await _until(lambda: spool_drained(spool))
        daemon.request_stop()

    assert run_daemon_with(daemon, body) is None
    assert sorted(_raws(path)) == sorted(after)
    assert _metric(daemon, "tfrecordd_watch_repairs_total", what="dead_letters") >= 1


def test_dead_letters_taken_away_while_they_are_written_are_never_lost(tmp_path: Path) -> None:
    """An operator takes the file away again and again while bad events flow, as the README
    says (move it away, wait for the daemon to make it again, replay and delete the moved
    file). Every dead letter is in a file the operator read or in the file at the path at the
    end: none went only to a file nobody could read."""
    cfg = write_config(tmp_path, output={"max_shard_age": "50ms"}, daemon={"max_batch_events": 8})
    spool, path = tmp_path / "spool", tmp_path / "state" / "dead-letters.jsonl"
    daemon = Daemon(load_config(cfg), handle_signals=False)
    taken: list[str] = []
    rounds = [0]
    stop = threading.Event()
    rng = random.Random(7)

    def operator() -> None:
        n = 0
        while not stop.is_set():
            time.sleep(rng.uniform(0, 0.03))
            moved = path.with_name(f"replayed-{n}")
            try:
                path.rename(moved)
            except FileNotFoundError:
                continue
            n += 1
            rounds[0] = n
            deadline = time.monotonic() + 3 * STATE_CHECK_INTERVAL
            while not path.exists() and time.monotonic() < deadline:
                time.sleep(0.01)  # the README: until the daemon has made the file again
            taken.extend(_raws(moved))
            moved.unlink()

    expected: list[str] = []

    async def body() -> None:
        worker = threading.Thread(target=operator)
        worker.start()
        try:
            k, until = 0, time.monotonic() + WITHIN
            while (k < 15 or rounds[0] < 5) and time.monotonic() < until:
                lines = _bad(f"f{k}", 40)
                expected.extend(lines)
                spool_file(spool, f"f{k}.jsonl", lines)
                k += 1
                await anyio.sleep(0.02)
            await _until(lambda: spool_drained(spool), 30)
        finally:
            stop.set()
            await anyio.to_thread.run_sync(worker.join)
        daemon.request_stop()

    assert run_daemon_with(daemon, body) is None
    missing = set(expected) - set(taken) - set(_raws(path))
    assert not missing, f"{len(missing)} dead letter(s) lost, e.g. {sorted(missing)[:5]}"
    assert rounds[0] >= 5, "the daemon made the file again each time it was moved away"


def test_a_dead_letter_path_that_cannot_be_a_file_again_stops_the_daemon(tmp_path: Path) -> None:
    """A folder put where the dead-letter file was: no dead letter can be written at the path;
    the daemon stops with exit 74 within seconds, without waiting for a dead letter."""
    cfg = write_config(tmp_path, output={"max_shard_age": "100ms"})
    spool, path = tmp_path / "spool", tmp_path / "state" / "dead-letters.jsonl"
    daemon = Daemon(load_config(cfg), handle_signals=False)

    async def body() -> None:
        spool_file(spool, "a.jsonl", _bad("a", 3))
        await _until(lambda: spool_drained(spool))
        path.unlink()
        path.mkdir()
        await anyio.sleep(WITHIN)
        daemon.request_stop()  # not reached when the change stops the daemon

    error = run_daemon_with(daemon, body)
    assert _exit_status(error) == EXIT_IO, error
    assert "dead-letters.jsonl" in _message(error)


class _RemovedBeforeWrite(FileSystem):
    """Removes (or renames away) the dead-letter file right before the next write once armed:
    the operator acting between the daemon's check of the path and its write."""

    def __init__(self, path: Path, *, rename: bool) -> None:
        self.path, self.rename, self.armed, self.taken = path, rename, False, 0

    def write(self, f: BinaryIO, data: bytes | memoryview) -> None:
        if self.armed:
            self.armed = False
            self.taken += 1
            if self.rename:
                self.path.rename(self.path.with_name(f"taken-{self.taken}"))
            else:
                self.path.unlink()
        super().write(f, data)


@pytest.mark.parametrize("rename", [False, True], ids=["removed", "moved-away"])
def test_a_dead_letter_written_as_the_file_goes_is_copied_into_the_new_one(
    tmp_path: Path, rename: bool
) -> None:
    """The file goes between the check of the path and the write: the line lands in the old
    file. The next check (the fsync before its ack, or the periodic one) copies it into the
    file at the path if the old one was removed; one moved away keeps it, for the operator."""
    path = tmp_path / NAME
    fs = _RemovedBeforeWrite(path, rename=rename)
    repairs: list[int] = []
    dl = DeadLetters(str(tmp_path), fs, 1 << 20, on_repair=lambda: repairs.append(1))
    dl.write("s", "w", "malformed", "", b"first")
    dl.sync()
    fs.armed = True
    dl.write("s", "w", "malformed", "", b"second")  # into the file going away
    dl.sync()
    assert _raws(path) == ([] if rename else ["second"])
    dl.write("s", "w", "malformed", "", b"third")
    fs.armed = True
    dl.write("s", "w", "malformed", "", b"fourth")  # goes with "third" (and "second")
    dl.check()  # the periodic check, with no fsync to come
    dl.close()
    assert len(repairs) == 2
    if rename:
        assert _raws(path) == []
        assert _raws(tmp_path / "taken-1") == ["first", "second"]
        assert _raws(tmp_path / "taken-2") == ["third", "fourth"]
    else:
        assert _raws(path) == ["fourth"]


# -- state lock and staging folder -------------------------------------------------------------


def test_a_removed_state_lock_is_taken_again(tmp_path: Path) -> None:
    """``rm state/lock`` (a "stale lock" cleared by hand): the daemon locks the new file at the
    path, so a second daemon on the same state_dir is still refused."""
    cfg = write_config(tmp_path)
    lock = tmp_path / "state" / statelock.LOCK
    daemon = Daemon(load_config(cfg), handle_signals=False)

    async def body() -> None:
        held = lock.stat().st_ino
        lock.unlink()
        await _until(lambda: lock.exists() and lock.stat().st_ino != held)
        assert statelock.held_by_other(str(tmp_path / "state"))
        daemon.request_stop()

    assert run_daemon_with(daemon, body) is None
    assert _metric(daemon, "tfrecordd_watch_repairs_total", what="state_lock") == 1


@pytest.mark.parametrize("how", ["output removed", "output moved away"])
def test_a_staging_folder_removed_stops_the_daemon_with_exit_74(tmp_path: Path, how: str) -> None:
    """The output directory deleted, or moved away and made again (shards shipped by moving the
    folder): the open shard can no longer be published; the daemon stops at once, idle."""
    cfg = write_config(tmp_path)
    out = tmp_path / "shards"
    daemon = Daemon(load_config(cfg), handle_signals=False)

    async def body() -> None:
        if how == "output removed":
            shutil.rmtree(out)
        else:
            out.rename(tmp_path / "shipped")
            out.mkdir()
        await anyio.sleep(WITHIN)
        daemon.request_stop()  # not reached when the change stops the daemon

    error = run_daemon_with(daemon, body)
    assert _exit_status(error) == EXIT_IO, error
    assert "staging folder was" in _message(error)


def test_the_check_shows_in_metrics_and_healthz(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    daemon = Daemon(load_config(cfg), handle_signals=False)

    async def body() -> None:
        await _until(lambda: _metric(daemon, "tfrecordd_watch_last_check_timestamp_seconds") > 0)
        assert daemon.healthy()
        assert not daemon.healthy(time.monotonic() + 60)  # as if the check had hung a minute
        daemon.request_stop()

    assert run_daemon_with(daemon, body) is None


# -- the unix socket source --------------------------------------------------------------------


def _unix_config(root: Path) -> DaemonConfig:
    data = {
        "daemon": {"node_id": "test", "state_dir": str(root / "state"), "drain_timeout": "20s"},
        "metrics": {"enabled": False},
        "output": {"dir": str(root / "shards"), "max_shard_age": "100ms", "min_free_bytes": 0},
        "sources": [
            {"name": "in", "type": "unix", "path": str(root / "ingest.sock"), "encoder": "movies"}
        ],
        "encoders": {"movies": {"type": "example", "features": MOVIES_FEATURES}},
    }
    return parse_config(data, Registry.from_entry_points())


def _send(path: Path, events: list[dict[str, Any]]) -> None:
    """One client: connect, send JSON lines, wait for the daemon's acks, close."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(WITHIN)
        s.connect(str(path))
        s.sendall(b"".join(json.dumps(e).encode() + b"\n" for e in events))
        s.shutdown(socket.SHUT_WR)
        while s.recv(4096):
            pass


def _connectable(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("traffic", [True, False], ids=["with-traffic", "idle"])
def test_a_removed_unix_socket_is_bound_again(tmp_path: Path, traffic: bool) -> None:
    """The socket file removed (a tmpfiles cleaner, an operator): clients cannot connect to an
    unlinked socket, so the source binds a new one at the path within seconds."""
    cfg = _unix_config(tmp_path)
    sock = tmp_path / "ingest.sock"
    daemon = Daemon(cfg, handle_signals=False)

    async def body() -> None:
        await anyio.to_thread.run_sync(_send, sock, [movie_event(i) for i in range(5)])
        held = sock.stat().st_ino
        sock.unlink()
        if traffic:
            await anyio.to_thread.run_sync(_connectable, sock)
        await _until(lambda: sock.exists() and _connectable(sock))
        assert sock.stat().st_ino != held
        assert oct(sock.stat().st_mode & 0o777) == oct(0o660)
        await anyio.to_thread.run_sync(_send, sock, [movie_event(i) for i in range(5, 10)])
        await _until(lambda: len(read_ids(tmp_path / "shards")) == 10)
        daemon.request_stop()

    assert run_daemon_with(daemon, body) is None
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(10), 1)
    assert not sock.exists(), "the socket this daemon bound is removed on shutdown"


def test_a_unix_socket_path_taken_by_another_file_stops_the_daemon(tmp_path: Path) -> None:
    """Another file put at the socket's path: it is not the daemon's to remove, and no client
    can reach the daemon; it stops with exit 74 and leaves that file alone."""
    cfg = _unix_config(tmp_path)
    sock = tmp_path / "ingest.sock"
    daemon = Daemon(cfg, handle_signals=False)

    async def body() -> None:
        sock.unlink()
        sock.write_text("someone else's\n")
        await anyio.sleep(WITHIN)
        daemon.request_stop()  # not reached when the change stops the daemon

    error = run_daemon_with(daemon, body)
    assert _exit_status(error) == EXIT_IO, error
    assert "ingest.sock" in _message(error)
    assert sock.read_text() == "someone else's\n"
    assert os.path.exists(sock)
