"""The daemon as a subprocess publishing to S3 (moto's server over HTTP): killed before, during
and after an upload, and facing a bucket that does not exist; after a restart every event is
in exactly one complete object, and no credential ever reaches a log."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.s3_server import SECRET_KEY, S3Server, running_s3
from tests.support import DaemonProcess, run_clean_until, spool_file, wait_for, write_config
from tfrecordd.crashpoints import POINTS
from tfrecordd.reader import iter_records
from tfrecordd_plugins.sources.directory import CLAIM_DIR

PART = 5 << 20
BLOB = 3000
"""Hex characters of payload per event: shards of a few MB take several upload parts."""
FEATURES = {"id": "int64", "blob": "bytes"}


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    yield from running_s3()


def config(root: Path, server: S3Server, bucket: str, **output: Any) -> Path:
    return write_config(
        root,
        features=FEATURES,
        output={
            "dir": f"s3://{bucket}/shards",
            "storage_options": server.storage_options(default_block_size=PART),
            "compression": "none",
            "max_shard_bytes": 3 * PART,
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
    spool = root / "spool"
    files = [p for p in spool.iterdir() if p.is_file() and not p.name.startswith(".")]
    claim = spool / CLAIM_DIR
    return not files and (not claim.exists() or not any(claim.iterdir()))


def read_ids(server: S3Server, bucket: str) -> dict[int, int]:
    """Every id in every visible shard object; each object must read to its end soundly."""
    counts: dict[int, int] = {}
    options = server.storage_options()
    for url in server.shard_urls(bucket, "shards"):
        from tfrecordd.reader import iter_examples

        for ex in iter_examples(url, storage_options=options, max_decompressed_bytes=None):
            i = int(ex["id"][0])
            counts[i] = counts.get(i, 0) + 1
    return counts


def assert_exactly_once(server: S3Server, bucket: str, expected: set[int]) -> None:
    ids = read_ids(server, bucket)
    lost = expected - set(ids)
    duplicated = {i: c for i, c in ids.items() if c > 1}
    assert (len(lost), len(duplicated), set(ids) - expected) == (0, 0, set()), (
        f"lost {sorted(lost)[:10]}, duplicated {list(duplicated.items())[:10]}"
    )
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
    expected = fill_spool(tmp_path, 4, 1500)
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
    assert_exactly_once(s3_server, bucket, expected)
    if point != "after-publish":
        assert "resumed upload" in log
    assert staged(tmp_path) == []
    assert SECRET_KEY not in first_log + log


def test_sigkill_during_uploads_never_shows_a_partial_object(
    tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.create_bucket()
    cfg = config(tmp_path, s3_server, bucket)
    expected = fill_spool(tmp_path, 12, 1500)
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
    assert_exactly_once(s3_server, bucket, expected)
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
    assert_exactly_once(s3_server, bucket, expected)


def test_check_config_never_prints_credentials(tmp_path: Path, s3_server: S3Server) -> None:
    cfg = config(tmp_path, s3_server, "any-bucket")
    done = subprocess.run(
        [sys.executable, "-m", "tfrecordd", "check-config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "s3://any-bucket/shards" in done.stdout
    assert SECRET_KEY not in done.stdout + done.stderr
