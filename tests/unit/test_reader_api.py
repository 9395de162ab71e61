"""The public reader, ``tfrecordd.reader``: a dataset's published shards listed (never in-progress,
hidden, staging, sidecar or late files unless asked), partitions and time ranges chosen,
completed partitions checked, shards read from any record on with the manifests' offsets, and
the split across workers and ranks resumed exactly where it stopped."""

from __future__ import annotations

import ast
import datetime as dt
import gzip
import hashlib
import importlib
import importlib.util
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfrecordd.format.reader as old_reader
import tfrecordd.reader as reader
from tfrecordd.errors import CorruptRecordError, InputError, TfrecorddError
from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.framing import frame
from tfrecordd.format.writer import open_writer
from tfrecordd.outputs import manifest
from tfrecordd.reader import (
    PositionTracker,
    Shard,
    ShardPosition,
    TorchShardDataset,
    check_partition,
    iter_records_from,
    list_shards,
    shard_files,
    split_shards,
)

# fsspec ships no type information.
fsspec: Any = importlib.import_module("fsspec")

DAY = "dt=2026-11-25"
HOUR3 = f"{DAY}/hour=03"
HOUR4 = f"{DAY}/hour=04"
FIELD = f"{HOUR3}/country=de"
REPEATED = "dt=2026-10-25/hour=02+0100"
T3 = dt.datetime(2026, 11, 25, 3, tzinfo=dt.UTC).timestamp()
_seq = iter(range(1, 1_000_000))


def shard_name(compression: Compression = Compression.GZIP) -> str:
    n = next(_seq)
    return f"part-20261125T030000.{n:06d}Z-node1-a1b2c3-{n:06d}{SUFFIXES[compression]}"


def records_of(name: str, count: int) -> list[bytes]:
    return [f"{name}:{i}".encode() for i in range(count)]


def write_manifest(path: Path, **extra: Any) -> dict[str, Any]:
    """The manifest the daemon writes beside a shard, measured from the shard itself."""
    measured = manifest.scan(str(path))
    doc = {
        "version": manifest.VERSION,
        "shard": path.name,
        "compression": extra.pop("compression", None) or str(_compression(path.name)),
        "records": measured["records"],
        "size": measured["size"],
        "sha256": measured["sha256"],
        "crc32c": measured["crc32c"],
        "time_range": [T3, T3 + 1],
        "schemas": {"spool": "abc"},
        "positions": {},
        "record_offsets": list(measured["record_offsets"]),
        **extra,
    }
    (path.parent / manifest.manifest_name(path.name)).write_bytes(orjson.dumps(doc))
    return doc


def _compression(name: str) -> Compression:
    found = reader.shard_compression(name)
    assert found is not None
    return found


