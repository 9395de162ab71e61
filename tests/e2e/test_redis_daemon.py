"""The daemon as a subprocess on a real Redis stream: crash points, kill -9, several daemons."""

from __future__ import annotations

import bisect
import io
import random
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis import Redis

from tests.redis_server import RedisServer, running_redis, write_redis_config
from tests.support import (
    DaemonProcess,
    assert_exactly_once,
    crash_cases,
    dead_letters,
    intent_shards,
    movie_event,
    read_shard,
    record_id,
    run_clean_until,
    shard_files,
    wait_for,
)
from tfrecordd.format.framing import iter_framed
from tfrecordd_plugins.sources.redis_stream.ranges import read_token

STREAM, GROUP = "events", "tfrecordd"
CRASH_POINTS = [
    "mid-write",
    "after-fsync",
    "after-intent",
    "after-publish",
    "after-dir-fsync",
    "after-ack",
    "after-done",
]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from running_redis(tmp_path / "redis")


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[Redis]:
    client = Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        client.close()


def xadd(r: Redis, payloads: list[bytes], chunk: int = 5000) -> list[str]:
    """One entry per payload, added through pipelines of ``chunk`` entries; returns the IDs."""
    ids: list[str] = []
    for start in range(0, len(payloads), chunk):
        pipe = r.pipeline(transaction=False)
        for p in payloads[start : start + chunk]:
            pipe.xadd(STREAM, {"data": p})
        ids += [i.decode() for i in pipe.execute()]
    return ids


def fill(r: Redis, first: int, n: int, bad_every: int = 0) -> tuple[set[int], set[str]]:
    """Add movie events ``first .. first+n-1`` (and a broken one every ``bad_every``); returns
    the good ids and the IDs of the broken entries."""
    payloads: list[bytes] = []
    bad_at: list[int] = []
    for i in range(first, first + n):
        payloads.append(orjson.dumps(movie_event(i)))
        if bad_every and (i + 1) % bad_every == 0:
            bad_at.append(len(payloads))
            payloads.append(b"{broken")
    ids = xadd(r, payloads)
    return set(range(first, first + n)), {ids[k] for k in bad_at}


def group_info(r: Redis) -> dict[str, Any]:
    groups = r.xinfo_groups(STREAM)
    return dict(groups[0]) if groups else {}


def drained(r: Redis) -> bool:
    """Every entry was delivered to some consumer and acked."""
    info = group_info(r)
    return bool(info) and info["pending"] == 0 and info["lag"] == 0


def finish(config: Path, r: Redis, timeout: float = 60) -> None:
    """Run a clean daemon until the stream is drained, then SIGTERM it: exit 0."""
    run_clean_until(config, lambda: drained(r), timeout)


@pytest.mark.parametrize(("point", "nth"), crash_cases(CRASH_POINTS, flip=True))
def test_crash_point_then_restart_is_exactly_once(
    tmp_path: Path, redis_server: RedisServer, r: Redis, point: str, nth: int
) -> None:
    cfg = write_redis_config(
        tmp_path,
        redis_server.url,
        output={"max_shard_records": 40, "max_shard_age": "200ms"},
        daemon={"max_batch_events": 16},
    )
    expected, bad = fill(r, 0, 200, bad_every=30)
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": f"{point}:{nth}"})
    rc = d.wait(60)
    assert rc == 137, f"crash point {point} not reached: exit {rc}\n{d.output()}"
    assert group_info(r)["pending"] > 0 or point in ("after-ack", "after-done")
    finish(cfg, r)
    assert_exactly_once(tmp_path / "shards", expected)
    assert r.xpending_range(STREAM, GROUP, "-", "+", 10) == []
    letters = {d["where"] for d in dead_letters(tmp_path / "state")}
    assert letters == {f"{STREAM}:{i}" for i in bad}


def node_config(root: Path, url: str, node: str, **source: Any) -> Path:
    return write_redis_config(
        root / node,
        url,
        daemon={"node_id": node, "state_dir": root / node / "state"},
        output={"dir": root / "shards", "max_shard_age": "200ms"},
        source=source,
        features={"id": "int64"},
    )


