"""The commit journal: recovery, torn tails, corruption, compaction into a checkpoint."""

from __future__ import annotations

import gc
import os
import random
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tfrecordd.errors import StateError
from tfrecordd.fsys import LOCAL, FileSystem
from tfrecordd.state.journal import Journal, Recovered
from tfrecordd.state.records import CHECKPOINT, JOURNAL, ShardRef
from tfrecordd_plugins.sources.directory import DirectorySource

FOLDS = {"spool": DirectorySource.fold}


def tok(f: str, o: int, eof: bool = False) -> dict[str, Any]:
    return {"f": f, "o": o, "eof": eof}


def journal(path: Path, **kw: Any) -> Journal:
    return Journal(str(path), LOCAL, FOLDS, **kw)


def recovered(path: Path) -> Recovered:
    j = journal(path)
    try:
        return j.recover()
    finally:
        j.close()


def commit(j: Journal, shard: str, tokens: Sequence[dict[str, Any]], done: bool = True) -> int:
    intent = j.next_intent({"spool": list(tokens)}, [ShardRef("", shard, len(tokens))])
    j.write_intent(intent)
    if done:
        j.write_done(intent.seq)
    return intent.seq


def test_recovery_folds_finished_and_lists_unfinished(tmp_path: Path) -> None:
    j = journal(tmp_path)
    j.recover()
    commit(j, "s1", [tok("a", 10), tok("a", 20)])
    commit(j, "s2", [tok("a", 30, eof=True), tok("b", 5)])
    commit(j, "s3", [tok("b", 9)], done=False)
    j.close()
    rec = recovered(tmp_path)
    assert rec.states == {"spool": {"b": 5}}
    assert [[s.name for s in i.shards] for i in rec.unfinished] == [["s3"]]
    assert rec.unfinished[0].positions == {"spool": [tok("b", 9)]}
    assert rec.torn_at is None


class _Syncs(FileSystem):
    """The local file system, listing each fsync: ``(path, size)`` of a file, ``(path, -1)`` of
    a folder."""

    def __init__(self) -> None:
        self.synced: list[tuple[str, int]] = []

    def fsync(self, f: Any) -> None:
        super().fsync(f)
        path = os.path.realpath(f"/proc/self/fd/{f.fileno()}")
        self.synced.append((path, os.fstat(f.fileno()).st_size))

    def fsync_dir(self, path: str) -> None:
        super().fsync_dir(path)
        self.synced.append((os.path.realpath(path), -1))


def test_recovery_makes_what_it_read_durable_before_anything_is_redone(tmp_path: Path) -> None:
    """A process killed after writing an intent and before its fsync left the record readable,
    not durable. Recovery fsyncs the journal (with that record) and its folder before it hands
    the intent back to be redone: redone first, a power cut would take the record and leave what
    the redo did (a shard published, spool files acknowledged), and the events would replay."""
    killed = journal(tmp_path, fsync=False)  # its intent written, never fsynced
    killed.recover()
    commit(killed, "s1", [tok("a", 10)], done=False)
    killed.close()
    size = (tmp_path / JOURNAL).stat().st_size
    fs = _Syncs()
    j = Journal(str(tmp_path), fs, FOLDS)
    rec = j.recover()
    j.close()
    assert [[s.name for s in i.shards] for i in rec.unfinished] == [["s1"]]
    assert (str((tmp_path / JOURNAL).resolve()), size) in fs.synced
    assert (str(tmp_path.resolve()), -1) in fs.synced


def test_dropped_intents_are_never_committed(tmp_path: Path) -> None:
    j = journal(tmp_path)
    j.recover()
    seq = commit(j, "s1", [tok("a", 10)], done=False)
    j.drop(seq)
    j.close()
    rec = recovered(tmp_path)
    assert rec.states == {"spool": {}} or rec.states == {}
    assert rec.unfinished == []


def test_sequence_numbers_keep_growing_across_restarts(tmp_path: Path) -> None:
    j = journal(tmp_path)
    j.recover()
    first = commit(j, "s1", [tok("a", 1)])
    j.close()
    j = journal(tmp_path)
    j.recover()
    assert commit(j, "s2", [tok("a", 2)]) > first
    j.close()


