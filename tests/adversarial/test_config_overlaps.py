"""Each overlap of the paths a config names that would lose or loop data is refused, at any
depth, naming both keys; the nestings that are safe load; every name the daemon will create is
checked against the file system's limits, with figures pinned to the code that makes the names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tfrecordd import pathcheck
from tfrecordd.config import parse_config
from tfrecordd.errors import ConfigError
from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.writer import inprogress_name
from tfrecordd.outputs import manifest, shards
from tfrecordd.plugin import Registry
from tfrecordd.state import deadletter, records
from tfrecordd_plugins.sources import spool_names

REGISTRY = Registry.from_entry_points()


def _spool(path: Path, name: str, **keys: Any) -> dict[str, Any]:
    return {"name": name, "type": "directory", "path": str(path), "encoder": "e"} | keys


def _config(
    root: Path,
    sources: list[dict[str, Any]],
    *,
    output: Path | str | None = None,
    state: Path | None = None,
    daemon: dict[str, Any] | None = None,
    out: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "daemon": {"node_id": "n1", "state_dir": str(state or root / "state")} | (daemon or {}),
        "output": {"dir": str(output or root / "shards")} | (out or {}),
        "sources": sources,
        "encoders": {"e": {"type": "example", "features": {"id": {"type": "int64"}}}},
    }


def _errors(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, REGISTRY)
    return caught.value.errors


def _one(data: dict[str, Any]) -> str:
    errors = _errors(data)
    assert len(errors) == 1, errors
    return errors[0]


def test_a_done_dir_inside_another_recursive_spool_is_refused(tmp_path: Path) -> None:
    # The first case found: the recursive source re-read the archive (every event written
    # twice) and deleted it.
    a = _spool(tmp_path / "a", "a", recursive=True)
    b = _spool(tmp_path / "b", "b", on_done="move", done_dir=str(tmp_path / "a" / "x" / "done"))
    error = _one(_config(tmp_path, [a, b]))
    assert error.startswith("sources[1].done_dir: ")
    assert "is inside sources[0].path (recursive)" in error
    assert "read again" in error


def test_the_same_done_dir_inside_a_spool_read_at_its_top_only_loads(tmp_path: Path) -> None:
    a = _spool(tmp_path / "a", "a")
    b = _spool(tmp_path / "b", "b", on_done="move", done_dir=str(tmp_path / "a" / "x" / "done"))
    parse_config(_config(tmp_path, [a, b]), REGISTRY)


def test_a_spool_inside_the_output_directory_is_refused(tmp_path: Path) -> None:
    a = _spool(tmp_path / "shards" / "in", "a")
    error = _one(_config(tmp_path, [a]))
    assert error.startswith("sources[0].path: ")
    assert "inside output.dir" in error


def test_a_spool_inside_another_sources_done_dir_is_refused(tmp_path: Path) -> None:
    a = _spool(tmp_path / "a", "a", on_done="move", done_dir=str(tmp_path / "archive"))
    b = _spool(tmp_path / "archive" / "2024", "b")
    error = _one(_config(tmp_path, [a, b]))
    assert error.startswith("sources[1].path: ")
    assert "inside sources[0].done_dir" in error


def test_a_spool_inside_its_own_done_dir_is_refused(tmp_path: Path) -> None:
    # A file at <spool>/sub/f is moved to <done>/sub/f: the spool itself, read again.
    a = _spool(tmp_path / "done" / "sub", "a", on_done="move", done_dir=str(tmp_path / "done"))
    error = _one(_config(tmp_path, [a]))
    assert error.startswith("sources[0].path: ")
    assert "inside sources[0].done_dir" in error


def test_the_state_dir_inside_the_output_is_refused(tmp_path: Path) -> None:
    error = _one(
        _config(tmp_path, [_spool(tmp_path / "a", "a")], state=tmp_path / "shards" / "state")
    )
    assert error.startswith("daemon.state_dir: ")
    assert "inside output.dir" in error


def test_the_output_inside_the_state_dir_loads_unless_it_takes_a_state_name(
    tmp_path: Path,
) -> None:
    a = _spool(tmp_path / "a", "a")
    parse_config(_config(tmp_path, [a], output=tmp_path / "state" / "shards"), REGISTRY)
    error = _one(_config(tmp_path, [a], output=tmp_path / "state" / "sources"))
    assert error.startswith("output.dir: ")
    assert "inside daemon.state_dir" in error


@pytest.mark.parametrize("folder", [".tfrecordd-claimed/n1", ".tfrecordd-rejected"])
@pytest.mark.parametrize("key", ["path", "done_dir"])
def test_nothing_may_sit_in_a_spools_own_folders(tmp_path: Path, folder: str, key: str) -> None:
    a = _spool(tmp_path / "a", "a")
    inside = str(tmp_path / "a" / folder)
    b = _spool(tmp_path / "b", "b", on_done="move" if key == "done_dir" else "delete")
    b[key] = inside
    error = _one(_config(tmp_path, [a, b]))
    assert error.startswith(f"sources[1].{key}: ")
    assert "inside sources[0].path" in error
    assert "claimed and rejected files" in error


def test_two_sources_moving_into_one_done_dir_are_refused(tmp_path: Path) -> None:
    done = str(tmp_path / "archive")
    a = _spool(tmp_path / "a", "a", on_done="move", done_dir=done)
    b = _spool(tmp_path / "b", "b", on_done="move", done_dir=done)
    error = _one(_config(tmp_path, [a, b]))
    assert error.startswith("sources[1].done_dir: is the same directory as sources[0].done_dir")


def test_a_done_dir_inside_another_is_refused(tmp_path: Path) -> None:
    a = _spool(tmp_path / "a", "a", on_done="move", done_dir=str(tmp_path / "archive"))
    b = _spool(tmp_path / "b", "b", on_done="move", done_dir=str(tmp_path / "archive" / "b"))
    error = _one(_config(tmp_path, [a, b]))
    assert error.startswith("sources[1].done_dir: ")
    assert "inside sources[0].done_dir" in error


def test_two_sources_on_one_spool_are_refused_whatever_their_patterns(tmp_path: Path) -> None:
    a = _spool(tmp_path / "a", "a", pattern="*.jsonl")
    b = _spool(tmp_path / "a", "b", pattern="*.csv", format="csv")
    error = _one(_config(tmp_path, [a, b]))
    assert error.startswith("sources[1].path: is the same directory as sources[0].path")
    assert "claim folder" in error


def test_a_hidden_folder_of_a_recursive_spool_may_be_another_spool(tmp_path: Path) -> None:
    a = _spool(tmp_path / "a", "a", recursive=True)
    b = _spool(tmp_path / "a" / ".inbox", "b")
    parse_config(_config(tmp_path, [a, b]), REGISTRY)


def test_a_recursive_spools_own_done_dir_may_hold_nothing_else(tmp_path: Path) -> None:
    a = _spool(tmp_path / "a", "a", recursive=True, on_done="move")
    parse_config(_config(tmp_path, [a]), REGISTRY)
    b = _spool(tmp_path / "a" / "done" / "b", "b")
    errors = _errors(_config(tmp_path, [a, b]))
    assert any(
        e.startswith("sources[1].path: ") and "inside sources[0].done_dir" in e for e in errors
    )


def test_a_symlink_into_a_recursive_spool_is_seen_through(tmp_path: Path) -> None:
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "a" / "sub")
    a = _spool(tmp_path / "a", "a", recursive=True)
    b = _spool(tmp_path / "b", "b", on_done="move", done_dir=str(tmp_path / "alias"))
    error = _one(_config(tmp_path, [a, b]))
    assert error.startswith("sources[1].done_dir: ")
    assert "inside sources[0].path (recursive)" in error


def test_a_spool_reached_through_a_symlink_out_of_a_recursive_spool_loads(
    tmp_path: Path,
) -> None:
    # The source never follows a symlink below its spool: the folder behind it is not read.
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "link").symlink_to(tmp_path / "elsewhere")
    a = _spool(tmp_path / "a", "a", recursive=True)
    b = _spool(tmp_path / "a" / "link", "b")
    parse_config(_config(tmp_path, [a, b]), REGISTRY)


def _unix(path: Path | str, name: str = "sock") -> dict[str, Any]:
    return {"name": name, "type": "unix", "path": str(path), "encoder": "e"}


def test_a_socket_in_a_spool_or_on_a_state_name_is_refused(tmp_path: Path) -> None:
    a = _spool(tmp_path / "a", "a")
    error = _one(_config(tmp_path, [a, _unix(tmp_path / "a" / "in.sock")]))
    assert error.startswith("sources[1].path: ")
    assert "inside sources[0].path" in error
    error = _one(_config(tmp_path, [a, _unix(tmp_path / "state" / "journal")]))
    assert error.startswith("sources[1].path: ")
    assert "inside daemon.state_dir" in error
    parse_config(_config(tmp_path, [a, _unix(tmp_path / "state" / "in.sock")]), REGISTRY)


def test_two_sources_on_one_socket_are_refused(tmp_path: Path) -> None:
    a = _spool(tmp_path / "a", "a")
    errors = _errors(_config(tmp_path, [a, _unix(tmp_path / "s"), _unix(tmp_path / "s", "t")]))
    assert any(
        e.startswith("sources[2].path: is the same directory as sources[1].path") for e in errors
    )


def test_a_socket_path_longer_than_sun_path_is_refused(tmp_path: Path) -> None:
    long = tmp_path / ("s" * 120)
    error = _one(_config(tmp_path, [_spool(tmp_path / "a", "a"), _unix(long)]))
    assert error.startswith("sources[1].path: the socket path")
    assert "107" in error


# -- names ----------------------------------------------------------------------------------


def test_a_prefix_that_makes_shard_names_too_long_is_refused(tmp_path: Path) -> None:
    # The shard name itself still fits; its in-progress offsets file does not.
    limit = pathcheck.name_max(tmp_path)
    longest = max(
        map(len, pathcheck.staged_names(pathcheck.shard_names("", "n1", Compression.GZIP, True)))
    )
    prefix = "p" * (limit - longest + 1)
    data = _config(tmp_path, [_spool(tmp_path / "a", "a")], out={"prefix": prefix})
    errors = _errors(data)
    assert errors
    assert all(e.startswith("output.prefix and daemon.node_id: ") for e in errors), errors
    assert any("NAME_MAX" in e and "in-progress" in e for e in errors)
    data["output"]["prefix"] = prefix[:-1]
    parse_config(data, REGISTRY)


def test_a_node_id_too_long_for_a_name_is_refused(tmp_path: Path) -> None:
    node = "n" * 256
    errors = _errors(_config(tmp_path, [_spool(tmp_path / "a", "a")], daemon={"node_id": node}))
    assert any(e.startswith("daemon.node_id and sources[0].path: the claims") for e in errors)
    assert any(e.startswith("output.prefix and daemon.node_id: ") for e in errors)


def test_a_source_name_too_long_for_its_state_folder_is_refused(tmp_path: Path) -> None:
    error = _one(_config(tmp_path, [_spool(tmp_path / "a", "a" * 256)]))
    assert error.startswith("daemon.state_dir and sources[0].name: the source state")
    assert "NAME_MAX" in error


def test_paths_past_path_max_are_refused(tmp_path: Path) -> None:
    limit = pathcheck.path_max(tmp_path)
    deep = tmp_path.joinpath(*["d" * 200] * (limit // 201 + 1))
    errors = _errors(_config(tmp_path, [_spool(tmp_path / "a", "a")], state=deep))
    assert errors
    assert all(e.startswith("daemon.state_dir") and "PATH_MAX" in e for e in errors), errors
    errors = _errors(_config(tmp_path, [_spool(deep, "a")]))
    assert any(e.startswith("sources[0].path: the folder") for e in errors), errors


@pytest.mark.parametrize("compression", list(Compression))
@pytest.mark.parametrize("manifests", [True, False])
def test_the_names_checked_are_the_names_made(compression: Compression, manifests: bool) -> None:
    namer = shards.ShardNamer("part", "node-7", compression)
    namer.seq = 10**pathcheck.SHARD_SEQ_DIGITS - 2
    shard = namer.next()
    checked = pathcheck.shard_names("part", "node-7", compression, manifests)
    assert len(checked[0]) == len(shard)
    assert checked[0].endswith(SUFFIXES[compression])
    made = [shard, manifest.manifest_name(shard)] if manifests else [shard]
    assert [len(n) for n in checked] == [len(n) for n in made]
    staged = [inprogress_name(n) for n in made] + [shards.offsets_name(shard)]
    assert [len(n) for n in pathcheck.staged_names(checked)] == [len(n) for n in staged]


def test_the_folder_and_state_names_are_the_daemons() -> None:
    assert pathcheck.STAGING_DIR == shards.STAGING_DIR
    assert pathcheck.MANIFEST_SUFFIX == manifest.SUFFIX
    assert pathcheck.CLAIM_FOLDER == spool_names.CLAIM_DIR
    assert spool_names.CLAIM_DIR.startswith(pathcheck.SPOOL_FOLDERS)
    assert spool_names.REJECT_DIR.startswith(pathcheck.SPOOL_FOLDERS)
    assert {records.JOURNAL, records.CHECKPOINT, deadletter.NAME} <= pathcheck.STATE_NAMES
    pid = "9" * pathcheck.PID_DIGITS
    assert f".{records.CHECKPOINT}.{pid}.tmp" in pathcheck.state_names()
    assert f"{deadletter.NAME}.1" in pathcheck.state_names()
    assert len(str(os.getpid())) <= pathcheck.PID_DIGITS
