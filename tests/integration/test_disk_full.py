"""A full output disk pauses the sources, publishes nothing partial, and resumes by itself."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.support import (
    claimed_files,
    movie_event,
    read_ids,
    shard_files,
    skip_or_fail,
    spool_file,
    write_config,
)
from tfrecordd.config import load_config
from tfrecordd.outputs import manifest
from tfrecordd.pipeline.runtime import Daemon

pytestmark = pytest.mark.anyio


def mount_tmpfs(mnt: Path, size: str = "4m") -> None:
    """Mount a tmpfs of ``size`` on ``mnt``: needs root, as in CI, where this fails rather
    than skips if it cannot (``CI=true``)."""
    if os.geteuid() != 0:
        skip_or_fail("mounting a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        skip_or_fail(f"cannot mount a tmpfs on {mnt}: {done.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, mounted for the test."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mount_tmpfs(mnt)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_tmpfs_that_cannot_be_mounted_fails_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    """CI provides root and mount: there, a mount that fails is a failure, not a silent skip."""
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci == "true" else pytest.skip.Exception
    with pytest.raises(expected):
        mount_tmpfs(tmp_path / "no-such-folder")


async def test_full_disk_pauses_and_resumes(tmp_path: Path, small_disk: Path) -> None:
    out = small_disk / "shards"
    cfg = write_config(
        tmp_path,
        output={
            "dir": out,
            "compression": "none",
            "min_free_bytes": 1 << 20,
            "max_shard_bytes": 256 << 10,
            "max_shard_age": "200ms",
        },
    )
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (2 << 20))
    events = 12_000  # about 3.5 MiB of records: more than the disk holds with the filler
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(events)])
    daemon = Daemon(load_config(cfg), handle_signals=False)
    m = daemon.metrics.registry

    def value(name: str) -> float:
        return m.get_sample_value(name) or 0.0

    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        with anyio.fail_after(30):
            while value("tfrecordd_paused") != 1:
                await anyio.sleep(0.05)
        # The writer pauses; a shard it finished before may still be committing, and publishes.
        await anyio.sleep(1)
        published = len(shard_files(out))
        await anyio.sleep(2)
        # Paused: nothing more is published, the spool file is not acked, nothing is partial.
        assert value("tfrecordd_paused") == 1
        assert len(shard_files(out)) == published
        assert claimed_files(tmp_path / "spool")
        for shard in shard_files(out):
            assert manifest.check(str(shard)) == []
        assert value("tfrecordd_disk_full_pauses_total") >= 1
        filler.unlink()
        with anyio.fail_after(60):
            while read_ids(out) != dict.fromkeys(range(events), 1):
                await anyio.sleep(0.2)
        assert value("tfrecordd_paused") == 0
        daemon.request_stop()
    assert read_ids(out) == dict.fromkeys(range(events), 1)


def test_a_full_state_dir_stops_with_exit_74_and_never_tears_a_dead_letter(
    tmp_path: Path, small_disk: Path
) -> None:
    """The state_dir's file system fills while bad events are dead-lettered: the daemon exits 74
    saying so (no traceback), every line of dead-letters.jsonl is whole, nothing unpublished is
    acked, and after space returns every event arrives once and every bad one is dead-lettered."""
    import json

    from tests.reliability.harness import count_ids
    from tests.support import DaemonProcess, run_clean_until

    state = small_disk / "state"
    cfg = write_config(
        tmp_path,
        output={"max_shard_records": 100, "max_shard_age": "200ms"},
        daemon={"state_dir": state, "max_batch_events": 50},
    )
    lines: list[object] = []
    bad = 0
    for i in range(3000):
        lines.append(movie_event(i))
        if i % 5 == 4:
            lines.append("{broken " + "x" * 3000)
            bad += 1
    spool_file(tmp_path / "spool", "a.jsonl", lines)  # type: ignore[arg-type]
    state.mkdir()
    st = os.statvfs(small_disk)
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 64 * 1024 - 1000))
    d = DaemonProcess(cfg)
    try:
        rc = d.wait(60)
    finally:
        d.kill()
    out = d.output()
    assert rc == 74, out
    assert "state_dir is full" in out
    assert "Traceback" not in out
    letters = (state / "dead-letters.jsonl").read_bytes()
    assert letters
    assert letters.endswith(b"\n"), "a torn dead letter was left"
    for line in letters.splitlines():
        json.loads(line)
    filler.unlink()

    def drained() -> bool:
        return not list((tmp_path / "spool").glob("*.jsonl")) and not claimed_files(
            tmp_path / "spool"
        )

    run_clean_until(cfg, drained)
    ids, problems = count_ids(out_dir := tmp_path / "shards")
    assert problems == [], out_dir
    assert ids == dict.fromkeys(range(3000), 1)
    letters = (state / "dead-letters.jsonl").read_bytes()
    wheres = [json.loads(line)["where"] for line in letters.splitlines()]
    assert len(set(wheres)) == bad