def test_two_daemons_in_one_group_split_a_stream_exactly_once(
    tmp_path: Path, redis_server: RedisServer, r: Redis
) -> None:
    total = 100_000
    daemons = [DaemonProcess(node_config(tmp_path, redis_server.url, n)) for n in ("a", "b")]
    try:
        for d in daemons:
            d.wait_started()
        t0 = time.monotonic()
        xadd(r, [b'{"id": %d}' % i for i in range(total)], chunk=10_000)
        wait_for(lambda: drained(r), 60, interval=0.2)
        assert time.monotonic() - t0 < 60
        for d in daemons:
            assert d.stop() == 0, d.output()
    finally:
        for d in daemons:
            d.kill()
    assert_exactly_once(tmp_path / "shards", set(range(total)))
    per_node: Counter[str] = Counter()
    for shard in shard_files(tmp_path / "shards"):
        per_node["a" if "-a-" in shard.name else "b"] += len(read_shard(shard))
    assert per_node.total() == total
    assert min(per_node["a"], per_node["b"]) > 0, per_node


def test_entries_of_a_killed_daemon_are_claimed_by_another(
    tmp_path: Path, redis_server: RedisServer, r: Redis
) -> None:
    dead_cfg = node_config(tmp_path, redis_server.url, "a")
    dead_cfg.write_text(dead_cfg.read_text().replace('"200ms"', '"1h"'))
    expected = set(range(300))
    xadd(r, [b'{"id": %d}' % i for i in expected])
    a = DaemonProcess(dead_cfg)
    try:
        a.wait_started()
        wait_for(lambda: group_info(r).get("pending") == 300, 20)
        assert shard_files(tmp_path / "shards") == []
    finally:
        a.kill()
    heir = DaemonProcess(
        node_config(tmp_path, redis_server.url, "b", claim_idle="1s", claim_interval="200ms")
    )
    try:
        heir.wait_started()
        wait_for(lambda: drained(r), 30)
        assert heir.stop() == 0, heir.output()
    finally:
        heir.kill()
    # The dead daemon read its entries in batches, at moments apart: a pass over the pending
    # list may find only some of them idle long enough, and the next pass the rest.
    claims = re.findall(r"claimed (\d+) idle entries", heir.output())
    assert sum(map(int, claims)) == 300, heir.output()
    # The dead daemon comes back: its entries are no longer its own, and nothing repeats.
    back = DaemonProcess(dead_cfg)
    try:
        back.wait_started()
        time.sleep(1.0)
        back.signal(signal.SIGTERM)
        assert back.wait(30) == 0, back.output()
    finally:
        back.kill()
    assert_exactly_once(tmp_path / "shards", expected)
    assert all("-b-" in p.name for p in shard_files(tmp_path / "shards"))


def peak_rss(pid: int) -> int:
    """The process's peak resident set size so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


HUGE = 8 << 20
RSS_GROWTH_BOUND = 40 << 20
"""Measured: 20 entries of 8 MiB raise the daemon's peak RSS (from 56 MiB) by 10 to 13 MiB with
byte-bounded reads (one read holds max_batch_bytes plus one event cut to max_event_bytes), and
by 163 MiB when one XREADGROUP reply holds them all."""


def test_huge_entries_are_read_within_a_byte_budget(
    tmp_path: Path, redis_server: RedisServer, r: Redis
) -> None:
    cfg = write_redis_config(tmp_path, redis_server.url, output={"max_shard_age": "200ms"})
    expected, _ = fill(r, 0, 200)
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: drained(r), 60)
        before = peak_rss(d.proc.pid)
        xadd(r, [b"{" + b"x" * HUGE + b"}" for _ in range(20)], chunk=1)
        more, _ = fill(r, 200, 200)
        wait_for(lambda: drained(r), 120)
        growth = peak_rss(d.proc.pid) - before
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    assert growth < RSS_GROWTH_BOUND, f"peak RSS grew by {growth >> 20} MiB"
    assert_exactly_once(tmp_path / "shards", expected | more)
    letters = dead_letters(tmp_path / "state")
    assert len(letters) == 20
    assert all("max_event_bytes" in dl["detail"] for dl in letters)


def test_a_deleted_consumer_group_stops_the_daemon_and_resumes_where_committed(
    tmp_path: Path, redis_server: RedisServer, r: Redis
) -> None:
    cfg = write_redis_config(tmp_path, redis_server.url, output={"max_shard_age": "200ms"})
    first, _ = fill(r, 0, 1000)
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: drained(r), 60)
        r.xgroup_destroy(STREAM, GROUP)
        code = d.wait(60)
    finally:
        d.kill()
    log = d.output()
    assert code == 69, log
    assert "consumer group tfrecordd was deleted" in log
    assert_exactly_once(tmp_path / "shards", first)

    # Restarted, it refuses to create the group again at start_id ("0": a replay) and names
    # where to create it: after the last entry its journal holds.
    second, _ = fill(r, 1000, 500)
    d = DaemonProcess(cfg)
    try:
        code = d.wait(60)
    finally:
        d.kill()
    log = d.output()
    assert code == 69, log
    entries: Any = r.xrange(STREAM, count=1000)
    last = entries[-1][0].decode()
    command = f"XGROUP CREATE {STREAM} {GROUP} {last} MKSTREAM"
    assert command in log, log
    assert_exactly_once(tmp_path / "shards", first)

    r.xgroup_create(STREAM, GROUP, last, mkstream=True)
    finish(cfg, r)
    assert_exactly_once(tmp_path / "shards", first | second)


def journal_ranges(state: Path) -> list[tuple[str, list[Any]]]:
    """``(shard, items)`` of every intent in a daemon's journal."""
    data = (state / "journal").read_bytes()
    intents = [orjson.loads(p) for _, p in iter_framed(io.BytesIO(data), "journal")]
    return [
        (
            intent_shards(rec)[0],
            [t for token in rec["positions"].get("events", []) for t in read_token(token)],
        )
        for rec in intents
        if rec["t"] == "intent" and intent_shards(rec)
    ]


