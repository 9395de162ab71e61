"""The commands on a config's datasets: ``schema --dataset``, ``verify``/``cat``/``transcode`` on
a dataset's published shards (by ``--config``, or its directory) with its completion markers
checked, and ``status`` per dataset; on the output of a real daemon run."""

from __future__ import annotations

import json
import shutil
import socket
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    DaemonProcess,
    dataset_shards,
    dead_letters,
    example_int64,
    free_port,
    read_shard,
    run_tfrecordd,
    spool_drained,
    spool_file,
    wait_for,
    write_datasets_config,
)
from tfrecordd.cli.describe import describe_encoder
from tfrecordd.config import load_config
from tfrecordd.errors import EXIT_DATA, EXIT_OK, EXIT_USAGE
from tfrecordd.format.reader import iter_records

TIME = {"type": "int64", "time_unit": "ms"}
CLICKS = {"id": "int64", "ts": TIME, "country": "bytes"}
IMPRESSIONS = {"id": "int64", "ts": TIME, "slot": {"type": "int64", "required": True, "shape": []}}
ROUTE = {"field": "type", "to": {"click": "clicks", "impression": "impressions"}}
T0 = int(datetime(2024, 3, 1, 22, tzinfo=UTC).timestamp())
HOURS = ["dt=2024-03-01/hour=22", "dt=2024-03-01/hour=23", "dt=2024-03-02/hour=00"]


