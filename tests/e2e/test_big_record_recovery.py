"""A record over the reader's default limit (256 MiB), written by a daemon killed before its
shard's manifest: the restart rebuilds the manifest from the shard and runs on. It used to read
the record back through the 256 MiB limit and exit 65 at every start."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support import DaemonProcess, run_clean_until, shard_files
from tfrecordd.format.framing import DEFAULT_MAX_RECORD_BYTES
from tfrecordd.format.reader import iter_records
from tfrecordd.format.wire import ExampleWriter, FeatureType
from tfrecordd.outputs import manifest

BIG = DEFAULT_MAX_RECORD_BYTES + 4096

CONFIG = """\
[daemon]
node_id = "test"
state_dir = "{root}/state"
drain_timeout = "60s"
[metrics]
enabled = false
[output]
dir = "{root}/shards"
compression = "none"
max_shard_age = "200ms"
min_free_bytes = 0
[[sources]]
name = "blobs"
type = "directory"
path = "{root}/spool"
pattern = "*.pb"
format = "whole-file"
max_file_bytes = "300MiB"
# One read: the source joins a whole file's chunks with bytes +=, quadratic in their count
# (two minutes for this file in 1 MiB reads).
read_size = "300MiB"
encoder = "ready"
poll_interval = "100ms"
[encoders.ready]
type = "passthrough"
"""


def test_a_big_record_then_a_crash_before_its_manifest_restarts_cleanly(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    cfg = tmp_path / "tfrecordd.toml"
    cfg.write_text(CONFIG.format(root=tmp_path))
    record = ExampleWriter([("blob", FeatureType.BYTES)]).encode([[bytes(BIG - 16)]])
    assert len(record) > DEFAULT_MAX_RECORD_BYTES
    (tmp_path / "spool" / ".big.tmp").write_bytes(record)
    os.replace(tmp_path / "spool" / ".big.tmp", tmp_path / "spool" / "big.pb")
    size = len(record)
    del record

    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": "after-publish"})
    assert d.wait(120) == 137, d.output()
    (shard,) = shard_files(tmp_path / "shards")
    manifest_path = tmp_path / "shards" / manifest.manifest_name(shard.name)
    assert not manifest_path.exists()

    # Restarted, the daemon rebuilds the manifest, acks the file and runs until stopped.
    log = run_clean_until(cfg, lambda: not list((tmp_path / "spool").glob("*.pb")), 120)
    assert "corrupted" not in log
    assert shard_files(tmp_path / "shards") == [shard]
    assert manifest_path.exists()
    assert manifest.check(str(shard), max_record_bytes=size) == []
    assert [len(r) for r in iter_records(shard, max_record_bytes=size)] == [size]