def write_shard(
    folder: Path,
    count: int,
    compression: Compression = Compression.GZIP,
    *,
    with_manifest: bool = True,
    name: str | None = None,
    **extra: Any,
) -> Path:
    """A shard of ``count`` records written by the real writer (a sync point every two
    records), with its manifest unless told otherwise."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name or shard_name(compression))
    with open_writer(path, compression) as w:
        for i, record in enumerate(records_of(path.name, count)):
            w.write(record)
            if i % 2:
                w.sync()
    if with_manifest:
        write_manifest(path, **extra)
    return path


def write_marker(
    folder: Path, partition: str, shards: list[Path], start: float, end: float, **extra: Any
) -> Path:
    entries: list[dict[str, Any]] = []
    for path in shards:
        data = path.read_bytes()
        records = sum(1 for _ in reader.iter_records(path))
        entries.append(
            {
                "name": path.relative_to(folder).as_posix(),  # a field partition's: its path
                "records": records,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    doc = {
        "version": 1,
        "dataset": "clicks",
        "partition": partition,
        "start": start,
        "end": end,
        "start_local": "",
        "end_local": "",
        "watermark": end + 800,
        "records": sum(e["records"] for e in entries),
        "shards": entries,
        **extra,
    }
    marker = folder / "_SUCCESS"
    marker.write_text(json.dumps(doc))
    return marker


class Layout:
    """A partitioned dataset as the daemon lays it out, with every file a reader must skip."""

    def __init__(self, root: Path) -> None:
        self.root = root
        h3 = root / HOUR3
        self.s1 = write_shard(h3, 3)
        self.s2 = write_shard(h3, 2, Compression.NONE, with_manifest=False)
        write_marker(h3, HOUR3, [self.s1, self.s2], T3, T3 + 3600)
        self.field = write_shard(root / FIELD, 4, Compression.ZLIB)
        write_marker(root / FIELD, FIELD, [self.field], T3, T3 + 3600)
        self.open_hour = write_shard(
            root / HOUR4, 2, Compression.ZSTD, event_time_range=[T3 + 3600, T3 + 3700]
        )
        self.repeated = write_shard(root / REPEATED, 1)
        write_marker(root / REPEATED, REPEATED, [self.repeated], T3 - 86400, T3 - 82800)
        self.late = write_shard(root / "_late" / HOUR3, 2)
        # what no listing may return: in-progress, hidden, staged, sidecar and stray files
        (h3 / f".{self.s1.name.replace('.', '_')}.inprogress").write_bytes(b"x")
        (h3 / ".hidden.tfrecord.gz").write_bytes(self.s1.read_bytes())
        (h3 / "_tmp.tfrecord").write_bytes(b"")
        (h3 / "notes.txt").write_text("hi")
        (h3 / "part-gone.manifest.json").write_text("{}")
        for folder in (".unpublished/node1", "_other", ".hidden"):
            (root / folder).mkdir(parents=True)
            (root / folder / shard_name()).write_bytes(self.s1.read_bytes())

    def expected(self) -> list[tuple[str, str]]:
        return [
            (REPEATED, self.repeated.name),
            (HOUR3, self.s1.name),
            (HOUR3, self.s2.name),
            (FIELD, self.field.name),
            (HOUR4, self.open_hour.name),
        ]


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path / "clicks")


def pairs(shards: list[Shard]) -> list[tuple[str, str]]:
    return [(s.partition, s.name) for s in shards]


def test_lists_published_shards_only_sorted_by_partition_then_name(layout: Layout) -> None:
    shards = list_shards(layout.root)
    assert pairs(shards) == layout.expected()
    by_name = {s.name: s for s in shards}
    s1, s2 = by_name[layout.s1.name], by_name[layout.s2.name]
    assert s1.path == str(layout.s1)
    assert (s1.records, s1.compression, s1.size) == (3, "gzip", layout.s1.stat().st_size)
    assert s1.manifest is not None
    assert "record_offsets" not in s1.manifest  # read again only when a reader seeks
    assert s1.manifest["sha256"] == hashlib.sha256(layout.s1.read_bytes()).hexdigest()
    assert (s2.manifest, s2.records) == (None, 2)  # no manifest: the marker's count
    assert s1.marker is not None
    assert s1.marker.partition == HOUR3
    assert s1.partition_values == {"dt": "2026-11-25", "hour": "03"}
    assert by_name[layout.repeated.name].partition_values["hour"] == "02+0100"
    assert by_name[layout.open_hour.name].marker is None
    assert by_name[layout.open_hour.name].event_time_range == (T3 + 3600, T3 + 3700)


def test_an_unpartitioned_dataset_lists_its_root(tmp_path: Path) -> None:
    a = write_shard(tmp_path, 2)
    b = write_shard(tmp_path, 1, Compression.NONE, with_manifest=False)
    assert pairs(list_shards(tmp_path)) == [("", a.name), ("", b.name)]
    assert pairs(list_shards(f"file://{tmp_path}", partitions=[""])) == [("", a.name), ("", b.name)]
    assert list_shards(tmp_path, partitions=["dt=*"]) == []


def _memory_copy(root: Path) -> str:
    fs = fsspec.filesystem("memory")
    base = f"/reader-{uuid.uuid4().hex}"
    for path in root.rglob("*"):
        if path.is_file():
            fs.pipe_file(f"{base}/{path.relative_to(root).as_posix()}", path.read_bytes())
    return f"memory://{base}"


def test_an_fsspec_location_lists_the_same(layout: Layout) -> None:
    url = _memory_copy(layout.root)
    try:
        local = list_shards(layout.root, include_late=True)
        remote = list_shards(url, include_late=True)
        assert [(s.partition, s.name, s.records, s.size, s.late) for s in remote] == [
            (s.partition, s.name, s.records, s.size, s.late) for s in local
        ]
        assert remote[0].path == f"{url}/{REPEATED}/{layout.repeated.name}"
        assert remote[0].manifest == local[0].manifest
        assert check_partition(f"{url}/{HOUR3}") == []
        assert list(iter_records_from(remote[1], 1)) == records_of(layout.s1.name, 3)[1:]
    finally:
        fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)


@pytest.mark.parametrize(
    ("selectors", "partitions"),
    [
        ([DAY], [HOUR3, FIELD, HOUR4]),
        ([HOUR3], [HOUR3, FIELD]),
        ([FIELD], [FIELD]),
        (["dt=*/hour=03"], [HOUR3, FIELD]),
        (["dt=2026-1?-25/hour=0[2-3]*"], [REPEATED, HOUR3, FIELD]),
        (["*/country=de"], [FIELD]),
        ([f"/{HOUR4}/"], [HOUR4]),
        (["dt=2026-11-2"], []),  # a prefix is whole folders, not characters
        ([""], []),
        ([HOUR4, REPEATED], [REPEATED, HOUR4]),
        (HOUR4, [HOUR4]),  # one selector as a string
    ],
)
def test_partition_selectors(layout: Layout, selectors: Any, partitions: list[str]) -> None:
    shards = list_shards(layout.root, partitions=selectors)
    assert sorted({s.partition for s in shards}) == sorted(partitions)


def test_time_range_by_markers_else_the_manifests_event_times(layout: Layout) -> None:
    utc = dt.UTC

    def listed(start: Any = None, end: Any = None) -> set[str]:
        return {s.partition for s in list_shards(layout.root, start=start, end=end)}

    everything = {REPEATED, HOUR3, FIELD, HOUR4}
    assert listed() == everything
    assert listed(T3, T3 + 1) == {HOUR3, FIELD}
    assert listed(dt.datetime(2026, 11, 25, 3, 30, tzinfo=utc)) == {HOUR3, FIELD, HOUR4}
    # [start, end) of a marker is half-open; an event time range is closed
    assert listed(T3 + 3600) == {HOUR4}
    assert listed(T3 + 3700) == {HOUR4}
    assert listed(T3 + 3700.5) == set()
    assert listed(end=T3) == {REPEATED}
    assert listed(end=dt.datetime(2026, 11, 25, 4, 0, 1, tzinfo=utc)) == everything
    cet = dt.timezone(dt.timedelta(hours=1))
    assert listed(dt.datetime(2026, 11, 25, 4, 0, tzinfo=cet), T3 + 60) == {HOUR3, FIELD}
    # a shard whose time nothing tells is kept, not dropped
    unknown = write_shard(layout.root / "dt=2026-11-26/hour=00", 1, with_manifest=False)
    assert unknown.name in {s.name for s in list_shards(layout.root, start=T3 + 3700.5)}


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (dt.datetime(2026, 11, 25), None, "no time zone"),
        (T3, T3, "must be before end"),
        ("2026-11-25", None, "datetime or epoch seconds"),
    ],
)
def test_bad_time_bounds_are_refused(layout: Layout, start: Any, end: Any, message: str) -> None:
    with pytest.raises(TfrecorddError, match=message):
        list_shards(layout.root, start=start, end=end)


def test_completed_only_lists_the_marked_shards_of_completed_partitions(layout: Layout) -> None:
    stray = write_shard(layout.root / HOUR3, 1)  # in the folder, but not in the marker
    assert stray.name in {s.name for s in list_shards(layout.root)}
    completed = list_shards(layout.root, completed_only=True)
    assert pairs(completed) == [p for p in layout.expected() if p[0] != HOUR4]
    with_late = list_shards(layout.root, completed_only=True, include_late=True)
    late = [s for s in with_late if s.late]
    assert [(s.partition, s.name) for s in late] == [(HOUR3, layout.late.name)]
    assert [s.name for s in with_late if s.partition == HOUR3][-1] == layout.late.name


def test_field_partitions_without_a_marker_are_completed_by_the_one_above(tmp_path: Path) -> None:
    hour = tmp_path / HOUR3
    de = write_shard(hour / "country=de", 2)
    fr = write_shard(hour / "country=fr", 1)
    unlisted = write_shard(hour / "country=fr", 1)
    write_marker(hour, HOUR3, [de, fr], T3, T3 + 3600)
    completed = list_shards(tmp_path, completed_only=True)
    assert pairs(completed) == [(f"{HOUR3}/country=de", de.name), (f"{HOUR3}/country=fr", fr.name)]
    assert [(s.records, s.marker and s.marker.partition) for s in completed] == [
        (2, HOUR3),
        (1, HOUR3),
    ]
    assert list_shards(tmp_path, partitions=["*/country=fr"], start=T3 + 3600) == []
    assert check_partition(hour) == [
        f"country=fr/{unlisted.name}: in the folder but not listed in _SUCCESS"
    ]


def test_late_shards_only_when_asked(layout: Layout) -> None:
    assert not any(s.late for s in list_shards(layout.root))
    shards = list_shards(layout.root, include_late=True, partitions=[HOUR3], start=T3, end=T3 + 1)
    assert [(s.name, s.late) for s in shards] == [
        (layout.s1.name, False),
        (layout.s2.name, False),
        (layout.late.name, True),
        (layout.field.name, False),
    ]


def test_manifests_can_be_left_unread(layout: Layout) -> None:
    shards = {s.name: s for s in list_shards(layout.root, read_manifests=False)}
    assert all(s.manifest is None for s in shards.values())
    assert shards[layout.s1.name].records == 3  # from the marker
    assert shards[layout.open_hour.name].records is None


def test_damaged_markers_and_manifests_are_errors_naming_the_file(layout: Layout) -> None:
    marker = layout.root / HOUR3 / "_SUCCESS"
    marker.write_text('{"shards": [{"records": 1}]}')
    with pytest.raises(TfrecorddError, match=r"_SUCCESS: shards\[0\] has no name"):
        list_shards(layout.root)
    marker.write_text("{not json")
    with pytest.raises(TfrecorddError, match="_SUCCESS: the completion marker is not JSON"):
        list_shards(layout.root)
    marker.unlink()
    other = layout.root / HOUR4 / manifest.manifest_name(layout.open_hour.name)
    other.write_text(json.dumps({"shard": "part-else.tfrecord.zst", "records": 2}))
    with pytest.raises(TfrecorddError, match=r"the manifest is shard 'part-else\.tfrecord\.zst'"):
        list_shards(layout.root)


def test_a_location_that_is_no_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such directory"):
        list_shards(tmp_path / "missing")
    with pytest.raises(InputError, match="not a directory"):
        list_shards(write_shard(tmp_path, 1))
    with pytest.raises(InputError, match="no such directory"):
        list_shards(f"memory:///reader-{uuid.uuid4().hex}")


# --- check_partition ----------------------------------------------------------------------------


def test_a_sound_partition_has_no_problems(layout: Layout) -> None:
    for partition in (HOUR3, FIELD, REPEATED):
        assert check_partition(layout.root / partition) == []
    assert check_partition(layout.root / HOUR4) == [
        "no _SUCCESS marker: the partition is not complete"
    ]


def test_check_partition_names_every_mismatch(layout: Layout) -> None:
    folder = layout.root / HOUR3
    layout.s2.unlink()
    data = bytearray(layout.s1.read_bytes())
    data[-9] ^= 1  # same size, other bytes
    layout.s1.write_bytes(bytes(data))
    stray = write_shard(folder, 1)
    field = layout.root / FIELD
    with open(layout.field, "ab") as f:
        f.write(b"\0")
    marker = json.loads((field / "_SUCCESS").read_text())
    marker["shards"][0]["records"] = 5
    (field / "_SUCCESS").write_text(json.dumps(marker))
    s1_sha = hashlib.sha256(bytes(data)).hexdigest()
    assert check_partition(folder) == [
        f"{layout.s1.name}: SHA-256 {s1_sha}, _SUCCESS says "
        + json.loads((folder / "_SUCCESS").read_text())["shards"][0]["sha256"],
        f"{layout.s2.name}: listed in _SUCCESS but missing",
        f"{stray.name}: in the folder but not listed in _SUCCESS",
    ]
    assert check_partition(folder, verify_digests=False) == check_partition(folder)[1:]
    problems = check_partition(field, verify_digests=False)
    size = layout.field.stat().st_size
    assert problems == [
        f"{layout.field.name}: size {size}, _SUCCESS says {size - 1}",
        f"{layout.field.name}: 4 records in its manifest, _SUCCESS says 5",
        "_SUCCESS: 4 records in all, its shards hold 5",
    ]


def test_check_partition_with_another_marker_name(tmp_path: Path) -> None:
    shard = write_shard(tmp_path, 2)
    write_marker(tmp_path, "", [shard], T3, T3 + 60)
    (tmp_path / "_SUCCESS").rename(tmp_path / "_DONE")
    assert check_partition(tmp_path, marker_name="_DONE") == []
    assert list_shards(tmp_path, completed_only=True) == []
    assert pairs(list_shards(tmp_path, completed_only=True, marker_name="_DONE")) == [
        ("", shard.name)
    ]


# --- reading from a record on -------------------------------------------------------------------


@pytest.mark.parametrize("compression", list(Compression))
@pytest.mark.parametrize("with_manifest", [True, False])
def test_reading_from_every_record_on(
    tmp_path: Path, compression: Compression, with_manifest: bool
) -> None:
    path = write_shard(tmp_path, 5, compression, with_manifest=with_manifest)
    records = records_of(path.name, 5)
    for start in range(6):
        assert list(iter_records_from(path, start)) == records[start:]
    with pytest.raises(TfrecorddError, match="record 6 is past its 5 records"):
        list(iter_records_from(path, 6))
    starts = [sum(16 + len(r) for r in records[:i]) for i in range(5)]  # 16 bytes of framing
    assert reader.record_offsets(path) == (starts if with_manifest else None)


def _hand_framed(tmp_path: Path, compression: Compression) -> tuple[Path, list[bytes]]:
    """A shard whose record 1 fails its data CRC, compression intact, and its manifest."""
    records = [b"zero", b"one!", b"two", b"three"]
    framed = [frame(r) for r in records]
    framed[1] = framed[1][:-5] + b"?" + framed[1][-4:]
    raw = b"".join(framed)
    path = tmp_path / shard_name(compression)
    path.write_bytes(gzip.compress(raw) if compression is Compression.GZIP else raw)
    offsets = [sum(len(f) for f in framed[:i]) for i in range(len(framed))]
    doc = {"version": 1, "shard": path.name, "compression": str(compression), "records": 4}
    doc["record_offsets"] = offsets
    (tmp_path / manifest.manifest_name(path.name)).write_text(json.dumps(doc))
    return path, records


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_records_before_the_position_are_skipped_unread(
    tmp_path: Path, compression: Compression
) -> None:
    path, records = _hand_framed(tmp_path, compression)
    assert list(iter_records_from(path, 2)) == records[2:]
    with pytest.raises(CorruptRecordError, match="at offset 20: data CRC mismatch"):
        list(iter_records_from(path, 0))
    manifest_path = tmp_path / manifest.manifest_name(path.name)
    manifest_path.unlink()  # counting instead reads the damaged record
    with pytest.raises(CorruptRecordError):
        list(iter_records_from(path, 2))


def test_a_manifest_that_does_not_fit_its_shard_is_an_error(tmp_path: Path) -> None:
    path = write_shard(tmp_path, 3, Compression.NONE)
    manifest_path = tmp_path / manifest.manifest_name(path.name)
    doc = json.loads(manifest_path.read_text())
    offsets, size = doc["record_offsets"], path.stat().st_size
    doc["record_offsets"] = [0, offsets[1], offsets[2] - 1]
    manifest_path.write_text(json.dumps(doc))
    at = offsets[2] - 1
    with pytest.raises(CorruptRecordError, match=f"at offset {at}: length CRC mismatch"):
        list(iter_records_from(path, 2))
    doc["record_offsets"], doc["records"] = [*offsets, size], 4
    manifest_path.write_text(json.dumps(doc))
    with pytest.raises(TfrecorddError, match=f"the file ends before offset {size}"):
        list(iter_records_from(path, 3))
    with pytest.raises(TfrecorddError, match="3 records, its manifest lists 4"):
        list(iter_records_from(path, 1))
    doc["records"] = 3
    manifest_path.write_text(json.dumps(doc))
    with pytest.raises(TfrecorddError, match="not one offset a record"):
        list(iter_records_from(path, 1))


# --- the split across workers and ranks, and resuming --------------------------------------------


def test_split_is_round_robin_and_seeded_shuffles_are_reproducible() -> None:
    shards = list(range(10))
    assert split_shards(shards, 3) == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    seeded = split_shards(shards, 3, seed=7, epoch=1)
    assert seeded == split_shards(shards, 3, seed=7, epoch=1)
    assert sorted(s for part in seeded for s in part) == shards
    epochs = {tuple(map(tuple, split_shards(shards, 3, seed=7, epoch=e))) for e in range(5)}
    assert len(epochs) > 1
    with pytest.raises(TfrecorddError, match="at least 1"):
        split_shards(shards, 0)


POOL_SIZES = [0, 1, 2, 3, 5, 7]
POOL_KINDS = [
    (Compression.NONE, True),
    (Compression.GZIP, True),
    (Compression.ZSTD, False),
]


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Shards of every size and kind (with a manifest to seek by, or without: counting)."""
    folder = tmp_path_factory.mktemp("pool")
    return [
        write_shard(folder, size, compression, with_manifest=with_manifest)
        for compression, with_manifest in POOL_KINDS
        for size in POOL_SIZES
    ]


