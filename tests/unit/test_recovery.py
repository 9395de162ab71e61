"""Recovery alone (tfrecordd.pipeline.recovery.recover) over hand-made journals: what each
unfinished intent becomes, from what the output holds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.pipeline_parts import DATASET, NODE, SOURCE, Parts, RecordingSource
from tfrecordd.format.framing import frame
from tfrecordd.format.writer import inprogress_name
from tfrecordd.outputs.manifest import manifest_name
from tfrecordd.state.journal import Journal
from tfrecordd.state.reading import scan_journal
from tfrecordd.state.records import STATE_FORMAT, Intent, ShardRef

pytestmark = pytest.mark.anyio

SHARD = f"part-{NODE}-abc-00001.tfrecord"


SHARD_BYTES = frame(b"abc")
"""A shard of one record (no compression)."""


def _journal(parts: Parts, *intents: tuple[str | None, int, str, bool]) -> list[Intent]:
    """Write intents ``(shard, token, then, kept)`` where ``then`` is ``"open"`` (no end),
    ``"done"`` or ``"dropped"``, as a daemon of the version that wrote them would."""
    journal = Journal(parts.state, parts.fs, folds={SOURCE: RecordingSource.fold})
    journal.recover()
    written = []
    for shard, token, then, kept in intents:
        refs = [ShardRef(DATASET, shard, 1, len(SHARD_BYTES))] if shard else []
        intent = journal.next_intent({SOURCE: [token]}, refs)
        intent.kept = kept
        journal.write_intent(intent)
        if then == "done":
            journal.write_done(intent.seq)
        elif then == "dropped":
            journal.drop(intent.seq)
        written.append(intent)
    journal.close()
    return written


def _staged(parts: Parts, shard: str, data: bytes = SHARD_BYTES) -> Path:
    path = Path(parts.output.staging_dir) / inprogress_name(shard)
    path.write_bytes(data)
    return path


def _published(parts: Parts, shard: str) -> Path:
    path = parts.root / "out" / shard
    path.write_bytes(SHARD_BYTES)
    return path


async def _recover(parts: Parts) -> tuple[RecordingSource, list[int], list[int]]:
    """Recover; the source, the tokens committed before (its state) and those to redo."""
    source = RecordingSource()
    await parts.restart(source)
    assert source.recovered is not None
    state, pending = source.recovered
    return source, list(state or []), pending


async def test_an_unfinished_intent_whose_shard_is_published_is_redone(tmp_path: Path) -> None:
    parts = Parts(tmp_path)
    (intent,) = _journal(parts, (SHARD, 1, "open", True))
    _published(parts, SHARD)
    source = RecordingSource()
    report = await parts.restart(source)
    assert [i.seq for i in report.redone] == [intent.seq]
    assert report.dropped == ()
    assert source.recovered == (None, [1])
    records = scan_journal(parts.journal.path).records
    assert records[-1] == {"t": "done", "seq": intent.seq, "v": STATE_FORMAT}
    assert parts.published() == [SHARD]


async def test_an_unfinished_intent_whose_shard_is_still_in_progress_is_rolled_forward(
    tmp_path: Path,
) -> None:
    # The intent is journalled only once its shard is complete and fsynced: the commit is
    # committed, and the next start finishes publishing it.
    parts = Parts(tmp_path)
    (intent,) = _journal(parts, (SHARD, 1, "open", True))
    staged = _staged(parts, SHARD)
    source = RecordingSource()
    report = await parts.restart(source)
    assert [i.seq for i in report.redone] == [intent.seq]
    assert report.dropped == ()
    assert source.recovered == (None, [1])
    assert not staged.exists()
    assert parts.published() == [SHARD]
    assert (parts.root / "out" / SHARD).read_bytes() == SHARD_BYTES
    _, state, pending = await _recover(parts)
    assert (state, pending) == ([1], [])


async def test_an_intent_whose_staged_copy_differs_from_it_is_dropped(tmp_path: Path) -> None:
    parts = Parts(tmp_path)
    (intent,) = _journal(parts, (SHARD, 1, "open", True))
    staged = _staged(parts, SHARD, SHARD_BYTES + frame(b"more"))
    source = RecordingSource()
    report = await parts.restart(source)
    assert [i.seq for i in report.dropped] == [intent.seq]
    assert report.redone == ()
    assert report.discarded == (str(staged),)
    assert source.recovered == (None, [])
    assert not staged.exists()
    assert parts.published() == []
    # The drop is in the journal: the next start does not see the intent again.
    assert {
        "t": "done",
        "seq": intent.seq,
        "dropped": True,
        "v": STATE_FORMAT,
    } in scan_journal(parts.journal.path).records
    _, state, pending = await _recover(parts)
    assert (state, pending) == ([], [])


async def test_a_shard_shipped_away_after_its_publish_is_redone_not_replayed(
    tmp_path: Path,
) -> None:
    # Neither the shard nor its in-progress file is there: a shipper moved the shard away. The
    # in-progress file of a journalled intent goes only when its shard is published (or after
    # a durable drop, which is not in the journal), so it was published.
    parts = Parts(tmp_path)
    _journal(parts, (SHARD, 5, "open", True))
    _, state, pending = await _recover(parts)
    assert (state, pending) == ([], [5])


@pytest.mark.parametrize("manifest", [False, True])
async def test_an_intent_of_the_version_before_kept_needs_its_shard_or_manifest(
    tmp_path: Path, manifest: bool
) -> None:
    # That version could remove an in-progress file without a durable drop: a missing one
    # proves nothing, only a published shard or manifest does.
    parts = Parts(tmp_path)
    (intent,) = _journal(parts, (SHARD, 5, "open", False))
    assert not intent.kept
    if manifest:
        (parts.root / "out" / manifest_name(SHARD)).write_text("{}")
    source = RecordingSource()
    report = await parts.restart(source)
    if manifest:
        assert [i.seq for i in report.redone] == [intent.seq]
        assert source.recovered == (None, [5])
    else:
        assert [i.seq for i in report.dropped] == [intent.seq]
        assert source.recovered == (None, [])


async def test_done_and_dropped_intents_are_left_as_they_are(tmp_path: Path) -> None:
    parts = Parts(tmp_path)
    _journal(
        parts,
        (SHARD, 1, "done", True),
        ("part-n1-abc-00002.tfrecord", 2, "dropped", True),
        (None, 3, "done", True),
    )
    _published(parts, SHARD)
    source = RecordingSource()
    report = await parts.restart(source)
    assert (report.redone, report.dropped, report.discarded) == ((), (), ())
    # Finished commits reach the source folded into its state; the dropped one not at all.
    assert source.recovered == ([1, 3], [])


async def test_positions_alone_are_redone_and_stray_in_progress_files_discarded(
    tmp_path: Path,
) -> None:
    parts = Parts(tmp_path)
    (intent,) = _journal(parts, (None, 9, "open", True))
    # An in-progress file no intent names (a crash before the intent): discarded. One of
    # another node in its own folder is not this daemon's to touch.
    stray = _staged(parts, "part-n1-abc-00007.tfrecord")
    other = Path(parts.output.staging_dir).parent / "n2"
    other.mkdir()
    (other / inprogress_name("part-n2-abc-00001.tfrecord")).write_bytes(b"x")
    source = RecordingSource()
    report = await parts.restart(source)
    assert [i.seq for i in report.redone] == [intent.seq]
    assert report.discarded == (str(stray),)
    assert source.recovered == (None, [9])
    assert os.listdir(other) == [inprogress_name("part-n2-abc-00001.tfrecord")]


async def test_an_in_progress_file_linked_to_its_final_name_counts_as_published(
    tmp_path: Path,
) -> None:
    # A crash between the link and the unlink of the publish, and the shard moved away since:
    # the in-progress file has a second link.
    parts = Parts(tmp_path)
    _journal(parts, (SHARD, 4, "open", True))
    staged = _staged(parts, SHARD)
    os.link(staged, tmp_path / "moved-away")
    _, state, pending = await _recover(parts)
    assert (state, pending) == ([], [4])
    assert not staged.exists()
