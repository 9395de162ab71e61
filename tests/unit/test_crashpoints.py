"""Crash points: the daemon's own and those its source plugins declare are armable, a misspelt
one is refused when the daemon is built (it would never fire, and its test would prove
nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import write_config
from tfrecordd import crashpoints
from tfrecordd.config import load_config
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.plugin import Registry
from tfrecordd_plugins.sources.directory import DirectorySourceConfig


@pytest.fixture
def armed() -> Iterator[None]:
    yield
    crashpoints.arm(None)


def test_the_known_points_are_the_daemons_then_the_sources(armed: None) -> None:
    points = Registry.from_entry_points().crash_points()
    assert points[: len(crashpoints.POINTS)] == crashpoints.POINTS
    assert set(DirectorySourceConfig.crash_points) <= set(points)
    assert "after-claim" not in crashpoints.POINTS, "the spool's points are the plugin's own"


@pytest.mark.parametrize("spec", ["after-claim:3", "after-intent", "no-such-point"])
def test_a_daemon_refuses_an_unknown_armed_point(armed: None, tmp_path: Path, spec: str) -> None:
    config = load_config(write_config(tmp_path))
    crashpoints.arm(spec)
    if spec.startswith("no-such"):
        with pytest.raises(ValueError, match="unknown crash point 'no-such-point'"):
            Daemon(config, handle_signals=False)
    else:
        Daemon(config, handle_signals=False)
