"""Edges of datasets that a review found broken, each reproduced here: a staged upload found after
a config moves to [datasets], a far-future event time, a kill between a marker and the state
that closes its partition, a late record in a batch that also cuts a commit, a kept-open shard
published (linked) by a killed start, and routing values JSON allows but orjson refuses."""

from __future__ import annotations

import base64
import errno
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import anyio
import pytest

from tests.s3_server import S3Server, running_s3
from tests.support import (
    DaemonProcess,
    DirSyncs,
    dataset_shards,
    dead_letters,
    example_int64,
    read_shard,
    run_clean_until,
    run_daemon_with,
    spool_drained,
    spool_file,
    wait_for,
    write_config,
    write_datasets_config,
)
from tfrecordd.config import load_config
from tfrecordd.errors import DurabilityError, StateError, find_error
from tfrecordd.events import RawEvent
from tfrecordd.fsys import FileSystem
from tfrecordd.pipeline.routing import route_value
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.sources.directory import DirectorySourceConfig
from tfrecordd_plugins.sources.spool_claims import Claims

T0 = 1_790_000_000 - 1_790_000_000 % 3600
"""An hour boundary in the past (2026-09)."""
EVENTS = {"id": "int64", "ts": {"type": "int64", "time_unit": "ms"}}


def _ids(out: Path) -> list[int]:
    return sorted(example_int64(r, "id")[0] for s in dataset_shards(out) for r in read_shard(s))


def _hour(k: int) -> str:
    return time.strftime("dt=%Y-%m-%d/hour=%H", time.gmtime(T0 + k * 3600))


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    yield from running_s3()


def test_an_upload_staged_before_the_config_moved_to_datasets_is_published(
    tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.create_bucket()
    features = {"id": "int64", "blob": "bytes"}
    out = {
        "dir": f"s3://{bucket}/shards",
        "storage_options": s3_server.storage_options(),
        "compression": "none",
        "max_shard_age": "1s",
    }
    cfg = write_config(tmp_path, features=features, output=out)
    spool_file(tmp_path / "spool", "a.jsonl", [{"id": i, "blob": "x" * 50} for i in range(300)])
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": "after-intent"})
    try:
        assert d.wait(120) == 137, d.output()
    finally:
        d.kill()
    # The same output written as [datasets]: its staging folder is another one now.
    cfg = write_datasets_config(
        tmp_path,
        {"movies": out | {"encoder": "movies"}},
        encoders={"movies": features},
        sources=[{"name": "spool", "dataset": "movies", "path": tmp_path / "spool"}],
    )
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "spool"))
    assert s3_server.read_ids(bucket, "shards") == Counter(range(300))


def _dataset(**completion: object) -> dict[str, object]:
    return {
        "encoder": "ev",
        "compression": "none",
        "partition": {"time": "event", "time_field": "ts"},
        "completion": {"idle_close": "10m"} | completion,
    }


def test_one_event_dated_far_ahead_closes_nothing_beyond_the_clock(tmp_path: Path) -> None:
    cfg = write_datasets_config(
        tmp_path,
        {"ev": _dataset()},
        encoders={"ev": EVENTS},
        sources=[{"name": "in", "dataset": "ev"}],
    )
    now = int(time.time())
    spool_file(tmp_path / "in", "a.jsonl", [{"id": 0, "ts": now + 50 * 365 * 86400}])
    spool_file(tmp_path / "in", "b.jsonl", [{"id": 1 + i, "ts": now + i} for i in range(10)])
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "in"))
    assert _ids(tmp_path / "ev") == list(range(11))
    assert dead_letters(tmp_path / "state") == []


_KILL_AFTER_MARKER = r"""
import os, sys
from tfrecordd.pipeline import completion
mark, save = completion.Completion.mark, completion.Completion._save
state = {"in": None, "saves": 0}
def marking(self, prefix):
    state["in"] = prefix
    try:
        return mark(self, prefix)
    finally:
        state["in"] = None
def saving(self):
    if state["in"] is not None and state["in"].endswith(sys.argv[2]):
        state["saves"] += 1
        if state["saves"] == 2:
            os._exit(137)  # the marker is published; the state saying so is not
    return save(self)
completion.Completion.mark, completion.Completion._save = marking, saving
from tfrecordd.cli import main
sys.exit(main(["run", "--config", sys.argv[1]]))
"""


