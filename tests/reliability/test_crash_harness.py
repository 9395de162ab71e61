"""SIGKILL at random instants while producers write, on a spool directory and a Redis stream.

The audit reads every published shard with the harness's own reader (not tfrecordd's) and runs
``tfrecordd verify``. Default: 30 + 25 kills; ``--run-slow``: 300 per source (the same as
``python scripts/crash_harness.py --source directory --kills 300``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_server import RedisServer, running_redis
from tests.reliability.harness import Figures, run_crash_trials


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from running_redis(tmp_path / "redis")


def check(figs: Figures, kills: int) -> None:
    print(figs.summary())
    assert figs.kills == kills
    assert figs.audit is not None
    a = figs.audit
    assert (a.lost, a.duplicated, a.unexpected) == (0, 0, 0), figs.summary()
    assert a.inprogress_visible == 0, figs.summary()
    assert a.problems == [], figs.notes
    assert a.verify_exit == 0
    assert figs.dead_letters_missing == 0, "every malformed input is dead-lettered"
    assert not figs.notes, figs.notes
    # The kills landed in each phase: start-up/recovery, and while a shard was being written.
    assert figs.killed_before_ready > 0, figs.summary()
    assert figs.recovered_discarded > 0, figs.summary()
    assert a.shards > kills // 2, "many commits per run"


def test_sigkill_spool_directory(tmp_path: Path) -> None:
    check(run_crash_trials(tmp_path, source="directory", kills=30, seed=1), 30)


def test_sigkill_redis_stream(tmp_path: Path, redis_server: RedisServer) -> None:
    figs = run_crash_trials(
        tmp_path,
        source="redis-stream",
        kills=25,
        seed=2,
        compression="gzip",
        redis_url=redis_server.url,
    )
    check(figs, 25)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sigkill_spool_directory_long(tmp_path: Path) -> None:
    figs = run_crash_trials(tmp_path, source="directory", kills=300, seed=3, compression="gzip")
    check(figs, 300)
    assert figs.recovered_dropped + figs.recovered_redone > 0, figs.summary()


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sigkill_redis_stream_long(tmp_path: Path, redis_server: RedisServer) -> None:
    figs = run_crash_trials(
        tmp_path, source="redis-stream", kills=300, seed=4, redis_url=redis_server.url
    )
    check(figs, 300)
    assert figs.recovered_dropped + figs.recovered_redone > 0, figs.summary()


@pytest.mark.parametrize("nth", [1, 3])
def test_redis_crash_after_create_then_restart_is_exactly_once(
    tmp_path: Path, redis_server: RedisServer, nth: int
) -> None:
    """The one named crash point the Redis e2e tests do not cover (``after-claim`` and
    ``after-spool-ack`` belong to the spool directory)."""
    from redis import Redis

    from tests.e2e.test_redis_daemon import assert_exactly_once, fill, finish, group_info
    from tests.redis_server import write_redis_config
    from tests.support import DaemonProcess

    cfg = write_redis_config(
        tmp_path,
        redis_server.url,
        output={"max_shard_records": 40, "max_shard_age": "200ms"},
        daemon={"max_batch_events": 16},
    )
    with Redis.from_url(redis_server.url) as r:
        expected, _ = fill(r, 0, 200)
        d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": f"after-create:{nth}"})
        assert d.wait(60) == 137, d.output()
        assert group_info(r)["pending"] > 0
        finish(cfg, r)
        assert_exactly_once(tmp_path / "shards", expected)
