"""The daemon's shards, read back by real TensorFlow; systemd's notify protocol spoken for real."""

from __future__ import annotations

import contextlib
import io
import socket
import time
import zlib
from pathlib import Path

import pytest

from tests.support import (
    DaemonProcess,
    movie_event,
    run_tfrecordd,
    shard_files,
    spool_file,
    wait_for,
    write_config,
)
from tfrecordd.format.compression import TF_COMPRESSION_TYPE, Compression
from tfrecordd.format.framing import iter_framed


@pytest.mark.tensorflow
@pytest.mark.parametrize("compression", ["none", "gzip", "zlib"])
def test_tensorflow_reads_every_event_the_daemon_wrote(tmp_path: Path, compression: str) -> None:
    tf = pytest.importorskip("tensorflow")
    cfg = write_config(tmp_path, output={"compression": compression, "max_shard_records": 70})
    events = [movie_event(i) for i in range(300)]
    spool_file(tmp_path / "spool", "a.jsonl", [*events[:150], "{bad json", *events[150:]])
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: not list((tmp_path / "spool").glob("*.jsonl")), 30)
        time.sleep(0.3)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    files = [str(p) for p in shard_files(tmp_path / "shards")]
    assert len(files) == 5
    spec = {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "user": tf.io.FixedLenFeature([], tf.string),
        "age": tf.io.FixedLenFeature([], tf.int64),
        "movie": tf.io.VarLenFeature(tf.string),
        "movie_ratings": tf.io.VarLenFeature(tf.float32),
        "suggestion": tf.io.FixedLenFeature([], tf.string),
        "suggestion_purchased": tf.io.FixedLenFeature([], tf.float32),
        "purchase_price": tf.io.FixedLenFeature([], tf.float32),
    }
    kind = TF_COMPRESSION_TYPE[Compression(compression)]
    ds = tf.data.TFRecordDataset(files, compression_type=kind).map(
        lambda r: tf.io.parse_single_example(r, spec)
    )
    got = {}
    for ex in ds:
        got[int(ex["id"])] = ex
    assert sorted(got) == list(range(300))
    for i in (0, 149, 150, 299):
        ex, want = got[i], events[i]
        assert ex["user"].numpy().decode() == want["user"]
        assert int(ex["age"]) == want["age"]
        assert [m.decode() for m in ex["movie"].values.numpy()] == want["movie"]
        assert ex["movie_ratings"].values.numpy().tolist() == want["movie_ratings"]
        assert float(ex["purchase_price"]) == pytest.approx(want["purchase_price"])


def _records_per_gzip_member(data: bytes) -> list[int]:
    counts = []
    while data:
        member = zlib.decompressobj(31)
        raw = member.decompress(data)
        counts.append(sum(1 for _ in iter_framed(io.BytesIO(raw), "member")))
        data = member.unused_data
    return counts


# A daemon per case: the format for each compression is proven in-process by
# test_tf_interop_files (packed units then a running unit); the default suite runs the daemon
# for gzip (its members counted) with workers and without, the rest with --run-slow.
@pytest.mark.tensorflow
@pytest.mark.parametrize(
    ("compression", "workers"),
    [
        ("gzip", 1),
        ("gzip", 2),
        pytest.param("none", 1, marks=pytest.mark.slow),
        pytest.param("none", 2, marks=pytest.mark.slow),
        pytest.param("zlib", 1, marks=pytest.mark.slow),
        pytest.param("zlib", 2, marks=pytest.mark.slow),
    ],
)
def test_tensorflow_reads_shards_of_packed_and_running_units(
    tmp_path: Path, compression: str, workers: int
) -> None:
    # Large batches are compressed where they are encoded, small ones held by the shard and
    # compressed as a unit of their own; one shard holds both kinds, in order, and TensorFlow
    # reads it as one stream.
    tf = pytest.importorskip("tensorflow")
    cfg = write_config(
        tmp_path,
        output={"compression": compression, "manifests": True},
        daemon={"encode_workers": workers, "max_batch_events": 1000},
    )
    big = [movie_event(i) for i in range(2500)]  # batches of 1000 events: ~200 KiB, packed
    small = [movie_event(i) for i in range(2500, 2510)]  # one batch of 2 KiB: not packed
    spool_file(tmp_path / "spool", "a.jsonl", big)
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: not list((tmp_path / "spool").glob("*.jsonl")), 60)
        spool_file(tmp_path / "spool", "b.jsonl", small)
        wait_for(lambda: not list((tmp_path / "spool").glob("*.jsonl")), 30)
        time.sleep(0.3)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    files = [str(p) for p in shard_files(tmp_path / "shards")]
    assert len(files) == 1
    kind = TF_COMPRESSION_TYPE[Compression(compression)]
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    ds = tf.data.TFRecordDataset(files, compression_type=kind).map(
        lambda r: tf.io.parse_single_example(r, spec)
    )
    assert [int(ex["id"]) for ex in ds] == list(range(2510))
    if compression == "gzip":
        # Members: the three packed batches (1000, 1000, 500 events), then the running unit.
        assert _records_per_gzip_member(Path(files[0]).read_bytes()) == [1000, 1000, 500, 10]
    result = run_tfrecordd("verify", *files, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_systemd_notifications(tmp_path: Path) -> None:
    sock_path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(sock_path)
        sock.settimeout(0.2)
        cfg = write_config(tmp_path)
        env = {"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "400000"}
        d = DaemonProcess(cfg, env=env)
        messages: list[str] = []

        def receive_until(needle: str) -> bool:
            with contextlib.suppress(TimeoutError):
                messages.append(sock.recv(4096).decode())
            return any(needle in m for m in messages)

        try:
            wait_for(lambda: receive_until("READY=1"), 30)
            wait_for(lambda: receive_until("WATCHDOG=1"), 10)
            d.signal(15)
            wait_for(lambda: receive_until("STOPPING=1"), 10)
            assert d.wait(30) == 0
        finally:
            d.kill()
    ready = next(m for m in messages if "READY=1" in m)
    assert "STATUS=" in ready