@pytest.mark.parametrize("cut", [1, 5, 11, 12, 13, 20])
def test_a_torn_tail_is_cut_and_appends_continue(tmp_path: Path, cut: int) -> None:
    j = journal(tmp_path)
    j.recover()
    commit(j, "s1", [tok("a", 10)])
    good = os.path.getsize(tmp_path / JOURNAL)
    commit(j, "s2", [tok("a", 20)])
    j.close()
    with open(tmp_path / JOURNAL, "r+b") as f:
        f.truncate(good + cut)
    j = journal(tmp_path)
    rec = j.recover()
    assert rec.torn_at == good
    assert os.path.getsize(tmp_path / JOURNAL) == good
    assert rec.states == {"spool": {"a": 10}}
    commit(j, "s3", [tok("a", 30)])
    j.close()
    assert recovered(tmp_path).states == {"spool": {"a": 30}}


def test_random_corruption_is_a_torn_tail_only_where_no_intent_follows(tmp_path: Path) -> None:
    """Flip bits anywhere. In the last commit (nothing fsynced after it), recovery keeps exactly
    the records before the damaged one; anywhere else committed intents follow the damage, so
    recovery refuses to start (StateError, file untouched) rather than forget them."""
    rng = random.Random(7)
    j = journal(tmp_path)
    j.recover()
    ends = []
    for i in range(20):
        commit(j, f"s{i}", [tok("a", i + 1)])
        ends.append(os.path.getsize(tmp_path / JOURNAL))
    j.close()
    pristine = (tmp_path / JOURNAL).read_bytes()
    refused = torn = 0
    for _ in range(300):
        data = bytearray(pristine)
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        (tmp_path / JOURNAL).write_bytes(bytes(data))
        # Each commit is two records (intent, done); the intact prefix ends before `pos`.
        intact = [e for e in ends if e <= pos]
        if len(intact) < len(ends) - 1:
            with pytest.raises(StateError, match="durable records follow"):
                recovered(tmp_path)
            assert (tmp_path / JOURNAL).read_bytes() == bytes(data)
            refused += 1
            continue
        rec = recovered(tmp_path)
        assert rec.states.get("spool", {}) == {"a": len(intact)}
        assert rec.torn_at is not None
        assert rec.torn_at <= pos
        torn += 1
    assert refused
    assert torn


def _framed(*records: dict[str, Any]) -> bytes:
    import orjson

    from tfrecordd.format.framing import frame

    return b"".join(frame(orjson.dumps(r)) for r in records)


