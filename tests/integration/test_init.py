"""``tfrecordd init``: starter configs that pass check-config, and the directory one really runs."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.support import (
    DaemonProcess,
    free_port,
    read_examples,
    run_tfrecordd,
    shard_files,
    skip_or_fail,
    wait_for,
)
from tfrecordd.cli import main
from tfrecordd.cli.initcmd import starter_sources
from tfrecordd.errors import EXIT_OK
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
    assert f"type {source}, encoder events" in check.stdout
    data = tomllib.loads(config.read_text())
    base = tmp_path / "tfrecordd-data"
    assert data["output"]["dir"] == str(base / "shards"), "paths are absolute, under the base"
    assert data["daemon"]["state_dir"] == str(base / "state")
    assert data["sources"][0]["type"] == source
    assert data["metrics"]["listen"] == "127.0.0.1:9464"


def test_source_keys_are_the_documented_ones(tmp_path: Path) -> None:
    keys = {}
    assert {"directory", "tcp", "redis-stream"} <= set(starter_sources())
    for source in ("directory", "tcp", "redis-stream"):
        out = tmp_path / f"{source}.toml"
        assert main(["init", "--source", source, "--output", str(out), "--dir", "b"]) == 0
        keys[source] = tomllib.loads(out.read_text())["sources"][0]
    assert keys["directory"] | {"path": "-"} == {
        "name": "spool",
        "type": "directory",
        "path": "-",
        "pattern": "*.jsonl",
        "format": "jsonl",
        "encoder": "events",
        "on_done": "delete",
    }
    assert keys["tcp"] == {
        "name": "tcp",
        "type": "tcp",
        "listen": "127.0.0.1:7070",
        "framing": "lines",
        "encoder": "events",
    }
    assert keys["redis-stream"] == {
        "name": "redis",
        "type": "redis-stream",
        "url": "redis://127.0.0.1:6379/0",
        "stream": "events",
        "group": "tfrecordd",
        "field": "data",
        "encoder": "events",
    }


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    existing = tmp_path / "tfrecordd.toml"
    existing.write_text("# mine\n")
    result = _init(tmp_path, "--source", "directory")
    assert result.returncode == 73
    assert (
        result.stderr.strip() == "tfrecordd: tfrecordd.toml: exists already; refusing to overwrite"
    )
    assert existing.read_text() == "# mine\n"
    assert not (tmp_path / "tfrecordd-data").exists()


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
    config = tmp_path / "tfrecordd.toml"
    base = tmp_path / "data"
    d = DaemonProcess(config)
    try:
        d.wait_started()
        spool = base / "spool"
        assert spool.is_dir(), "the daemon makes the spool it watches"
        tmp = spool / ".first.tmp"
        tmp.write_text(
            '{"id": 1, "text": "hello", "score": 0.5, "tags": ["a", "b"]}\n'
            '{"id": 2, "text": "world"}\n'
        )
        tmp.rename(spool / "first.jsonl")
        wait_for(lambda: len(shard_files(base / "shards")) == 1, timeout=40)
        assert d.proc.poll() is None
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    examples = sorted(read_examples(base / "shards"), key=lambda e: e["id"])
    assert examples == [
        {"id": [1], "text": [b"hello"], "score": [0.5], "tags": [b"a", b"b"]},
        {"id": [2], "text": [b"world"]},
    ]
    assert shard_files(base / "shards")[0].name.endswith(".tfrecord.gz")