def _items(dataset: TorchShardDataset, worker: int, workers: int) -> list[tuple[bytes, Any]]:
    return list(dataset.iter_worker(worker, workers))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    picks=st.lists(st.integers(0, len(POOL_SIZES) * len(POOL_KINDS) - 1), unique=True, max_size=9),
    world_size=st.integers(1, 3),
    num_workers=st.integers(1, 3),
    seed=st.none() | st.integers(0, 2**32),
    epoch=st.integers(0, 3),
    data=st.data(),
)
def test_a_resumed_iteration_yields_exactly_the_rest(
    pool: list[Path],
    picks: list[int],
    world_size: int,
    num_workers: int,
    seed: int | None,
    epoch: int,
    data: st.DataObject,
) -> None:
    shards = [pool[i] for i in picks]
    options: dict[str, Any] = {"world_size": world_size, "seed": seed, "epoch": epoch}
    tracker = PositionTracker()
    runs: dict[tuple[int, int], tuple[list[tuple[bytes, Any]], int]] = {}
    everything: list[bytes] = []
    for rank in range(world_size):
        dataset = TorchShardDataset(shards, rank=rank, with_position=True, **options)
        for worker in range(num_workers):
            items = _items(dataset, worker, num_workers)
            everything += [record for record, _ in items]
            stop = data.draw(st.integers(0, len(items)), label=f"stop of {rank}/{worker}")
            for _, position in items[:stop]:
                tracker.update(position)
            runs[rank, worker] = items, stop
    # every record of every shard, each read by exactly one worker
    assert sorted(everything) == sorted(r for p in shards for r in records_of(p.name, _size(p)))
    saved = json.loads(json.dumps(tracker.state()))
    for rank in range(world_size):
        resumed = TorchShardDataset(shards, rank=rank, with_position=True, start=saved, **options)
        for worker in range(num_workers):
            items, stop = runs[rank, worker]
            assert _items(resumed, worker, num_workers) == items[stop:]


