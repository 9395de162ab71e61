"""``tfrecordd init``: starter configs that pass check-config, and the directory one really runs."""

from __future__ import annotations

import json
import subprocess
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support import (
    DaemonProcess,
    dataset_shards,
    free_port,
    run_tfrecordd,
    skip_or_fail,
    wait_for,
)
from tfrecordd.cli import main
from tfrecordd.cli.initcmd import (
    ROUTE_TABLE,
    metrics_listen,
    routed,
    sample_event,
    starter_sources,
)
from tfrecordd.config import load_config
from tfrecordd.errors import EXIT_OK
from tfrecordd.format.reader import iter_examples
from tfrecordd.plugin import Registry


def _init(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return run_tfrecordd("init", *argv, cwd=cwd)


def _skip_unless_installed(source: str) -> None:
    registry = Registry.from_entry_points()
    if source in registry.sources:
        return
    error = registry.broken.get(f"tfrecordd.sources:{source}", "no such entry point")
    skip_or_fail(f"the {source!r} source plugin is not installed or does not import ({error})")


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_missing_source_plugin_fails_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    """CI installs every built-in plugin: there, one that is missing or does not import is a
    failure, not a silent skip."""
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci == "true" else pytest.skip.Exception
    with pytest.raises(expected, match="no-such-source"):
        _skip_unless_installed("no-such-source")


@pytest.mark.parametrize("source", ["directory", "tcp", "redis-stream"])
def test_starter_config_passes_check_config(tmp_path: Path, source: str) -> None:
    _skip_unless_installed(source)
    result = _init(tmp_path, "--source", source)
    assert result.returncode == EXIT_OK, result.stderr
    config = tmp_path / "tfrecordd.toml"
    assert "tfrecordd run --config tfrecordd.toml" in result.stdout
    check = run_tfrecordd("check-config", str(config))
    assert check.returncode == EXIT_OK, check.stdout + check.stderr
    assert f"type {source}, routes by 'type' to clicks, impressions" in check.stdout
    assert (
        "partitioned by event time (ts) per hour in UTC, completion marker _SUCCESS" in check.stdout
    )
    data = tomllib.loads(config.read_text())
    base = tmp_path / f"tfrecordd-{source}"
    datasets = data["datasets"]
    assert list(datasets) == ["clicks", "impressions"], "the datasets come first, in this order"
    assert datasets["clicks"]["dir"] == str(base / "shards" / "clicks"), "absolute, under the base"
    assert datasets["impressions"]["dir"] == str(base / "shards" / "impressions")
    assert "output" not in data
    assert data["daemon"]["state_dir"] == str(base / "state")
    assert data["sources"][0]["type"] == source
    assert data["metrics"]["listen"] == metrics_listen(source)


def test_source_keys_are_the_documented_ones(tmp_path: Path) -> None:
    keys = {}
    assert {"directory", "tcp", "redis-stream"} <= set(starter_sources())
    for source in ("directory", "tcp", "redis-stream"):
        out = tmp_path / f"{source}.toml"
        assert main(["init", "--source", source, "--output", str(out), "--dir", "b"]) == 0
        keys[source] = tomllib.loads(out.read_text())["sources"][0]
    route = {"field": "type", "to": {"click": "clicks", "impression": "impressions"}}
    assert keys["directory"] | {"path": "-"} == {
        "name": "spool",
        "type": "directory",
        "path": "-",
        "pattern": "*.jsonl",
        "format": "jsonl",
        "on_done": "delete",
        "route": route,
    }
    assert keys["tcp"] == {
        "name": "tcp",
        "type": "tcp",
        "listen": "127.0.0.1:7070",
        "framing": "lines",
        "route": route,
    }
    assert keys["redis-stream"] == {
        "name": "redis",
        "type": "redis-stream",
        "url": "redis://127.0.0.1:6379/0",
        "stream": "events",
        "group": "tfrecordd",
        "field": "data",
        "route": route,
    }


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        (
            'name = "a"\nencoder = "events"   # x\non_done = "delete"\n',
            'name = "a"\non_done = "delete"\n\n',
        ),
        ("name = 'a'\nencoder = 'events'", "name = 'a'\n\n"),
        ('name = "a"\n', 'name = "a"\n\n'),
    ],
)
def test_a_plugins_encoder_line_becomes_the_route(table: str, expected: str) -> None:
    """A plugin's starter table names the encoder ``events``: that line gives way to the
    route, placed after the table's own keys (TOML puts no key of the table after it)."""
    assert routed(table) == expected + ROUTE_TABLE
    parsed = tomllib.loads("[[sources]]\n" + routed(table))["sources"][0]
    assert parsed["route"] == {
        "field": "type",
        "to": {"click": "clicks", "impression": "impressions"},
    }


