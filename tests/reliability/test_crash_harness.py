"""SIGKILL at random instants while producers write, on a spool directory and a Redis stream.

Every other run is armed with a named crash point until each phase of the commit protocol has
been killed in; after every kill, whatever a reader's shard glob matches must be a published
shard. The audit reads every published shard with the independent reader (not tfrecordd's)
and runs ``tfrecordd verify``. Default: 30 + 25 kills; ``--run-slow``: 300 per source (the same
as ``python scripts/crash_harness.py --source directory --kills 300``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from tests.e2e.test_redis_daemon import fill, finish, group_info
from tests.redis_server import RedisServer, running_redis, write_redis_config
from tests.reliability.harness import (
    CRASH_PHASES,
    Figures,
    audit,
    published_shards,
    read_shard,
    run_crash_trials,
)
from tests.support import (
    DaemonProcess,
    GlobOracle,
    assert_exactly_once,
    movie_event,
    read_ids,
    spool_file,
    wait_for,
    write_config,
)
from tests.support import shard_files as shards_of
from tfrecordd.format.reader import iter_records


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from running_redis(tmp_path / "redis")


def check(figs: Figures, kills: int) -> None:
    print(figs.summary())
    assert figs.kills == kills
    assert figs.audit is not None
    a = figs.audit
    assert (a.lost, a.duplicated, a.unexpected) == (0, 0, 0), figs.summary()
    assert a.reader_visible_unpublished == 0, a.problems[:10]
    assert figs.glob_looks == kills + 1
    assert a.problems == [], figs.notes
    assert a.verify_exit == 0
    assert figs.dead_letters_missing == 0, "every malformed input is dead-lettered"
    assert not figs.notes, figs.notes
    # Every crash phase was killed in at least once, whatever the seed.
    assert figs.phases, "a run names the phases it must kill in"
    assert figs.phases_missed == [], figs.summary()
    # The random kills landed in start-up/recovery, and while a shard was being written.
    assert figs.killed_before_ready > 0, figs.summary()
    assert figs.recovered_discarded > 0, figs.summary()
    assert a.shards > kills // 2, "many commits per run"


def test_sigkill_spool_directory(tmp_path: Path) -> None:
    figs = run_crash_trials(tmp_path, source="directory", kills=30, seed=1)
    check(figs, 30)
    assert set(figs.phases) == set(CRASH_PHASES["directory"])


def test_sigkill_spool_directory_with_reloads(tmp_path: Path) -> None:
    """Kills land in live reloads too (SIGHUPs between kills, each restarting the source):
    every event once, none lost."""
    figs = run_crash_trials(
        tmp_path, source="directory", kills=16, seed=7, phases=[], max_delay=2.0, reloads=True
    )
    assert figs.ok, figs.summary() + "\n" + "\n".join(figs.notes)
    assert figs.reloads_applied > 0, figs.summary()
    assert figs.reloads > figs.reloads_applied, "some reloads were cut short by a kill"


@pytest.mark.tensorflow
def test_sigkill_spool_directory_tensorflow_globs(tmp_path: Path) -> None:
    """TensorFlow's globs (``tf.io.gfile.glob``, ``tf.io.matching_files``, which do not skip
    hidden names) are among the readers looking after every kill."""
    pytest.importorskip("tensorflow")
    figs = run_crash_trials(
        tmp_path,
        source="directory",
        kills=12,
        seed=5,
        compression="gzip",
        phases=["after-create", "mid-write", "after-fsync", "after-intent", "after-publish"],
        tf_globs=True,
    )
    check(figs, 12)


def test_sigkill_spool_directory_packed_units_two_workers(tmp_path: Path) -> None:
    # Batches large enough to be framed and compressed in the encode workers, appended to the
    # shard's zlib stream as they come (header and Adler-32 written by the shard itself).
    # Kills up to 2.5 s after start: the two workers start (and import) after the daemon does,
    # and each kill should as often land while shards are written as during start-up.
    figs = run_crash_trials(
        tmp_path,
        source="directory",
        kills=15,
        seed=4,
        compression="zlib",
        packed=True,
        max_delay=2.5,
        phases=["after-fsync", "after-intent", "after-publish", "after-dir-fsync", "after-ack"],
    )
    check(figs, 15)


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
    assert set(figs.phases) == set(CRASH_PHASES["redis-stream"])


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


@pytest.mark.parametrize("compression", ["none", "gzip", "zlib", "zstd"])
def test_the_audit_sees_loss_duplicates_and_partial_files(tmp_path: Path, compression: str) -> None:
    """The independent reader agrees with tfrecordd's on real shards, and the audit reports a
    missing shard, a copied one, an in-progress file a reader's glob matches, a record without
    an id and a damaged shard."""

    cfg = write_config(
        tmp_path,
        output={"compression": compression, "max_shard_records": 30, "max_shard_age": "100ms"},
        daemon={"max_batch_events": 10},
    )
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(100)])
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: not any((tmp_path / "spool").glob("*.jsonl")), 30)
        wait_for(lambda: sum(read_ids(tmp_path / "shards").values()) == 100, 30)
        assert d.stop() == 0
    finally:
        d.kill()
    out = tmp_path / "shards"
    assert published_shards(out) == shards_of(out)
    for shard in published_shards(out):
        assert read_shard(shard) == list(iter_records(shard))
    expected = set(range(100))
    assert audit(out, expected).ok
    # ``tfrecordd verify`` (a process each time) runs in the first and the last audit: the
    # shards between are sound, and what those audits must see is the reader's count.
    first, second = published_shards(out)[:2]
    shutil.copy(first, out / ("copy-" + first.name))
    a = audit(out, expected, verify=False)
    assert (a.lost, a.duplicated, a.unexpected) == (0, 30, 0)
    second.unlink()
    (out / f".{first.name}.inprogress").write_bytes(b"partial")
    a = audit(out, expected, verify=False)
    assert (a.lost, a.reader_visible_unpublished) == (30, 1)
    assert not a.ok
    (out / f".{first.name}.inprogress").unlink()
    assert audit(out, expected, verify=False).reader_visible_unpublished == 0
    # A complete shard holding one record without an id: unexpected, not ignored.
    third = published_shards(out)[2]
    no_id = out / ("no-id-" + third.name)
    no_id.write_bytes(_shard_of_records([b""], third.name))
    a = audit(out, expected, verify=False)
    assert a.unexpected == 1
    assert not a.ok
    no_id.unlink()
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x10
    first.write_bytes(bytes(data))
    a = audit(out, expected)
    assert a.problems
    assert a.verify_exit != 0
    assert not a.ok


def _shard_of_records(records: list[bytes], name: str) -> bytes:
    """A shard of ``records`` (compressed as ``name``'s suffix says), framed by TensorFlow's
    rules independently of tfrecordd."""
    import gzip
    import zlib

    import crc32c
    import zstandard

    def masked(data: bytes) -> bytes:
        c = crc32c.crc32c(data)
        return ((((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF).to_bytes(4, "little")

    stream = b"".join(
        len(r).to_bytes(8, "little") + masked(len(r).to_bytes(8, "little")) + r + masked(r)
        for r in records
    )
    if name.endswith(".gz"):
        return gzip.compress(stream)
    if name.endswith(".zz"):
        return zlib.compress(stream)
    if name.endswith(".zst"):
        return zstandard.ZstdCompressor(write_checksum=True).compress(stream)
    return stream


@pytest.mark.parametrize(
    "hidden",
    [
        ".shard-0001.tfrecord.gz.inprogress",
        ".staging/node/shard-0002.tfrecord.gz",
        "sub/x.tfrecord",
    ],
)
def test_the_glob_oracle_sees_what_each_globber_sees(tmp_path: Path, hidden: str) -> None:
    """A partial file under a name some reader's glob matches (a hidden name: fsspec and
    pathlib; a hidden folder: fsspec; a plain subfolder: Python's recursive glob too) is
    reported, and so is a published shard that later disappears or changes."""
    out = tmp_path / "shards"
    (out / hidden).parent.mkdir(parents=True, exist_ok=True)
    (out / hidden).write_bytes(b"partial")
    oracle = GlobOracle(out)
    oracle.look("now")
    assert len(oracle.violations) == 1, oracle.violations
    assert hidden.rpartition("/")[2] in oracle.violations[0]

    out2 = tmp_path / "shards2"
    out2.mkdir()
    good = out2 / "a.tfrecord.gz"
    good.write_bytes(_shard_of_records([b"x"], good.name))
    (out2 / ".staging" / "n").mkdir(parents=True)
    (out2 / ".staging" / "n" / "b.inprogress").write_bytes(b"partial, under no shard name")
    oracle = GlobOracle(out2)
    oracle.look("now")
    assert oracle.violations == []
    good.unlink()
    oracle.finish()
    assert len(oracle.violations) == 1
    assert "gone" in oracle.violations[0]


def test_a_folder_a_shard_glob_matches_is_reported(tmp_path: Path) -> None:
    """fsspec, pathlib and TensorFlow return folders too: a training job handed
    ``.tfrecordd-staging`` by ``shards/*.tfrecord*`` fails to open it as a shard."""
    out = tmp_path / "shards"
    (out / ".tfrecordd-staging" / "node").mkdir(parents=True)
    oracle = GlobOracle(out)
    oracle.look("now")
    assert len(oracle.violations) == 1, oracle.violations
    assert ".tfrecordd-staging (fsspec/pathlib) is not a regular file" in oracle.violations[0]