def _size(path: Path) -> int:
    return sum(1 for _ in reader.iter_records(path))


def test_positions_name_the_worker_the_shard_and_the_record(pool: list[Path]) -> None:
    shards = [pool[2], pool[3]]  # 2 and 3 records
    dataset = TorchShardDataset(shards, rank=1, world_size=2, with_position=True)
    items = list(dataset)  # outside a DataLoader worker: worker 0 of 1
    assert [p for _, p in items] == [ShardPosition(1, 2, 0, i, pool[3].name) for i in (1, 2, 3)]
    assert list(dataset.positions) == [items[-1][1]]
    parsed = TorchShardDataset(shards, parse=lambda r: r.decode().upper())
    assert next(iter(parsed)) == records_of(pool[2].name, 1)[0].decode().upper()


def test_a_position_from_another_split_or_shard_list_is_refused(pool: list[Path]) -> None:
    shards = pool[1:5]
    first = TorchShardDataset(shards, world_size=2, with_position=True)
    _, position = next(iter(first))
    with pytest.raises(TfrecorddError, match="saved with the shards split across 2 workers, now 4"):
        next(TorchShardDataset(shards, world_size=4, start=[position]).iter_worker())
    with pytest.raises(TfrecorddError, match="the shard list, its order, the seed or the epoch"):
        next(TorchShardDataset(shards[1:], world_size=2, start=[position]).iter_worker())
    with pytest.raises(TfrecorddError, match="rank 2 of 2"):
        TorchShardDataset(shards, rank=2, world_size=2)
    after_epoch = TorchShardDataset(shards, world_size=2, start=[position])
    after_epoch.set_epoch(1)
    assert len(list(after_epoch)) == len(list(TorchShardDataset(shards, world_size=2)))


