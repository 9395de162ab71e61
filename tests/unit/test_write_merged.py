"""The write stage with merged runs against the same stage writing part by part: for any batches
and caps, the same cuts, the same shards closed at each (records, order, positions, times,
offsets, within their size cap), and the same shards left open, least recently written first
(the one ``max_open_shards`` closes next)."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.reader import iter_records
from tfrecordd.format.writer import frame, pack
from tfrecordd.fsys import LOCAL
from tfrecordd.metrics import Metrics
from tfrecordd.outputs.shards import OpenShard
from tfrecordd.pipeline import shardrun
from tfrecordd.pipeline.datasets import DatasetOutput
from tfrecordd.pipeline.encoding import EncodedBatch, Part
from tfrecordd.pipeline.write import WriteStage

FOLDERS = ["h=1", "h=2", "h=3", "h=4"]


class _Namer:
    def __init__(self, compression: Compression) -> None:
        self.count = 0
        self.suffix = SUFFIXES[compression]

    def next(self) -> str:
        self.count += 1
        return f"part-{self.count:05d}{self.suffix}"


def _stage(root: Path, c: Compression, max_open: int, max_records: int, max_bytes: int) -> Any:
    config = SimpleNamespace(
        max_shard_records=max_records,
        max_open_shards=max_open,
        max_shard_bytes=max_bytes,
        compression=c,
        level=None,
        manifests=True,
        min_free_bytes=0,
        max_shard_age=1e9,
    )
    dataset = DatasetOutput("d", config, SimpleNamespace(staging_dir=str(root)), _Namer(c))  # type: ignore[arg-type]
    committer = SimpleNamespace(sources={"s": SimpleNamespace(compact=None)}, metrics=Metrics())
    committer.dead_letters = None
    return WriteStage({"d": dataset}, committer, fs=LOCAL)  # type: ignore[arg-type]


def _batch(rng: random.Random, i: int, c: Compression) -> EncodedBatch:
    parts = []
    for folder in rng.sample(FOLDERS, rng.randint(0, 3)):
        records = [
            b"b%d-%s-%d:" % (i, folder.encode(), k) + rng.randbytes(rng.choice([0, 20, 100, 400]))
            for k in range(rng.randint(1, 12))
        ]
        packed = pack(records, c) if rng.random() < 0.3 else frame(records)
        parts.append(Part("d", folder, packed, (float(i), i + rng.random())))
    return EncodedBatch("s", parts, ("token", i), sum(p.count for p in parts), [])


def _shard(shard: OpenShard, tokens: list[Any], c: Compression, cap: int) -> tuple[Any, ...]:
    f = shard.finish(fsync=False)
    return (
        shard.folder,
        list(iter_records(f.tmp_path, compression=c)),
        [t[1] for t in tokens],
        f.event_times,
        list(f.offsets.chunks()),
        f.size <= cap,
    )


def _run(root: Path, seed: int) -> list[Any]:
    rng = random.Random(seed)
    c = rng.choice([Compression.GZIP, Compression.ZLIB, Compression.NONE, Compression.ZSTD])
    cap = rng.choice([2 << 10, 4 << 10, 16 << 10, 1 << 30])
    stage = _stage(root, c, rng.choice([2, 3, 10]), rng.choice([0, 40, 100]), cap)
    trips = [[_batch(rng, g * 100 + i, c) for i in range(rng.randint(1, 8))] for g in range(4)]
    out: list[Any] = []
    for trip in trips:
        at = 0
        while at < len(trip):
            n = stage.write_run(trip[at:])
            at += n
            if n == 0 or stage.cut_wanted:  # a cut: what it publishes
                out.append(("cut", at))
                out += [
                    _shard(k.shard, k.positions.tokens["s"], c, cap) for k in stage.unit.closing
                ]
                stage.unit.closing.clear()
                stage.cut_wanted = False
    out += [_shard(e.shard, e.positions.tokens["s"], c, cap) for e in stage.open.values()]
    stage.compressing.shutdown()
    return out


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_merged_runs_write_and_cut_as_part_by_part(seed: int) -> None:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        merged = _run(Path(a), seed)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(shardrun.MergedRun, "take", lambda self, parts: False)
            alone = _run(Path(b), seed)
    assert merged == alone


def test_the_least_recently_written_shard_is_closed_at_the_cap_after_a_merged_run(
    tmp_path: Path,
) -> None:
    stage = _stage(tmp_path, Compression.GZIP, 2, 0, 1 << 30)

    def batch(i: int, *folders: str) -> EncodedBatch:
        parts = [Part("d", f, frame([b"%d" % i]), None) for f in folders]
        return EncodedBatch("s", parts, ("token", i), len(parts), [])

    assert stage.write_run([batch(0, "a", "b")]) == 1
    # Merged: a is written first in this trip, b last of all, then a again.
    assert stage.write_run([batch(1, "a"), batch(2, "b"), batch(3, "a")]) == 3
    assert list(stage.open) == [("d", "b"), ("d", "a")]
    stage.write_run([batch(4, "c")])
    assert [k.shard.folder for k in stage.unit.closing] == ["b"]
    for shard in [k.shard for k in stage.unit.closing] + [e.shard for e in stage.open.values()]:
        shard.discard()
    stage.compressing.shutdown()


@pytest.mark.parametrize("merged", [True, False])
def test_a_joined_batch_with_several_parts_for_one_shard_is_counted_once(
    tmp_path: Path, merged: bool
) -> None:
    # Batches joined in an encoder (pipeline/joining.py) come as one, with every position, and
    # may bring several framed parts for one shard: its positions go in once, a new folder
    # counts once against max_open_shards, and a shard its second part would take past the
    # record cap is closed as it is written, full, holding the batch's positions too.
    stage = _stage(tmp_path, Compression.GZIP, 2, 50, 1 << 30)

    def joined(first: int, folder: str, *counts: int) -> EncodedBatch:
        parts = [
            Part("d", folder, frame([b"%d-%d" % (first, k)] * n), None)
            for k, n in enumerate(counts)
        ]
        more = tuple(("token", first + k) for k in range(1, len(counts)))
        return EncodedBatch("s", parts, ("token", first), sum(counts), [], more)

    with pytest.MonkeyPatch.context() as patch:
        if not merged:
            patch.setattr(shardrun.MergedRun, "take", lambda self, parts: False)
        assert stage.write_run([joined(0, "a", 15, 15)]) == 1
        assert stage.write_run([joined(10, "b", 5, 5, 5)]) == 1
        assert not stage.unit.closing  # b counted once: two open, at the cap, a kept
        assert [e.positions.tokens["s"] for e in stage.open.values()] == [
            [("token", 0), ("token", 1)],
            [("token", 10), ("token", 11), ("token", 12)],
        ]
        # a holds 30: its first part of 15 fits, the second takes it past 50.
        assert stage.write_run([joined(20, "a", 15, 15)]) == 1
        assert stage.cut_wanted
        (closed,) = stage.unit.closing
        assert (closed.shard.folder, closed.shard.records) == ("a", 45)
        assert closed.positions.tokens["s"] == [("token", t) for t in (0, 1, 20, 21)]
        assert stage.open["d", "a"].shard.records == 15
        assert stage.open["d", "a"].positions.tokens["s"] == [("token", 20), ("token", 21)]
    for shard in [k.shard for k in stage.unit.closing] + [e.shard for e in stage.open.values()]:
        shard.discard()
    stage.compressing.shutdown()
