"""Overload: input at well over twice what the output takes, from a spool directory, a Redis
stream and UDP at once, into a daemon process whose fsyncs are slowed down.

Promised, and checked: the daemon's peak resident memory (VmHWM) stays under a bound; the
exactly-once sources pause instead of reading ahead (Redis entries wait unread in the stream,
with the consumer's pending entries bounded by the pipeline's queues; spool files wait on disk);
the datagram source, which cannot be paused, counts what it drops; SIGTERM drains and exits 0;
and after a restart every spool and Redis event is written exactly once (UDP: at most once).
Default: 20 s of overload; ``--run-slow``: 3 minutes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from redis import Redis

from tests.redis_server import RedisServer, running_redis
from tests.reliability.harness import count_ids, rss_high_water
from tests.support import DaemonProcess, free_port, movie_event, spool_file, wait_for

REPO = Path(__file__).resolve().parents[2]
RSS_BOUND = 160 << 20
"""Peak resident memory allowed to the daemon under overload (documented in
docs/reliability.md); an idle daemon with these three sources peaks near 55 MiB."""
RSS_GROWTH_BOUND = 64 << 20
"""How much overload may add to the idle daemon's peak."""
QUEUE_BATCHES = 4
BATCH = 20
PENDING_BOUND = (2 * QUEUE_BATCHES + 4) * BATCH + 2 * BATCH
"""Redis entries read but not acked: the two inter-stage queues, the batch each stage holds,
the open shard and the batch being delivered."""
UDP_BASE, REDIS_BASE = 20_000_000, 10_000_000


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from running_redis(tmp_path / "redis")


def _config(
    root: Path, redis_url: str, udp_port: int, metrics_port: int, *, drain: bool = False
) -> Path:
    """The overloaded daemon's config; ``drain``: the restart's, which drains the backlog in
    batches of 1000 and shards of 5000 records (at a commit per 20 events, as under overload,
    that run took minutes)."""
    batch, shard = (1000, 5000) if drain else (BATCH, BATCH)
    features = {"id": "int64", "user": "bytes", "age": "int64", "movie": "bytes"}
    lines = [
        "[daemon]",
        'node_id = "overload"',
        f'state_dir = "{root / "state"}"',
        'drain_timeout = "60s"',
        f"queue_batches = {QUEUE_BATCHES}",
        f"max_batch_events = {batch}",
        "[metrics]",
        f'listen = "127.0.0.1:{metrics_port}"',
        "[output]",
        f'dir = "{root / "shards"}"',
        'compression = "gzip"',
        f"max_shard_records = {shard}",
        'max_shard_age = "1s"',
        "min_free_bytes = 0",
        "[[sources]]",
        'name = "spool"',
        'type = "directory"',
        f'path = "{root / "spool"}"',
        'encoder = "e"',
        'poll_interval = "50ms"',
        "[[sources]]",
        'name = "events"',
        'type = "redis-stream"',
        f'url = "{redis_url}"',
        'stream = "events"',
        'encoder = "e"',
        'block = "100ms"',
        "[[sources]]",
        'name = "dgram"',
        'type = "udp"',
        f'listen = "127.0.0.1:{udp_port}"',
        'encoder = "e"',
        "buffer_events = 200",
        "[encoders.e]",
        'type = "example"',
        "[encoders.e.features]",
        *[f'{k} = "{v}"' for k, v in features.items()],
    ]
    (root / "spool").mkdir(parents=True, exist_ok=True)
    path = root / "tfrecordd.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


class Producers(threading.Thread):
    """Spool files, XADDs and datagrams at a fixed rate each, until stopped."""

    def __init__(self, root: Path, redis_url: str, udp_port: int, per_second: int) -> None:
        super().__init__(daemon=True)
        self.root, self.udp_port, self.rate = root, udp_port, per_second
        self.redis = Redis.from_url(redis_url)
        self.spool_ids: set[int] = set()
        self.redis_ids: set[int] = set()
        self.udp_sent = 0
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        tick, per_tick = 0.1, self.rate // 10
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        n = 0
        try:
            while not self.stopping.wait(tick):
                ids = range(n, n + per_tick)
                n += per_tick
                spool_file(self.root / "spool", f"f{n:09d}.jsonl", [movie_event(i) for i in ids])
                self.spool_ids.update(ids)
                pipe = self.redis.pipeline(transaction=False)
                for i in ids:
                    pipe.xadd("events", {"data": orjson.dumps(movie_event(REDIS_BASE + i))})
                pipe.execute()
                self.redis_ids.update(REDIS_BASE + i for i in ids)
                for i in ids:
                    sock.sendto(
                        orjson.dumps(movie_event(UDP_BASE + i)), ("127.0.0.1", self.udp_port)
                    )
                self.udp_sent += per_tick
        except BaseException as e:
            self.error = e
        finally:
            sock.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        self.redis.close()
        if self.error is not None:
            raise self.error


