"""Two datasets from one config, end to end, read back by real TensorFlow: one partitioned by event
hour in a zone with daylight saving and marked complete hour by hour, the other not; each hour
read with the schema `tfrecordd schema --dataset` prints."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.support import (
    DaemonProcess,
    dataset_shards,
    hour_folder,
    run_tfrecordd,
    spool_drained,
    spool_file,
    tf_features,
    wait_for,
    write_datasets_config,
)

BERLIN = ZoneInfo("Europe/Berlin")
CLICKS = {
    "id": "int64",
    "type": "bytes",
    "ts": {"type": "int64", "time_unit": "ms", "required": True},
    "url": "bytes",
    "scores": "float",
}
IMPRESSIONS = {"id": "int64", "type": "bytes", "slot": "int64"}


def _hour(seconds: int) -> str:
    return hour_folder(seconds, "Europe/Berlin")


def _values(tf: Any, value: Any) -> list[Any]:
    """A parsed feature's values, dense or sparse (optional features are VarLenFeatures)."""
    if isinstance(value, tf.sparse.SparseTensor):
        value = tf.sparse.to_dense(value)
    flat: list[Any] = value.numpy().reshape(-1).tolist()
    return flat


def _schema(cfg: Path, dataset: str) -> dict[str, Any]:
    done = run_tfrecordd("schema", "--config", str(cfg), "--dataset", dataset, "--format", "json")
    assert done.returncode == 0, done.stderr
    description: dict[str, Any] = json.loads(done.stdout)
    return description


@pytest.mark.tensorflow
def test_two_datasets_each_partition_read_by_tensorflow_with_its_printed_schema(
    tmp_path: Path,
) -> None:
    tf = pytest.importorskip("tensorflow")
    # From 00:00 CEST on the day clocks go back, for twelve hours: twelve folders, 02 twice.
    t0 = int(datetime.fromisoformat("2026-10-24T22:00:00+00:00").timestamp())
    events: list[dict[str, Any]] = [
        {
            "id": i,
            "type": ("click", "impression")[i % 2],
            "ts": t0 + i * 36,
            "url": f"https://example.org/{i}",
            "scores": [i / 10, 1.5],
            "slot": i % 5,
        }
        for i in range(1200)
    ]
    cfg = write_datasets_config(
        tmp_path,
        {
            "clicks": {
                "encoder": "clicks",
                "compression": "gzip",
                "max_shard_records": 40,
                "partition": {"time": "event", "time_field": "ts", "zone": "Europe/Berlin"},
                "completion": {"idle_close": "1s"},
            },
            "impressions": {"encoder": "impressions", "compression": "zlib"},
        },
        encoders={"clicks": CLICKS, "impressions": IMPRESSIONS},
        sources=[
            {
                "name": "events",
                "route": {"field": "type", "to": {"click": "clicks", "impression": "impressions"}},
            }
        ],
    )
    spool_file(tmp_path / "events", "a.jsonl", events)
    clicks = [e for e in events if e["type"] == "click"]
    hours = sorted({_hour(e["ts"]) for e in clicks})
    assert "dt=2026-10-25/hour=02" in hours
    assert "dt=2026-10-25/hour=02+0100" in hours
    assert len(hours) == 12
    out = tmp_path / "clicks"
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: len(list(out.rglob("_SUCCESS"))) == len(hours), 60)
        wait_for(lambda: spool_drained(tmp_path / "events"), 30)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()

    spec = tf_features(tf, _schema(cfg, "clicks"))
    for hour in hours:
        marker = json.loads((out / hour / "_SUCCESS").read_bytes())
        files = [str(out / hour / s["name"]) for s in marker["shards"]]
        # The marker lists exactly the shards of its partition.
        assert sorted(files) == [str(p) for p in dataset_shards(out / hour)]
        ds = tf.data.TFRecordDataset(files, compression_type="GZIP").map(
            lambda r: tf.io.parse_single_example(r, spec)
        )
        got = {_values(tf, ex["id"])[0]: ex for ex in ds}
        want = {e["id"]: e for e in clicks if _hour(e["ts"]) == hour}
        assert sorted(got) == sorted(want)
        assert marker["records"] == len(want)
        for i, ex in got.items():
            assert _values(tf, ex["ts"]) == [want[i]["ts"] * 1000]
            assert _values(tf, ex["url"]) == [want[i]["url"].encode()]
            assert _values(tf, ex["scores"]) == pytest.approx(want[i]["scores"])

    spec = tf_features(tf, _schema(cfg, "impressions"))
    files = [str(p) for p in dataset_shards(tmp_path / "impressions")]
    ds = tf.data.TFRecordDataset(files, compression_type="ZLIB").map(
        lambda r: tf.io.parse_single_example(r, spec)
    )
    got_ids = sorted(_values(tf, ex["id"])[0] for ex in ds)
    assert got_ids == [e["id"] for e in events if e["type"] == "impression"]
