"""Several datasets in one daemon: each event to its dataset (by source, or routed by a field),
one schema per shard, and exactly once while several shards are open at once."""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.support import (
    DaemonProcess,
    dataset_shards,
    dead_letters,
    example_int64,
    hour_folder,
    read_shard,
    run_clean_until,
    spool_drained,
    spool_file,
    wait_for,
    write_config,
    write_datasets_config,
)
from tfrecordd.config import load_config
from tfrecordd.errors import ConfigError
from tfrecordd.outputs.manifest import manifest_name

CLICKS = {"id": "int64", "type": "bytes", "url": "bytes"}
IMPRESSIONS = {"id": "int64", "type": "bytes", "slot": "int64"}
ROUTE = {"field": "type", "to": {"click": "clicks", "impression": "impressions"}}


def _event(i: int) -> dict[str, Any]:
    kind = ("click", "impression", "other")[i % 3]
    return {"id": i, "type": kind, "url": f"https://x/{i}", "slot": i % 7}


def _ids_by_shard(out: Path) -> dict[Path, list[int]]:
    return {
        shard: [example_int64(r, "id")[0] for r in read_shard(shard)]
        for shard in dataset_shards(out)
    }


def _features(record: bytes) -> set[str]:
    from tfrecordd.format.proto import Example

    example = Example()
    example.ParseFromString(record)
    return set(example.features.feature)


def _config(tmp_path: Path, **route: Any) -> Path:
    return write_datasets_config(
        tmp_path,
        {
            "clicks": {"encoder": "clicks", "compression": "none"},
            "impressions": {"encoder": "impressions", "compression": "gzip"},
        },
        encoders={"clicks": CLICKS, "impressions": IMPRESSIONS},
        sources=[{"name": "events", "route": ROUTE | route}],
    )


def test_a_routed_source_writes_each_event_to_its_dataset_alone(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    spool_file(tmp_path / "events", "a.jsonl", [_event(i) for i in range(900)])
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "events"))
    clicks = _ids_by_shard(tmp_path / "clicks")
    impressions = _ids_by_shard(tmp_path / "impressions")
    assert Counter(i for ids in clicks.values() for i in ids) == Counter(range(0, 900, 3))
    assert Counter(i for ids in impressions.values() for i in ids) == Counter(range(1, 900, 3))
    # One schema per shard: every record of a dataset has that dataset's features.
    for shard in clicks:
        assert {frozenset(_features(r)) for r in read_shard(shard)} == {frozenset(CLICKS)}
    for shard in impressions:
        assert shard.name.endswith(".tfrecord.gz")
        assert {frozenset(_features(r)) for r in read_shard(shard)} == {frozenset(IMPRESSIONS)}
    # An event whose value no route names (and no default) is dead-lettered, with the reason.
    routed_away = dead_letters(tmp_path / "state")
    assert sorted(json.loads(d["raw"])["id"] for d in routed_away) == list(range(2, 900, 3))
    assert {d["reason"] for d in routed_away} == {"route"}
    # The manifests name their dataset.
    for out, name in ((tmp_path / "clicks", "clicks"), (tmp_path / "impressions", "impressions")):
        manifests = [json.loads(p.read_bytes()) for p in out.glob("*.manifest.json")]
        assert manifests
        assert {m["dataset"] for m in manifests} == {name}
        assert {m["partition"] for m in manifests} == {""}


def test_a_route_default_takes_the_values_no_route_names(tmp_path: Path) -> None:
    cfg = _config(tmp_path, default="clicks")
    lines: list[Any] = [_event(i) for i in range(30)]
    lines += ['{"id": 100, "url": "no type"}', '{"id": 101, "type": [1], "url": "a list"}']
    spool_file(tmp_path / "events", "a.jsonl", lines)
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "events"))
    clicks = sorted(i for ids in _ids_by_shard(tmp_path / "clicks").values() for i in ids)
    assert clicks == sorted([*range(0, 30, 3), *range(2, 30, 3), 100])
    # 101 went to the default too, whose schema refuses a list for "type".
    (letter,) = dead_letters(tmp_path / "state")
    assert (json.loads(letter["raw"])["id"], letter["reason"]) == (101, "schema")


