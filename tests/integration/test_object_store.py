"""Object-store output against a real S3 API (moto's server over HTTP, reached by s3fs as AWS
would be): atomic create-only uploads, verification, retries, resume, redaction, and the
daemon in-process publishing every event exactly once to a bucket."""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry, Counter

from tests.s3_server import SECRET_KEY, S3Server, running_s3
from tests.support import (
    free_port,
    metric_sum,
    movie_event,
    spool_drained,
    spool_file,
    write_config,
)
from tfrecordd.config import DaemonConfig, load_config
from tfrecordd.errors import UploadError
from tfrecordd.format.compression import Compression
from tfrecordd.format.reader import iter_records
from tfrecordd.format.writer import inprogress_name
from tfrecordd.fsys import LOCAL
from tfrecordd.outputs import make_output
from tfrecordd.outputs.objectstore import FsspecOutput, is_transient
from tfrecordd.outputs.shards import FinishedShard, OpenShard
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.redact import REDACTED, redact_options, redact_url
from tfrecordd.state.records import ShardRef

PART = 5 << 20
"""S3's smallest multipart part: shards above it are uploaded in several parts."""


class UploadMetrics:
    """The two upload metrics the daemon exports, on a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.upload_errors = Counter(
            "tfrecordd_upload_errors_total", "", ["kind"], registry=self.registry
        )
        self.upload_retries = Counter("tfrecordd_upload_retries_total", "", registry=self.registry)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def s3_config(
    root: Path, server: S3Server, bucket: str, prefix: str = "shards", **options: Any
) -> DaemonConfig:
    return load_config(
        write_config(
            root,
            output={
                "dir": f"s3://{bucket}/{prefix}",
                "storage_options": server.storage_options(**options),
                "compression": "none",
            },
        )
    )


def make_shard(directory: str, name: str, records: list[bytes]) -> FinishedShard:
    os.makedirs(directory, exist_ok=True)
    shard = OpenShard(directory, name, Compression.NONE, None, 1 << 30, LOCAL)
    shard.write(records)
    return shard.finish()


def random_records(total_bytes: int, size: int = 64 << 10) -> list[bytes]:
    return [secrets.token_bytes(size) for _ in range(total_bytes // size)]


def intent_of(shard: FinishedShard) -> ShardRef:
    return ShardRef("", shard.name, shard.records, shard.size, shard.sha256)


def output(
    root: Path, server: S3Server, bucket: str, metrics: Any = None, **kwargs: Any
) -> FsspecOutput:
    config = s3_config(root, server, bucket, default_block_size=PART)
    return FsspecOutput(config, LOCAL, metrics, **kwargs)


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    yield from running_s3()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    return s3_server.create_bucket()


# -- publishing --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [300 << 10, 3 * PART + 12345], ids=["one-part", "multipart"])
def test_published_object_is_the_staged_shard_byte_for_byte(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, size: int
) -> None:
    out = output(tmp_path, s3_server, s3_bucket)
    records = random_records(size)
    shard = make_shard(out.staging_dir, "part-a.tfrecord", records)
    staged = Path(shard.tmp_path).read_bytes()
    assert not out.is_published(intent_of(shard))

    out.publish(shard)

    body = s3_server.client().get_object(Bucket=s3_bucket, Key="shards/part-a.tfrecord")["Body"]
    assert body.read() == staged
    assert out.final_path(shard.name) == f"s3://{s3_bucket}/shards/part-a.tfrecord"
    assert list(iter_records(out.final_path(shard.name), storage_options=out.storage_options)) == (
        records
    )
    assert not os.path.exists(shard.tmp_path), "the staged copy goes once the upload is verified"
    assert out.is_published(intent_of(shard))
    assert s3_server.incomplete_uploads(s3_bucket) == []


def test_a_failed_upload_leaves_no_object_and_keeps_the_staged_copy(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    out = output(tmp_path, s3_server, s3_bucket)
    shard = make_shard(out.staging_dir, "part-b.tfrecord", random_records(3 * PART))
    # A digest that does not match the staged bytes: the upload must be abandoned before the
    # commit, after parts were sent.
    bad = FinishedShard(
        shard.name,
        shard.tmp_path,
        shard.records,
        shard.size,
        shard.raw_bytes,
        "0" * 64,
        shard.crc32c,
        shard.offsets,
        shard.first_time,
        shard.last_time,
    )
    with pytest.raises(UploadError):
        out.publish(bad)
    assert s3_server.keys(s3_bucket) == []
    assert s3_server.incomplete_uploads(s3_bucket) == [], "the multipart upload was aborted"
    assert os.path.exists(shard.tmp_path)


def test_refuses_to_overwrite_another_object(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    metrics = UploadMetrics()
    out = output(tmp_path, s3_server, s3_bucket, metrics)
    shard = make_shard(out.staging_dir, "part-c.tfrecord", random_records(100 << 10))
    s3_server.client().put_object(Bucket=s3_bucket, Key="shards/part-c.tfrecord", Body=b"theirs")

    with pytest.raises(UploadError, match="refusing to overwrite") as raised:
        out.publish(shard)

    assert raised.value.kind == "exists"
    body = s3_server.client().get_object(Bucket=s3_bucket, Key="shards/part-c.tfrecord")["Body"]
    assert body.read() == b"theirs"
    assert os.path.exists(shard.tmp_path)
    assert metrics.value("tfrecordd_upload_errors_total", kind="exists") == 1


def test_an_identical_object_counts_as_published(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    """A commit whose answer was lost leaves the object in place: the retry must accept it."""
    out = output(tmp_path, s3_server, s3_bucket)
    shard = make_shard(out.staging_dir, "part-d.tfrecord", random_records(100 << 10))
    data = Path(shard.tmp_path).read_bytes()
    s3_server.client().put_object(Bucket=s3_bucket, Key="shards/part-d.tfrecord", Body=data)
    out.publish(shard)
    assert not os.path.exists(shard.tmp_path)


def test_a_missing_bucket_is_a_permanent_error(tmp_path: Path, s3_server: S3Server) -> None:
    metrics = UploadMetrics()
    out = output(tmp_path, s3_server, "no-such-bucket", metrics, retry_for=60)
    shard = make_shard(out.staging_dir, "part-e.tfrecord", random_records(64 << 10))
    t0 = time.monotonic()
    with pytest.raises(UploadError) as raised:
        out.publish(shard)
    assert raised.value.kind == "permanent"
    assert raised.value.exit_code != 0
    assert time.monotonic() - t0 < 30, "a permanent error is not retried for the whole budget"
    assert os.path.exists(shard.tmp_path)
    assert metrics.value("tfrecordd_upload_errors_total", kind="permanent") == 1
    assert metrics.value("tfrecordd_upload_retries_total") == 0


def test_transient_errors_are_retried_until_the_budget_is_spent(tmp_path: Path) -> None:
    nobody = S3Server(free_port())  # never started: connections are refused
    config = load_config(
        write_config(
            tmp_path,
            output={
                "dir": "s3://bucket/shards",
                "storage_options": nobody.storage_options(
                    config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 1}
                ),
            },
        )
    )
    metrics = UploadMetrics()
    out = FsspecOutput(config, LOCAL, metrics, retry_for=3)
    shard = make_shard(out.staging_dir, "part-f.tfrecord", random_records(64 << 10))
    with pytest.raises(UploadError) as raised:
        out.publish(shard)
    assert raised.value.kind == "exhausted"
    assert metrics.value("tfrecordd_upload_retries_total") >= 1
    assert metrics.value("tfrecordd_upload_errors_total", kind="exhausted") == 1
    assert os.path.exists(shard.tmp_path)


def test_an_outage_shorter_than_the_budget_is_ridden_out(tmp_path: Path) -> None:
    server = S3Server()
    server.start()
    try:
        bucket = server.create_bucket()
        out = output(tmp_path, server, bucket, retry_for=120)
        shard = make_shard(out.staging_dir, "part-g.tfrecord", random_records(2 * PART))
        server.stop()
        with anyio.from_thread.start_blocking_portal() as portal:
            restart = portal.start_task_soon(_restart_after, server, 3.0)
            out.publish(shard)
            restart.result()
        assert out.is_published(intent_of(shard))
        assert server.incomplete_uploads(bucket) == []
    finally:
        server.stop()


async def _restart_after(server: S3Server, delay: float) -> None:
    await anyio.sleep(delay)
    await anyio.to_thread.run_sync(server.start)


def test_transient_and_permanent_errors_are_told_apart() -> None:
    import errno

    assert is_transient(ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    assert is_transient(TimeoutError())
    assert is_transient(OSError(errno.EIO, "InternalError"))
    assert is_transient(OSError(errno.EBUSY, "SlowDown"))
    assert not is_transient(PermissionError("AccessDenied"))
    assert not is_transient(FileNotFoundError("NoSuchBucket"))
    assert not is_transient(FileExistsError("PreconditionFailed"))
    assert not is_transient(OSError(errno.EINVAL, "InvalidArgument"))
    assert not is_transient(KeyError("a bug is not waited out"))


# -- recovery ----------------------------------------------------------------------------------


def test_resume_uploads_an_intact_staged_copy(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    out = output(tmp_path, s3_server, s3_bucket)
    shard = make_shard(out.staging_dir, "part-h.tfrecord", random_records(2 * PART))
    intent = intent_of(shard)
    # A multipart upload left behind by a run killed mid-upload: invisible, to be aborted.
    s3_server.client().create_multipart_upload(Bucket=s3_bucket, Key="shards/part-h.tfrecord")
    staged = os.path.join(out.staging_dir, inprogress_name(shard.name))
    assert staged == shard.tmp_path

    assert not out.is_published(intent)
    out.resume(shard)

    assert out.is_published(intent)
    assert s3_server.incomplete_uploads(s3_bucket) == []
    assert not os.path.exists(staged)


def test_resume_refuses_a_damaged_or_missing_staged_copy(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    # The staged copy is uploaded only if it holds exactly what its intent journalled.
    out = output(tmp_path, s3_server, s3_bucket)
    shard = make_shard(out.staging_dir, "part-i.tfrecord", random_records(PART + 1000))
    with open(shard.tmp_path, "r+b") as f:  # same size, one byte changed
        f.seek(shard.size // 2)
        byte = f.read(1)
        f.seek(shard.size // 2)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(UploadError):
        out.resume(shard)
    assert s3_server.keys(s3_bucket) == []
    assert s3_server.incomplete_uploads(s3_bucket) == []

    with open(shard.tmp_path, "ab") as f:
        f.write(b"x")
    with pytest.raises(UploadError):
        out.resume(shard)
    os.unlink(shard.tmp_path)
    with pytest.raises(UploadError):
        out.resume(shard)
    assert s3_server.keys(s3_bucket) == []


def test_published_needs_the_journalled_size(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    out = output(tmp_path, s3_server, s3_bucket)
    s3_server.client().put_object(Bucket=s3_bucket, Key="shards/part-j.tfrecord", Body=b"12345")
    assert out.is_published(ShardRef("", "part-j.tfrecord", 1, 5, "0" * 64))
    assert not out.is_published(ShardRef("", "part-j.tfrecord", 1, 6, "0" * 64))
    assert not out.is_published(ShardRef("", "part-k.tfrecord", 1, 5, "0" * 64))


def test_sidecars_replace_earlier_copies(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    out = output(tmp_path, s3_server, s3_bucket)
    assert not out.sidecar_exists("part-l.manifest.json")
    out.publish_sidecar("part-l.manifest.json", [b'{"v": 1}'])
    out.publish_sidecar("part-l.manifest.json", [b'{"v":', b" 2}"])
    assert out.sidecar_exists("part-l.manifest.json")
    body = s3_server.client().get_object(Bucket=s3_bucket, Key="shards/part-l.manifest.json")
    assert body["Body"].read() == b'{"v": 2}'
    assert os.listdir(out.staging_dir) == [], "the staged copy is removed after the upload"


# -- configuration -----------------------------------------------------------------------------


def test_redact_hides_every_secret_looking_option(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    options = {
        "endpoint_url": "http://127.0.0.1:9000",
        "key": "AKIAEXAMPLE",
        "secret": SECRET_KEY,
        "Session_Token": "tok",
        "client_kwargs": {"region_name": "eu-west-1", "aws_secret_access_key": "nested"},
        "credentials_file": "/etc/creds",
        "password": "pw",
        "anon": False,
    }
    assert redact_options(options) == {
        "endpoint_url": "http://127.0.0.1:9000",
        "key": REDACTED,
        "secret": REDACTED,
        "Session_Token": REDACTED,
        "client_kwargs": {"region_name": "eu-west-1", "aws_secret_access_key": REDACTED},
        "credentials_file": REDACTED,
        "password": REDACTED,
        "anon": False,
    }
    out = output(tmp_path, s3_server, s3_bucket)
    described = out.redact()
    assert described["location"] == f"s3://{s3_bucket}/shards"
    assert described["storage_options"]["endpoint_url"] == s3_server.endpoint
    assert described["storage_options"]["secret"] == REDACTED
    assert SECRET_KEY not in repr(described)
    assert redact_url("sftp://user:hunter2@host/x") == "sftp://user:***@host/x"
    assert redact_url("s3://bucket/prefix") == "s3://bucket/prefix"


def test_staging_defaults_to_the_state_dir(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    out = make_output(s3_config(tmp_path, s3_server, s3_bucket), LOCAL)
    assert isinstance(out, FsspecOutput)
    assert out.staging_dir == str(tmp_path / "state" / "staging" / "test")
    assert out.verify == "sha256"


# -- the daemon --------------------------------------------------------------------------------


def _metric(daemon: Daemon, name: str, **labels: str) -> float:
    return metric_sum(daemon.metrics.registry, name, **labels)


async def _run_until_drained(daemons: list[tuple[Daemon, Path]], timeout: float = 60) -> None:
    async with anyio.create_task_group() as tg:
        for daemon, _ in daemons:
            await tg.start(daemon.run)
        with anyio.fail_after(timeout):
            while not all(spool_drained(spool) for _, spool in daemons):
                await anyio.sleep(0.05)
        for daemon, _ in daemons:
            daemon.request_stop()


def daemon_config(
    root: Path, server: S3Server, bucket: str, node: str, **options: Any
) -> DaemonConfig:
    return load_config(
        write_config(
            root,
            daemon={"node_id": node},
            output={
                "dir": f"s3://{bucket}/shards",
                "storage_options": server.storage_options(**options),
                "max_shard_records": 150,
                "max_shard_age": "300ms",
            },
        )
    )


@pytest.mark.anyio
async def test_daemon_publishes_every_event_once_to_the_bucket(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    config = daemon_config(tmp_path, s3_server, s3_bucket, "node-a")
    for f in range(4):
        spool_file(
            tmp_path / "spool", f"f{f}.jsonl", [movie_event(f * 250 + i) for i in range(250)]
        )
    daemon = Daemon(config, handle_signals=False)
    await _run_until_drained([(daemon, tmp_path / "spool")])

    assert s3_server.read_ids(s3_bucket, "shards") == dict.fromkeys(range(1000), 1)
    shards = s3_server.shard_urls(s3_bucket, "shards")
    assert len(shards) == _metric(daemon, "tfrecordd_shards_published_total") >= 7
    assert s3_server.incomplete_uploads(s3_bucket) == []
    assert os.listdir(tmp_path / "state" / "staging" / "node-a") == []


@pytest.mark.anyio
async def test_two_nodes_share_one_prefix(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    runs = []
    for n, node in enumerate(["node-a", "node-b"]):
        root = tmp_path / node
        config = daemon_config(root, s3_server, s3_bucket, node)
        events = [movie_event(n * 1000 + i) for i in range(600)]
        spool_file(root / "spool", "a.jsonl", events[:300])
        spool_file(root / "spool", "b.jsonl", events[300:])
        runs.append((Daemon(config, handle_signals=False), root / "spool"))
    await _run_until_drained(runs)

    ids = s3_server.read_ids(s3_bucket, "shards")
    assert ids == dict.fromkeys([*range(600), *range(1000, 1600)], 1)
    names = [url.rpartition("/")[2] for url in s3_server.shard_urls(s3_bucket, "shards")]
    assert len(names) == len(set(names))
    assert any("-node-a-" in n for n in names)
    assert any("-node-b-" in n for n in names)


@pytest.mark.anyio
async def test_daemon_waits_out_an_outage_and_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tfrecordd")
    server = S3Server()
    server.start()
    try:
        bucket = server.create_bucket()
        # One connection attempt per request: the outage shows in our retries, not botocore's.
        quick = {"retries": {"max_attempts": 1}, "connect_timeout": 1}
        config = daemon_config(tmp_path, server, bucket, "node-a", config_kwargs=quick)
        daemon = Daemon(config, handle_signals=False)
        spool = tmp_path / "spool"
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            spool_file(spool, "a.jsonl", [movie_event(i) for i in range(200)])
            with anyio.fail_after(30):
                while not spool_drained(spool):
                    await anyio.sleep(0.05)
            server.stop()
            spool_file(spool, "b.jsonl", [movie_event(200 + i) for i in range(400)])
            with anyio.fail_after(30):
                while "retry" not in caplog.text:
                    await anyio.sleep(0.05)
            assert not spool_drained(spool), "nothing is acked while the store is down"
            await anyio.sleep(2)
            await anyio.to_thread.run_sync(server.start)
            with anyio.fail_after(120):
                while not spool_drained(spool):
                    await anyio.sleep(0.05)
            daemon.request_stop()

        assert server.read_ids(bucket, "shards") == dict.fromkeys(range(600), 1)
        assert SECRET_KEY not in caplog.text
    finally:
        server.stop()
