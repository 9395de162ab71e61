"""A run of batches merged by the shard each part goes to, for the write stage to write in one
call per shard instead of one per part (:class:`MergedRun`).

A partitioned dataset splits each batch into a part per folder: with 24 hours open, a batch of
a few thousand events brings 25 parts of a few kilobytes each, and writing them one by one costs
the daemon's process more than encoding them. Merged over the batches the stage takes at once,
each open shard gets one write: its framed parts as one (held, and compressed with the writes
around them, as before: their buffers are not copied), any part already compressed into a unit
of its own appended in its place. The records of each shard stay in batch order.

A batch joins the run only if every part it brings goes to a shard open already, which takes it
with the run's earlier parts without reaching its record cap and with room under its size cap
for the worst that compression may give: nothing in a merged run closes or opens a shard, so
the cuts and the caps are the same as batch by batch. Any other batch is the stage's to write
alone, and the run ends before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tfrecordd.format.compress import Compressor, Unit
from tfrecordd.format.compression import Compression
from tfrecordd.format.writer import Framed, Packed
from tfrecordd.outputs.shards import OpenShard
from tfrecordd.pipeline.encoding import Part

__all__ = ["Merged", "MergedRun", "joined"]

ShardKey = tuple[str, str]
"""``(dataset, partition folder)``: what one open shard holds."""


@dataclass(slots=True)
class _Shard:
    """The parts of the run for one open shard, and what they add to it at most."""

    shard: OpenShard
    limit: int
    records: int = 0
    bound: int = 0
    parts: list[Part] = field(default_factory=list)


class MergedRun:
    """Batches' placed parts gathered by shard (:meth:`take`), then merged (:meth:`parts`).

    ``shard_of(key)`` is the open shard of a key (``None``: none open), ``limit_of(dataset)``
    the dataset's ``max_shard_records`` (``0``: none)."""

    def __init__(
        self,
        shard_of: Callable[[ShardKey], OpenShard | None],
        limit_of: Callable[[str], int],
    ) -> None:
        self._shard_of = shard_of
        self._limit_of = limit_of
        self._shards: dict[ShardKey, _Shard] = {}
        self.batches = 0
        """Batches taken."""

    def take(self, parts: list[Part]) -> bool:
        """Take a batch's parts (those to write) into the run if all of them fit as the module
        says; else take nothing and return ``False``."""
        added: dict[ShardKey, tuple[int, int]] = {}
        for part in parts:
            key = (part.dataset, part.folder)
            entry = self._shards.get(key)
            if entry is None:
                shard = self._shard_of(key)
                if shard is None:
                    return False
                entry = self._shards[key] = _Shard(
                    shard, self._limit_of(part.dataset), bound=shard.pending_bound()
                )
            grow = _bound(entry.shard.compression, part.records.unit)
            if grow is None:
                return False
            records, bound = added.get(key, (0, 0))
            records += part.count
            bound += grow
            shard = entry.shard
            if (entry.limit and shard.records + entry.records + records >= entry.limit) or (
                shard.file_bytes + entry.bound + bound > shard.max_bytes
            ):
                return False
            added[key] = records, bound
        for part in parts:
            self._shards[part.dataset, part.folder].parts.append(part)
        for key, (records, bound) in added.items():
            entry = self._shards[key]
            entry.records += records
            entry.bound += bound
        self.batches += 1
        return True

    def parts(self) -> Iterator[Merged]:
        """The run's writes: per shard, in the order of their first batch, each stretch of
        framed parts as one (:func:`joined`), units compressed already as they are."""
        for entry in self._shards.values():
            stretch: list[Part] = []
            for part in entry.parts:
                if part.records.unit.compression is Compression.NONE:
                    stretch.append(part)
                    continue
                if stretch:
                    yield joined(stretch)
                    stretch = []
                yield Merged(part.dataset, part.folder, part.records, part.times)
            if stretch:
                yield joined(stretch)


def _bound(compression: Compression, unit: Unit) -> int | None:
    """The most bytes ``unit`` may add to a shard of ``compression``: framed records compressed
    (as a unit of their own: the sum over parts bounds any way the writer may gather them), a
    unit as it is, plus what may end the stream; ``None``: a unit of another compression, which
    the shard cannot take."""
    if unit.compression is compression:
        return len(unit.data) + Compressor.bound(compression, 0)
    if unit.compression is Compression.NONE:
        return Compressor.bound(compression, unit.raw_size)
    return None


@dataclass(frozen=True, slots=True)
class Merged:
    """One write of a merged run to one shard: a stretch of its framed parts as one, or a part
    compressed already. Read as a :class:`~tfrecordd.pipeline.encoding.Part` is."""

    dataset: str
    folder: str
    records: Packed | Framed
    times: tuple[float, float] | None

    @property
    def count(self) -> int:
        """How many records."""
        return self.records.records


def joined(parts: list[Part]) -> Merged:
    """Framed parts of one shard as one write (no copy: :class:`Framed` holds their buffers),
    their times' span."""
    first = parts[0]
    lo = hi = None
    for part in parts:
        if part.times is not None:
            lo = part.times[0] if lo is None else min(lo, part.times[0])
            hi = part.times[1] if hi is None else max(hi, part.times[1])
    times = None if lo is None or hi is None else (lo, hi)
    records = first.records if len(parts) == 1 else Framed(tuple(p.records for p in parts))
    return Merged(first.dataset, first.folder, records, times)
