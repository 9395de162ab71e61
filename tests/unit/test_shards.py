"""Open shards: what a finished or discarded shard leaves behind, in memory and on disk."""

from __future__ import annotations

import gc
import random
import weakref
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.reader import iter_records
from tfrecordd.format.writer import pack
from tfrecordd.fsys import LOCAL
from tfrecordd.outputs import manifest, shards
from tfrecordd.outputs.shards import FinishedShard, OpenShard


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
        assert shard.offsets.in_memory < 100
    shard.write(pack(records[1000:], compression, None))
    spill = tmp_path / ".a_tfrecord_offsets.inprogress"
    assert spill.stat().st_size == 8 * (len(shard.offsets) - shard.offsets.in_memory)
    finished = shard.finish()
    assert len(finished.offsets) == 1050
    assert array("Q", _offsets(finished)) == manifest.scan(finished.tmp_path)["record_offsets"]
    assert all(len(chunk) <= 100 for chunk in finished.offsets.chunks())
    finished.offsets.remove()
    assert not spill.exists()


def test_an_offsets_file_a_crash_left_is_replaced_not_added_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash leaves a shard's offsets file behind, and a manifest rebuilt at recovery spills
    under the same name: the rebuilt offsets start a file of their own."""
    monkeypatch.setattr(shards, "OFFSETS_IN_MEMORY", 10)
    spill = tmp_path / ".a_tfrecord_offsets.inprogress"
    spill.write_bytes(array("Q", range(1000, 1040)).tobytes())
    shard = OpenShard(str(tmp_path), "a.tfrecord", Compression.NONE, None, 1 << 30, LOCAL)
    records = [b"y" * (i % 5) for i in range(35)]
    shard.write(records)
    finished = shard.finish()
    assert array("Q", _offsets(finished)) == manifest.scan(finished.tmp_path)["record_offsets"]
    assert spill.stat().st_size == 8 * (35 - finished.offsets.in_memory)


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


@pytest.mark.parametrize("compression", list(Compression))
@pytest.mark.parametrize("packed", [False, True], ids=["records", "packed"])
def test_fits_keeps_every_shard_under_its_cap_and_fills_it(
    tmp_path: Path, compression: Compression, packed: bool
) -> None:
    # The rule the daemon rotates by (test_daemon_spool runs it end to end): a batch goes into
    # the open shard only if the file stays within the cap, and a shard is cut only when the
    # next batch would not fit, so shards are filled.
    cap = 128 << 10
    rng = random.Random(11)
    # Partly random, so the compressed batches stay a small but real part of the cap.
    records = [
        b"event %d " % i * rng.randint(1, 10) + rng.randbytes(rng.randint(0, 200))
        for i in range(8000)
    ]
    batches: list[list[bytes]] = []
    while len(batches) < 1 or sum(map(len, batches)) < len(records):
        start = sum(map(len, batches))
        batches.append(records[start : start + rng.randint(1, 100)])
    sizes: list[int] = []
    read: list[bytes] = []
    shard: OpenShard | None = None
    for batch in batches:
        item = pack(batch, compression) if packed else batch
        if shard is not None and not shard.fits(item):
            sizes.append(shard.finish(fsync=False).size)
            read += iter_records(shard.tmp_path, compression=compression)
            shard = None
        if shard is None:
            name = f"part-{len(sizes)}{SUFFIXES[compression]}"
            shard = OpenShard(str(tmp_path), name, compression, None, cap, LOCAL)
            assert shard.fits(item), "an empty shard takes any batch"
        shard.write(item)
    assert shard is not None
    sizes.append(shard.finish(fsync=False).size)
    read += iter_records(shard.tmp_path, compression=compression)
    assert read == records
    assert len(sizes) > 2
    assert max(sizes) <= cap
    assert min(sizes[:-1]) >= cap // 2


def test_a_batch_larger_than_the_cap_goes_into_an_empty_shard_alone(tmp_path: Path) -> None:
    shard = OpenShard(str(tmp_path), "big.tfrecord", Compression.NONE, None, 1024, LOCAL)
    big = [b"x" * 4096]
    assert shard.fits(big)
    shard.write(big)
    assert not shard.fits([b"y"])
    assert shard.finish(fsync=False).size > 1024
