"""A run of batches merged by shard (:class:`~tfrecordd.pipeline.shardrun.MergedRun`): what it
takes, and that writing its merged parts gives each shard what writing the parts one by one
gives: the same records in the same order, the same offsets and times, within the same caps."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.reader import iter_records
from tfrecordd.format.writer import Framed, Packed, frame, pack, unpack
from tfrecordd.fsys import LOCAL
from tfrecordd.outputs.shards import OpenShard
from tfrecordd.pipeline.encoding import Part
from tfrecordd.pipeline.shardrun import MergedRun, joined

KEYS = [("a", ""), ("a", "h=1"), ("b", "")]


def _unpacked(records: Packed | Framed) -> list[bytes]:
    units = records.units if isinstance(records, Framed) else (records,)
    return [r for u in units for r in unpack(u)]


def _records(rng: random.Random, n: int, tag: int) -> list[bytes]:
    return [b"r%d-%d:" % (tag, i) + rng.randbytes(rng.randint(0, 300)) for i in range(n)]


def _part(
    key: tuple[str, str],
    records: list[bytes],
    packed: bool,
    at: float,
    c: Compression = Compression.GZIP,
) -> Part:
    return Part(key[0], key[1], pack(records, c) if packed else frame(records), (at, at + 1))


def _open(
    tmp_path: Path, key: tuple[str, str], cap: int, c: Compression = Compression.GZIP
) -> OpenShard:
    name = f"{key[0]}-{key[1] or 'x'}".replace("=", "")
    return OpenShard(str(tmp_path), name + SUFFIXES[c], c, None, cap, LOCAL)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32 - 1),
    batches=st.lists(
        st.lists(
            # The key with no shard open (2) ends a run: drawn less often, so runs grow.
            st.tuples(st.sampled_from([0, 0, 0, 1, 1, 1, 2]), st.integers(1, 40), st.booleans()),
            max_size=4,
        ),
        min_size=1,
        max_size=12,
    ),
    limit=st.sampled_from([0, 30, 90, 400]),
    cap=st.sampled_from([8 << 10, 24 << 10, 1 << 30]),
    preload=st.integers(0, 40),
    c=st.sampled_from([Compression.GZIP, Compression.NONE, Compression.ZLIB]),
)
def test_merged_writes_equal_part_by_part_writes(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    batches: list[list[tuple[int, int, bool]]],
    limit: int,
    cap: int,
    preload: int,
    c: Compression,
) -> None:
    rng = random.Random(seed)
    tmp = tmp_path_factory.mktemp("run")
    merged_dir, single_dir = tmp / "merged", tmp / "single"
    merged_dir.mkdir()
    single_dir.mkdir()
    shards = {k: _open(merged_dir, k, cap, c) for k in KEYS[:2]}  # KEYS[2]: no shard open
    alone = {k: _open(single_dir, k, cap, c) for k in KEYS[:2]}
    first = _records(rng, preload, -1)
    if first:
        for s in (*shards.values(), *alone.values()):
            s.write(frame(first), (0.0, 0.5))
    before = {k: s.file_bytes + s.pending_bound() for k, s in shards.items()}
    parts = [
        [
            _part(KEYS[k], _records(rng, n, 100 * b + j), packed, float(b), c)
            for j, (k, n, packed) in enumerate(batch)
        ]
        for b, batch in enumerate(batches)
    ]
    run = MergedRun(shards.get, lambda dataset: limit)
    taken = 0
    for batch_parts in parts:
        if not run.take(batch_parts):
            break
        taken += 1
    assert run.batches == taken

    # What the run took fits: a shard open for every part, under the record cap.
    for batch_parts in parts[:taken]:
        for p in batch_parts:
            assert (p.dataset, p.folder) in shards
    for key, shard in alone.items():
        count = sum(p.count for b in parts[:taken] for p in b if (p.dataset, p.folder) == key)
        assert not limit or not count or shard.records + count < limit
    # The one it refused would not: a part with no open shard, past the record cap, or, past
    # the size cap for the worst compression may give.
    if taken < len(parts):
        refused = parts[taken]
        keys = {(p.dataset, p.folder) for p in refused}
        counts = {
            k: sum(p.count for b in parts[: taken + 1] for p in b if (p.dataset, p.folder) == k)
            for k in keys
        }
        assert (
            not keys <= shards.keys()
            or any(limit and alone[k].records + counts[k] >= limit for k in keys)
            or cap < 1 << 30
        )

    for merged in run.parts():
        shards[merged.dataset, merged.folder].write(merged.records, merged.times)
    for batch_parts in parts[:taken]:
        for part in batch_parts:
            alone[part.dataset, part.folder].write(part.records, part.times)
    for key in shards:
        got, want = shards[key].finish(fsync=False), alone[key].finish(fsync=False)
        assert got.records == want.records
        assert got.raw_bytes == want.raw_bytes
        assert got.event_times == want.event_times
        assert list(got.offsets.chunks()) == list(want.offsets.chunks())
        records = list(iter_records(got.tmp_path, compression=c))
        assert records == list(iter_records(want.tmp_path, compression=c))
        assert got.size <= max(cap, before[key])


def test_joined_parts_keep_their_records_lengths_and_times_in_order() -> None:
    rng = random.Random(3)
    a, b, c = (_records(rng, n, i) for i, n in enumerate((3, 1, 5)))
    part = joined(
        [
            Part("d", "f", frame(a), (5.0, 6.0)),
            Part("d", "f", frame(b), None),
            Part("d", "f", frame(c), (1.0, 2.0)),
        ]
    )
    assert _unpacked(part.records) == a + b + c
    assert part.count == len(a + b + c)
    assert isinstance(part.records, Framed)
    # The parts' buffers are held as they are, not copied.
    assert [u.unit.data for u in part.records.units] == [frame(x).unit.data for x in (a, b, c)]
    assert part.times == (1.0, 6.0)
    assert (part.dataset, part.folder) == ("d", "f")


def test_a_compressed_unit_keeps_its_place_between_framed_stretches(tmp_path: Path) -> None:
    rng = random.Random(5)
    shard = _open(tmp_path, KEYS[0], 1 << 30)
    run = MergedRun({KEYS[0]: shard}.get, lambda dataset: 0)
    batches = [_records(rng, 4, i) for i in range(4)]
    for i, records in enumerate(batches):
        assert run.take([_part(KEYS[0], records, i == 2, float(i))])
    out = list(run.parts())
    assert [type(p.records) for p in out] == [Framed, Packed, Packed]
    assert [p.count for p in out] == [8, 4, 4]
    assert [r for p in out for r in _unpacked(p.records)] == [r for b in batches for r in b]
    shard.discard()


def test_a_refused_batch_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    shard = _open(tmp_path, KEYS[0], 1 << 30)
    run = MergedRun({KEYS[0]: shard}.get, lambda dataset: 10)
    assert run.take([_part(KEYS[0], [b"x"] * 6, False, 0.0)])
    # Its first part fits, its second reaches the record cap: nothing of it is taken.
    late = [_part(KEYS[0], [b"y"], False, 1.0), _part(KEYS[0], [b"z"] * 3, False, 2.0)]
    assert not run.take(late)
    assert not run.take([_part(KEYS[2], [b"w"], False, 3.0)])  # no shard open there
    assert run.take([_part(KEYS[0], [b"v"] * 3, False, 4.0)])
    assert [r for p in run.parts() for r in _unpacked(p.records)] == [b"x"] * 6 + [b"v"] * 3
    assert run.batches == 2
    shard.discard()