class _Tensor:
    """What a DataLoader's default collation makes of a batch of ints."""

    def __init__(self, values: list[int]) -> None:
        self.values = values

    def tolist(self) -> list[int]:
        return self.values


def test_the_tracker_reads_collated_batches_of_positions() -> None:
    tracker = PositionTracker()
    tracker.update(ShardPosition(0, 2, 0, 1, "a"))
    # a batch of two items of worker 1, as default_collate hands it over
    tracker.update((_Tensor([1, 1]), _Tensor([2, 2]), _Tensor([3, 3]), _Tensor([4, 5]), ["b", "b"]))
    tracker.update(ShardPosition(0, 2, 0, 2, "a"))
    assert tracker.state() == [[0, 2, 0, 2, "a"], [1, 2, 3, 5, "b"]]
    assert list(PositionTracker(tracker.state())) == list(tracker)
    with pytest.raises(TfrecorddError, match="not a shard position"):
        tracker.update([1, 2, 3])


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_torch_dataset_without_torch_says_how_to_get_it(pool: list[Path]) -> None:
    with pytest.raises(TfrecorddError, match="pip install torch"):
        reader.torch_dataset(pool)


# --- tf.data's file list, without TensorFlow ------------------------------------------------------


def test_shard_files_for_tf_data(layout: Layout) -> None:
    h3 = [s for s in list_shards(layout.root, partitions=[HOUR3]) if s.partition == HOUR3]
    gz = [s for s in h3 if s.compression is Compression.GZIP]
    assert shard_files(gz) == ([str(layout.s1)], Compression.GZIP)
    assert shard_files([f"file://{layout.s1}"]) == ([str(layout.s1)], Compression.GZIP)
    assert shard_files([layout.s2], "none") == ([str(layout.s2)], Compression.NONE)
    assert shard_files(layout.root / "_late") == ([str(layout.late)], Compression.GZIP)
    assert shard_files([]) == ([], Compression.NONE)
    with pytest.raises(TfrecorddError, match=r"the shards mix compressions \(gzip, none\)"):
        shard_files(h3)
    with pytest.raises(TfrecorddError, match="TensorFlow cannot read zstd shards: transcode"):
        shard_files([layout.open_hour])


# --- the public module ----------------------------------------------------------------------------


def test_the_old_reader_imports_still_work_and_are_the_same_objects() -> None:
    for name in ("iter_records", "iter_records_with_offsets", "iter_examples"):
        assert getattr(reader, name) is getattr(old_reader, name)
    assert reader.iter_sequence_examples is old_reader.iter_sequence_examples
    assert reader.Source == old_reader.Source
    assert sorted(reader.__all__) == sorted(set(reader.__all__))
    missing = [name for name in reader.__all__ if not hasattr(reader, name)]
    assert missing == []


def _top_level_imports(path: Path) -> Iterator[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_importing_the_reader_loads_neither_tensorflow_nor_torch() -> None:
    package = Path(reader.__file__).parent
    modules = [package / "reader.py", *sorted((package / "readers").glob("*.py"))]
    heavy = {
        f"{m.name}: {name}"
        for m in modules
        for name in _top_level_imports(m)
        if name.split(".")[0] in {"tensorflow", "torch"}
    }
    assert heavy == set()