def test_a_dataset_whose_shards_stay_open_is_not_cut_small_by_another(tmp_path: Path) -> None:
    # clicks rotate every 50 records; impressions take all their records into one shard that
    # stays open across those commits, made durable at each, and is published once, at the end.
    cfg = write_datasets_config(
        tmp_path,
        {
            "clicks": {"encoder": "clicks", "compression": "none", "max_shard_records": 50},
            "impressions": {
                "encoder": "impressions",
                "compression": "zlib",
                "max_shard_age": "10m",
            },
        },
        encoders={"clicks": CLICKS, "impressions": IMPRESSIONS},
        sources=[{"name": "events", "route": ROUTE | {"default": "impressions"}}],
        daemon={"max_batch_events": 30},
    )
    spool_file(tmp_path / "events", "a.jsonl", [_event(i) for i in range(1500)])
    # The last click is in the tenth clicks shard: every line was read once it is published.
    # The stop publishes the impressions shard; until then its batches are not acknowledged.
    log = run_clean_until(cfg, lambda: len(dataset_shards(tmp_path / "clicks")) == 10)
    clicks = _ids_by_shard(tmp_path / "clicks")
    impressions = _ids_by_shard(tmp_path / "impressions")
    assert len(clicks) == 10
    assert len(impressions) == 1
    assert sorted(i for ids in clicks.values() for i in ids) == list(range(0, 1500, 3))
    expected = sorted(i for i in range(1500) if i % 3)
    assert sorted(i for ids in impressions.values() for i in ids) == expected
    assert spool_drained(tmp_path / "events")
    assert "published" in log


def test_a_source_names_its_dataset(tmp_path: Path) -> None:
    cfg = write_datasets_config(
        tmp_path,
        {"clicks": {"encoder": "clicks"}, "impressions": {"encoder": "impressions"}},
        encoders={"clicks": CLICKS, "impressions": IMPRESSIONS},
        sources=[
            {"name": "c", "dataset": "clicks"},
            {"name": "i", "dataset": "impressions"},
        ],
    )
    spool_file(tmp_path / "c", "a.jsonl", [_event(i) for i in range(0, 60, 3)])
    spool_file(tmp_path / "i", "a.jsonl", [_event(i) for i in range(1, 60, 3)])
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "c") and spool_drained(tmp_path / "i"))
    clicks = _ids_by_shard(tmp_path / "clicks")
    assert sorted(i for ids in clicks.values() for i in ids) == list(range(0, 60, 3))
    impressions = _ids_by_shard(tmp_path / "impressions")
    assert sorted(i for ids in impressions.values() for i in ids) == list(range(1, 60, 3))


