"""``tfrecordd.reader.torch_dataset`` under a real ``torch.utils.data.DataLoader`` with worker
processes: the shards split across workers and ranks as documented, every record read once, and
a run stopped after some batches resumed from the positions it consumed, yielding exactly the
rest. torch is in no extra of the package (its wheel pulls in gigabytes of CUDA libraries), so
this module is skipped where it is not installed."""

from __future__ import annotations

import importlib
from collections import defaultdict
from typing import Any

import pytest

from tfrecordd.format.compression import SUFFIXES, Compression
from tfrecordd.format.writer import open_writer
from tfrecordd.outputs import manifest
from tfrecordd.reader import (
    PositionTracker,
    ShardPosition,
    TorchShardDataset,
    list_shards,
    torch_dataset,
)

pytestmark = pytest.mark.subprocess  # DataLoader workers are processes

torch: Any = pytest.importorskip("torch")
data: Any = importlib.import_module("torch.utils.data")

SIZES = [5, 0, 7, 3, 9, 4, 6]
WORKERS = 2
WORLD = 2


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """Shards of several sizes, with manifests (so resuming seeks) or without (so it counts)."""
    root = tmp_path_factory.mktemp("torch")
    for i, size in enumerate(SIZES):
        compression = [Compression.GZIP, Compression.NONE, Compression.ZSTD][i % 3]
        path = root / f"part-20261125T030000.00000{i}Z-n-a1b2c3-00000{i}{SUFFIXES[compression]}"
        with open_writer(path, compression) as w:
            for j in range(size):
                w.write(f"{i}:{j}".encode())
                w.sync()
        if i % 2 == 0:
            measured = manifest.scan(str(path))
            doc = b"".join(
                manifest.parts(
                    shard=path.name,
                    compression=str(compression),
                    records=measured["records"],
                    size=measured["size"],
                    sha256=measured["sha256"],
                    crc=measured["crc32c"],
                    offsets=[measured["record_offsets"]],
                    first_time=None,
                    last_time=None,
                    schemas={},
                    positions={},
                )
            )
            (root / manifest.manifest_name(path.name)).write_bytes(doc)
    return list_shards(root)


def run(loader: Any, stop: int | None = None) -> tuple[dict[int, list[Any]], PositionTracker]:
    """The records each global worker delivered, in order, and their positions, over the
    first ``stop`` batches (all when ``None``)."""
    got: dict[int, list[Any]] = defaultdict(list)
    tracker = PositionTracker()
    for n, (records, positions) in enumerate(loader):
        if stop is not None and n == stop:
            break
        assert isinstance(positions, ShardPosition)
        workers: Any = positions.worker  # collated: a tensor of the batch's workers
        [worker] = set(workers.tolist())  # a batch comes from one worker
        got[worker] += records
        tracker.update(positions)
    return got, tracker


def loader(dataset: Any, **options: Any) -> Any:
    return data.DataLoader(dataset, batch_size=3, num_workers=WORKERS, **options)


def test_the_split_across_dataloader_workers_and_ranks(shards: list[Any]) -> None:
    everything: list[bytes] = []
    for rank in range(WORLD):
        dataset = torch_dataset(shards, rank=rank, world_size=WORLD, seed=3, with_position=True)
        assert isinstance(dataset, data.IterableDataset)
        assert isinstance(dataset, TorchShardDataset)
        got, _ = run(loader(dataset))
        plain = TorchShardDataset(shards, rank=rank, world_size=WORLD, seed=3)
        for worker in range(WORKERS):
            expected = list(plain.iter_worker(worker, WORKERS))
            assert got.get(rank * WORKERS + worker, []) == expected
        everything += [r for records in got.values() for r in records]
    assert sorted(everything) == sorted(
        f"{i}:{j}".encode() for i, n in enumerate(SIZES) for j in range(n)
    )


@pytest.mark.parametrize("stop", [1, 3, 5])
def test_a_stopped_run_resumes_with_exactly_the_rest(shards: list[Any], stop: int) -> None:
    options: dict[str, Any] = {"world_size": WORLD, "seed": 11, "epoch": 2, "with_position": True}
    saved: list[list[Any]] = []
    full: dict[int, list[bytes]] = {}
    first: dict[int, list[bytes]] = {}
    for rank in range(WORLD):
        full |= run(loader(torch_dataset(shards, rank=rank, **options)))[0]
        got, tracker = run(loader(torch_dataset(shards, rank=rank, **options)), stop)
        first |= got
        saved += tracker.state()
    for rank in range(WORLD):
        rest, _ = run(loader(torch_dataset(shards, rank=rank, start=saved, **options)))
        for worker in range(rank * WORKERS, (rank + 1) * WORKERS):
            assert first.get(worker, []) + rest.get(worker, []) == full.get(worker, [])


def test_workers_started_by_spawn_rebuild_the_dataset(shards: list[Any]) -> None:
    picked = [shards[0], shards[2], shards[3]]  # worker 0 reads the first and the last
    dataset = torch_dataset(picked, with_position=True, parse=bytes.decode)
    got, tracker = run(loader(dataset, multiprocessing_context="spawn"))
    assert got == {
        0: [f"0:{j}" for j in range(SIZES[0])] + [f"3:{j}" for j in range(SIZES[3])],
        1: [f"2:{j}" for j in range(SIZES[2])],
    }
    assert list(tracker) == [
        ShardPosition(0, 2, 1, SIZES[3], picked[2].name),
        ShardPosition(1, 2, 0, SIZES[2], picked[1].name),
    ]
