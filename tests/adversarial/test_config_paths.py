"""Configurations whose directories overlap so that data would be lost or read forever are
refused at start-up (exit 78), each naming the keys involved; sound layouts still load."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support import run_tfrecordd, write_config
from tfrecordd.config import parse_config
from tfrecordd.errors import EXIT_CONFIG, ConfigError
from tfrecordd.plugin import Registry

REGISTRY = Registry.from_entry_points()


def _config(
    root: Path,
    *,
    output: str | Path | None = None,
    state: Path | None = None,
    sources: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spool = root / "spool"
    spool.mkdir(exist_ok=True)
    return {
        "daemon": {"node_id": "n1", "state_dir": str(state or root / "state")},
        "output": {"dir": str(output or root / "shards")},
        "sources": sources
        or [{"name": "spool", "type": "directory", "path": str(spool), "encoder": "e"}],
        "encoders": {"e": {"type": "example", "features": {"id": {"type": "int64"}}}},
    }


def _errors(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, REGISTRY)
    return caught.value.errors


def _spool(root: Path, name: str = "spool", **keys: Any) -> dict[str, Any]:
    path = root / name
    path.mkdir(exist_ok=True)
    return {"name": name, "type": "directory", "path": str(path), "encoder": "e"} | keys


def test_done_dir_equal_to_the_spool_is_refused(tmp_path: Path) -> None:
    src = _spool(tmp_path, on_done="move", done_dir=str(tmp_path / "spool"))
    (error,) = _errors(_config(tmp_path, sources=[src]))
    assert error.startswith("sources[0].done_dir: is the same directory as sources[0].path")
    assert "read again, forever" in error


@pytest.mark.parametrize("where", ["same", "inside", "inside-recursive"])
def test_output_in_a_spool_is_refused(tmp_path: Path, where: str) -> None:
    src = _spool(tmp_path, recursive=where == "inside-recursive")
    out = tmp_path / "spool" if where == "same" else tmp_path / "spool" / "shards"
    (error,) = _errors(_config(tmp_path, output=out, sources=[src]))
    assert error.startswith("output.dir: ")
    assert "sources[0].path" in error
    assert "the daemon's own files" in error


@pytest.mark.parametrize("where", ["same", "inside"])
def test_state_dir_in_a_spool_is_refused(tmp_path: Path, where: str) -> None:
    # dead-letters.jsonl in a spool of *.jsonl files: the daemon would read its own dead letters.
    state = tmp_path / "spool" if where == "same" else tmp_path / "spool" / "state"
    errors = _errors(_config(tmp_path, state=state))
    assert any(e.startswith("daemon.state_dir: ") and "sources[0].path" in e for e in errors)


def test_a_staging_dir_in_a_spool_is_refused(tmp_path: Path) -> None:
    data = _config(tmp_path, output="s3://bucket/prefix")
    data["output"]["staging_dir"] = str(tmp_path / "spool" / "staging")
    (error,) = _errors(data)
    assert error.startswith("output.staging_dir: ")
    assert "sources[0].path" in error


def test_a_symlink_to_the_spool_is_the_spool(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "spool")
    errors = _errors(_config(tmp_path, output=tmp_path / "alias"))
    assert any(e.startswith("output.dir: is the same directory as sources[0].path") for e in errors)


def test_two_sources_on_one_spool_are_refused(tmp_path: Path) -> None:
    a = _spool(tmp_path, "a")
    b = _spool(tmp_path, "b") | {"path": a["path"]}
    (error,) = _errors(_config(tmp_path, sources=[a, b]))
    assert "sources[1].path" in error
    assert "sources[0].path" in error
    assert "each other's files" in error


def test_a_spool_inside_a_recursive_spool_is_refused(tmp_path: Path) -> None:
    outer = _spool(tmp_path, "outer", recursive=True)
    inner = _spool(tmp_path / "outer", "inner")
    (error,) = _errors(_config(tmp_path, sources=[outer, inner]))
    assert error.startswith("sources[1].path: ")
    assert "inside sources[0].path" in error


def test_output_dir_equal_to_state_dir_is_refused(tmp_path: Path) -> None:
    (error,) = _errors(_config(tmp_path, output=tmp_path / "state", state=tmp_path / "state"))
    assert "output.dir" in error
    assert "daemon.state_dir" in error


def test_a_file_where_a_directory_belongs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "shards").write_text("not a directory")
    (error,) = _errors(_config(tmp_path))
    assert error.startswith("output.dir: ")
    assert "is not a directory" in error


def test_done_dir_on_another_file_system_is_refused(tmp_path: Path) -> None:
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system at /dev/shm here")
    done = other / f"tfrecordd-done-{os.getpid()}"
    src = _spool(tmp_path, on_done="move", done_dir=str(done))
    (error,) = _errors(_config(tmp_path, sources=[src]))
    assert error.startswith("sources[0].done_dir: ")
    assert "another file system" in error
    assert "EXDEV" in error


def test_sound_layouts_load(tmp_path: Path) -> None:
    # The packaged layout: shards and the spool under state_dir's parent, done/ in the spool.
    src = _spool(tmp_path, recursive=True, on_done="move")
    parse_config(_config(tmp_path, output=tmp_path / "state" / "shards", sources=[src]), REGISTRY)
    done = tmp_path / "done"
    src = _spool(tmp_path, on_done="move", done_dir=str(done))
    parse_config(_config(tmp_path, sources=[src]), REGISTRY)
    parse_config(_config(tmp_path, output="s3://bucket/prefix"), REGISTRY)


def test_check_config_exits_78_naming_every_key(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        output={"dir": tmp_path / "spool"},
        source={"on_done": "move", "done_dir": tmp_path / "spool"},
    )
    run = run_tfrecordd("check-config", str(config))
    assert run.returncode == EXIT_CONFIG, run.stdout + run.stderr
    assert "output.dir: is the same directory as sources[0].path" in run.stderr
    assert "sources[0].done_dir: is the same directory as sources[0].path" in run.stderr


def test_check_config_refuses_a_done_dir_read_by_another_recursive_spool(tmp_path: Path) -> None:
    config = write_config(tmp_path, source={"recursive": True})
    archive = tmp_path / "spool" / "archive"
    with config.open("a") as f:
        f.write(
            "[[sources]]\n"
            'name = "other"\ntype = "directory"\nencoder = "movies"\n'
            f'path = "{tmp_path / "other"}"\non_done = "move"\ndone_dir = "{archive}"\n'
        )
    run = run_tfrecordd("check-config", str(config))
    assert run.returncode == EXIT_CONFIG, run.stdout + run.stderr
    assert f"sources[1].done_dir: {archive} is inside sources[0].path (recursive)" in run.stderr