def _errors(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return caught.value.errors


def test_an_old_config_with_two_encoders_is_refused_not_mixed(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    text = cfg.read_text()
    text += '[[sources]]\nname = "more"\ntype = "directory"\n'
    text += f'path = "{tmp_path / "more"}"\nencoder = "other"\n'
    text += '[encoders.other]\ntype = "example"\n[encoders.other.features]\nx = "int64"\n'
    cfg.write_text(text)
    (errors,) = _errors(cfg)
    assert "would mix the records of several encoders" in errors
    assert "[datasets.NAME]" in errors


def test_an_old_config_is_one_dataset_named_after_its_encoder(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    assert list(config.datasets) == ["movies"]
    assert config.datasets["movies"].dir == str(tmp_path / "shards")
    assert config.datasets["movies"].compression == "gzip"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"sources": [{"name": "s", "dataset": "nope"}]}, "no [datasets.nope] table"),
        ({"sources": [{"name": "s", "encoder": "clicks"}]}, "names its dataset"),
        ({"sources": [{"name": "s"}]}, "set either `dataset"),
        (
            {"sources": [{"name": "s", "route": {"field": "t", "to": {"a": "gone"}}}]},
            "no [datasets.gone] table",
        ),
        ({"datasets": {"clicks": {"encoder": "missing"}}}, "no [encoders.missing] table"),
        (
            {
                "datasets": {
                    "clicks": {"encoder": "clicks", "dir": "s3://b/x"},
                    "more": {"encoder": "clicks", "dir": "s3://b/x/"},
                }
            },
            "is the same location as datasets.clicks.dir",
        ),
        (
            {
                "datasets": {
                    "clicks": {"encoder": "clicks", "dir": "s3://b/x"},
                    "more": {"encoder": "clicks", "dir": "s3://b/x/inner"},
                }
            },
            "datasets.more.dir: is inside datasets.clicks.dir",
        ),
        (
            {
                "datasets": {
                    "clicks": {"encoder": "clicks", "partition": {"fields": ["hour"]}},
                }
            },
            "the time folders' own key",
        ),
        (
            {"datasets": {"clicks": {"encoder": "clicks", "partition": {"time": "event"}}}},
            "needs time_field",
        ),
        (
            {
                "datasets": {
                    "clicks": {
                        "encoder": "clicks",
                        "partition": {"time": "event", "time_field": "id"},
                    }
                }
            },
            "must be an int64 feature with time_unit, or a bytes feature",
        ),
        (
            {
                "datasets": {
                    "clicks": {
                        "encoder": "clicks",
                        "partition": {"time": "arrival", "zone": "Mars/Olympus"},
                    }
                }
            },
            "unknown IANA time zone",
        ),
    ],
)
def test_dataset_config_errors_say_what_to_write(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    datasets: dict[str, Any] = {"clicks": {"encoder": "clicks"}}
    datasets |= change.get("datasets", {})
    cfg = write_datasets_config(
        tmp_path,
        datasets,
        encoders={"clicks": CLICKS | {"url": "bytes"}},
        sources=change.get("sources", [{"name": "s", "dataset": "clicks"}]),
    )
    errors = _errors(cfg)
    assert any(expected in e for e in errors), errors


# -- partitions ---------------------------------------------------------------------------------

BERLIN = ZoneInfo("Europe/Berlin")
EVENTS = {"id": "int64", "ts": {"type": "int64", "time_unit": "ms"}, "country": "bytes"}


def _berlin_hour(seconds: int) -> str:
    return hour_folder(seconds, "Europe/Berlin")


@pytest.mark.parametrize(
    "start",
    [
        pytest.param("2026-10-24T22:00:00+00:00", id="clocks-go-back"),
        pytest.param("2026-03-28T23:00:00+00:00", id="clocks-go-forward"),
    ],
)
def test_event_time_folders_across_a_daylight_saving_change(tmp_path: Path, start: str) -> None:
    # A JSON number is seconds since the epoch (written as milliseconds: time_unit).
    t0 = int(datetime.fromisoformat(start).timestamp())
    events: list[dict[str, Any]] = [
        {"id": i, "ts": t0 + i * 60, "country": ("de", "fr", "../x")[i % 3]} for i in range(360)
    ]
    cfg = write_datasets_config(
        tmp_path,
        {
            "events": {
                "encoder": "events",
                "compression": "gzip",
                "partition": {
                    "time": "event",
                    "time_field": "ts",
                    "zone": "Europe/Berlin",
                    "fields": ["country"],
                },
            }
        },
        encoders={"events": EVENTS},
        sources=[{"name": "in", "dataset": "events"}],
    )
    spool_file(tmp_path / "in", "a.jsonl", events)
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "in"))
    expected: dict[str, list[int]] = {}
    for e in events:
        country = e["country"] if e["country"] != "../x" else "_other"
        folder = f"{_berlin_hour(e['ts'])}/country={country}"
        expected.setdefault(folder, []).append(e["id"])
    found: dict[str, list[int]] = {}
    for shard, ids in _ids_by_shard(tmp_path / "events").items():
        folder = str(shard.parent.relative_to(tmp_path / "events"))
        found.setdefault(folder, []).extend(ids)
        doc = json.loads(shard.with_name(manifest_name(shard.name)).read_bytes())
        assert (doc["dataset"], doc["partition"]) == ("events", folder)
        lo, hi = doc["event_time_range"]
        assert lo <= hi
        assert all(lo <= events[i]["ts"] <= hi for i in ids)
    assert {k: sorted(v) for k, v in found.items()} == expected
    hours = {f.rsplit("/", 1)[0] for f in expected}
    # Six hours of events: six folders, whatever the clocks did.
    assert len(hours) == 6