def test_a_kill_after_a_marker_never_lets_its_partition_be_written_again(
    tmp_path: Path,
) -> None:
    cfg = write_datasets_config(
        tmp_path,
        {"ev": _dataset()},
        encoders={"ev": EVENTS},
        sources=[{"name": "in", "dataset": "ev"}],
        daemon={"max_batch_events": 10},
    )
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen(
        [sys.executable, "-c", _KILL_AFTER_MARKER, str(cfg), _hour(1)[-7:]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        for k in range(3):
            events = [{"id": 10 * k + i, "ts": T0 + k * 3600 + i} for i in range(10)]
            spool_file(tmp_path / "in", f"a{k}.jsonl", events)
            wait_for(lambda: spool_drained(tmp_path / "in") or p.poll() is not None, 30)
        assert p.wait(60) == 137
    finally:
        p.kill()
    marker = tmp_path / "ev" / _hour(1) / "_SUCCESS"
    first = json.loads(marker.read_bytes())
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        spool_file(tmp_path / "in", "b.jsonl", [{"id": 1000, "ts": T0 + 3600 + 5}])
        wait_for(lambda: spool_drained(tmp_path / "in"), 30)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    assert json.loads(marker.read_bytes()) == first
    (late,) = dead_letters(tmp_path / "state")
    assert late["reason"] == "late"


def test_a_late_record_in_a_batch_that_cuts_a_commit_is_dead_lettered_once(
    tmp_path: Path,
) -> None:
    cfg = write_datasets_config(
        tmp_path,
        {"ev": _dataset() | {"max_shard_records": 25}},
        encoders={"ev": EVENTS},
        sources=[{"name": "in", "dataset": "ev"}],
        daemon={"max_batch_events": 25},
    )
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        first = [{"id": i, "ts": T0 + (i // 10) * 3600 + i} for i in range(30)]
        spool_file(tmp_path / "in", "a.jsonl", first)
        wait_for(lambda: len(list((tmp_path / "ev").rglob("_SUCCESS"))) == 2, 30)
        second = [{"id": 1000, "ts": T0 + 5}]
        second += [{"id": 100 + k, "ts": T0 + 2 * 3600 + 100 + k} for k in range(20)]
        spool_file(tmp_path / "in", "b.jsonl", second)
        wait_for(lambda: spool_drained(tmp_path / "in"), 30)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    late = [
        example_int64(base64.b64decode(letter["raw_base64"]), "id")[0]
        for letter in dead_letters(tmp_path / "state")
    ]
    assert late == [1000]
    assert _ids(tmp_path / "ev") == [*range(30), *range(100, 120)]


_KILL_AT_LINK = r"""
import os, sys
from tfrecordd import fsys
publish, truncate = fsys.FileSystem.publish, fsys.FileSystem.truncate
def linking(self, src, dst):
    if sys.argv[2] == "link" and dst.endswith(".zz"):
        os.link(src, dst)
        os._exit(137)  # between the link and the unlink
    return publish(self, src, dst)
def cutting(self, f, size):
    truncate(self, f, size)
    if sys.argv[2] == "cut":
        os._exit(137)  # between the cut and the stream's ending
fsys.FileSystem.publish, fsys.FileSystem.truncate = linking, cutting
from tfrecordd.cli import main
sys.exit(main(["run", "--config", sys.argv[1]]))
"""


def test_a_kept_open_shard_linked_by_a_killed_start_is_never_cut(tmp_path: Path) -> None:
    route = {"field": "type", "to": {"click": "clicks"}, "default": "views"}
    cfg = write_datasets_config(
        tmp_path,
        {
            "clicks": {"encoder": "ev", "compression": "none", "max_shard_records": 50},
            "views": {"encoder": "ev", "compression": "zlib", "max_shard_age": "10m"},
        },
        encoders={"ev": EVENTS | {"type": "bytes"}},
        sources=[{"name": "in", "route": route}],
        daemon={"max_batch_events": 30},
    )
    events = [{"id": i, "type": ("click", "view")[i % 2]} for i in range(1000)]
    spool_file(tmp_path / "in", "a.jsonl", events)
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": "after-intent:6"})
    try:
        assert d.wait(60) == 137, d.output()
    finally:
        d.kill()
    # The next start finishes the views shard at its prefix and is killed between publishing
    # its link and removing its in-progress name.
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _KILL_AT_LINK, str(cfg), "link"],
        capture_output=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 137
    (linked,) = dataset_shards(tmp_path / "views")
    before = linked.read_bytes()
    # The start after must not cut the published file (which is the in-progress one too): a
    # kill between the cut and the ending would leave a published shard that does not read.
    p = subprocess.Popen([sys.executable, "-c", _KILL_AT_LINK, str(cfg), "cut"], env=env)
    try:
        p.wait(8)
    except subprocess.TimeoutExpired:
        p.terminate()
        assert p.wait(60) == 0
    assert linked.read_bytes() == before
    assert read_shard(linked)
    # Every click published means every line was read; the stop publishes the views shard.
    run_clean_until(cfg, lambda: len(_ids(tmp_path / "clicks")) == 500)
    assert spool_drained(tmp_path / "in")
    assert linked.read_bytes() == before, "a published shard was cut"
    assert _ids(tmp_path / "views") == list(range(1, 1000, 2))
    assert _ids(tmp_path / "clicks") == list(range(0, 1000, 2))


@pytest.mark.parametrize(
    ("payload", "value"),
    [
        (b'{"type": "click", "x": 1e400}', "click"),
        (b'{"type": 1e400}', "1e400"),
        (b'{"type": true}', "true"),
        (b'{"type": 7}', "7"),
        (b'{"type": [1]}', None),
        (b"[1]", None),
        (b"not json", None),
    ],
)
def test_route_values_of_every_json_the_encoders_take(payload: bytes, value: str | None) -> None:
    assert route_value(RawEvent(payload, ""), "type") == value


def test_the_descriptor_reserve_grows_with_the_shards_datasets_may_hold_open() -> None:
    from tfrecordd import descriptors

    # A daemon made earlier in this process set it for its own datasets: put back after.
    before = (descriptors.reserved() - descriptors.RESERVED) // 2
    try:
        descriptors.reserve_for_shards(0)
        assert descriptors.reserved() == descriptors.RESERVED
        descriptors.reserve_for_shards(5 * 32)
        assert descriptors.reserved() == descriptors.RESERVED + 2 * 5 * 32
    finally:
        descriptors.reserve_for_shards(before)


def test_a_kept_open_shard_published_by_a_killed_start_gets_its_manifest(tmp_path: Path) -> None:
    route = {"field": "type", "to": {"click": "clicks"}, "default": "views"}

    def config(views_age: str) -> Path:
        return write_datasets_config(
            tmp_path,
            {
                "clicks": {"encoder": "ev", "compression": "none", "max_shard_records": 50},
                "views": {"encoder": "ev", "compression": "gzip", "max_shard_age": views_age},
            },
            encoders={"ev": EVENTS | {"type": "bytes"}},
            sources=[{"name": "in", "route": route}],
            daemon={"max_batch_events": 30},
        )

    cfg = config("10m")
    spool_file(
        tmp_path / "in",
        "a.jsonl",
        [{"id": i, "type": ("click", "view")[i % 2]} for i in range(1000)],
    )
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        wait_for(lambda: len(dataset_shards(tmp_path / "clicks")) >= 10, 30)
    finally:
        d.kill()
    # The next start publishes the kept-open views shard and is killed before its manifest.
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": "after-publish:1"})
    try:
        assert d.wait(60) == 137, d.output()
    finally:
        d.kill()
    # Drained means acknowledged: the last views may wait for their shard's age cap, which
    # the last run makes short (10 minutes would outlast the wait).
    run_clean_until(config("1s"), lambda: spool_drained(tmp_path / "in"))
    for shard in dataset_shards(tmp_path / "views"):
        assert shard.with_name(shard.name.replace(".tfrecord.gz", ".manifest.json")).exists()
    assert _ids(tmp_path / "views") == list(range(1, 1000, 2))


class _KeptShardEio(FileSystem):
    """EIO at the ``nth`` fsync of the views dataset's shard: the fsync a commit makes of a
    shard it keeps open (the views shard is never closed before the stop)."""

    def __init__(self, nth: int) -> None:
        self.nth = nth
        self.seen = 0

    def fsync(self, f: BinaryIO) -> None:
        path = os.readlink(f"/proc/self/fd/{f.fileno()}")
        if "/views/" in path and path.endswith(".inprogress"):
            self.seen += 1
            if self.seen == self.nth:
                raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        super().fsync(f)


@pytest.mark.parametrize("nth", [1, 3])
def test_a_failed_fsync_of_a_kept_open_shard_stops_and_loses_nothing(
    tmp_path: Path, nth: int
) -> None:
    route = {"field": "type", "to": {"click": "clicks"}, "default": "views"}
    cfg = write_datasets_config(
        tmp_path,
        {
            "clicks": {"encoder": "ev", "compression": "none", "max_shard_records": 50},
            "views": {"encoder": "ev", "compression": "zlib", "max_shard_age": "10m"},
        },
        encoders={"ev": EVENTS | {"type": "bytes"}},
        sources=[{"name": "in", "route": route}],
        daemon={"max_batch_events": 30},
    )
    spool_file(
        tmp_path / "in",
        "a.jsonl",
        [{"id": i, "type": ("click", "view")[i % 2]} for i in range(600)],
    )
    fs = _KeptShardEio(nth)
    daemon = Daemon(load_config(cfg), fs=fs, handle_signals=False)

    async def body() -> None:
        await anyio.sleep(30)
        daemon.request_stop()

    error = run_daemon_with(daemon, body)
    assert fs.seen == nth, "the fault was injected"
    assert error is not None
    assert isinstance(find_error(error), DurabilityError), error
    assert not spool_drained(tmp_path / "in"), "acknowledged after an fsync error"
    run_clean_until(cfg, lambda: len(_ids(tmp_path / "clicks")) == 300)
    assert _ids(tmp_path / "clicks") == list(range(0, 600, 2))
    assert _ids(tmp_path / "views") == list(range(1, 600, 2))


def test_a_drain_cuts_the_upload_budget_of_every_dataset_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tfrecordd.outputs.output import LocalOutput

    cut: list[str] = []
    monkeypatch.setattr(
        LocalOutput, "stop_retrying_at", lambda self, deadline: cut.append(self.location)
    )
    cfg = write_datasets_config(
        tmp_path,
        {"a": {"encoder": "ev"}, "b": {"encoder": "ev"}},
        encoders={"ev": EVENTS},
        sources=[{"name": "in", "dataset": "a"}],
    )
    Daemon(load_config(cfg), handle_signals=False).request_stop()
    assert sorted(cut) == [str(tmp_path / "a"), str(tmp_path / "b")]


def test_state_files_found_at_start_are_made_durable_before_they_are_read(tmp_path: Path) -> None:
    """A dataset's completion state and a spool's claims left, found at start, may be what a
    process killed before its folder's fsync wrote or renamed in (readable, not durable). Their
    folders are fsynced, down from ``state_dir``, before the daemon acts on them: else a power
    cut after a marker or a skipped claim would take the state that led to it."""
    cfg = write_datasets_config(
        tmp_path,
        {"ev": _dataset()},
        encoders={"ev": EVENTS},
        sources=[{"name": "in", "dataset": "ev"}],
    )
    state = tmp_path / "state"
    completion_state = state / "datasets" / "ev" / "completion.json"
    completion_state.parent.mkdir(parents=True)
    completion_state.write_text('{"watermark": null, "pending": [], "closed_through": null}')
    left = state / "sources" / "in" / "left.json"
    left.parent.mkdir(parents=True)
    left.write_text("[]")
    fs = DirSyncs()
    daemon = Daemon(load_config(cfg), fs=fs, handle_signals=False)

    async def body() -> None:
        with anyio.fail_after(10):
            while not (tmp_path / "in" / ".tfrecordd-claimed" / "test").is_dir():
                await anyio.sleep(0.01)  # the source took its claim folder: it read left.json
        daemon.request_stop()

    assert run_daemon_with(daemon, body) is None
    for folder in (state / "datasets", completion_state.parent, state / "sources", left.parent):
        assert str(folder.resolve()) in fs.folders, folder


def test_each_source_state_folder_is_made_durably_before_the_source_recovers(
    tmp_path: Path,
) -> None:
    """The daemon makes ``state_dir/sources/<name>/`` for every source, each folder fsynced
    into its parent down from ``state_dir``, before any source recovers (the spool's first act
    is to take its claim folder): a source's state file then needs only its own folder's
    fsync, and a source knows nothing of the daemon's layout."""
    cfg = write_datasets_config(
        tmp_path,
        {"ev": _dataset()},
        encoders={"ev": EVENTS},
        sources=[{"name": "in", "dataset": "ev"}, {"name": "other", "dataset": "ev"}],
    )
    fs = DirSyncs()
    daemon = Daemon(load_config(cfg), fs=fs, handle_signals=False)
    claims = tmp_path / "in" / ".tfrecordd-claimed" / "test"

    async def body() -> None:
        with anyio.fail_after(10):
            while not claims.is_dir():
                await anyio.sleep(0.01)
        daemon.request_stop()

    assert run_daemon_with(daemon, body) is None
    state = (tmp_path / "state").resolve()
    spool = str((tmp_path / "in").resolve())
    first_claim = next(i for i, f in enumerate(fs.folders) if f.startswith(spool))
    for name in ("in", "other"):
        wanted = [str(state), str(state / "sources"), str(state / "sources" / name)]
        assert (state / "sources" / name).is_dir()
        synced = [f for f in fs.folders[:first_claim] if f in wanted]
        assert sorted(set(synced), key=wanted.index) == wanted, (name, fs.folders)


class _NoDirFsync(FileSystem):
    """A file system whose folders (those under ``only``, if given) cannot be fsynced (some
    FUSE and shared-folder mounts)."""

    def __init__(self, only: str = "") -> None:
        self.only = only

    def fsync_dir(self, path: str) -> None:
        if self.only not in path:
            return super().fsync_dir(path)
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)


async def _stop_after(daemon: Daemon, seconds: float) -> None:
    await anyio.sleep(seconds)
    daemon.request_stop()


def _net_daemon(tmp_path: Path, fs: FileSystem, **dataset: object) -> Daemon:
    cfg = write_datasets_config(
        tmp_path,
        {"ev": {"encoder": "ev", **dataset}},
        encoders={"ev": EVENTS},
        sources=[{"name": "net", "type": "udp", "listen": "127.0.0.1:0", "dataset": "ev"}],
    )
    return Daemon(load_config(cfg), fs=fs, handle_signals=False)


def test_without_fsync_a_source_state_folder_is_made_and_not_fsynced(tmp_path: Path) -> None:
    """With ``fsync = false`` the daemon fsyncs nothing, a source's state folder included: it
    starts on a file system that cannot fsync a folder."""
    daemon = _net_daemon(tmp_path, _NoDirFsync(), fsync=False)

    async def body() -> None:
        daemon.request_stop()

    assert run_daemon_with(daemon, body) is None
    assert (tmp_path / "state" / "sources" / "net").is_dir()


def test_a_failed_fsync_of_a_source_state_folder_stops_the_daemon(tmp_path: Path) -> None:
    daemon = _net_daemon(tmp_path, _NoDirFsync(only="/sources"))
    raised = run_daemon_with(daemon, lambda: _stop_after(daemon, 10))
    assert raised is not None
    error = find_error(raised)
    assert isinstance(error, DurabilityError), error
    assert "source net: fsync of its state folder" in str(error)


def test_a_source_state_folder_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    """A symbolic link planted in ``state_dir/sources/`` is never followed."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "state" / "sources").mkdir(parents=True)
    (tmp_path / "state" / "sources" / "net").symlink_to(elsewhere)
    daemon = _net_daemon(tmp_path, FileSystem())
    raised = run_daemon_with(daemon, lambda: _stop_after(daemon, 10))
    assert raised is not None
    error = find_error(raised)
    assert isinstance(error, StateError), error
    assert "is a symbolic link" in str(error)
    assert list(elsewhere.iterdir()) == []


def test_a_claim_left_for_good_is_recorded_durably(tmp_path: Path) -> None:
    """A claim left for good (read and published, and it could be neither deleted, moved, set
    aside nor renamed) is recorded in ``left.json``, its folder fsynced: or a power cut could
    take the record and the claim would be read again."""
    (tmp_path / "in").mkdir()
    config = DirectorySourceConfig.model_validate(
        {"name": "in", "encoder": "e", "path": tmp_path / "in"}
    )
    fs = DirSyncs()
    claims = Claims(config)
    state = tmp_path / "state" / "sources" / "in"
    claims.attach(RecordingContext(name="in", state_dir=str(state), fs=fs))
    claims.leave("a.jsonl")
    assert json.loads((state / "left.json").read_text()) == ["a.jsonl"]
    assert set(fs.folders) == {str(state.resolve())}


def test_a_claim_left_during_recovery_keeps_the_claims_left_before(tmp_path: Path) -> None:
    """A claim can be left while the source recovers (finishing a file its journal says was
    read to the end), before ``left.json`` is read with the claim folder: the record then
    keeps the claims it already named, or they would be read again."""
    (tmp_path / "in").mkdir()
    config = DirectorySourceConfig.model_validate(
        {"name": "in", "encoder": "e", "path": tmp_path / "in"}
    )
    state = tmp_path / "state" / "sources" / "in"
    state.mkdir(parents=True)
    (state / "left.json").write_text('["a.jsonl"]')
    claims = Claims(config)
    claims.attach(RecordingContext(name="in", state_dir=str(state), fs=DirSyncs()))
    claims.leave("b.jsonl")
    assert json.loads((state / "left.json").read_text()) == ["a.jsonl", "b.jsonl"]


def test_a_watermark_moved_by_records_no_commit_covers_closes_nothing_after_a_crash(
    tmp_path: Path,
) -> None:
    """Five files of hours 1, 2, 0, 3 and 4, read into one commit; a kill at its first fsync.
    Hour 0's events are on time when read (90 minutes of lateness after hour 2). The state file
    the watermark lives in was written as each new hour's shard opened, and must keep the
    watermark of the last commit only: else the restart finds hour 0 closed by records it
    never committed (hour 3's), and its replayed events are late."""
    cfg = write_datasets_config(
        tmp_path,
        {"ev": _dataset(allowed_lateness="90m") | {"max_shard_age": "2s"}},
        encoders={"ev": {"id": "int64", "ts": {"type": "int64", "time_unit": "s"}}},
        sources=[{"name": "in", "dataset": "ev"}],
    )
    for k, hour in enumerate([1, 2, 0, 3, 4]):
        events = [{"id": 10 * hour + i, "ts": T0 + hour * 3600 + i} for i in range(10)]
        spool_file(tmp_path / "in", f"{k}.jsonl", events)
    d = DaemonProcess(cfg, env={"TFRECORDD_CRASH_AT": "after-fsync:1"})
    try:
        assert d.wait(60) == 137, d.output()
    finally:
        d.kill()
    run_clean_until(cfg, lambda: spool_drained(tmp_path / "in"))
    assert dead_letters(tmp_path / "state") == []
    assert _ids(tmp_path / "ev") == list(range(50))
