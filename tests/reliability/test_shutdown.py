"""SIGTERM mid-stream, again and again: each time the daemon drains, publishes what is open,
exits 0 within ``drain_timeout`` and leaves no in-progress file; in the end every event is
written exactly once. Spool directory and Redis stream; producers keep writing throughout."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_server import RedisServer, running_redis
from tests.reliability.harness import (
    Producer,
    RedisProducer,
    SpoolProducer,
    audit,
    harness_config,
    redis_drained,
)
from tests.support import DaemonProcess, GlobOracle, spool_drained, wait_for

DRAIN_TIMEOUT = 10.0


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from running_redis(tmp_path / "redis")


def sigterm_trials(root: Path, source: str, trials: int, seed: int, url: str | None) -> None:
    rng = random.Random(seed)
    cfg = harness_config(root, source, "gzip", url)
    text = cfg.read_text().replace('drain_timeout = "30s"', f'drain_timeout = "{DRAIN_TIMEOUT}s"')
    text = text.replace('"drain_timeout" = "30s"', f'"drain_timeout" = "{DRAIN_TIMEOUT}s"')
    cfg.write_text(text)
    assert f'{DRAIN_TIMEOUT}s"' in text
    producer: Producer
    if source == "directory":
        producer = SpoolProducer(root / "spool", batch=100, interval=0.05)
    else:
        assert url is not None
        producer = RedisProducer(url, batch=100, interval=0.05)
    slowest = 0.0
    globs = GlobOracle(root / "shards")
    producer.start()
    try:
        for n in range(trials):
            d = DaemonProcess(cfg)
            try:
                d.wait_started()
                time.sleep(rng.uniform(0.2, 1.5))
                t0 = time.monotonic()
                rc = d.stop(DRAIN_TIMEOUT + 20)
                took = time.monotonic() - t0
            finally:
                d.kill()
            slowest = max(slowest, took)
            assert rc == 0, d.output()[-3000:]
            assert took < DRAIN_TIMEOUT + 2, f"stop took {took:.1f}s"
            globs.look(f"after stop {n + 1}")
            assert globs.violations == [], globs.violations[:10]
            assert list((root / "shards").rglob(".*.inprogress")) == []
    finally:
        producer.stop()

    def done() -> bool:
        if url is None:
            return spool_drained(root / "spool")
        return redis_drained(url)

    # The backlog drains in big shards (harness_config's drain): at 50 events a commit, the
    # clean run took longer than the trials.
    d = DaemonProcess(harness_config(root, source, "gzip", url, drain=True))
    try:
        d.wait_started()
        wait_for(done, 120, interval=0.2)
        assert d.stop(60) == 0
    finally:
        d.kill()
    a = audit(root / "shards", producer.ids, globs=globs)
    print(
        f"{source}: {trials} SIGTERMs mid-stream, slowest stop {slowest:.2f}s, {a.events} events "
        f"in {a.shards} shards: lost {a.lost}, duplicated {a.duplicated}, unexpected {a.unexpected}"
    )
    assert a.ok, a


def test_sigterm_trials_spool_directory(tmp_path: Path) -> None:
    sigterm_trials(tmp_path, "directory", 8, seed=21, url=None)


def test_sigterm_trials_redis_stream(tmp_path: Path, redis_server: RedisServer) -> None:
    sigterm_trials(tmp_path, "redis-stream", 8, seed=22, url=redis_server.url)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(
    "source", ["directory", pytest.param("redis-stream", marks=pytest.mark.redis)]
)
def test_sigterm_trials_long(tmp_path: Path, source: str) -> None:
    if source == "directory":
        sigterm_trials(tmp_path, source, 60, seed=23, url=None)
        return
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        sigterm_trials(tmp_path, source, 60, seed=24, url=server.url)
    finally:
        server.stop()
