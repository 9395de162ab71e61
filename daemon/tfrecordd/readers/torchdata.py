"""Shards split across PyTorch's workers and ranks, and read on from a saved position.

Every process of a training job lists the same shards in the same order; the shards (shuffled
by ``seed`` and ``epoch`` when a seed is given) go round-robin to the job's *global workers*:
DataLoader worker ``w`` of rank ``r`` is global worker ``r * num_workers + w``, one of
``world_size * num_workers``. Each global worker reads its shards in order, so where it stands
is one :class:`ShardPosition`: which of its shards, and how many records of it are read. A job
that is preempted saves the positions of the items it consumed (:class:`PositionTracker`) and
starts again with ``start=``: each worker skips its shards before the position, and the records
before it in that shard unread (:func:`~tfrecordd.readers.seek.iter_records_from`).

PyTorch is optional: :class:`TorchShardDataset` is a plain iterable, and :func:`torch_dataset`
makes it a ``torch.utils.data.IterableDataset`` (importing torch only then).
"""

from __future__ import annotations

import importlib
import os
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cache
from typing import Any, NamedTuple, TypeVar

from tfrecordd.errors import DecodeError, TfrecorddError
from tfrecordd.format.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from tfrecordd.format.framing import DEFAULT_MAX_RECORD_BYTES
from tfrecordd.readers.layout import Shard, as_shard
from tfrecordd.readers.seek import iter_records_from

_T = TypeVar("_T")


class ShardPosition(NamedTuple):
    """Where global worker ``worker`` (of ``workers``) stands: ``record`` records of its
    ``shard``-th shard (named ``name``) are read. Resuming from it reads the next one.

    A ``NamedTuple`` of ints and a string: DataLoader's default collation keeps it one (each
    field a batch), :class:`PositionTracker` reads it back, and ``list(position)`` is JSON."""

    worker: int
    workers: int
    shard: int
    record: int
    name: str


def split_shards(
    shards: Sequence[_T], workers: int, *, seed: int | None = None, epoch: int = 0
) -> list[list[_T]]:
    """The shards of each of ``workers`` global workers: round-robin over ``shards``, first
    shuffled by ``seed`` and ``epoch`` when ``seed`` is given (the same on every machine and
    Python version)."""
    if workers < 1:
        raise TfrecorddError(f"the shards are split across {workers} workers: at least 1")
    order = list(shards)
    if seed is not None:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return [order[g::workers] for g in range(workers)]


def _last(value: Any) -> Any:
    """The last item of a collated field (a tensor, a list), or ``value`` when it is one item."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list | tuple):
        if not value:
            raise TfrecorddError("an empty batch of positions")
        return value[-1]
    return value


class PositionTracker:
    """The position of each global worker, as far as the items consumed go.

    Feed it the position of every item (or batch) the training loop has consumed, keep
    :meth:`state` with the model's checkpoint, and give it back as ``start=`` after a restart."""

    def __init__(self, positions: Iterable[ShardPosition | Sequence[Any]] = ()) -> None:
        self._positions: dict[int, ShardPosition] = {}
        for position in positions:
            self.update(position)

    def update(self, position: ShardPosition | Sequence[Any]) -> None:
        """Take one item's position, or a batch's as DataLoader collates them (the last one
        counts: a batch comes from one worker, in order)."""
        if len(position) != len(ShardPosition._fields):
            raise TfrecorddError(f"not a shard position: {position!r}")
        worker, workers, shard, record, name = (_last(v) for v in position)
        for what, value in (("worker", worker), ("workers", workers)):
            if type(value) is not int or value < 0:
                raise TfrecorddError(f"not a shard position: {what} is {value!r}")
        if type(shard) is not int or type(record) is not int or not isinstance(name, str):
            raise TfrecorddError(f"not a shard position: {position!r}")
        self._positions[worker] = ShardPosition(worker, workers, shard, record, name)

    def __iter__(self) -> Iterator[ShardPosition]:
        return iter(sorted(self._positions.values()))

    def __len__(self) -> int:
        return len(self._positions)

    def state(self) -> list[list[Any]]:
        """The positions as JSON-ready lists; ``start=`` takes them back."""
        return [list(p) for p in self]


def _worker_info() -> tuple[int, int]:
    """This process's DataLoader worker id and their number; ``(0, 1)`` outside a worker."""
    # A worker has torch imported; a process without it is no worker, and must not pay for it.
    if "torch.utils.data" not in sys.modules:
        return 0, 1
    info = sys.modules["torch.utils.data"].get_worker_info()
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))