def _event(i: int) -> dict[str, Any]:
    kind = ("click", "impression")[i % 2]
    return {"id": i, "type": kind, "ts": T0 + i * 45, "country": ("de", "fr")[i // 2 % 2]} | (
        {"slot": i % 5} if kind == "impression" else {}
    )


EVENTS = [_event(i) for i in range(240)]
CLICK_IDS = [e["id"] for e in EVENTS if e["type"] == "click"]


def _hour(e: dict[str, Any]) -> str:
    return datetime.fromtimestamp(e["ts"], UTC).strftime("dt=%Y-%m-%d/hour=%H")


def _config(root: Path, metrics_port: int | None = None) -> Path:
    path = write_datasets_config(
        root,
        {
            "clicks": {
                "encoder": "clicks",
                "max_shard_records": 20,
                "partition": {"time": "event", "time_field": "ts", "fields": ["country"]},
                "completion": {"idle_close": "2s"},
            },
            "impressions": {"encoder": "impressions", "compression": "zstd"},
        },
        encoders={"clicks": CLICKS, "impressions": IMPRESSIONS},
        sources=[{"name": "events", "route": ROUTE}],
    )
    if metrics_port is not None:
        text = path.read_text()
        listen = f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n'
        path.write_text(text.replace("[metrics]\nenabled = false\n", listen))
    return path


def _markers(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("_SUCCESS") if "_late" not in p.parts)


@dataclass(frozen=True)
class Run:
    """A daemon's output, and what ``status`` said while it ran."""

    root: Path
    config: Path
    status_json: dict[str, Any]
    status_text: str


def _answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One daemon run: three hours of clicks (each hour marked complete), impressions, then a
    click late for the first hour; ``status`` is asked while the daemon runs."""
    root = tmp_path_factory.mktemp("datasets")
    port = free_port()
    config = _config(root, port)
    spool_file(root / "events", "a.jsonl", EVENTS)
    d = DaemonProcess(config)
    try:
        d.wait_started()
        wait_for(lambda: len(_markers(root / "clicks")) == 3, 60)
        spool_file(root / "events", "late.jsonl", [EVENTS[0] | {"id": 1000}])
        wait_for(lambda: spool_drained(root / "events") and dead_letters(root / "state"), 30)
        wait_for(lambda: _answers(port), 10)
        url = f"http://127.0.0.1:{port}/metrics"
        as_json = run_tfrecordd("status", "--url", url, "--once", "--interval", "0", "--json")
        as_text = run_tfrecordd("status", "--url", url, "--once", "--interval", "0")
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    assert as_json.returncode == EXIT_OK, as_json.stderr
    assert as_text.returncode == EXIT_OK, as_text.stderr
    return Run(root, config, json.loads(as_json.stdout), as_text.stdout)


def _copy(run: Run, tmp_path: Path) -> Path:
    """The run's clicks dataset, copied to be damaged."""
    return Path(shutil.copytree(run.root / "clicks", tmp_path / "clicks"))


def _ids(stdout: str) -> list[int]:
    return sorted(json.loads(line)["id"][0] for line in stdout.splitlines())


# -- schema -------------------------------------------------------------------------------------


def test_schema_describes_a_dataset_and_names_them_when_several(tmp_path: Path) -> None:
    config = _config(tmp_path)
    result = run_tfrecordd("schema", "--config", str(config), "--dataset", "impressions")
    assert result.returncode == EXIT_OK, result.stderr
    assert result.stdout.splitlines()[2] == (
        "# dataset 'impressions', encoder 'impressions' (type 'example'): "
        "tf.io.parse_example(serialized, features)"
    )
    assert "    'slot': tf.io.FixedLenFeature(shape=[], dtype=tf.int64),\n" in result.stdout
    as_json = run_tfrecordd("schema", "-c", str(config), "--dataset", "clicks", "--format", "json")
    assert as_json.returncode == EXIT_OK, as_json.stderr
    encoders = load_config(config).encoders
    assert json.loads(as_json.stdout) == describe_encoder("clicks", encoders["clicks"])
    by_encoder = run_tfrecordd("schema", "-c", str(config), "--encoder", "clicks")
    assert by_encoder.returncode == EXIT_OK, "--encoder keeps working"
    assert "# encoder 'clicks' (type 'example')" in by_encoder.stdout

    neither = run_tfrecordd("schema", "--config", str(config))
    assert (neither.returncode, neither.stdout) == (EXIT_USAGE, "")
    assert neither.stderr == (
        f"tfrecordd: {config}: 2 datasets, choose one with --dataset: clicks, impressions\n"
    )


# -- verify -------------------------------------------------------------------------------------


def test_verify_a_dataset_checks_its_shards_and_markers(ran: Run) -> None:
    out = ran.root / "clicks"
    shards = dataset_shards(out)
    result = run_tfrecordd("verify", "--config", str(ran.config), "--dataset", "clicks")
    assert result.returncode == EXIT_OK, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for shard in shards:
        assert f"OK   {shard}: {len(read_shard(shard))} records" in lines
    for marker in _markers(out):
        doc = json.loads(marker.read_bytes())
        count = len(doc["shards"])
        assert f"OK   {marker}: {count} shards, {doc['records']} records, as in the partition" in (
            lines
        )
    assert lines[-1] == (
        f"total: {len(CLICK_IDS)} records in {len(shards)} files, 0 bad; "
        "3 completion markers, 0 bad"
    )
    assert sum("_SUCCESS: " in line for line in lines) == 3
    assert not any(".manifest.json" in line or "/.unpublished/" in line for line in lines)

    by_dir = run_tfrecordd("verify", str(out))
    assert by_dir.returncode == EXIT_OK, by_dir.stdout + by_dir.stderr
    assert by_dir.stdout == result.stdout, "a dataset's directory is the dataset"

    as_json = run_tfrecordd("verify", "--json", "-c", str(ran.config), "--dataset", "clicks")
    doc = json.loads(as_json.stdout)
    assert (as_json.returncode, doc["ok"], doc["bad_markers"]) == (EXIT_OK, True, 0)
    assert [m["partition"] for m in doc["markers"]] == HOURS
    assert all(m["ok"] and m["problems"] == [] for m in doc["markers"])
    assert sum(m["records"] for m in doc["markers"]) == len(CLICK_IDS)


def test_verify_with_several_datasets_asks_which(ran: Run) -> None:
    result = run_tfrecordd("verify", "--config", str(ran.config))
    assert (result.returncode, result.stdout) == (EXIT_USAGE, "")
    assert "2 datasets, choose one with --dataset: clicks, impressions" in result.stderr
    unpartitioned = run_tfrecordd("verify", "-c", str(ran.config), "--dataset", "impressions")
    assert unpartitioned.returncode == EXIT_OK, unpartitioned.stdout + unpartitioned.stderr
    impressions = len(EVENTS) - len(CLICK_IDS)
    assert unpartitioned.stdout.splitlines()[-1].startswith(f"total: {impressions} records in ")
    assert "completion marker" not in unpartitioned.stdout


def test_verify_reports_each_marker_that_does_not_match_its_partition(
    ran: Run, tmp_path: Path
) -> None:
    out = _copy(ran, tmp_path)
    first, second, third = (out / hour for hour in HOURS)
    gone = sorted(first.rglob("part-*.tfrecord.gz"))[0]
    gone.unlink()
    extra = sorted(second.rglob("part-*.tfrecord.gz"))[0]
    unlisted = extra.with_name("part-extra.tfrecord.gz")
    shutil.copyfile(extra, unlisted)
    grown = sorted(third.rglob("part-*.tfrecord.gz"))[0]
    with grown.open("ab") as f:
        f.write(grown.read_bytes())  # a second gzip member: still sound, but not what was listed
    result = run_tfrecordd("verify", str(out), "--no-manifest")
    assert result.returncode == EXIT_DATA, result.stdout + result.stderr
    bad = [line for line in result.stdout.splitlines() if line.startswith("BAD  ")]
    name = str(gone.relative_to(first))
    assert bad == [
        f"BAD  {first / '_SUCCESS'}: {name}: listed in _SUCCESS but missing",
        f"BAD  {second / '_SUCCESS'}: {unlisted.relative_to(second)}: in the folder but not "
        "listed in _SUCCESS",
        f"BAD  {third / '_SUCCESS'}: {grown.relative_to(third)}: size "
        f"{grown.stat().st_size}, _SUCCESS says {grown.stat().st_size // 2}",
        bad[3],
    ]
    assert bad[3].startswith(f"BAD  {third / '_SUCCESS'}: {grown.relative_to(third)}: SHA-256 ")
    assert result.stdout.splitlines()[-1].endswith("; 3 completion markers, 3 bad")


def test_verify_reports_a_marker_that_does_not_read(ran: Run, tmp_path: Path) -> None:
    out = _copy(ran, tmp_path)
    (out / HOURS[1] / "_SUCCESS").write_text("{not json")
    result = run_tfrecordd("verify", "--json", str(out))
    assert result.returncode == EXIT_DATA, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["ok"] is False
    assert [m["ok"] for m in doc["markers"]] == [True, False, True]
    assert "the completion marker is not JSON" in doc["markers"][1]["problems"][0]
    assert len(doc["listing_errors"]) == 1, "its shards cannot be listed, and verify says so"


def test_verify_a_partition_of_a_dataset(ran: Run) -> None:
    result = run_tfrecordd(
        "verify", "-c", str(ran.config), "--dataset", "clicks", "--partition", "dt=*/hour=23"
    )
    assert result.returncode == EXIT_OK, result.stdout + result.stderr
    expected = sum(1 for e in EVENTS if e["type"] == "click" and _hour(e) == HOURS[1])
    assert result.stdout.splitlines()[-1].startswith(f"total: {expected} records in ")
    assert result.stdout.splitlines()[-1].endswith("; 1 completion marker, 0 bad")
    assert all(HOURS[1] in line for line in result.stdout.splitlines()[:-1])


def test_verify_reads_the_late_shards_that_cat_leaves_out(ran: Run, tmp_path: Path) -> None:
    """Late shards sit under _late/<partition>/: published data that verify checks; readers
    (and cat, like list_shards) leave them out unless asked."""
    out = _copy(ran, tmp_path)
    late = out / "_late" / HOURS[0] / "part-late.tfrecord.gz"
    late.parent.mkdir(parents=True)
    shutil.copyfile(next((out / HOURS[0]).rglob("part-*.tfrecord.gz")), late)
    result = run_tfrecordd("verify", str(out))
    assert result.returncode == EXIT_OK, result.stdout + result.stderr
    assert f"OK   {late}: 20 records" in result.stdout.splitlines()
    assert result.stdout.splitlines()[-1].endswith("0 bad; 3 completion markers, 0 bad")
    cat = run_tfrecordd("cat", "--json", str(out))
    assert str(late) not in cat.stdout
    assert len(cat.stdout.splitlines()) == len(CLICK_IDS)


# -- cat and transcode --------------------------------------------------------------------------


def test_cat_a_dataset_its_partitions_and_its_completed_shards(ran: Run) -> None:
    cfg = ("-c", str(ran.config), "--dataset", "clicks")
    whole = run_tfrecordd("cat", *cfg)
    assert whole.returncode == EXIT_OK, whole.stderr
    assert _ids(whole.stdout) == sorted(CLICK_IDS)
    completed = run_tfrecordd("cat", *cfg, "--completed")
    assert _ids(completed.stdout) == sorted(CLICK_IDS), "every hour is complete"
    hour = run_tfrecordd("cat", *cfg, "--partition", HOURS[0], "--partition", HOURS[2])
    assert _ids(hour.stdout) == sorted(
        e["id"] for e in EVENTS if e["type"] == "click" and _hour(e) in (HOURS[0], HOURS[2])
    )
    fr = "dt=*/hour=*/country=fr"
    country = run_tfrecordd("cat", str(ran.root / "clicks"), "--partition", fr)
    assert _ids(country.stdout) == sorted(
        e["id"] for e in EVENTS if e["type"] == "click" and e["country"] == "fr"
    )
    none = run_tfrecordd("cat", *cfg, "--partition", "dt=1999-*")
    assert none.returncode == 66
    assert none.stderr == (
        f"tfrecordd: {ran.root / 'clicks'}: no published shard in partitions dt=1999-*\n"
    )


def test_transcode_a_dataset_keeps_its_partition_folders(ran: Run, tmp_path: Path) -> None:
    out = tmp_path / "zst"
    out.mkdir()
    result = run_tfrecordd(
        "transcode", "-c", str(ran.config), "--dataset", "clicks", "--to", "zstd", "--out", str(out)
    )
    assert result.returncode == EXIT_OK, result.stderr
    sources = dataset_shards(ran.root / "clicks")
    copies = dataset_shards(out)
    assert [p.relative_to(out).parent for p in copies] == [
        p.relative_to(ran.root / "clicks").parent for p in sources
    ]
    for src, dst in zip(sources, copies, strict=True):
        assert dst.name == src.name.replace(".tfrecord.gz", ".tfrecord.zst")
        assert list(iter_records(dst)) == read_shard(src)
    again = run_tfrecordd("verify", str(out))
    assert again.returncode == EXIT_OK, again.stdout
    assert "completion marker" not in again.stdout, "markers are the daemon's, not copied"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cat"], "give shard PATHs, or --config FILE [--dataset NAME]"),
        (["cat", "x.tfrecord", "--config", "c.toml"], "give shard PATHs or --config FILE, not"),
        (["verify", "--dataset", "clicks", "x.tfrecord"], "--dataset NAME needs --config FILE"),
        (["verify", "x.tfrecord", "--completed"], "give --config FILE or a dataset directory"),
        (["transcode", "--to", "gzip", "--out", "."], "give shard PATHs, or --config FILE"),
    ],
)
def test_arguments_that_choose_nothing_are_usage_errors(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    result = run_tfrecordd(*argv, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (EXIT_USAGE, ""), result.stderr
    assert message in result.stderr


# -- status -------------------------------------------------------------------------------------


def test_status_shows_each_dataset(ran: Run) -> None:
    clicks = dataset_shards(ran.root / "clicks")
    doc = ran.status_json
    got = doc["datasets"]["clicks"]
    assert got["records_written"] == len(CLICK_IDS)
    assert got["shards_published"] == len(clicks)
    assert (got["open_shards"], got["partitions_pending"], got["partitions_completed"]) == (0, 0, 3)
    assert got["events_late"] == 1
    assert got["watermark"] == pytest.approx(max(e["ts"] for e in EVENTS if e["type"] == "click"))
    other = doc["datasets"]["impressions"]
    assert other["records_written"] == len(EVENTS) - len(CLICK_IDS)
    assert (other["partitions_pending"], other["watermark"], other["events_late"]) == (
        None,
        None,
        None,
    )
    assert doc["records_written"] == len(EVENTS), "the totals stay"
    assert doc["shards_published"] == sum(d["shards_published"] for d in doc["datasets"].values())

    lines = ran.status_text.splitlines()
    header = next(line for line in lines if line.startswith("DATASET "))
    assert header.split() == [
        *("DATASET", "WRITTEN", "PUBLISHED", "OPEN", "PENDING", "COMPLETE", "LATE"),
        *("WATERMARK", "(UTC)"),
    ]
    row = next(line for line in lines if line.startswith("clicks "))
    watermark = datetime.fromtimestamp(got["watermark"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert row.split() == ["clicks", "120", str(len(clicks)), "0", "0", "3", "1", watermark]
    row = next(line for line in lines if line.startswith("impressions "))
    assert row.split()[1] == "120"
    assert row.split()[4:] == ["-", "-", "-", "-"]
    assert f"\nwritten     {len(EVENTS)} records (" in ran.status_text


def test_the_late_click_was_dead_lettered(ran: Run) -> None:
    """The run the other tests read: the late click went nowhere but the dead letters."""
    (late,) = dead_letters(ran.root / "state")
    assert late["reason"] == "late"
    ids = Counter(
        example_int64(r, "id")[0]
        for p in dataset_shards(ran.root / "clicks")
        for r in read_shard(p)
    )
    assert 1000 not in ids
    assert sorted(ids) == sorted(CLICK_IDS)
    assert all(n == 1 for n in ids.values())


def test_each_tool_offers_the_dataset_options() -> None:
    for command in ("verify", "cat", "transcode"):
        result = run_tfrecordd(command, "--help")
        assert result.returncode == EXIT_OK
        for option in ("--config FILE", "--dataset NAME", "--partition P", "--completed"):
            assert option in result.stdout, (command, option)
