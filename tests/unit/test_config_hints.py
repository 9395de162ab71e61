""" "Did you mean": a mistyped key or choice in a config is told with the closest valid one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import write_config, write_datasets_config
from tfrecordd.cli import main
from tfrecordd.errors import EXIT_CONFIG


def test_mistyped_keys_and_choices_are_told_with_the_closest_valid_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path,
        daemon={"log_formt": "json"},
        output={"compression": "gzp", "max_shard_agee": "1m"},
        source={"on_done": "delet", "pathh": "x"},
    )
    config.write_text(config.read_text() + "[sorces]\n")
    assert main(["check-config", str(config)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "daemon.log_formt: unknown key (did you mean 'log_format'?)" in err
    assert "output.max_shard_agee: unknown key (did you mean 'max_shard_age'?)" in err
    assert "(got 'gzp') (did you mean 'gzip'?)" in err
    assert "sorces: unknown key (did you mean 'sources'?)" in err
    assert "sources[0].pathh: unknown key (did you mean 'path'?)" in err
    assert "(got 'delet') (did you mean 'delete'?)" in err


def test_a_key_nested_below_a_named_table_is_told_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_datasets_config(
        tmp_path,
        {"events": {"encoder": "events", "partition": {"granularty": "hour"}}},
        encoders={"events": {"id": "int64"}},
        sources=[{"name": "spool", "dataset": "events"}],
    )
    assert main(["check-config", str(config)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "datasets.events.partition.granularty: unknown key (did you mean 'granularity'?)" in err


def test_nothing_is_proposed_when_nothing_is_close(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, daemon={"zzzzzz": 1})
    assert main(["check-config", str(config)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "daemon.zzzzzz: unknown key\n" in err
