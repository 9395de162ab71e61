"""RecordWriter's accounting and sync promise, and open_writer's atomic publish."""

from __future__ import annotations

import io
import os
import random
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tfrecordd.format.compress import Compressor
from tfrecordd.format.compression import Compression
from tfrecordd.format.framing import OVERHEAD, frame_many
from tfrecordd.format.reader import iter_records
from tfrecordd.format.writer import (
    HOLD_BYTES,
    RecordWriter,
    frame,
    inprogress_name,
    open_writer,
    pack,
)

batches_st = st.lists(st.lists(st.binary(max_size=500), max_size=8), max_size=6)


def _read(data: bytes, compression: Compression) -> list[bytes]:
    return list(iter_records(io.BytesIO(data), compression=compression))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(list(Compression)), batches_st, st.lists(st.booleans(), max_size=6))
def test_round_trip_and_accounting(
    compression: Compression, batches: list[list[bytes]], syncs: list[bool]
) -> None:
    out = bytearray()
    calls: list[bytes] = []

    def sink(data: bytes) -> None:
        calls.append(data)
        out.extend(data)

    w = RecordWriter(sink, compression)
    written: list[bytes] = []
    for i, batch in enumerate(batches):
        w.write_many(batch)
        written += batch
        if i < len(syncs) and syncs[i]:
            w.sync()
            assert w.pending_raw == 0
    w.finish()
    assert all(calls), "the sink is never called with empty bytes"
    assert _read(bytes(out), compression) == written
    assert w.records == len(written)
    assert w.raw_bytes == sum(len(r) + OVERHEAD for r in written)
    assert w.file_bytes == len(out)


@pytest.mark.parametrize("compression", [Compression.GZIP, Compression.ZSTD, Compression.NONE])
def test_sync_makes_everything_so_far_readable(compression: Compression) -> None:
    out = bytearray()
    w = RecordWriter(out.extend, compression)
    w.write(b"first")
    w.write_many([b"second", b"third"])
    w.sync()
    assert _read(bytes(out), compression) == [b"first", b"second", b"third"]


def test_zlib_sync_flushes_all_records_into_the_stream() -> None:
    out = bytearray()
    w = RecordWriter(out.extend, Compression.ZLIB)
    w.write_many([b"a", b"bb"])
    w.sync()
    # The zlib stream is finished only by finish(), but every synced byte is already decodable.
    assert zlib.decompressobj().decompress(bytes(out)) == frame_many([b"a", b"bb"])


