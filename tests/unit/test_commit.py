"""The committer alone (tfrecordd.pipeline.commit): its steps in order, acks only after the
publish, and a failure at each step leaving state that the next start recovers exactly once;
the shards of one cut handled at once, in threads, without breaking that order."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from tests.unit.pipeline_parts import DATASET, NODE, SOURCE, Parts, RecordingSource, StepFs
from tfrecordd.errors import DurabilityError
from tfrecordd.format.compression import Compression
from tfrecordd.fsys import FileSystem
from tfrecordd.outputs.manifest import manifest_name
from tfrecordd.outputs.output import LocalOutput
from tfrecordd.outputs.shards import FinishedShard, OpenShard
from tfrecordd.pipeline.commit import Kept, each_at_once
from tfrecordd.state.reading import scan_journal

pytestmark = pytest.mark.anyio

RECORDS = [b"one", b"two", b"three"]


async def test_steps_run_in_protocol_order_and_acks_follow_the_publish(tmp_path: Path) -> None:
    log: list[tuple[str, str]] = []
    parts = Parts(tmp_path, StepFs(log))
    parts.open()
    source = RecordingSource(log)
    unit = parts.unit(RECORDS, {"file": "a", "offset": 3})
    del log[:]
    await parts.committer(source).commit(unit)
    assert log == [
        ("fsync", "shard"),
        ("fsync", "staging"),
        ("write", "journal"),  # the intent
        ("fsync", "journal"),
        ("publish", "shard"),
        ("fsync", "dir"),
        ("ack", SOURCE),
        ("write", "journal"),  # done
    ]
    assert source.acked == [{"file": "a", "offset": 3}]
    assert parts.published() == [unit.closing[0].shard.name]
    assert parts.staged() == []
    records = scan_journal(parts.journal.path).records
    assert [r["t"] for r in records] == ["intent", "done"]
    assert records[0]["positions"] == {SOURCE: [{"file": "a", "offset": 3}]}
    assert records[0]["shards"][0][2] == len(RECORDS)
    parts.journal.close()


async def test_positions_alone_journal_and_ack_without_a_shard(tmp_path: Path) -> None:
    log: list[tuple[str, str]] = []
    parts = Parts(tmp_path, StepFs(log))
    parts.open()
    source = RecordingSource(log)
    unit = parts.unit([], 7)
    del log[:]
    await parts.committer(source).commit(unit)
    assert log == [
        ("write", "journal"),
        ("fsync", "journal"),
        ("ack", SOURCE),
        ("write", "journal"),
    ]
    assert source.acked == [7]
    assert parts.published() == []
    parts.journal.close()


async def test_a_manifest_is_published_after_its_shard_and_before_the_acks(tmp_path: Path) -> None:
    log: list[tuple[str, str]] = []
    parts = Parts(tmp_path, StepFs(log), manifests=True)
    parts.open()
    source = RecordingSource(log)
    unit = parts.unit(RECORDS, 1)
    await parts.committer(source).commit(unit)
    published = log.index(("publish", "shard"))
    assert published < log.index(("ack", SOURCE))
    # The manifest is staged, fsynced and renamed in between (its in-progress file is a "shard"
    # to the step log: it has the same suffix).
    between = log[published + 1 : log.index(("ack", SOURCE))]
    assert between.count(("fsync", "shard")) == 1
    assert between.count(("fsync", "dir")) == 2
    assert (tmp_path / "out" / manifest_name(unit.closing[0].shard.name)).exists()
    parts.journal.close()


# Each step that can fail, what the next start must make of it: "redone" (the intent is in the
# journal: the shard is published, its acks are redone), or "replayed" (no intent, nothing
# committed: the events come again from the source). An intent whose fsync failed is in the
# journal file all the same (the process did not crash): committed.
FAILURES = [
    pytest.param(("fsync", "shard"), "replayed", id="shard-fsync"),
    pytest.param(("fsync", "staging"), "replayed", id="staging-fsync"),
    pytest.param(("write", "journal"), "replayed", id="intent-write"),
    pytest.param(("fsync", "journal"), "redone", id="intent-fsync"),
    pytest.param(("publish", "shard"), "redone", id="publish"),
    pytest.param(("fsync", "dir"), "redone", id="dir-fsync-after-publish"),
    pytest.param(("ack", SOURCE), "redone", id="ack"),
]


@pytest.mark.parametrize(("step", "outcome"), FAILURES)
async def test_a_failed_step_leaves_state_the_next_start_recovers(
    tmp_path: Path, step: tuple[str, str], outcome: str
) -> None:
    log: list[tuple[str, str]] = []
    fs = StepFs(log)
    parts = Parts(tmp_path, fs)
    parts.open()
    source = RecordingSource(log, fail_ack=step == ("ack", SOURCE))
    unit = parts.unit(RECORDS, 42)
    name = unit.closing[0].shard.name
    fs.fail = None if source.fail_ack else step
    with pytest.raises((DurabilityError, OSError)):
        await parts.committer(source).commit(unit)
    assert fs.fail is None, "the step was reached"
    assert step in log
    # Nothing is acknowledged unless the shard was published.
    assert source.acked == []
    if ("publish", "shard") not in log or step == ("publish", "shard"):
        assert ("ack", SOURCE) not in log
        assert parts.published() == []
    # The files stay as they are for the next start to decide on.

    after = RecordingSource()
    report = await parts.restart(after)
    assert parts.staged() == [], "no in-progress file outlives the next start"
    assert after.recovered is not None
    state, pending = after.recovered
    committed = [*(state or []), *pending]
    if outcome == "redone":
        assert parts.published() == [name]
        assert committed == [42]
        assert [[s.name for s in i.shards] for i in report.redone] == [[name]]
    else:
        assert parts.published() == []
        assert committed == []
        assert report.redone == ()
    # Either way the journal is finished: a second start has nothing left to do.
    again = RecordingSource()
    second = await parts.restart(again)
    assert (second.redone, second.dropped) == ((), ())
    assert again.recovered is not None
    assert [*(again.recovered[0] or []), *again.recovered[1]] == committed


class _FolderOrderFs(FileSystem):
    """Logs each shard linked into the output and each fsync of the output's root; the root's
    fsync is slow, as on a loaded disk, and fails with EIO if told to."""

    def __init__(self, root: str, log: list[str], *, fail: bool = False) -> None:
        self.root = root
        self.log = log
        self.fail = fail

    def fsync_dir(self, path: str) -> None:
        if os.path.realpath(path) == os.path.realpath(self.root):
            time.sleep(0.2)
            if self.fail:
                self.log.append("root fsync failed")
                raise OSError(errno.EIO, os.strerror(errno.EIO), path)
            self.log.append("root synced")
        super().fsync_dir(path)

    def publish(self, src: str, dst: str) -> None:
        self.log.append("linked")
        super().publish(src, dst)


def _finished(output: LocalOutput, fs: FileSystem, names: list[str]) -> list[FinishedShard]:
    shards = []
    for name in names:
        shard = OpenShard(
            output.staging_dir,
            name,
            Compression.NONE,
            None,
            1 << 20,
            fs,
            track_offsets=False,
            folder=FOLDER,
        )
        shard.write([b"record"])
        shards.append(shard.finish())
    return shards


FOLDER = "dt=2026-11-28"


def _output(tmp_path: Path, *, fail: bool = False) -> tuple[LocalOutput, FileSystem, list[str]]:
    """A local output under ``tmp_path / "out"`` through a :class:`_FolderOrderFs`, and its
    log."""
    log: list[str] = []
    fs = _FolderOrderFs(str(tmp_path / "out"), log, fail=fail)
    output = LocalOutput(str(tmp_path / "out"), fs, node_id=NODE)
    os.makedirs(output.staging_dir)
    return output, fs, log


def test_shards_published_at_once_find_their_new_folder_durable_first(tmp_path: Path) -> None:
    # Two shards of one cut published at once into one new partition folder: the one that does
    # not make the folder must not link its shard there before the folder's entry is durable in
    # the output's root (a power cut would lose the folder, and the shard in it, after the
    # journal said it was published).
    output, fs, log = _output(tmp_path)
    out = tmp_path / "out"
    each_at_once(output.publish, _finished(output, fs, ["part-0.tfrecord", "part-1.tfrecord"]))
    assert log == ["root synced", "linked", "linked"]
    assert sorted(os.listdir(out / FOLDER)) == ["part-0.tfrecord", "part-1.tfrecord"]
    # Known durable from now on: no more fsyncs of the root for it.
    output.publish(_finished(output, fs, ["part-2.tfrecord"])[0])
    assert log == ["root synced", "linked", "linked", "linked"]


def test_a_folder_found_at_start_is_made_durable_before_a_shard_goes_in(tmp_path: Path) -> None:
    # A crash between a folder's mkdir and its parent's fsync leaves the folder there, its entry
    # not durable: the next start does not take it for durable because it exists.
    output, fs, log = _output(tmp_path)
    out = tmp_path / "out"
    os.mkdir(out / FOLDER)
    output.publish(_finished(output, fs, ["part-0.tfrecord"])[0])
    assert log == ["root synced", "linked"]


def test_no_shard_goes_into_a_folder_whose_parent_failed_its_fsync(tmp_path: Path) -> None:
    # The shard that made the folder fails; the one published at once with it, which finds the
    # folder there, must fail too, not go in.
    output, fs, log = _output(tmp_path, fail=True)
    out = tmp_path / "out"
    shards = _finished(output, fs, ["part-0.tfrecord", "part-1.tfrecord"])
    with pytest.raises(DurabilityError):
        each_at_once(output.publish, shards)
    assert "linked" not in log
    assert os.listdir(out / FOLDER) == []
    with pytest.raises(DurabilityError, match="failed before"):
        output.publish(shards[0])


def test_each_at_once_raises_the_first_error_after_every_call_ended(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ended: list[int] = []

    def call(n: int) -> int:
        if n == 1:
            raise ValueError("one")
        if n == 3:
            raise KeyError("three")
        time.sleep(0.05 * (n % 3))
        ended.append(n)
        return n * 10

    assert each_at_once(call, [0, 2, 4, 5]) == [0, 20, 40, 50]
    ended.clear()
    with pytest.raises(ValueError, match="one"):
        each_at_once(call, list(range(12)))
    assert sorted(ended) == [n for n in range(12) if n not in (1, 3)]
    # The other error is not lost: a bug behind an I/O error of the same cut still shows.
    assert "'three'" in caplog.text


async def test_a_cut_of_many_shards_keeps_the_protocol_order_across_them(tmp_path: Path) -> None:
    # Shards of a cut are finished, made durable and published at once, in threads: still every
    # one is fsynced before the intent, and published (with its manifest) before the ack; the
    # ack waits for the shard the cut kept open, which the next cut publishes.
    log: list[tuple[str, str]] = []
    parts = Parts(tmp_path, StepFs(log), manifests=True)
    parts.open()
    source = RecordingSource(log)
    committer = parts.committer(source)
    unit = parts.unit(RECORDS, 5)
    for n in range(11):
        extra = parts.shard([b"r%d" % k for k in range(n + 1)])
        unit.closing.append(Kept(DATASET, extra))
    kept_open = parts.shard([b"open"])
    kept_open.mark()
    unit.continuing.append(Kept(DATASET, kept_open, prefix=kept_open.marked))
    del log[:]
    await committer.commit(unit)
    intent = log.index(("write", "journal"))
    shard_fsyncs = [i for i, step in enumerate(log) if step == ("fsync", "shard")]
    publishes = [i for i, step in enumerate(log) if step == ("publish", "shard")]
    # 12 shards finished and 1 kept open before the intent; 12 manifests staged after it.
    assert len([i for i in shard_fsyncs if i < intent]) == 13
    assert len(publishes) == 12
    assert intent < min(publishes)
    assert source.acked == []
    names = [k.shard.name for k in unit.closing]
    assert parts.published() == sorted(names)
    assert all((tmp_path / "out" / manifest_name(n)).exists() for n in names)

    last = parts.unit([], 6)
    last.closing.append(Kept(DATASET, kept_open))
    del log[:]
    await committer.commit(last)
    assert log.index(("publish", "shard")) < log.index(("ack", SOURCE))
    assert source.acked == [5, 6]
    assert parts.published() == sorted([*names, kept_open.name])
    parts.journal.close()