def test_two_daemons_killed_at_commit_points_never_ack_each_others_entries(
    tmp_path: Path, redis_server: RedisServer, r: Redis
) -> None:
    """Two daemons of one group read a stream in turns (small batches) and are killed at random
    commit points: the ranges each merges never span an entry the other read."""
    rng = random.Random(20261125)
    nodes = ("a", "b")
    configs = {
        n: write_redis_config(
            tmp_path / n,
            redis_server.url,
            daemon={"node_id": n, "state_dir": tmp_path / n / "state", "max_batch_events": 10},
            output={"dir": tmp_path / "shards", "max_shard_records": 120, "max_shard_age": "200ms"},
            features={"id": "int64"},
        )
        for n in nodes
    }
    expected: set[int] = set()
    crashed = 0
    for round_ in range(6):
        first = round_ * 3000
        xadd(r, [b'{"id": %d}' % i for i in range(first, first + 3000)])
        expected |= set(range(first, first + 3000))
        armed = {n: f"{rng.choice(CRASH_POINTS)}:{rng.randint(1, 6)}" for n in nodes}
        daemons = [DaemonProcess(configs[n], env={"TFRECORDD_CRASH_AT": armed[n]}) for n in nodes]
        try:
            wait_for(
                lambda ds=daemons: all(d.proc.poll() is not None for d in ds) or drained(r), 60
            )
            crashed += sum(d.proc.poll() == 137 for d in daemons)
        finally:
            for d in daemons:
                d.kill()
    assert crashed >= 6, f"only {crashed} of 12 runs reached their crash point"
    # Both run again, clean, until the stream is drained: each rereads its own pending entries
    # and redoes the acks of its published commits.
    finishing = [DaemonProcess(configs[n]) for n in nodes]
    try:
        for d in finishing:
            d.wait_started()
        wait_for(lambda: drained(r), 60)
        for d in finishing:
            assert d.stop() == 0, d.output()
    finally:
        for d in finishing:
            d.kill()
    assert_exactly_once(tmp_path / "shards", expected)
    assert r.xpending_range(STREAM, GROUP, "-", "+", 10) == []

    entries: Any = r.xrange(STREAM)
    keys = [tuple(map(int, e[0].decode().split("-"))) for e in entries]
    event_id = [orjson.loads(e[1][b"data"])["id"] for e in entries]
    written: dict[str, set[int | None]] = {n: set() for n in nodes}
    for shard in shard_files(tmp_path / "shards"):
        node = "a" if "-a-" in shard.name else "b"
        written[node] |= {record_id(rec) for rec in read_shard(shard)}
    merged = 0
    for n in nodes:
        for name, items in journal_ranges(tmp_path / n / "state"):
            if not (tmp_path / "shards" / name).exists():
                continue
            for item in items:
                low, high = (item, item) if isinstance(item, str) else (item[0], item[1])
                lo, hi = (tuple(map(int, x.split("-"))) for x in (low, high))
                start, end = bisect.bisect_left(keys, lo), bisect.bisect_right(keys, hi)
                inside = {event_id[k] for k in range(start, end)}
                assert inside <= written[n], f"{n}'s range {item} holds the other's entries"
                merged += end - start > 10
    assert merged, "some ranges merged batches"
