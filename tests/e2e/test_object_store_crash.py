"""The daemon as a subprocess publishing to S3 (moto's server over HTTP): killed before, during
and after an upload, and facing a bucket that does not exist; after a restart every event is
in exactly one complete object, and no credential ever reaches a log."""

from __future__ import annotations

import json
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.s3_server import SECRET_KEY, S3Server, running_s3
from tests.support import (
    DaemonProcess,
    assert_exactly_once,
    run_clean_until,
    run_tfrecordd,
    spool_drained,
    spool_file,
    wait_for,
    write_config,
)
from tfrecordd.format.reader import iter_records
from tfrecordd.outputs import manifest
from tfrecordd.plugin import Registry

POINTS = Registry.from_entry_points().crash_points()
"""Every crash point: the daemon's and the built-in sources'."""

PART = 5 << 20
BLOB = 3000
"""Hex characters of payload per event: shards of a few MB take several upload parts."""
FEATURES = {"id": "int64", "blob": "bytes"}


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    yield from running_s3()


def config(
    root: Path,
    server: S3Server,
    bucket: str,
    daemon: dict[str, Any] | None = None,
    **output: Any,
) -> Path:
    return write_config(
        root,
        features=FEATURES,
        daemon=daemon,
        output={
            "dir": f"s3://{bucket}/shards",
            "storage_options": server.storage_options(default_block_size=PART),
            "compression": "none",
            "max_shard_bytes": 2 * PART,
            "max_shard_age": "1s",
        }
        | output,
    )


