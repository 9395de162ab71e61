"""Open shards of a dataset: the cap on open shards, arrival-time folders, late records under
_late/, and state a crash leaves for a dataset."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support import (
    DaemonProcess,
    dataset_shards,
    example_int64,
    read_shard,
    run_clean_until,
    run_tfrecordd,
    spool_drained,
    spool_file,
    wait_for,
    write_datasets_config,
)

EVENTS = {
    "id": "int64",
    "type": "bytes",
    "ts": {"type": "int64", "time_unit": "ms"},
    "country": "bytes",
}


def _ids(out: Path) -> Counter[int]:
    return Counter(
        example_int64(r, "id")[0] for shard in dataset_shards(out) for r in read_shard(shard)
    )


def test_at_the_open_shard_cap_the_least_recently_written_is_published(tmp_path: Path) -> None:
    countries = ["de", "fr", "it", "es", "nl"]
    cfg = write_datasets_config(
        tmp_path,
        {
            "events": {
                "encoder": "events",
                "compression": "none",
                "max_open_shards": 2,
                "partition": {"fields": ["country"]},
            }
        },
        encoders={"events": EVENTS},
        sources=[{"name": "in", "dataset": "events"}],
        daemon={"max_batch_events": 10},
    )
    # Runs of ten events of one country each: a new country at each batch, five of them.
    events = [{"id": i, "country": countries[(i // 10) % 5], "ts": 0} for i in range(500)]
    spool_file(tmp_path / "in", "a.jsonl", events)
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "in"))
    out = tmp_path / "events"
    assert _ids(out) == Counter(range(500))
    shards = dataset_shards(out)
    # Each country's runs are cut into several shards by the cap, none empty, each of one
    # country: published to make room, never dropped.
    assert len(shards) > 5
    for shard in shards:
        ids = [example_int64(r, "id")[0] for r in read_shard(shard)]
        assert ids
        assert {countries[(i // 10) % 5] for i in ids} == {shard.parent.name.split("=")[1]}


def test_arrival_time_folders_are_the_hour_the_daemon_read_the_events(tmp_path: Path) -> None:
    cfg = write_datasets_config(
        tmp_path,
        {"events": {"encoder": "events", "partition": {"time": "arrival", "granularity": "day"}}},
        encoders={"events": EVENTS},
        sources=[{"name": "in", "dataset": "events"}],
    )
    before = datetime.now(UTC).date()
    spool_file(tmp_path / "in", "a.jsonl", [{"id": i} for i in range(50)])
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "in"))
    after = datetime.now(UTC).date()
    folders = {p.parent.name for p in dataset_shards(tmp_path / "events")}
    assert folders <= {f"dt={before.isoformat()}", f"dt={after.isoformat()}"}
    assert _ids(tmp_path / "events") == Counter(range(50))


def test_a_late_record_goes_under_late_never_into_a_marked_partition(tmp_path: Path) -> None:
    t0 = int(datetime(2026, 11, 25, tzinfo=UTC).timestamp())
    cfg = write_datasets_config(
        tmp_path,
        {
            "events": {
                "encoder": "events",
                "partition": {"time": "event", "time_field": "ts"},
                "completion": {"late": "late-partition", "idle_close": "1h"},
            }
        },
        encoders={"events": EVENTS},
        sources=[{"name": "in", "dataset": "events"}],
    )
    out = tmp_path / "events"
    spool_file(tmp_path / "in", "a.jsonl", [{"id": i, "ts": t0 + i * 600} for i in range(30)])
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        # Five hours: the first four close as the watermark passes them.
        wait_for(lambda: len(list(out.rglob("_SUCCESS"))) == 4, 30)
        spool_file(tmp_path / "in", "late.jsonl", [{"id": 100, "ts": t0 + 60}])
        wait_for(lambda: spool_drained(tmp_path / "in"), 30)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    marker = json.loads((out / "dt=2026-11-25/hour=00/_SUCCESS").read_bytes())
    assert marker["records"] == 6
    hour0 = [
        example_int64(r, "id")[0]
        for p in dataset_shards(out / "dt=2026-11-25/hour=00")
        for r in read_shard(p)
    ]
    assert sorted(hour0) == list(range(6))
    late = list((out / "_late" / "dt=2026-11-25" / "hour=00").glob("*.tfrecord.gz"))
    assert [example_int64(r, "id")[0] for p in late for r in read_shard(p)] == [100]
    # The late tree is no partition: dataset listings and markers leave it out.
    assert 100 not in _ids(out)


def test_state_of_a_dataset_no_longer_configured_stops_the_start(tmp_path: Path) -> None:
    datasets: dict[str, Any] = {
        "clicks": {"encoder": "events", "compression": "none", "max_shard_records": 20},
        "impressions": {"encoder": "events", "compression": "none"},
    }
    route = {"field": "type", "to": {"click": "clicks", "impression": "impressions"}}
    cfg = write_datasets_config(
        tmp_path,
        datasets,
        encoders={"events": EVENTS},
        sources=[{"name": "in", "route": route}],
        daemon={"max_batch_events": 10},
    )
    events = [{"id": i, "type": ("click", "impression")[i % 2]} for i in range(200)]
    spool_file(tmp_path / "in", "a.jsonl", events)
    # The first commit publishes a clicks shard and keeps the impressions shard open: killed
    # right after its intent, the impressions shard's prefix is journalled.
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": "after-intent"})
    try:
        assert d.wait(60) == 137, d.output()
    finally:
        d.kill()
    (tmp_path / "other").mkdir()
    without = write_datasets_config(
        tmp_path / "other",
        {"clicks": datasets["clicks"] | {"dir": tmp_path / "clicks"}},
        encoders={"events": EVENTS},
        sources=[{"name": "in", "dataset": "clicks", "path": tmp_path / "in"}],
        daemon={"state_dir": tmp_path / "state"},
    )
    refused = run_tfrecordd("run", "--config", str(without), timeout=60)
    assert refused.returncode == 78, refused.stderr
    assert "dataset 'impressions'" in refused.stderr
    # With the dataset back, the start finishes the commit: every event once, in its dataset.
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "in"))
    assert _ids(tmp_path / "clicks") == Counter(range(0, 200, 2))
    assert _ids(tmp_path / "impressions") == Counter(range(1, 200, 2))


def test_a_kill_with_shards_kept_open_loses_and_repeats_nothing(tmp_path: Path) -> None:
    route = {"field": "type", "to": {"click": "clicks"}, "default": "impressions"}
    cfg = write_datasets_config(
        tmp_path,
        {
            "clicks": {"encoder": "events", "compression": "zlib", "max_shard_records": 15},
            "impressions": {"encoder": "events", "compression": "zlib"},
        },
        encoders={"events": EVENTS},
        sources=[{"name": "in", "route": route}],
        daemon={"max_batch_events": 10},
    )
    # Each run is killed while the impressions shard is kept open by commits that published
    # clicks shards, with records written after the last: the next start finishes it at its
    # durable prefix and publishes it, and the rest replays.
    n = 0
    logs = []
    for point in ("after-ack:3", "mid-write:5", "after-fsync:2", "after-intent:4"):
        spool_file(
            tmp_path / "in",
            f"{n:04d}.jsonl",
            [{"id": i, "type": ("click", "view")[i % 2]} for i in range(n, n + 200)],
        )
        n += 200
        d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": point})
        try:
            assert d.wait(60) == 137, d.output()
        finally:
            d.kill()
        logs.append(d.output())
    logs.append(run_clean_until(cfg, lambda: spool_drained(tmp_path / "in")))
    assert _ids(tmp_path / "clicks") == Counter(range(0, n, 2))
    assert _ids(tmp_path / "impressions") == Counter(range(1, n, 2))
    finished = [int(m) for m in re.findall(r"(\d+) open shard\(s\) finished", "".join(logs))]
    assert max(finished) > 0, "a start finished a kept-open shard at its prefix"
