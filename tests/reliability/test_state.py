"""State an operator may change: shards shipped away between a crash and the restart, a
state_dir that fills up, damaged state and the ``tfrecordd state`` commands."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.test_daemon_process import drained, fill_spool
from tests.reliability.harness import count_ids
from tests.support import DaemonProcess, run_clean_until, write_config
from tfrecordd.crashpoints import POINTS

COMMIT_POINTS = [p for p in POINTS if p not in ("mid-upload", "after-claim", "mid-write")]


def _ship(out: Path, shipped: Path) -> int:
    """What a shipper does: move every published shard (and its manifest) away."""
    moved = 0
    for p in sorted(out.iterdir()):
        if not p.name.startswith(".") and p.is_file():
            shutil.move(str(p), shipped / p.name)
            moved += 1
    return moved


@pytest.mark.parametrize("point", COMMIT_POINTS)
@pytest.mark.parametrize("manifests", [True, False])
def test_shards_shipped_away_after_a_crash_are_not_written_again(
    tmp_path: Path, point: str, manifests: bool
) -> None:
    """Killed at each step of a commit, then every published shard is moved away (the runbook
    ships shards) before the restart: nothing is lost and nothing written twice."""
    cfg = write_config(
        tmp_path,
        output={"max_shard_records": 40, "max_shard_age": "200ms", "manifests": manifests},
        daemon={"max_batch_events": 16},
    )
    expected = fill_spool(tmp_path, 4, 50)
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": f"{point}:2"})
    rc = d.wait(60)
    assert rc == 137, f"crash point {point} not reached: exit {rc}\n{d.output()}"
    out, shipped = tmp_path / "shards", tmp_path / "shipped"
    shipped.mkdir()
    _ship(out, shipped)
    run_clean_until(cfg, lambda: drained(tmp_path))
    _ship(out, shipped)
    ids, problems = count_ids(shipped)
    assert problems == []
    lost = expected - set(ids)
    duplicated = {i: c for i, c in ids.items() if c > 1}
    assert (len(lost), len(duplicated)) == (0, 0), (sorted(lost)[:10], list(duplicated)[:10])
    assert not [p for p in out.iterdir() if p.name.endswith(".inprogress")]
