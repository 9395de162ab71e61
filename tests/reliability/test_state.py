"""State an operator may change: shards shipped away between a crash and the restart, a
state_dir that fills up, damaged state and the ``tfrecordd state`` commands."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.test_daemon_process import drained, fill_spool
from tests.reliability.harness import count_ids
from tests.support import DaemonProcess, intent_shards, run_clean_until, run_tfrecordd, write_config
from tfrecordd.plugin import Registry

POINTS = Registry.from_entry_points().crash_points()
"""Every crash point: the daemon's and the built-in sources'."""

COMMIT_POINTS = [
    p for p in POINTS if p not in ("mid-upload", "after-claim", "mid-write", "after-marker")
]


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


def _run_to_exit(cfg: Path, timeout: float = 60) -> tuple[int, str]:
    d = DaemonProcess(cfg)
    try:
        rc = d.wait(timeout)
    finally:
        d.kill()
    return rc, d.output()


def _state(cfg: Path, *args: str) -> tuple[int, str]:
    done = run_tfrecordd("state", *args[:1], "--config", str(cfg), *args[1:])
    return done.returncode, done.stdout + done.stderr


def _assert_once(root: Path, expected: set[int]) -> None:
    ids, problems = count_ids(root / "shards")
    assert problems == []
    assert set(ids) == expected
    assert {i: c for i, c in ids.items() if c > 1} == {}


def _half_read(tmp_path: Path, **source: object) -> tuple[Path, set[int]]:
    """A daemon killed after two finished commits of one big file: positions committed in the
    middle of it (compaction every commit, so they are in the checkpoint too)."""
    cfg = write_config(
        tmp_path,
        output={"max_shard_records": 40, "max_shard_age": "200ms"},
        daemon={"max_batch_events": 20},
        source=source,
    )
    expected = fill_spool(tmp_path, 1, 400)
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": "after-done:3"})
    assert d.wait(60) == 137, d.output()
    return cfg, expected


def test_a_renamed_source_refuses_to_start_then_resumes_after_rename_source(
    tmp_path: Path,
) -> None:
    cfg, expected = _half_read(tmp_path)
    text = cfg.read_text().replace('name = "spool"', 'name = "inbox"')
    cfg.write_text(text)
    rc, out = _run_to_exit(cfg)
    assert rc == 78, out
    assert "'spool'" in out
    assert "'inbox'" in out
    assert "Traceback" not in out
    rc, out = _state(cfg, "check")
    assert rc == 78, out
    rc, out = _state(cfg, "rename-source", "spool", "inbox")
    assert rc == 0, out
    assert _state(cfg, "check")[0] == 0
    run_clean_until(cfg, lambda: drained(tmp_path))
    _assert_once(tmp_path, expected)


def test_a_forgotten_source_with_only_its_empty_folder_has_nothing_to_move(
    tmp_path: Path,
) -> None:
    """The daemon makes every source's state folder; once the source is forgotten, its empty
    folder is no state: renaming it finds nothing to move."""
    cfg = write_config(tmp_path)
    run_clean_until(cfg, lambda: True)
    assert (tmp_path / "state" / "sources" / "spool").is_dir()
    cfg.write_text(cfg.read_text().replace('name = "spool"', 'name = "inbox"'))
    assert _state(cfg, "forget-source", "spool")[0] == 0
    rc, out = _state(cfg, "rename-source", "spool", "other")
    assert rc == 0, out
    assert "nothing to move" in out
    assert not (tmp_path / "state" / "sources" / "other").exists()


@pytest.mark.parametrize("keep", [0, 7, -3])
def test_a_truncated_checkpoint_is_a_clear_error_and_state_repair_fixes_it(
    tmp_path: Path, keep: int
) -> None:
    cfg, expected = _half_read(tmp_path)
    ckpt = tmp_path / "state" / "checkpoint.json"
    if not ckpt.exists():  # compaction runs every 512 commits: make one now
        from tfrecordd.fsys import LOCAL
        from tfrecordd.state.journal import Journal
        from tfrecordd_plugins.sources.directory import DirectorySource

        j = Journal(str(tmp_path / "state"), LOCAL, {"spool": DirectorySource.fold})
        j.recover()
        j.compact()
        j.close()
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[:keep])
    rc, out = _run_to_exit(cfg)
    assert rc == 65, out
    assert str(ckpt) in out
    assert "tfrecordd state repair" in out
    assert "Traceback" not in out
    assert _state(cfg, "check")[0] == 65
    rc, out = _state(cfg, "repair")
    assert rc == 65, out
    assert "--discard-checkpoint" in out
    rc, out = _state(cfg, "repair", "--discard-checkpoint")
    assert rc == 0, out
    assert _state(cfg, "check")[0] == 0
    # The positions are lost, as the repair said: the half-read file is read from its start.
    run_clean_until(cfg, lambda: drained(tmp_path))
    ids, problems = count_ids(tmp_path / "shards")
    assert problems == []
    assert set(ids) == expected


def test_a_damaged_journal_refuses_to_start_and_repair_keeps_every_sound_commit(
    tmp_path: Path,
) -> None:
    from tfrecordd.state.reading import scan_journal

    cfg, expected = _half_read(tmp_path)
    journal = tmp_path / "state" / "journal"
    scan = scan_journal(str(journal))
    assert len([r for r in scan.records if r["t"] == "intent"]) >= 3
    data = bytearray(journal.read_bytes())
    data[20] ^= 0x40  # inside the first record: committed intents follow it
    journal.write_bytes(bytes(data))
    rc, out = _run_to_exit(cfg)
    assert rc == 65, out
    assert "damaged" in out
    assert "Traceback" not in out
    assert _state(cfg, "check")[0] == 65
    rc, out = _state(cfg, "repair")
    assert rc == 0, out
    assert list((tmp_path / "state").glob("journal.damaged-*"))
    run_clean_until(cfg, lambda: drained(tmp_path))
    # The first commit's intent is lost; the later commits' positions (beyond it) survive.
    _assert_once(tmp_path, expected)


def test_state_commands_refuse_while_a_daemon_holds_the_lock(tmp_path: Path) -> None:
    import fcntl

    cfg, _ = _half_read(tmp_path)
    lock = tmp_path / "state" / "lock"
    lock.touch()
    with lock.open("rb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        for args in (("repair",), ("rename-source", "spool", "x")):
            rc, out = _state(cfg, *args)
            assert rc == 75, out
            assert "in use by another tfrecordd" in out


def test_a_journal_removed_while_running_stops_the_daemon_with_exit_74(tmp_path: Path) -> None:
    from tests.support import spool_file, wait_for

    cfg = write_config(tmp_path, output={"max_shard_age": "100ms"})
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        shutil.rmtree(tmp_path / "state")
        spool_file(tmp_path / "spool", "a.jsonl", [{"id": 1, "title": "x"}])
        wait_for(lambda: d.proc.poll() is not None, 30)
    finally:
        d.kill()
    assert d.proc.returncode == 74, d.output()
    assert "removed while the daemon ran" in d.output()


@pytest.mark.parametrize("how", ["state_dir removed", "journal replaced"])
def test_state_lost_while_idle_stops_the_daemon_at_once(tmp_path: Path, how: str) -> None:
    """No event arrives after the loss: the daemon must not wait for a commit (which may never
    come before the next crash) to notice that its committed positions are gone."""
    from tests.support import wait_for

    cfg = write_config(tmp_path)
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        state = tmp_path / "state"
        if how == "state_dir removed":
            shutil.rmtree(state)
        else:
            old = (state / "journal").read_bytes()
            (state / "journal").unlink()
            (state / "journal").write_bytes(old)
        wait_for(lambda: d.proc.poll() is not None, 15)
    finally:
        d.kill()
    assert d.proc.returncode == 74, d.output()
    assert f"{how.split()[-1]} while the daemon ran" in d.output()


def test_an_in_progress_shard_of_the_layout_before_staging_folders_is_not_taken_as_published(
    tmp_path: Path,
) -> None:
    """An upgrade in place after a crash between a commit's intent and its publish: the old
    version's in-progress file sits beside the shards (``.<name>.inprogress``), not in the
    node's staging folder. Its absence from the staging folder must not read as "published and
    shipped away" (its events would be acked and never written): it is found under its old
    name, the commit dropped, and its events written once."""
    from tfrecordd.format.writer import inprogress_name
    from tfrecordd.outputs.shards import offsets_name, staging_dir
    from tfrecordd.state.reading import scan_journal

    cfg = write_config(tmp_path, output={"max_shard_records": 40, "max_shard_age": "200ms"})
    expected = fill_spool(tmp_path, 4, 50)
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": "after-intent:1"})
    assert d.wait(60) == 137, d.output()
    out = tmp_path / "shards"
    scan = scan_journal(str(tmp_path / "state" / "journal"))
    (shard,) = [s for r in scan.records if r["t"] == "intent" for s in intent_shards(r)]
    staging = Path(staging_dir(str(out), "test"))
    (staging / inprogress_name(shard)).rename(out / f".{shard}.inprogress")
    if (staging / offsets_name(shard)).exists():
        (staging / offsets_name(shard)).rename(out / f".{shard}.offsets.inprogress")
    run_clean_until(cfg, lambda: drained(tmp_path))
    _assert_once(tmp_path, expected)
    assert not [p for p in out.rglob("*") if p.name.endswith(".inprogress")]


def test_a_commit_staged_under_an_earlier_node_id_is_not_taken_as_published(
    tmp_path: Path,
) -> None:
    """Killed between a commit's intent and its publish, then restarted under another
    ``node_id`` (the default is the host name, which a container may change): the staged file
    is in the earlier node's folder. It must be found there, the commit dropped and its events
    replayed, never taken as "published and moved away" (acked, and lost)."""
    output = {"max_shard_records": 40, "max_shard_age": "200ms"}
    cfg = write_config(tmp_path, output=output)
    expected = fill_spool(tmp_path, 4, 50)
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": "after-intent:1"})
    assert d.wait(60) == 137, d.output()
    write_config(tmp_path, output=output, daemon={"node_id": "renamed"})
    spool = tmp_path / "spool"
    run_clean_until(cfg, lambda: not [p for p in spool.iterdir() if p.is_file()])
    write_config(tmp_path, output=output)  # back to the node whose claims are left
    run_clean_until(cfg, lambda: drained(tmp_path))
    _assert_once(tmp_path, expected)


def test_an_intent_of_the_version_before_is_published_only_if_its_shard_or_manifest_is_there(
    tmp_path: Path,
) -> None:
    """The version before this one could remove a shard's in-progress file without a durable
    drop (a failed commit; recovery's unsynced drops). For its intents a missing in-progress
    file proves nothing: with no shard and no manifest the commit is dropped and its events
    replay, never acked unwritten."""
    import orjson

    from tfrecordd.format.framing import frame
    from tfrecordd.format.writer import inprogress_name
    from tfrecordd.outputs.shards import offsets_name, staging_dir
    from tfrecordd.state.reading import scan_journal

    cfg = write_config(tmp_path, output={"max_shard_records": 40, "max_shard_age": "200ms"})
    expected = fill_spool(tmp_path, 4, 50)
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": "after-intent:1"})
    assert d.wait(60) == 137, d.output()
    journal = tmp_path / "state" / "journal"
    records = scan_journal(str(journal)).records
    (shard,) = [s for r in records if r["t"] == "intent" for s in intent_shards(r)]
    # As that version wrote it: no "kept"; and its in-progress file gone with no drop.
    journal.write_bytes(
        b"".join(frame(orjson.dumps({k: v for k, v in r.items() if k != "kept"})) for r in records)
    )
    staging = Path(staging_dir(str(tmp_path / "shards"), "test"))
    (staging / inprogress_name(shard)).unlink()
    (staging / offsets_name(shard)).unlink(missing_ok=True)
    run_clean_until(cfg, lambda: drained(tmp_path))
    _assert_once(tmp_path, expected)