class TorchShardDataset:
    """Records of ``shards``, split across global workers and resumable (see the module).

    ``shards``: :class:`~tfrecordd.readers.layout.Shard` objects or paths, in the same order in
    every process (:func:`~tfrecordd.readers.layout.list_shards` sorts them). ``parse`` turns
    each record's bytes into the item (``tfrecordd.reader.parse_example``, say); ``None`` yields
    the bytes. ``rank`` / ``world_size``: this process among the job's. ``seed`` / ``epoch``
    shuffle the shards before they are split (:meth:`set_epoch` moves to the next epoch).
    ``start``: the positions to resume from (:meth:`PositionTracker.state`, or
    :class:`ShardPosition` objects); a worker with none starts at its beginning.
    ``with_position``: yield ``(item, ShardPosition)``, the position after the item.

    Iterating it outside a DataLoader worker reads as worker 0 of 1; :meth:`iter_worker` reads
    as any worker. :attr:`positions` tracks the workers read in this process.
    """

    def __init__(
        self,
        shards: Iterable[Shard | str | os.PathLike[str]],
        *,
        parse: Callable[[bytes], Any] | None = None,
        rank: int = 0,
        world_size: int = 1,
        seed: int | None = None,
        epoch: int = 0,
        start: Iterable[ShardPosition | Sequence[Any]] | None = None,
        with_position: bool = False,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        max_decompressed_bytes: int | None = DEFAULT_MAX_DECOMPRESSED_BYTES,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise TfrecorddError(f"rank {rank} of {world_size}: need 0 <= rank < world_size")
        self.shards = [as_shard(s) for s in shards]
        self.parse = parse
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.epoch = epoch
        self.start = list(PositionTracker(start or ()))
        self.with_position = with_position
        self.max_record_bytes = max_record_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self.storage_options = storage_options
        self.positions = PositionTracker()

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next, from its beginning (a new shuffle when seeded)."""
        self.epoch = epoch
        self.start = []

    def worker_shards(self, worker_id: int = 0, num_workers: int = 1) -> list[Shard]:
        """The shards DataLoader worker ``worker_id`` of ``num_workers`` of this rank reads."""
        if not 0 <= worker_id < num_workers:
            raise TfrecorddError(f"worker {worker_id} of {num_workers}: no such worker")
        workers = self.world_size * num_workers
        split = split_shards(self.shards, workers, seed=self.seed, epoch=self.epoch)
        return split[self.rank * num_workers + worker_id]

    def _resume_point(self, worker: int, workers: int, mine: list[Shard]) -> tuple[int, int]:
        saved = [p for p in self.start if p.worker == worker]
        if not saved:
            return 0, 0
        [p] = saved
        if p.workers != workers:
            raise TfrecorddError(
                f"the position of worker {worker} was saved with the shards split across "
                f"{p.workers} workers, now {workers}: resume with the same world_size and "
                "num_workers"
            )
        if not 0 <= p.shard < len(mine) or mine[p.shard].name != p.name or p.record < 0:
            raise TfrecorddError(
                f"worker {worker}'s position (shard {p.shard}, {p.name!r}) is not among its "
                "shards now: the shard list, its order, the seed or the epoch changed since it "
                "was saved; resume with the shard list saved beside the positions"
            )
        return p.shard, p.record

    def iter_worker(self, worker_id: int = 0, num_workers: int = 1) -> Iterator[Any]:
        """The items of DataLoader worker ``worker_id`` of ``num_workers`` of this rank."""
        mine = self.worker_shards(worker_id, num_workers)
        worker, workers = self.rank * num_workers + worker_id, self.world_size * num_workers
        first, skip = self._resume_point(worker, workers, mine)
        for index in range(first, len(mine)):
            shard = mine[index]
            at = skip if index == first else 0
            for record in iter_records_from(
                shard,
                at,
                max_record_bytes=self.max_record_bytes,
                max_decompressed_bytes=self.max_decompressed_bytes,
                storage_options=self.storage_options,
            ):
                at += 1
                position = ShardPosition(worker, workers, index, at, shard.name)
                self.positions.update(position)
                item = record if self.parse is None else self._parse(record, shard, at - 1)
                yield (item, position) if self.with_position else item

    def _parse(self, record: bytes, shard: Shard, index: int) -> Any:
        assert self.parse is not None
        try:
            return self.parse(record)
        except DecodeError as e:
            raise DecodeError(f"{shard.path}: record {index}: {e}") from e

    def __iter__(self) -> Iterator[Any]:
        return self.iter_worker(*_worker_info())


@cache
def _torch_class() -> type[TorchShardDataset]:
    try:
        data: Any = importlib.import_module("torch.utils.data")
    except ImportError as e:
        raise TfrecorddError(f"PyTorch is not installed ({e}): pip install torch") from None
    made: type[TorchShardDataset] = type(
        "TorchIterableShardDataset",
        (TorchShardDataset, data.IterableDataset),
        {"__module__": __name__, "__reduce__": _reduce},
    )
    return made


def _reduce(self: TorchShardDataset) -> tuple[Any, tuple[dict[str, Any]]]:
    """Pickled by state, rebuilt through :func:`_rebuild`: the class is made at run time, so a
    DataLoader worker started by ``spawn`` cannot find it by name."""
    return _rebuild, (dict(vars(self)),)


def _rebuild(state: dict[str, Any]) -> TorchShardDataset:
    cls = _torch_class()
    dataset = cls.__new__(cls)
    vars(dataset).update(state)
    return dataset


def torch_dataset(
    shards: Iterable[Shard | str | os.PathLike[str]],
    *,
    parse: Callable[[bytes], Any] | None = None,
    rank: int = 0,
    world_size: int = 1,
    seed: int | None = None,
    epoch: int = 0,
    start: Iterable[ShardPosition | Sequence[Any]] | None = None,
    with_position: bool = False,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_decompressed_bytes: int | None = DEFAULT_MAX_DECOMPRESSED_BYTES,
    storage_options: Mapping[str, Any] | None = None,
) -> TorchShardDataset:
    """A :class:`TorchShardDataset` that is also a ``torch.utils.data.IterableDataset``, for a
    ``DataLoader``; the arguments are :class:`TorchShardDataset`'s. Imports torch."""
    return _torch_class()(
        shards,
        parse=parse,
        rank=rank,
        world_size=world_size,
        seed=seed,
        epoch=epoch,
        start=start,
        with_position=with_position,
        max_record_bytes=max_record_bytes,
        max_decompressed_bytes=max_decompressed_bytes,
        storage_options=storage_options,
    )