def fill_spool(root: Path, files: int, per_file: int) -> set[int]:
    ids: set[int] = set()
    for f in range(files):
        events = []
        for i in range(f * per_file, (f + 1) * per_file):
            events.append({"id": i, "blob": secrets.token_hex(BLOB // 2)})
            ids.add(i)
        spool_file(root / "spool", f"f{f:03d}.jsonl", events)
    return ids


def drained(root: Path) -> bool:
    return spool_drained(root / "spool")


def assert_exactly_once_in(server: S3Server, bucket: str, expected: set[int]) -> None:
    """Exactly once in what a reader's glob of the bucket's shard prefix sees, and no multipart
    upload left behind."""
    assert_exactly_once(f"s3://{bucket}/shards", expected, storage_options=server.storage_options())
    assert server.incomplete_uploads(bucket) == [], "no multipart upload is left behind"


def assert_objects_complete(server: S3Server, bucket: str) -> None:
    """Whatever is visible is a whole shard: it reads to its end with every CRC sound."""
    for url in server.shard_urls(bucket, "shards"):
        assert sum(1 for _ in iter_records(url, storage_options=server.storage_options())) > 0


def finish(root: Path, cfg: Path, timeout: float = 120) -> str:
    """Run a clean daemon until the spool is drained, SIGTERM it (exit 0); return its log."""
    return run_clean_until(cfg, lambda: drained(root), timeout)


def staged(root: Path) -> list[Path]:
    staging = root / "state" / "staging"
    return sorted(staging.rglob(".*.inprogress")) if staging.exists() else []


CRASH_POINTS = [
    "after-intent",
    pytest.param(
        "mid-upload",
        marks=pytest.mark.skipif(
            "mid-upload" not in POINTS, reason="crash point mid-upload is not registered"
        ),
    ),
    "after-publish",
]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_killed_around_an_upload_then_restarted_exactly_once(
    tmp_path: Path, s3_server: S3Server, point: str
) -> None:
    bucket = s3_server.create_bucket()
    cfg = config(tmp_path, s3_server, bucket)
    expected = fill_spool(tmp_path, 3, 1500)
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": point})
    try:
        assert d.wait(120) == 137, d.output()
    finally:
        d.kill()
    first_log = d.output()
    visible = s3_server.shard_urls(bucket, "shards")
    if point == "after-publish":
        assert len(visible) == 1, "the object was committed just before the crash"
        assert_objects_complete(s3_server, bucket)
    else:
        assert visible == [], "nothing is visible before the commit"
        # The fsynced staged copy survives the crash; beside it, at most the next shard, which
        # was filling while this one was committed (discarded at the restart).
        assert 1 <= len(staged(tmp_path)) <= 2, "the fsynced staged copy survives the crash"
    if point == "mid-upload":
        assert len(s3_server.incomplete_uploads(bucket)) == 1, "parts were sent, not committed"

    log = finish(tmp_path, cfg)
    assert_exactly_once_in(s3_server, bucket, expected)
    if point != "after-publish":
        assert "resumed upload" in log
    assert staged(tmp_path) == []
    assert SECRET_KEY not in first_log + log


def test_sigkill_during_uploads_never_shows_a_partial_object(
    tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.create_bucket()
    cfg = config(tmp_path, s3_server, bucket)
    expected = fill_spool(tmp_path, 8, 1500)
    logs = ""
    mid_upload_kills = 0
    for _ in range(4):
        before = s3_server.upload_ids(bucket)
        d = DaemonProcess(cfg)
        try:
            d.wait_started()
            # Kill as soon as a new multipart upload has begun: parts sent, none committed.
            wait_for(
                lambda seen=before: bool(s3_server.upload_ids(bucket) - seen) or drained(tmp_path),
                60,
                interval=0.005,
            )
            uploading = not drained(tmp_path)
        finally:
            d.kill()
        logs += d.output()
        mid_upload_kills += uploading
        assert_objects_complete(s3_server, bucket)
    assert mid_upload_kills >= 2
    logs += finish(tmp_path, cfg, timeout=180)
    assert_exactly_once_in(s3_server, bucket, expected)
    assert "resumed upload" in logs
    assert SECRET_KEY not in logs


def test_a_missing_bucket_stops_the_daemon_without_acking(
    tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = f"later-{secrets.token_hex(4)}"
    cfg = config(tmp_path, s3_server, bucket)
    expected = fill_spool(tmp_path, 1, 300)
    d = DaemonProcess(cfg)
    try:
        code = d.wait(120)
    finally:
        d.kill()
    assert code not in (0, 137), d.output()
    assert "later-" in d.output()
    assert SECRET_KEY not in d.output()
    assert not drained(tmp_path), "nothing was acked"

    s3_server.client().create_bucket(Bucket=bucket)
    finish(tmp_path, cfg)
    assert_exactly_once_in(s3_server, bucket, expected)


def test_check_config_never_prints_credentials(tmp_path: Path, s3_server: S3Server) -> None:
    cfg = config(tmp_path, s3_server, "any-bucket")
    done = run_tfrecordd("check-config", str(cfg))
    assert done.returncode == 0, done.stderr
    assert "s3://any-bucket/shards" in done.stdout
    assert SECRET_KEY not in done.stdout + done.stderr


def test_sigterm_during_an_outage_drains_within_drain_timeout(
    tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.create_bucket()
    drain = 3.0
    cfg = config(tmp_path, s3_server, bucket, {"drain_timeout": f"{drain:g}s"}, retry_for="300s")
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        s3_server.stop()
        expected = fill_spool(tmp_path, 2, 300)
        # An upload failed and is being retried: the store is down. (Each attempt takes the
        # client's own retries, seconds of them: SIGTERM lands in one or in the backoff.)
        wait_for(lambda: "retry 1 in" in d.output(), 120)
        t0 = time.monotonic()
        d.signal(signal.SIGTERM)
        code = d.wait(120)
        took = time.monotonic() - t0
    finally:
        d.kill()
        s3_server.start()
    first_log = d.output()
    assert took < drain + 2.0, f"SIGTERM took {took:.1f}s with drain_timeout = {drain}s"
    assert code not in (0, 137), first_log
    assert "retries cut short by the drain" in first_log, first_log[-3000:]
    assert not drained(tmp_path), "nothing unpublished was acked"
    assert s3_server.shard_urls(bucket, "shards") == []

    log = finish(tmp_path, cfg)
    assert_exactly_once_in(s3_server, bucket, expected)
    assert SECRET_KEY not in first_log + log


@pytest.mark.parametrize("point", ["after-intent", "after-publish"])
def test_a_manifest_lost_to_a_crash_is_rebuilt_from_the_object(
    tmp_path: Path, s3_server: S3Server, point: str
) -> None:
    bucket = s3_server.create_bucket()
    cfg = config(tmp_path, s3_server, bucket)
    expected = fill_spool(tmp_path, 2, 1500)
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": point})
    try:
        assert d.wait(120) == 137, d.output()
    finally:
        d.kill()
    assert not any(k.endswith(manifest.SUFFIX) for k in s3_server.keys(bucket))

    log = finish(tmp_path, cfg)
    assert_exactly_once_in(s3_server, bucket, expected)
    client = s3_server.client()
    shards = s3_server.shard_urls(bucket, "shards")
    assert shards
    for url in shards:
        key = url.removeprefix(f"s3://{bucket}/")
        local = tmp_path / "check" / key.rpartition("/")[2]
        local.parent.mkdir(exist_ok=True)
        client.download_file(bucket, key, str(local))
        mkey = key.rpartition("/")[0] + "/" + manifest.manifest_name(local.name)
        mpath = tmp_path / "check" / manifest.manifest_name(local.name)
        assert mkey in s3_server.keys(bucket), f"{key} has no manifest"
        client.download_file(bucket, mkey, str(mpath))
        assert manifest.check(str(local), str(mpath)) == [], key
        doc = json.loads(mpath.read_text())
        assert doc["positions"], "the manifest names the positions its shard covers"
    # Killed before the upload, the next start uploads the staged copy with its manifest;
    # after it, the manifest is made from the object read back.
    if point == "after-intent":
        assert "resumed upload" in log
    else:
        assert "rebuilt from the published object" in log
