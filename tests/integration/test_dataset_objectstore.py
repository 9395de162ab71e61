"""Datasets published to an object store: partition folders as key prefixes, completion markers
listing the uploaded shards, each dataset staged apart."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.s3_server import S3Server, running_s3
from tests.support import spool_drained, spool_file, write_datasets_config
from tfrecordd.config import load_config
from tfrecordd.format.reader import iter_examples
from tfrecordd.pipeline.runtime import Daemon

EVENTS = {"id": "int64", "type": "bytes", "ts": {"type": "int64", "time_unit": "s"}}
ROUTE = {"field": "type", "to": {"click": "clicks"}, "default": "views"}


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    yield from running_s3()


@pytest.mark.anyio
async def test_partitioned_datasets_with_markers_in_a_bucket(
    tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.create_bucket()
    options = s3_server.storage_options()
    t0 = int(datetime(2026, 11, 25, tzinfo=UTC).timestamp())
    cfg = write_datasets_config(
        tmp_path,
        {
            "clicks": {
                "encoder": "events",
                "dir": f"s3://{bucket}/clicks",
                "storage_options": options,
                "max_shard_records": 40,
                "partition": {"time": "event", "time_field": "ts"},
                "completion": {"idle_close": "1s"},
            },
            "views": {
                "encoder": "events",
                "dir": f"s3://{bucket}/views",
                "storage_options": options,
            },
        },
        encoders={"events": EVENTS},
        sources=[
            {
                "name": "in",
                "route": {"field": "type", "to": {"click": "clicks"}, "default": "views"},
            }
        ],
    )
    events: list[dict[str, Any]] = [
        {"id": i, "type": ("click", "view")[i % 2], "ts": t0 + i * 30} for i in range(600)
    ]
    spool_file(tmp_path / "in", "a.jsonl", events)
    config = load_config(cfg)
    daemon = Daemon(config, handle_signals=False)

    def markers() -> list[str]:
        return [k for k in s3_server.keys(bucket) if k.endswith("/_SUCCESS")]

    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        with anyio.fail_after(60):
            while not (spool_drained(tmp_path / "in") and len(markers()) == 5):
                await anyio.sleep(0.1)
        daemon.request_stop()
    # Staged apart: each dataset has a staging folder of its own.
    staging = tmp_path / "state" / "staging"
    assert sorted(p.name for p in staging.iterdir()) == ["clicks", "views"]
    by_hour: dict[str, list[int]] = {}
    for url in s3_server.shard_urls(bucket, "clicks"):
        folder = url.removeprefix(f"s3://{bucket}/clicks/").rpartition("/")[0]
        by_hour.setdefault(folder, []).extend(
            int(ex["id"][0]) for ex in iter_examples(url, storage_options=options)
        )
    expected: dict[str, list[int]] = {}
    for e in events:
        if e["type"] == "click":
            hour = datetime.fromtimestamp(e["ts"], UTC)
            folder = f"dt={hour.date().isoformat()}/hour={hour.hour:02d}"
            expected.setdefault(folder, []).append(e["id"])
    assert {k: sorted(v) for k, v in by_hour.items()} == expected
    client = s3_server.client()
    for key in markers():
        folder = key.removeprefix("clicks/").removesuffix("/_SUCCESS")
        doc = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        names = sorted(
            u.rpartition("/")[2]
            for u in s3_server.shard_urls(bucket, "clicks")
            if u.startswith(f"s3://{bucket}/clicks/{folder}/")
        )
        assert sorted(s["name"] for s in doc["shards"]) == names
        assert doc["records"] == len(expected[folder])
    assert s3_server.read_ids(bucket, "views") == Counter(range(1, 600, 2))