@pytest.mark.parametrize("then_intent", [True, False])
def test_a_drop_after_damage_is_never_lost_to_a_resync(tmp_path: Path, then_intent: bool) -> None:
    """A commit dropped at recovery (its in-progress file removed after the drop was durable),
    then damage in a record written before the drop: the drop must survive ``state repair``,
    or the commit reads as unfinished with no in-progress file, i.e. published and moved away,
    and its events are acked without being in any shard. With no intent after the damage, the
    drop alone proves it is damage rather than a torn tail."""
    from tfrecordd.state.reading import scan_journal

    j = journal(tmp_path)
    j.recover()
    commit(j, "s1", [tok("a", 10)])
    seq = commit(j, "s2", [tok("a", 20)], done=False)
    j.close()
    good = (tmp_path / JOURNAL).read_bytes()
    sources = _framed({"t": "sources", "types": {"spool": "directory"}})
    bad = bytearray(sources)
    bad[len(bad) // 2] ^= 0x20
    tail = _framed({"t": "done", "seq": seq, "dropped": True})
    if then_intent:
        tail += _framed(
            {"t": "intent", "seq": seq + 1, "shard": "s3", "positions": {"spool": [tok("a", 30)]}}
        )
    (tmp_path / JOURNAL).write_bytes(good + bytes(bad) + tail)
    with pytest.raises(StateError, match="durable records follow"):
        recovered(tmp_path)
    scan = scan_journal(str(tmp_path / JOURNAL))
    assert scan.damage is not None
    (tmp_path / JOURNAL).write_bytes(_framed(*scan.records, *scan.salvage))  # as repair does
    rec = recovered(tmp_path)
    assert seq not in [i.seq for i in rec.unfinished]
    assert rec.states == {"spool": {"a": 10}}


def test_compaction_folds_into_a_checkpoint(tmp_path: Path) -> None:
    j = journal(tmp_path, compact_after=4)
    j.recover()
    for i in range(10):
        commit(j, f"s{i}", [tok("a", (i + 1) * 10)])
    open_seq = commit(j, "open", [tok("b", 3)], done=False)
    j.close()
    assert (tmp_path / CHECKPOINT).exists()
    assert os.path.getsize(tmp_path / JOURNAL) < 600
    rec = recovered(tmp_path)
    assert rec.states == {"spool": {"a": 100}}
    assert [i.seq for i in rec.unfinished] == [open_seq]


class Token(dict[str, Any]):
    """A token a test can hold a weak reference to."""


def test_a_finished_commits_tokens_are_folded_at_once_not_kept(tmp_path: Path) -> None:
    """Memory does not grow with the tokens of the commits between two compactions (a big
    shard covers many)."""
    j = journal(tmp_path, compact_after=10_000)
    j.recover()
    refs = []
    for i in range(50):
        tokens = [Token(tok("a", i * 100 + k)) for k in range(100)]
        refs += [weakref.ref(t) for t in tokens]
        commit(j, f"s{i}", tokens)
        del tokens
    gc.collect()
    assert not [r for r in refs if r() is not None]
    j.compact()
    j.close()
    assert recovered(tmp_path).states == {"spool": {"a": 4999}}


def test_a_crash_between_checkpoint_and_journal_rewrite_is_harmless(tmp_path: Path) -> None:
    j = journal(tmp_path)
    j.recover()
    for i in range(3):
        commit(j, f"s{i}", [tok("a", (i + 1) * 10), tok("c", i, eof=i == 2)])
    j.close()
    before = recovered(tmp_path).states
    old_journal = (tmp_path / JOURNAL).read_bytes()
    j = journal(tmp_path)
    j.recover()
    j.compact()
    j.close()
    # As if the crash came after the checkpoint was renamed in, before the journal was.
    (tmp_path / JOURNAL).write_bytes(old_journal)
    assert recovered(tmp_path).states == before


def test_a_committed_record_over_any_size_limit_is_read_back_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit covering millions of positions makes one big record: no record-size limit may
    make it look torn. The framing reader's limit is lowered to 1 MiB so the record stays small."""
    from tfrecordd.format import framing

    monkeypatch.setattr(framing.iter_framed, "__kwdefaults__", {"max_record_bytes": 1 << 20})
    j = journal(tmp_path)
    j.recover()
    commit(j, "s1", [tok("a", 1)])
    big = [tok(f"file-{k:07d}", k) for k in range(60_000)]  # about 2.4 MiB of JSON
    commit(j, "s2", big)
    commit(j, "s3", [tok("b", 7)], done=False)
    j.close()
    size = os.path.getsize(tmp_path / JOURNAL)
    rec = recovered(tmp_path)
    assert rec.torn_at is None
    assert os.path.getsize(tmp_path / JOURNAL) == size
    assert len(rec.states["spool"]) == 60_001
    assert [[s.name for s in i.shards] for i in rec.unfinished] == [["s3"]]


@pytest.mark.parametrize("keep", [0, 1, 10, -1])
def test_a_damaged_checkpoint_is_a_clear_error_naming_the_file(tmp_path: Path, keep: int) -> None:
    j = journal(tmp_path, compact_after=2)
    j.recover()
    for i in range(3):
        commit(j, f"s{i}", [tok("a", i + 1)])
    j.close()
    data = (tmp_path / CHECKPOINT).read_bytes()
    (tmp_path / CHECKPOINT).write_bytes(data[:keep] if keep >= 0 else b"[1, 2]")
    with pytest.raises(StateError) as caught:
        recovered(tmp_path)
    message = str(caught.value)
    assert str(tmp_path / CHECKPOINT) in message
    assert "tfrecordd state check" in message
    assert "tfrecordd state repair" in message


@pytest.mark.parametrize("how", ["removed", "replaced", "state_dir removed", "checkpoint removed"])
def test_a_journal_removed_or_replaced_while_running_stops_the_next_commit(
    tmp_path: Path, how: str
) -> None:
    import shutil

    from tfrecordd.errors import DurabilityError

    state = tmp_path / "state"
    j = journal(state, compact_after=3)
    j.recover()
    for i in range(4):  # past one compaction: a checkpoint exists
        commit(j, f"s{i}", [tok("a", i + 1)])
    assert (state / CHECKPOINT).exists()
    if how == "removed":
        os.unlink(state / JOURNAL)
    elif how == "replaced":
        old = (state / JOURNAL).read_bytes()
        os.unlink(state / JOURNAL)
        (state / JOURNAL).write_bytes(old)
    elif how == "state_dir removed":
        shutil.rmtree(state)
    else:
        os.unlink(state / CHECKPOINT)
    intent = j.next_intent({"spool": [tok("a", 99)]}, [ShardRef("", "s9")])
    with pytest.raises(DurabilityError, match=how.split()[-1]):
        j.write_intent(intent)
    j.close()


def test_a_symlink_planted_in_state_dir_is_never_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    (state / JOURNAL).symlink_to(victim)
    with pytest.raises(StateError, match="symbolic link"):
        recovered(state)
    os.unlink(state / JOURNAL)
    (state / CHECKPOINT).symlink_to(victim)
    with pytest.raises(StateError, match="symbolic link"):
        recovered(state)
    os.unlink(state / CHECKPOINT)
    j = journal(state, compact_after=1)
    j.recover()
    # A temp file name planted as a symlink: the checkpoint is still written, the target not.
    (state / f".{CHECKPOINT}.{os.getpid()}.tmp").symlink_to(victim)
    commit(j, "s1", [tok("a", 1)])
    j.close()
    assert recovered(state).states == {"spool": {"a": 1}}
    assert victim.read_bytes() == b"precious\n"


def _typed(path: Path, folds: dict[str, Any], types: dict[str, str], **kw: Any) -> Journal:
    return Journal(str(path), LOCAL, folds, types=types, **kw)


def test_a_renamed_source_refuses_to_start_naming_both(tmp_path: Path) -> None:
    from tfrecordd.errors import ConfigError

    j = _typed(tmp_path, FOLDS, {"spool": "directory"})
    j.recover()
    commit(j, "s1", [tok("half-read", 400)])
    j.close()
    renamed = _typed(tmp_path, {"inbox": DirectorySource.fold}, {"inbox": "directory"})
    with pytest.raises(ConfigError) as caught:
        renamed.recover()
    message = str(caught.value)
    assert "'spool'" in message
    assert "'inbox'" in message
    assert "tfrecordd state rename-source" in message
    # After a compaction the positions live in the checkpoint: still refused.
    j = _typed(tmp_path, FOLDS, {"spool": "directory"})
    j.recover()
    j.compact()
    j.close()
    with pytest.raises(ConfigError, match="rename-source"):
        _typed(tmp_path, {"inbox": DirectorySource.fold}, {"inbox": "directory"}).recover()
    # A configured source of another type is no rename.
    other = _typed(tmp_path, {"q": DirectorySource.fold}, {"q": "redis-stream"})
    other.recover()
    other.close()


def test_a_removed_sources_positions_are_kept_until_it_comes_back(tmp_path: Path) -> None:
    both = {"spool": DirectorySource.fold, "other": DirectorySource.fold}
    types = {"spool": "directory", "other": "directory"}
    j = _typed(tmp_path, both, types, compact_after=2)
    j.recover()
    commit(j, "s1", [tok("a", 10)])
    intent = j.next_intent({"spool": [tok("a", 20)], "other": [tok("x", 5)]}, [ShardRef("", "s2")])
    j.write_intent(intent)
    j.write_done(intent.seq)
    j.close()
    # "spool" removed (the other source keeps running): its positions are kept, through
    # compactions, and come back with it.
    j = _typed(tmp_path, {"other": DirectorySource.fold}, {"other": "directory"}, compact_after=2)
    j.recover()
    for i in range(3):
        commit_other = j.next_intent({"other": [tok("x", 10 + i)]}, [ShardRef("", f"o{i}")])
        j.write_intent(commit_other)
        j.write_done(commit_other.seq)
    j.close()
    assert (tmp_path / CHECKPOINT).exists()
    back = _typed(tmp_path, both, types)
    rec = back.recover()
    back.close()
    assert rec.states["spool"] == {"a": 20}
    assert rec.states["other"] == {"x": 12}


class _FullAfter(type(LOCAL)):  # type: ignore[misc]
    """Writes ``room`` more bytes, then fails with ENOSPC, as a full file system does."""

    def __init__(self, room: int) -> None:
        self.room = room

    def write(self, f: Any, data: bytes | memoryview) -> None:
        import errno

        view = memoryview(data)
        if len(view) > self.room:
            f.write(view[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(view)
        super().write(f, view)


@pytest.mark.parametrize("room", [0, 30, 200])
def test_a_full_state_dir_stops_commits_and_leaves_the_journal_whole(
    tmp_path: Path, room: int
) -> None:
    from tfrecordd.errors import DurabilityError

    j = journal(tmp_path)
    j.recover()
    commit(j, "s1", [tok("a", 10)])
    size = os.path.getsize(tmp_path / JOURNAL)
    j.fs = _FullAfter(room)

    def fill() -> None:
        for i in range(2, 20):
            commit(j, f"s{i}", [tok("a", i * 10)])

    with pytest.raises(DurabilityError, match="state_dir is full"):
        fill()
    j.close()
    assert os.path.getsize(tmp_path / JOURNAL) >= size
    rec = recovered(tmp_path)
    assert rec.torn_at is None, "a partial record was left in the journal"
    assert rec.states["spool"]["a"] >= 10


class _NoRoomForNewFiles(type(LOCAL)):  # type: ignore[misc]
    """Appends succeed; a new file (the checkpoint's and the journal's temp copies) gets ENOSPC."""

    def __init__(self) -> None:
        self.new: set[int] = set()

    def create_exclusive(self, path: str) -> Any:
        f = super().create_exclusive(path)
        self.new.add(f.fileno())
        return f

    def write(self, f: Any, data: bytes | memoryview) -> None:
        import errno

        if f.fileno() in self.new:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write(f, data)


def test_a_full_state_dir_during_compaction_keeps_the_old_checkpoint(tmp_path: Path) -> None:
    from tfrecordd.errors import DurabilityError

    j = journal(tmp_path, compact_after=3)
    j.recover()
    for i in range(3):
        commit(j, f"s{i}", [tok("a", i + 1)])
    before = (tmp_path / CHECKPOINT).read_bytes()
    commit(j, "s3", [tok("a", 4)])
    commit(j, "s4", [tok("a", 5)])
    intent = j.next_intent({"spool": [tok("a", 6)]}, [ShardRef("", "s5")])
    j.write_intent(intent)
    j.fs = _NoRoomForNewFiles()
    with pytest.raises(DurabilityError, match="state_dir is full"):
        j.write_done(intent.seq)  # the third finished commit: compaction
    j.close()
    assert (tmp_path / CHECKPOINT).read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))
    assert recovered(tmp_path).states == {"spool": {"a": 6}}


def test_every_record_and_the_checkpoint_carry_the_state_format(tmp_path: Path) -> None:
    import orjson

    from tfrecordd.state.reading import scan_journal
    from tfrecordd.state.records import STATE_FORMAT

    j = journal(tmp_path, compact_after=2)
    j.recover()
    for i in range(3):
        commit(j, f"s{i}", [tok("a", i + 1)])
    j.close()
    records = scan_journal(str(tmp_path / JOURNAL)).records
    assert records
    assert {r.get("v") for r in records} == {STATE_FORMAT}
    assert orjson.loads((tmp_path / CHECKPOINT).read_bytes())["version"] == STATE_FORMAT


@pytest.mark.parametrize("where", ["last record", "middle record", "checkpoint"])
def test_state_of_a_newer_format_is_refused_never_misread_or_cut(
    tmp_path: Path, where: str
) -> None:
    """A newer tfrecordd's record at the journal's end must not be taken for a torn tail and cut
    (its commit would be lost), nor one in the middle for damage; the file stays as it was."""
    import orjson

    from tfrecordd.errors import StateFormatError
    from tfrecordd.state.records import STATE_FORMAT

    j = journal(tmp_path, compact_after=100)
    j.recover()
    commit(j, "s1", [tok("a", 10)])
    j.close()
    newer = STATE_FORMAT + 1
    record = {"t": "intent", "seq": 9, "shard": "s9", "positions": {}, "v": newer, "new": 1}
    if where == "checkpoint":
        (tmp_path / CHECKPOINT).write_bytes(orjson.dumps({"version": newer, "sources": {}}))
    elif where == "last record":
        with (tmp_path / JOURNAL).open("ab") as f:
            f.write(_framed(record))
    else:
        data = (tmp_path / JOURNAL).read_bytes()
        (tmp_path / JOURNAL).write_bytes(_framed(record) + data)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(StateFormatError, match=f"newer tfrecordd \\(state format {newer}"):
        recovered(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_the_state_check_from_another_thread_never_sees_a_compaction_half_done(
    tmp_path: Path,
) -> None:
    """The daemon checks its state files every second from a thread while commits compact the
    journal in another: a compaction replaces both files and then notes their new identities,
    and a check between the two must not take the daemon's own rewrite for an operator's."""
    import threading

    from tfrecordd.errors import DurabilityError

    j = journal(tmp_path, compact_after=1)
    j.recover()
    errors: list[DurabilityError] = []
    done = threading.Event()

    def check() -> None:
        while not done.is_set():
            try:
                j.check_files()
            except DurabilityError as e:
                errors.append(e)
                return

    checker = threading.Thread(target=check)
    checker.start()
    try:
        for i in range(300):  # compact_after=1: every commit compacts
            commit(j, f"s{i}", [tok("a", i + 1)])
            if errors:
                break
    finally:
        done.set()
        checker.join(10)
        j.close()
    assert errors == []
