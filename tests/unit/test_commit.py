"""The committer alone (tfrecordd.pipeline.commit): its steps in order, acks only after the
publish, and a failure at each step leaving state that the next start recovers exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.pipeline_parts import SOURCE, Parts, RecordingSource, StepFs
from tfrecordd.errors import DurabilityError
from tfrecordd.outputs.manifest import manifest_name
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
