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

from tfrecordd.fsys import LOCAL
from tfrecordd.journal import CHECKPOINT, JOURNAL, Journal, Recovered
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
    intent = j.next_intent(shard, {"spool": list(tokens)}, records=len(tokens))
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
    assert [i.shard for i in rec.unfinished] == ["s3"]
    assert rec.unfinished[0].positions == {"spool": [tok("b", 9)]}
    assert rec.torn_at is None


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


def test_random_corruption_stops_at_the_first_bad_record(tmp_path: Path) -> None:
    """Flip bits anywhere: recovery keeps exactly the records before the damaged one."""
    rng = random.Random(7)
    j = journal(tmp_path)
    j.recover()
    ends = []
    for i in range(20):
        commit(j, f"s{i}", [tok("a", i + 1)])
        ends.append(os.path.getsize(tmp_path / JOURNAL))
    j.close()
    pristine = (tmp_path / JOURNAL).read_bytes()
    for _ in range(300):
        data = bytearray(pristine)
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        (tmp_path / JOURNAL).write_bytes(bytes(data))
        rec = recovered(tmp_path)
        # Each commit is two records (intent, done); the intact prefix ends before `pos`.
        intact = [e for e in ends if e <= pos]
        expected = {"a": len(intact)} if intact else {}
        assert rec.states.get("spool", {}) == expected
        assert rec.torn_at is not None
        assert rec.torn_at <= pos


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