def overload(root: Path, redis_url: str, seconds: float) -> None:
    udp_port, metrics_port = free_port(), free_port()
    cfg = _config(root, redis_url, udp_port, metrics_port)
    log = (root / "slow-daemon.log").open("wb")
    # The repository for ``tests``, before the test process's own path (which may name the
    # package's source roots): the slow daemon runs the code this test runs.
    path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.harness", "slow-daemon", str(cfg), "0.02"],
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
    )  # fmt: skip
    producers = Producers(root, redis_url, udp_port, per_second=1000)
    r = Redis.from_url(redis_url)
    try:
        wait_for(lambda: b" started: " in (root / "slow-daemon.log").read_bytes(), 30)
        idle_rss = rss_high_water(proc.pid)
        producers.start()
        t0 = time.monotonic()
        max_pending = 0
        while time.monotonic() - t0 < seconds:  # bounded by time; one sample per 0.5 s
            time.sleep(0.5)
            assert proc.poll() is None, (root / "slow-daemon.log").read_text()[-3000:]
            groups = r.xinfo_groups("events")
            if groups:
                max_pending = max(max_pending, int(groups[0]["pending"]))
        producers.stop()
        elapsed = time.monotonic() - t0
        peak_rss = rss_high_water(proc.pid)
        m = _scrape(metrics_port)
        written = sum(v for k, v in m.items() if k.startswith("tfrecordd_records_written_total"))
        produced = len(producers.spool_ids) + len(producers.redis_ids) + producers.udp_sent
        lag = int(r.xinfo_groups("events")[0]["lag"] or 0)
        waiting_files = sum(1 for p in (root / "spool").rglob("*.jsonl"))
        dropped = m.get('tfrecordd_events_dropped_total{reason="pipeline_full",source="dgram"}', 0)
        figures = {
            "seconds": round(elapsed, 1),
            "input_events_per_s": round(produced / elapsed),
            "output_records_per_s": round(written / elapsed),
            "idle_rss_mib": idle_rss >> 20,
            "peak_rss_mib": peak_rss >> 20,
            "max_redis_pending": max_pending,
            "redis_lag_at_end": lag,
            "spool_files_waiting": waiting_files,
            "udp_sent": producers.udp_sent,
            "udp_dropped_counted": int(dropped),
        }
        print("overload:", json.dumps(figures))
        assert produced >= 2 * written, "the input ran at least twice as fast as the output"
        assert peak_rss < RSS_BOUND, figures
        assert peak_rss - idle_rss < RSS_GROWTH_BOUND, figures
        assert max_pending <= PENDING_BOUND, figures
        assert lag > 0, "Redis entries wait unread in the stream"
        assert waiting_files > 0, "spool files wait on disk"
        assert dropped > 0, "datagrams the pipeline could not take are counted"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, (root / "slow-daemon.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()
        r.close()
    # A normal daemon drains what waited; nothing acked was lost, nothing is written twice.
    d = DaemonProcess(_config(root, redis_url, udp_port, metrics_port, drain=True))
    try:
        d.wait_started()
        with Redis.from_url(redis_url) as r2:

            def drained() -> bool:
                g = r2.xinfo_groups("events")[0]
                spool_left = any((root / "spool").rglob("*.jsonl"))
                return g["pending"] == 0 and g["lag"] == 0 and not spool_left

            try:
                wait_for(drained, 150, interval=0.5)
            except AssertionError:
                # What is left, and what the daemon said, for the one who reads the failure.
                left = [str(p.relative_to(root)) for p in (root / "spool").rglob("*.jsonl")]
                group = r2.xinfo_groups("events")[0]
                raise AssertionError(
                    f"not drained: group {group}, spool files left {left[:10]} "
                    f"({len(left)}), daemon exit {d.proc.poll()}:\n{d.output()[-4000:]}"
                ) from None
        assert d.stop(120) == 0, d.output()
    finally:
        d.kill()
    ids, problems = count_ids(root / "shards")
    assert problems == []
    expected = producers.spool_ids | producers.redis_ids
    assert expected <= ids.keys(), f"lost {len(expected - ids.keys())}"
    assert all(c == 1 for c in ids.values()), "nothing written twice"
    udp = {i for i in ids if i >= UDP_BASE}
    assert 0 < len(udp) <= producers.udp_sent - dropped


def test_overload_stays_bounded(tmp_path: Path, redis_server: RedisServer) -> None:
    overload(tmp_path, redis_server.url, 20)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_overload_stays_bounded_long(tmp_path: Path, redis_server: RedisServer) -> None:
    overload(tmp_path, redis_server.url, 180)