@pytest.mark.parametrize("compression", list(Compression))
def test_pending_raw_and_bound_cover_the_next_sync(compression: Compression) -> None:
    out = bytearray()
    w = RecordWriter(out.extend, compression, level=1)
    for n in (10, 1000, 100_000):
        w.write_many([os.urandom(n), os.urandom(n // 2)])
        size = n + n // 2 + 2 * OVERHEAD
        # Writes are held (pending) until HOLD_BYTES gather, then compressed into a unit.
        expected = 0 if compression is Compression.NONE or size >= HOLD_BYTES else size
        assert w.pending_raw == expected
        cap = w.file_bytes + Compressor.bound(compression, w.pending_raw)
        w.sync()
        assert w.pending_raw == 0
        assert w.file_bytes <= cap
    cap = w.file_bytes + Compressor.bound(compression, 0)
    w.finish()
    assert w.file_bytes <= cap


@pytest.mark.parametrize("compression", list(Compression))
def test_finish_without_records_is_an_empty_but_valid_stream(compression: Compression) -> None:
    out = bytearray()
    w = RecordWriter(out.extend, compression)
    w.finish()
    assert _read(bytes(out), compression) == []
    assert w.records == 0


def test_finish_does_not_close_the_sink() -> None:
    f = io.BytesIO()
    w = RecordWriter(f.write, Compression.GZIP)
    w.write(b"x")
    w.finish()
    assert not f.closed


def test_open_writer_publishes_only_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "shard.tfrecord.gz"
    with open_writer(path, Compression.GZIP) as w:
        w.write(b"one")
        w.sync()
        assert not path.exists()
        assert (tmp_path / inprogress_name(path.name)).exists()
        assert inprogress_name(path.name) == ".shard_tfrecord_gz.inprogress"
        w.write(b"two")
    assert list(iter_records(path)) == [b"one", b"two"]
    assert os.listdir(tmp_path) == ["shard.tfrecord.gz"]


def test_open_writer_publishes_nothing_on_an_exception(tmp_path: Path) -> None:
    path = tmp_path / "shard.tfrecord"

    def write_then_fail() -> None:
        with open_writer(path, Compression.NONE) as w:
            w.write(b"partial")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_then_fail()
    assert os.listdir(tmp_path) == []


def test_open_writer_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "shard.tfrecord"
    path.write_bytes(b"precious")
    with pytest.raises(FileExistsError), open_writer(path, Compression.NONE) as w:
        w.write(b"new")
    assert path.read_bytes() == b"precious"
    assert os.listdir(tmp_path) == ["shard.tfrecord"]


def test_open_writer_refuses_a_leftover_in_progress_file(tmp_path: Path) -> None:
    path = tmp_path / "shard.tfrecord"
    leftover = tmp_path / inprogress_name(path.name)
    leftover.write_bytes(b"someone else's")
    with pytest.raises(FileExistsError), open_writer(path, Compression.NONE):
        pass
    assert leftover.read_bytes() == b"someone else's"
    assert not path.exists()


_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"),
            st.lists(st.sampled_from([0, 7, 1_000, 60_000, 150_000, 300_000]), max_size=3),
        ),
        st.tuples(st.just("packed"), st.lists(st.integers(0, 5_000), min_size=1, max_size=4)),
        st.tuples(
            st.just("framed"),
            st.lists(st.sampled_from([0, 7, 1_000, 60_000, 150_000]), min_size=1, max_size=3),
        ),
        st.tuples(st.just("sync"), st.just([])),
        st.tuples(st.just("collect"), st.just([])),
    ),
    max_size=12,
)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(list(Compression)), _OPS, st.randoms(use_true_random=False))
@example(Compression.GZIP, [("write", [300_000])] * 3 + [("sync", [])], random.Random(1))
@example(Compression.ZSTD, [("write", [300_000])] * 2 + [("collect", [])], random.Random(2))
@example(Compression.GZIP, [("framed", [150_000]), ("write", [7]), ("sync", [])], random.Random(3))
def test_units_compressed_in_an_executor_keep_order_and_bounds(
    compression: Compression, ops: list[tuple[str, list[int]]], rng: Any
) -> None:
    """Held writes (records, or records framed where they were encoded) compressed in threads
    reach the sink in order, from the writer's thread only, and ``file_bytes + pending_bound()``
    bounds the stream at each sync and at the end."""
    out = bytearray()
    sink_threads: set[int] = set()

    def sink(data: bytes) -> None:
        sink_threads.add(threading.get_ident())
        out.extend(data)

    written: list[bytes] = []
    with ThreadPoolExecutor(2) as pool:
        w = RecordWriter(sink, compression, level=1, executor=pool)
        cap = w.file_bytes + w.pending_bound()
        for op, sizes in ops:
            # Random bytes do not compress: a bound that leaves out a unit shows.
            records = [rng.randbytes(n) for n in sizes]
            if op == "write":
                w.write_many(records)
                written += records
            elif op == "packed":
                w.write_packed(pack(records, compression, 1))
                written += records
            elif op == "framed":
                # Framed where encoded: held and compressed with the writes around it.
                w.write_packed(frame(records))
                written += records
            elif op == "sync":
                w.sync()
                assert w.file_bytes <= cap
                assert w.pending_raw == 0
            else:
                w.collect()
                assert w.file_bytes + w.pending_bound() <= cap
            cap = w.file_bytes + w.pending_bound()
        w.finish()
    assert w.file_bytes <= cap
    assert sink_threads <= {threading.get_ident()}
    assert _read(bytes(out), compression) == written
    assert w.file_bytes == len(out)
    assert w.records == len(written)
