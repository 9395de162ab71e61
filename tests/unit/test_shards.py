"""Open shards: what a finished or discarded shard leaves behind, in memory and on disk."""

from __future__ import annotations

import gc
import weakref
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfrecordd import manifest, shards
from tfrecordd.compression import Compression
from tfrecordd.fsys import LOCAL
from tfrecordd.reader import iter_records
from tfrecordd.shards import FinishedShard, OpenShard
from tfrecordd.writer import pack


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("compression", list(Compression))
@pytest.mark.parametrize("end", ["finish", "discard"])
def test_a_shard_is_freed_as_soon_as_it_is_dropped(
    tmp_path: Path, compression: Compression, end: str, no_gc: None
) -> None:
    """No reference cycle holds a shard (its compressor's state, its record offsets: megabytes
    for a large shard) until the garbage collector's next full pass: a long run's memory would
    grow with the shards waiting for it."""
    records = [b"r%d" % i * 50 for i in range(2000)]
    shard = OpenShard(str(tmp_path), "a.tfrecord", compression, None, 1 << 30, LOCAL)
    shard.write(records[:1000])
    shard.write(pack(records[1000:], compression, None))
    refs: list[weakref.ref[object]] = [weakref.ref(shard), weakref.ref(shard.offsets)]
    if end == "finish":
        finished = shard.finish()
        assert finished.records == 2000
        assert list(iter_records(finished.tmp_path, compression=compression)) == records
        del finished
    else:
        shard.discard()
    del shard
    assert [r() for r in refs] == [None, None]


def _offsets(shard: OpenShard | FinishedShard) -> list[int]:
    return [o for chunk in shard.offsets.chunks() for o in chunk]


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_offsets_past_the_memory_limit_wait_in_a_file_and_come_back_in_order(
    tmp_path: Path, compression: Compression, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard of millions of records must not hold all their offsets in memory: past
    OFFSETS_IN_MEMORY they go to a file beside the shard, and the manifest reads them back."""
    monkeypatch.setattr(shards, "OFFSETS_IN_MEMORY", 100)
    records = [b"x" * (i % 37) for i in range(1050)]
    shard = OpenShard(str(tmp_path), "a.tfrecord", compression, None, 1 << 30, LOCAL)
    for at in range(0, 1000, 70):
        shard.write(records[at : min(at + 70, 1000)])
        assert len(shard.offsets._tail) < 100
    shard.write(pack(records[1000:], compression, None))
    spill = tmp_path / ".a_tfrecord_offsets.inprogress"
    assert spill.stat().st_size == 8 * (len(shard.offsets) - len(shard.offsets._tail))
    finished = shard.finish()
    assert len(finished.offsets) == 1050
    assert array("Q", _offsets(finished)) == manifest.scan(finished.tmp_path)["record_offsets"]
    assert all(len(chunk) <= 100 for chunk in finished.offsets.chunks())
    finished.offsets.remove()
    assert not spill.exists()


def test_a_discarded_shard_leaves_no_offsets_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shards, "OFFSETS_IN_MEMORY", 10)
    shard = OpenShard(str(tmp_path), "a.tfrecord", Compression.ZSTD, None, 1 << 30, LOCAL)
    shard.write([b"r"] * 25)
    assert (tmp_path / ".a_tfrecord_offsets.inprogress").exists()
    shard.discard()
    assert list(tmp_path.iterdir()) == []


def test_offsets_are_not_kept_when_not_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shards, "OFFSETS_IN_MEMORY", 10)
    shard = OpenShard(
        str(tmp_path), "a.tfrecord", Compression.NONE, None, 1 << 30, LOCAL, track_offsets=False
    )
    shard.write([b"r"] * 25)
    finished = shard.finish()
    assert finished.records == 25
    assert len(finished.offsets) == 0
    assert _offsets(finished) == []
    assert [p.name for p in tmp_path.iterdir()] == [".a_tfrecord.inprogress"]
