"""The daemon as a subprocess: signals, kill -9 and every named crash point, then exactly once."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support import (
    DaemonProcess,
    assert_exactly_once,
    crash_cases,
    dead_letters,
    free_port,
    inprogress_files,
    movie_event,
    run_clean_until,
    shard_files,
    spool_drained,
    spool_file,
    wait_for,
    write_config,
)
from tfrecordd.outputs.shards import OFFSETS_IN_MEMORY
from tfrecordd.pipeline.write import WRITE_RUN_BATCHES
from tfrecordd.plugin import Registry

POINTS = Registry.from_entry_points().crash_points()
"""Every crash point: the daemon's and the built-in sources'."""


def drained(root: Path) -> bool:
    return spool_drained(root / "spool")


def fill_spool(
    root: Path, files: int, per_file: int, bad_every: int = 0, first_file: int = 0
) -> set[int]:
    ids: set[int] = set()
    n = first_file * per_file
    for f in range(first_file, first_file + files):
        lines: list[object] = []
        for _ in range(per_file):
            lines.append(movie_event(n))
            ids.add(n)
            n += 1
            if bad_every and n % bad_every == 0:
                lines.append("{broken")
        spool_file(root / "spool", f"f{f:04d}.jsonl", lines)  # type: ignore[arg-type]
    return ids


def finish(root: Path, config: Path, timeout: float = 60) -> None:
    """Run a clean daemon until the spool is drained, then SIGTERM it: exit 0."""
    run_clean_until(config, lambda: drained(root), timeout)


def test_sigterm_drains_publishes_and_exits_0(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, output={"max_shard_age": "1h"}, daemon={"drain_timeout": "10s"})
    expected = fill_spool(tmp_path, 3, 200)
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: not list((tmp_path / "spool").glob("*.jsonl")), 20)
        time.sleep(0.5)
        t0 = time.monotonic()
        assert d.stop() == 0, d.output()
        assert time.monotonic() - t0 < 10
    finally:
        d.kill()
    assert_exactly_once(tmp_path / "shards", expected, manifests=True)
    assert drained(tmp_path)
    assert "stopped" in d.output()


def test_sigusr1_publishes_open_shard_now(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, output={"max_shard_age": "1h"})
    expected = fill_spool(tmp_path, 1, 20)
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: not list((tmp_path / "spool").glob("*.jsonl")), 20)
        time.sleep(0.5)
        assert shard_files(tmp_path / "shards") == []
        d.signal(signal.SIGUSR1)
        wait_for(lambda: len(shard_files(tmp_path / "shards")) == 1, 10)
        wait_for(lambda: drained(tmp_path), 10)
        assert d.proc.poll() is None, "SIGUSR1 does not stop the daemon"
        assert d.stop() == 0
    finally:
        d.kill()
    assert_exactly_once(tmp_path / "shards", expected, manifests=True)


def test_metrics_and_health_endpoints(tmp_path: Path) -> None:
    port = free_port()
    cfg = write_config(tmp_path, metrics_port=port, output={"max_shard_age": "200ms"})
    fill_spool(tmp_path, 2, 50, bad_every=25)
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: drained(tmp_path), 20)

        def scrape(path: str) -> tuple[int, str]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.status, r.read().decode()

        wait_for(lambda: _port_open(port), 10)
        status, body = scrape("/healthz")
        assert (status, body) == (200, "ok\n")
        status, text = scrape("/metrics")
        assert status == 200
        assert 'tfrecordd_events_received_total{source="spool"} 104.0' in text
        assert 'tfrecordd_records_written_total{dataset="movies"} 100.0' in text
        assert 'tfrecordd_events_dead_lettered_total{source="spool"} 4.0' in text
        assert 'tfrecordd_events_invalid_total{reason="malformed",source="spool"} 4.0' in text
        assert "tfrecordd_up 1.0" in text
        assert 'tfrecordd_build_info{version="' in text
        assert d.stop() == 0
    finally:
        d.kill()
    assert len(dead_letters(tmp_path / "state")) == 4


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_config_error_exits_78(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, output={"compression": "lz4"})
    d = DaemonProcess(cfg)
    assert d.wait(30) == 78
    assert "output.compression" in d.output()


# A single dataset with no completion markers: it never reaches mid-upload nor after-marker
# (tests/reliability/test_datasets_crash.py kills at those).
@pytest.mark.parametrize(
    ("point", "nth"), crash_cases(p for p in POINTS if p not in ("mid-upload", "after-marker"))
)
def test_crash_point_then_restart_is_exactly_once(tmp_path: Path, point: str, nth: int) -> None:
    cfg = write_config(
        tmp_path,
        output={"max_shard_records": 40, "max_shard_age": "200ms"},
        daemon={"max_batch_events": 16},
    )
    expected = fill_spool(tmp_path, 4, 50, bad_every=30)
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": f"{point}:{nth}"})
    rc = d.wait(60)
    assert rc == 137, f"crash point {point} not reached: exit {rc}\n{d.output()}"
    finish(tmp_path, cfg)
    assert_exactly_once(tmp_path / "shards", expected, manifests=True)
    # A bad line dead-lettered again after the restart (its commit was cut short) has no line
    # number if its file resumed mid-way: the same place, as file:offset.
    letters = [re.sub(r":line \d+:", ":", d["where"]) for d in dead_letters(tmp_path / "state")]
    assert len(set(letters)) == len(expected) // 30


# 160,000 events a case: the rules (offsets past OFFSETS_IN_MEMORY wait in a file, a crash's
# copy is replaced, a discarded shard leaves none) are unit-tested in test_shards; the daemon
# proves them by default with a crash mid-write, and .ci/run after the intent and the publish.
@pytest.mark.parametrize(
    "point",
    [
        "mid-write",
        pytest.param("after-intent", marks=pytest.mark.slow),
        pytest.param("after-publish", marks=pytest.mark.slow),
    ],
)
def test_a_crash_with_offsets_spilled_to_disk_then_restart(tmp_path: Path, point: str) -> None:
    """Shards past OFFSETS_IN_MEMORY records keep the older offsets in a file beside them: a
    crash leaves that file behind, the restart discards it, and every manifest is whole."""
    cfg = write_config(
        tmp_path,
        output={"max_shard_records": 80_000, "max_shard_age": "60s", "compression": "none"},
        daemon={"max_batch_events": 500, "max_batch_bytes": "64MiB"},
    )
    expected = fill_spool(tmp_path, 16, 10_000)
    # Batches of 500 events: mid-write is passed once per batch written, a trip of merged
    # batches at its end. The 140th (70,000 records, at most 77,500 with the rest of its trip)
    # comes after the first 65,536 offsets went to disk, and before the first shard's cap.
    assert OFFSETS_IN_MEMORY < 139 * 500
    assert (140 + WRITE_RUN_BATCHES - 1) * 500 < 80_000
    nth = 140 if point == "mid-write" else 1
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": f"{point}:{nth}"})
    rc = d.wait(120)
    assert rc == 137, f"crash point {point} not reached: exit {rc}\n{d.output()}"
    left = [p.name for p in inprogress_files(tmp_path / "shards")]
    assert any(n.endswith("_offsets.inprogress") for n in left), left
    finish(tmp_path, cfg, timeout=120)
    assert_exactly_once(tmp_path / "shards", expected, manifests=True)
    assert len(shard_files(tmp_path / "shards")) == 2


def test_encode_workers_as_a_subprocess(tmp_path: Path) -> None:
    """``python -m tfrecordd`` with worker processes (they import the main module again)."""
    cfg = write_config(tmp_path, daemon={"encode_workers": 2}, output={"max_shard_records": 100})
    expected = fill_spool(tmp_path, 3, 200)
    run_clean_until(cfg, lambda: drained(tmp_path), 60)
    assert_exactly_once(tmp_path / "shards", expected, manifests=True)


def test_a_killed_encode_worker_stops_the_daemon_and_nothing_is_lost(tmp_path: Path) -> None:
    """SIGKILL one encode worker mid-stream: the daemon exits with an error naming it (systemd
    restarts it), and the restarted daemon delivers every event exactly once."""
    cfg = write_config(
        tmp_path,
        daemon={"encode_workers": 2, "max_batch_events": 50},
        output={"max_shard_records": 500},
    )
    expected = fill_spool(tmp_path, 40, 500)
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        # Two encoders: the daemon's own thread and one worker process.
        wait_for(lambda: len(_children(d.proc.pid)) == 1, 30)
        wait_for(lambda: bool(shard_files(tmp_path / "shards")), 30)
        os.kill(_children(d.proc.pid)[0], signal.SIGKILL)
        assert d.wait(60) == 1
        assert "exited (killed by SIGKILL)" in d.output()
        assert not drained(tmp_path), "the kill came before the spool was read"
    finally:
        d.kill()
    run_clean_until(cfg, lambda: drained(tmp_path), 120)
    assert_exactly_once(tmp_path / "shards", expected, manifests=True)


def test_ctrl_c_with_encode_workers_drains_and_exits_cleanly(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the daemon's whole process group: the workers, in sessions of
    their own, keep working while the daemon drains, then exit with it."""
    cfg = write_config(
        tmp_path,
        daemon={"encode_workers": 3, "max_batch_events": 50},
        output={"max_shard_records": 500, "max_shard_age": "1s"},
    )
    expected = fill_spool(tmp_path, 40, 500)
    d = DaemonProcess(cfg, own_group=True)
    try:
        d.wait_started()
        wait_for(lambda: len(_children(d.proc.pid)) == 2, 30)
        workers = _children(d.proc.pid)
        wait_for(lambda: bool(shard_files(tmp_path / "shards")), 30)
        d.interrupt_group()
        assert d.wait(60) == 0, d.output()
        assert "SIGINT received" in d.output()
        assert "stopped" in d.output()
        assert "encode worker" not in d.output()
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), 10)
    finally:
        d.kill()
    run_clean_until(cfg, lambda: drained(tmp_path), 120)
    assert_exactly_once(tmp_path / "shards", expected, manifests=True)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_file_is_acked_soon_after_its_last_shard(tmp_path: Path) -> None:
    """A file's end, arriving after its records filled whole shards, does not wait for
    max_shard_age."""
    cfg = write_config(tmp_path, output={"max_shard_records": 100, "max_shard_age": "1h"})
    expected = fill_spool(tmp_path, 1, 300)
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: drained(tmp_path), 20)
        assert d.stop() == 0
    finally:
        d.kill()
    assert_exactly_once(tmp_path / "shards", expected, manifests=True)
    assert len(shard_files(tmp_path / "shards")) == 3