def test_a_table_that_names_its_dataset_is_kept() -> None:
    table = 'name = "a"\ndataset = "clicks"\n'
    assert routed(table) == table


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    existing = tmp_path / "tfrecordd.toml"
    existing.write_text("# mine\n")
    result = _init(tmp_path, "--source", "directory")
    assert result.returncode == 73
    assert (
        result.stderr.strip() == "tfrecordd: tfrecordd.toml: exists already; refusing to overwrite"
    )
    assert existing.read_text() == "# mine\n"
    assert not (tmp_path / "tfrecordd-directory").exists()


def test_output_dash_prints_the_config(tmp_path: Path) -> None:
    result = _init(tmp_path, "--source", "tcp", "--output", "-")
    assert result.returncode == EXIT_OK
    assert tomllib.loads(result.stdout)["sources"][0]["listen"] == "127.0.0.1:7070"
    assert list(tmp_path.iterdir()) == []


def test_directory_starter_runs_as_written(tmp_path: Path) -> None:
    port = free_port()
    result = _init(
        tmp_path, "--source", "directory", "--dir", "data", "--metrics-listen", f"127.0.0.1:{port}"
    )
    assert result.returncode == EXIT_OK, result.stderr
    (try_it,) = [line for line in result.stdout.splitlines() if "try it:" in line]
    sample = json.loads(try_it.split("'")[1])
    assert sample["type"] == "click"
    config = tmp_path / "tfrecordd.toml"
    assert f"#   {json.dumps(sample)}\n" in config.read_text(), "the config shows the same event"
    base = tmp_path / "data"
    now = datetime.now(UTC)
    ts = int(now.timestamp())
    impression = {"type": "impression", "ts": ts, "user": "bo", "slot": 3}
    d = DaemonProcess(config)
    try:
        d.wait_started()
        spool = base / "spool"
        assert spool.is_dir(), "the daemon makes the spool it watches"
        tmp = spool / ".first.tmp"
        tmp.write_text(f"{json.dumps(sample)}\n{json.dumps(impression)}\n")
        tmp.rename(spool / "first.jsonl")
        wait_for(lambda: len(dataset_shards(base / "shards")) == 2, timeout=40)
        assert d.proc.poll() is None
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    click, other = dataset_shards(base / "shards")
    at = datetime.fromisoformat(sample["ts"])
    assert str(click.parent.relative_to(base / "shards")) == at.strftime(
        "clicks/dt=%Y-%m-%d/hour=%H"
    ), "a click lands in its event hour's folder"
    assert other.parent == base / "shards" / "impressions"
    assert list(iter_examples(click)) == [
        {
            "ts": [int(at.timestamp()) * 1000],
            "user": [b"ada"],
            "url": [sample["url"].encode()],
            "position": [1],
        }
    ]
    assert list(iter_examples(other)) == [{"ts": [ts * 1000], "user": [b"bo"], "slot": [3]}]
    assert click.name.endswith(".tfrecord.gz")


def test_the_sample_event_is_at_the_given_time() -> None:
    at = datetime(2026, 11, 25, 3, 12, 5, 123, tzinfo=UTC)
    assert json.loads(sample_event(at))["ts"] == "2026-11-25T03:12:05Z"


def test_a_folder_holding_dollars_is_written_to_load_back_as_it_is(tmp_path: Path) -> None:
    # Config strings are interpolated when they load: `${x}` and `$$` in a folder's name must
    # reach the daemon as written, as they do from `check-config --show` and `schema --infer`.
    base = tmp_path / "data-${NOT_SET_ANYWHERE}-$$"
    out = tmp_path / "walk.toml"
    assert main(["init", "--source", "directory", "--dir", str(base), "--output", str(out)]) == 0
    config = load_config(out)
    assert str(config.daemon.state_dir) == str(base / "state")
    assert str(config.sources[0].path) == str(base / "spool")  # type: ignore[attr-defined]
