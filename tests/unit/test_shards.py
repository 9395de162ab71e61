"""Open shards: what a finished or discarded shard leaves behind in memory."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfrecordd.compression import Compression
from tfrecordd.fsys import LOCAL
from tfrecordd.reader import iter_records
from tfrecordd.shards import OpenShard
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