# -- completion markers -------------------------------------------------------------------------


def _markers(out: Path, name: str = "_SUCCESS") -> dict[str, dict[str, Any]]:
    return {
        str(p.parent.relative_to(out)): json.loads(p.read_bytes())
        for p in out.rglob(name)
        if "_late" not in p.parts
    }


def test_closed_partitions_get_markers_that_list_exactly_their_shards(tmp_path: Path) -> None:
    t0 = int(datetime.fromisoformat("2026-10-24T22:00:00+00:00").timestamp())
    events: list[dict[str, Any]] = [
        {"id": i, "type": ("click", "impression")[i % 2], "ts": t0 + i * 30, "country": "de"}
        for i in range(480)
    ]
    cfg = write_datasets_config(
        tmp_path,
        {
            "clicks": {
                "encoder": "clicks",
                "max_shard_records": 25,
                "partition": {"time": "event", "time_field": "ts", "zone": "Europe/Berlin"},
                "completion": {"idle_close": "2s"},
            },
            "impressions": {"encoder": "impressions"},
        },
        encoders={"clicks": EVENTS | {"type": "bytes"}, "impressions": IMPRESSIONS},
        sources=[{"name": "events", "route": ROUTE}],
    )
    spool_file(tmp_path / "events", "a.jsonl", events)
    out = tmp_path / "clicks"
    # Four hours of clicks: the first three close as the watermark passes them, the last when
    # no event has come for idle_close.
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: len(_markers(out)) == 4, 60)
        # A click of the first hour, after its marker: late, dead-lettered.
        spool_file(tmp_path / "events", "late.jsonl", [events[0] | {"id": 1000}])
        wait_for(lambda: spool_drained(tmp_path / "events"), 30)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    markers = _markers(out)
    expected = {_berlin_hour(e["ts"]) for e in events if e["type"] == "click"}
    assert set(markers) == expected
    for folder, marker in markers.items():
        shards = sorted(p for p in dataset_shards(out / folder))
        listed = {s["name"]: s for s in marker["shards"]}
        assert sorted(listed) == [str(p.relative_to(out / folder)) for p in shards]
        ids = []
        for p in shards:
            records = read_shard(p)
            ids += [example_int64(r, "id")[0] for r in records]
            doc = listed[str(p.relative_to(out / folder))]
            assert doc["records"] == len(records)
            assert doc["size"] == p.stat().st_size
            assert doc["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
        assert marker["records"] == len(ids)
        assert sorted(ids) == sorted(
            e["id"] for e in events if e["type"] == "click" and _berlin_hour(e["ts"]) == folder
        )
        assert (marker["dataset"], marker["partition"]) == ("clicks", folder)
        assert marker["start"] < marker["end"] <= marker["watermark"]
    (late,) = dead_letters(tmp_path / "state")
    assert late["reason"] == "late"
    assert example_int64(base64.b64decode(late["raw_base64"]), "id") == [1000]
