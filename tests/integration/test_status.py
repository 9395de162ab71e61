"""``tfrecordd status`` against a live daemon subprocess: snapshots, rates, live mode, errors."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    DaemonProcess,
    free_port,
    movie_event,
    run_tfrecordd,
    shard_files,
    spool_file,
    wait_for,
    write_config,
)
from tfrecordd.cli.status import scrape

CLEAR = "\x1b[H\x1b[2J"


class Daemon:
    def __init__(self, root: Path, process: DaemonProcess, port: int) -> None:
        self.root = root
        self.process = process
        self.url = f"http://127.0.0.1:{port}/metrics"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    port = free_port()
    cfg = write_config(tmp_path, metrics_port=port, output={"max_shard_age": "1h"})
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: _answers(port), 10)
        yield Daemon(tmp_path, d, port)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _status(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_tfrecordd("status", *argv)


def _events(first: int, n: int, bad_every: int) -> list[Any]:
    lines: list[Any] = []
    for i in range(first, first + n):
        lines.append(movie_event(i))
        if (i + 1) % bad_every == 0:
            lines.append("{broken")
    return lines


def test_once_json_snapshot_before_and_after_publish(daemon: Daemon) -> None:
    spool_file(daemon.root / "spool", "a.jsonl", _events(0, 500, bad_every=100))
    wait_for(lambda: scrape(daemon.url).open_shard_records == 500, 20)
    result = _status("--url", daemon.url, "--once", "--json", "--interval", "1s")
    assert result.returncode == 0, result.stderr
    snap = json.loads(result.stdout)
    assert snap["url"] == daemon.url
    assert snap["interval_seconds"] == pytest.approx(1.0, abs=0.5), "--once scrapes twice"
    src = snap["sources"]["spool"]
    assert src["received"] == 505
    assert src["rate_per_second"] == 0.0, "nothing new arrived between the two scrapes"
    assert src["blocked_ratio"] == 0.0
    assert src["pending"] == 505, "nothing is acked before its shard is published"
    assert src["dead_lettered"] == 5
    assert src["invalid"] == 5
    assert snap["up"] is True
    assert snap["shards_published"] == 0
    assert snap["last_publish_seconds_ago"] is None
    assert snap["open_shard"]["records"] == 500
    assert snap["open_shards"] == 1
    sizes = {"compressed_bytes_written": 0, "open_shard_bytes": 0, "open_shard_age_seconds": 0}
    assert snap["datasets"]["movies"] | sizes == {
        "records_written": 500,
        "compressed_bytes_written": 0,
        "shards_published": 0,
        "open_shards": 1,
        "open_shard_bytes": 0,
        "open_shard_records": 500,
        "open_shard_age_seconds": 0,
        "partitions_pending": None,
        "partitions_completed": None,
        "watermark": None,
        "events_late": None,
        "partition_fallbacks": 0,
    }, "an older config's one dataset is named after its encoder"
    assert snap["open_shard"]["bytes"] > 0
    assert 0 < snap["open_shard"]["age_seconds"] < 60
    assert set(snap["stream_depth_batches"]) >= {"encode", "write"}
    assert snap["output_free_bytes"] > 0

    daemon.process.signal(signal.SIGUSR1)
    wait_for(lambda: len(shard_files(daemon.root / "shards")) == 1, 20)
    # The open-shard gauges are refreshed by the write stage at least once a second.
    wait_for(lambda: scrape(daemon.url).open_shard_records == 0, 10)
    after = _status("--url", daemon.url, "--once", "--json", "--interval", "0")
    assert after.returncode == 0, after.stderr
    snap = json.loads(after.stdout)
    assert snap["interval_seconds"] is None
    assert snap["sources"]["spool"]["rate_per_second"] is None, "one scrape gives no rate"
    assert snap["sources"]["spool"]["pending"] == 0, "every event is acked once published"
    assert snap["shards_published"] == 1
    assert 0 <= snap["last_publish_seconds_ago"] < 20
    assert snap["open_shard"]["records"] == 0
    assert snap["dead_lettered"] == 5


def test_once_text_view(daemon: Daemon) -> None:
    spool_file(daemon.root / "spool", "a.jsonl", _events(0, 40, bad_every=20))
    wait_for(lambda: not list((daemon.root / "spool").glob("*.jsonl")), 20)
    result = _status("--url", daemon.url, "--once", "--interval", "200ms")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"tfrecordd 0.1.0 at {daemon.url}: up  (rates over ")
    assert "\nwritten     40 records (" in result.stdout
    assert "): 0 in published shards, 40 in open shards\n" in result.stdout
    assert "\npublished   0 shards, last never\n" in result.stdout
    assert "\nopen        1 shard holding 40 records not yet published, " in result.stdout
    assert ", oldest " in result.stdout
    assert "dead letters 2" in result.stdout
    row = next(line for line in lines if line.startswith("movies "))
    assert row.split() == ["movies", "40", "0", "1", "-", "-", "-", "-"], "no completion"
    row = next(line for line in lines if line.startswith("spool "))
    assert row.split() == ["spool", "0.0", "42", "0%", "42", "2", "2", "0"]
    assert CLEAR not in result.stdout, "no terminal, no escape codes"


def test_live_mode_redraws_on_a_terminal_and_stops_on_ctrl_c(daemon: Daemon) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfrecordd", "status", "--url", daemon.url, "--interval", "200ms"],
        stdout=slave,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while seen.count(CLEAR.encode()) < 3 and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if ready:
                seen += os.read(master, 65536)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        assert proc.stderr is not None
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()
        os.close(master)
    frames = seen.decode().split(CLEAR)[1:]
    assert len(frames) >= 3
    assert "(totals; rates need two scrapes)" in frames[0]
    assert "(rates over 0." in frames[1], "later frames show rates against the previous scrape"


def test_live_json_rates_add_up_to_the_events_received(daemon: Daemon) -> None:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "tfrecordd", "status"),
            *("--url", daemon.url, "--json", "--interval", "500ms"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        docs = [json.loads(proc.stdout.readline())]
        spool_file(daemon.root / "spool", "a.jsonl", _events(0, 300, bad_every=1000))
        while docs[-1]["sources"].get("spool", {}).get("received") != 300:
            docs.append(json.loads(proc.stdout.readline()))
            assert len(docs) < 100, "the daemon reads the file within 50 snapshots"
        docs.append(json.loads(proc.stdout.readline()))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert docs[0]["interval_seconds"] is None, "the first snapshot has no rates"
    assert all(d["url"] == daemon.url and d["up"] for d in docs)
    assert all(d["interval_seconds"] > 0 for d in docs[1:])
    assert [d["time"] for d in docs] == sorted(d["time"] for d in docs)
    counted = sum(
        d["sources"]["spool"]["rate_per_second"] * d["interval_seconds"]
        for d in docs[1:]
        if "spool" in d["sources"]
    )
    assert counted == pytest.approx(300, abs=0.5), "rates are events received per second"
    assert docs[-1]["sources"]["spool"]["rate_per_second"] == 0.0


def test_unreachable_daemon_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    for argv in (["--once"], ["--once", "--json"], []):
        result = _status("--url", url, *argv)
        assert result.returncode == 1
        assert result.stdout == ""
        assert result.stderr.startswith(f"tfrecordd status: cannot reach the daemon at {url}: ")
        assert "refused" in result.stderr.lower()
        assert "Traceback" not in result.stderr


def test_bad_interval_is_a_usage_error() -> None:
    result = _status("--interval", "soon")
    assert result.returncode == 2
    assert "--interval" in result.stderr
