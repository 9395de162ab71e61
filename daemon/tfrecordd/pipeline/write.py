"""The write stage: encoded batches in, shards out; it decides when a commit is cut.

Each part of a batch (one dataset's records, in one partition folder) is appended to the open
shard of its (dataset, folder), opened when it has none. Several shards are open at once, one
per dataset and folder written to, at most ``max_open_shards`` per dataset: at the cap the least
recently written one is closed to make room (published at the next commit, never dropped).
A part that would take its shard past ``max_shard_bytes`` or ``max_shard_records`` closes the
shard first (:meth:`OpenShard.fits <tfrecordd.outputs.shards.OpenShard.fits>`); a shard that
reaches its record cap is closed at once. Batches are written in order, in as few trips to a
worker thread as the caps allow (:data:`WRITE_RUN_BATCHES` at most); the batches of a trip whose
parts all go to open shards that take them without closing are written merged by shard, one
write per shard (:class:`~tfrecordd.pipeline.shardrun.MergedRun`). Failures go to the dead
letters first. While an output's file system lacks room above its ``min_free_bytes``, the stage
waits (and so, by backpressure, do the sources).

A commit is *cut* between two batches: when a shard was closed, when the oldest open shard is older
than its dataset's ``max_shard_age``, when a flush is asked for, when the stream pauses with
positions but no shard open, and at the end. The cut covers every batch since the last one: the
closed shards and those past their age are finished and published; every other open shard that took
records since the last cut is made durable where it is (:meth:`OpenShard.mark
<tfrecordd.outputs.shards.OpenShard.mark>`), and stays open: the journal holds that prefix, and
after a crash the next start finishes the shard there and publishes it. So every record of the
cut's batches is published or durable before any of their positions is acknowledged, whatever
number of shards they went to, and no shard is published small only because another one filled. The
commit runs in a task of its own while the next batches are written; commits run one at a time, in
order (:meth:`WriteStage.commit`).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from tfrecordd import crashpoints
from tfrecordd.errors import DurabilityError
from tfrecordd.fsys import FileSystem
from tfrecordd.outputs.shards import OpenShard
from tfrecordd.pipeline.commit import Committer, CommitUnit, Kept, Positions, each_at_once
from tfrecordd.pipeline.completion import LATE_TREE
from tfrecordd.pipeline.datasets import DatasetOutput, Placed, account_all, dead_letter
from tfrecordd.pipeline.encode import take_waiting
from tfrecordd.pipeline.encoding import EncodedBatch, Part
from tfrecordd.pipeline.shardrun import Merged, MergedRun
from tfrecordd.pipeline.space import FreeSpace
from tfrecordd.pipeline.writecounts import WriteCounts

COMPRESS_THREADS = min(4, os.cpu_count() or 1)
"""Threads that compress what small writes to open shards gathered (a partitioned dataset's
parts), while the stage goes on writing: the compressor releases the interpreter lock, so the
daemon's process compresses on several cores as the encode workers do for large batches."""

WRITE_RUN_BATCHES = 16
"""The most waiting batches the write stage takes at once: written in one trip to its thread
where the shards' caps allow (each trip costs the event loop and the thread a hand-off)."""

IDLE_COMMIT_AFTER = 1.0
"""Seconds without a batch after which positions that came with no records (a file's end, blank
lines, bad events) are committed on their own, when no shard is open to carry them."""

POSITIONS_ONLY_BATCHES = 16384
"""A commit without records is made at the latest when this many batches' positions wait (an
intent of about a megabyte), however fast batches without records keep coming."""

ShardKey = tuple[str, str]
"""``(dataset, partition folder)``: what one open shard holds."""


@dataclass(slots=True)
class _Open:
    """An open shard, when it was first and last written (``time.monotonic()``), and the
    positions of the batches it holds records of."""

    dataset: str
    shard: OpenShard
    first_at: float
    written_at: float
    positions: Positions = field(default_factory=Positions)


class WriteStage:
    """Writes encoded batches to the shards of ``datasets`` and hands cuts to ``committer``."""

    def __init__(
        self,
        datasets: Mapping[str, DatasetOutput],
        committer: Committer,
        *,
        fs: FileSystem,
    ) -> None:
        self.datasets = dict(datasets)
        self.committer = committer
        # One dead-letter file and one set of metrics for the whole pipeline: the committer's.
        self.dead_letters = committer.dead_letters
        self.metrics = committer.metrics
        self.fs = fs
        self.open: dict[ShardKey, _Open] = {}
        """The open shards, least recently written first."""
        self.unit = CommitUnit()
        """What the next cut covers so far: the batches' positions, the shards closed since the
        last cut. A unit being committed stays here until its commit has begun: if the one
        before fails, the daemon's clean-up sees its shards."""
        self.beat = time.monotonic()
        """``time.monotonic()`` when the stage last showed it is alive (the watchdog's view)."""
        self._flush_requested = False
        self.flushes = 0  # commits of every open shard so far; a reload waits for one
        self.taken: dict[str, int] = {}  # per source, batches taken into commit units
        self.commit_gate = anyio.Semaphore(1)  # held from a cut to its commit's end
        self.cut_wanted = False
        """Whether a commit is cut next: a shard or a partition was closed since the last."""
        self._commits: TaskGroup | None = None
        self._committed: anyio.Event | None = None
        self._commit_failed = False
        self.space = FreeSpace(self.metrics)
        self.draining = False
        """Whether the daemon stops: its sources read no more (``/readyz`` says so)."""
        self.counts = WriteCounts(self.metrics)
        self.compressing = ThreadPoolExecutor(COMPRESS_THREADS, "tfrecordd-compress")
        """Where open shards compress their held writes (:data:`COMPRESS_THREADS`)."""

    def held_back(self) -> list[str]:
        """What keeps the pipeline from taking events now, a line each (``/readyz``)."""
        held = ["daemon: draining (stopping: the sources read no more)"] if self.draining else []
        if self.space.paused is not None:
            held.append(f"dataset {self.space.paused}: output nearly full, sources paused")
        return held

    def request_flush(self) -> None:
        """Publish every open shard at the next turn of the loop."""
        self._flush_requested = True

    def _next_deadline(self) -> float | None:
        """``time.monotonic()`` at which the oldest open shard reaches its age cap."""
        ages = [
            o.first_at + self.datasets[o.dataset].config.max_shard_age for o in self.open.values()
        ]
        return min(ages) if ages else None

    async def run(self, recv: MemoryObjectReceiveStream[EncodedBatch]) -> None:
        """Write what ``recv`` brings until it ends, then commit what is left and wait for the
        last commit."""
        try:
            await self._run(recv)
        finally:
            self.compressing.shutdown(wait=False, cancel_futures=True)

    async def _run(self, recv: MemoryObjectReceiveStream[EncodedBatch]) -> None:
        depth = self.metrics.stream_depth.labels("write")
        # Leaving the commits' group waits for the last commit.
        async with recv, anyio.create_task_group() as self._commits:
            ended = False
            while not ended:
                wait = IDLE_COMMIT_AFTER
                deadline = self._next_deadline()
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                batch: EncodedBatch | None = None
                with anyio.move_on_after(max(wait, 0.0)):
                    try:
                        batch = await recv.receive()
                    except anyio.EndOfStream:
                        ended = True
                self.beat = time.monotonic()
                if batch is not None:
                    batches = take_waiting(recv, batch, WRITE_RUN_BATCHES)
                    depth.set(recv.statistics().current_buffer_used)
                    await self._write_batches(batches)
                self.counts.update_open(self.datasets, self.open.values())
                self.close_partitions()
                if self.unit.empty() and not self.open:
                    self.flushes += self._flush_requested
                    self._flush_requested = False
                    continue
                deadline = self._next_deadline()
                # Positions without records ride with the next cut; with no shard open, they
                # are committed when the stream pauses.
                idle = batch is None and not self.open and not self.unit.empty()
                if (
                    idle
                    or self._flush_requested
                    or self.cut_wanted
                    or (deadline is not None and self.beat >= deadline)
                ):
                    flushing, self._flush_requested = self._flush_requested, False
                    await self.commit(everything=flushing)
                    self.flushes += flushing
            if self.open or not self.unit.empty():
                await self.commit(everything=True)

    async def discard(self) -> bool:
        """Discard the open and closed shards no commit has made durable (the daemon stops on
        an error): those a journalled prefix covers stay for the next start to finish and
        publish. Whether any was discarded."""
        shards = [o.shard for o in self.open.values()] + [k.shard for k in self.unit.closing]
        self.open.clear()
        self.unit = CommitUnit()
        fresh = [s for s in shards if s.marked is None]
        for shard in shards:
            await anyio.to_thread.run_sync(shard.discard if shard.marked is None else shard.leave)
        return bool(fresh)

    async def _write_batches(self, batches: list[EncodedBatch]) -> None:
        """Write batches in order, in as few trips to a worker thread as the shards' caps allow,
        cutting a commit after each batch that closed a shard. Positions that came with no
        records wait in the unit for the next cut: a storm of blank lines must not cost a
        journal fsync per batch."""
        # The free-space check holds back one batch at a time.
        step = 1 if any(d.config.min_free_bytes for d in self.datasets.values()) else len(batches)
        at = 0
        while at < len(batches):
            run = batches[at : at + step]
            if any(b.count for b in run):
                await self.space.wait(run[0], self.datasets, self._alive)
                written = await anyio.to_thread.run_sync(self.write_run, run)
                if not written:
                    await self.commit()
                    written = await anyio.to_thread.run_sync(self.write_run, run)
            elif any(b.failures for b in run):  # dead letters: one trip to a thread for all
                written = await anyio.to_thread.run_sync(self._add, *run)
            else:
                written = self._add(*run)
            at += written
            if self.unit.first_at is None:
                self.unit.first_at = time.monotonic()
            if not self.open and sum(map(len, self.unit.tokens.values())) >= (
                POSITIONS_ONLY_BATCHES
            ):
                self.cut_wanted = True
            if self.cut_wanted:
                await self.commit()

    def _alive(self) -> None:
        self.beat = time.monotonic()

    def _add(self, *batches: EncodedBatch) -> int:
        """Take batches into the unit, each one's dead letters first: so a cut's
        :meth:`DeadLetters.end <tfrecordd.state.deadletter.DeadLetters.end>` falls between the
        dead letters of its batches and those of the next ones; the count. Blocking."""
        for batch in batches:
            if batch.failures:
                dead_letter(batch.source, batch.failures, self.dead_letters, self.metrics)
            if batch.parts:  # its records written, the commit to come
                crashpoints.reached("mid-write")
            self.taken[batch.source] = self.taken.get(batch.source, 0) + batch.batches
            self.unit.add(batch, self.committer.sources[batch.source].compact)
        return len(batches)

    def write_run(self, run: list[EncodedBatch]) -> int:
        """Write the batches of ``run`` in order, taking each one's position into the unit, up
        to the first that does not fit in its shards as they are (a cut comes first, so that the
        shards it closes are published without waiting for this batch's records elsewhere) or
        through one that closed a shard; the count written (``0``: cut, then write again).
        Then the units compressed meanwhile (:data:`COMPRESS_THREADS`) go to their files.
        Blocking."""
        try:
            return self._write_batches_of(run)
        finally:
            for entry in self.open.values():
                shard = entry.shard
                before = shard.file_bytes
                shard.collect()
                if shard.file_bytes != before:
                    self.counts.written(entry.dataset)[2].inc(shard.file_bytes - before)

    def _write_batches_of(self, run: list[EncodedBatch]) -> int:
        n = self._write_merged(run)
        while n < len(run):
            batch = run[n]
            placed = [self.datasets[p.dataset].place(p) for p in batch.parts]
            parts = [p.part for p in placed if not p.refused]
            if self._make_room(parts):
                return n
            account_all(self.datasets, placed, batch.source, self.metrics, self.dead_letters)
            compact = self.committer.sources[batch.source].compact
            # A joined batch may bring several parts to one shard: its positions go in once.
            for entry in {id(e): e for e in map(self._write_part, parts)}.values():
                entry.positions.extend(batch.source, batch.tokens, compact)
            self._add(batch)
            n += 1
            if self.cut_wanted:
                return n
            n += self._write_merged(run[n:])
        return n

    def _write_merged(self, run: list[EncodedBatch]) -> int:
        """Write the batches at the head of ``run`` whose parts all go to open shards that take
        them without closing, merged by shard (:class:`MergedRun`); how many."""
        merged = MergedRun(
            lambda key: entry.shard if (entry := self.open.get(key)) else None,
            lambda dataset: self.datasets[dataset].config.max_shard_records,
        )
        taken: list[tuple[EncodedBatch, list[Placed]]] = []
        for batch in run:
            placed = [self.datasets[p.dataset].place(p) for p in batch.parts]
            if not merged.take([p.part for p in placed if not p.refused]):
                break
            taken.append((batch, placed))
        for batch, placed in taken:
            account_all(self.datasets, placed, batch.source, self.metrics, self.dead_letters)
        entries = {(part.dataset, part.folder): self._write_part(part) for part in merged.parts()}
        last: dict[ShardKey, None] = {}  # the shards in the order of their last part
        for batch, placed in taken:
            compact = self.committer.sources[batch.source].compact
            for key in dict.fromkeys(
                (p.part.dataset, p.part.folder) for p in placed if not p.refused
            ):
                entries[key].positions.extend(batch.source, batch.tokens, compact)
                last[key] = last.pop(key, None)
            self._add(batch)
        for key in last:  # least recently written first, as part by part
            self.open[key] = self.open.pop(key)
        return len(taken)

    def close_partitions(self) -> None:
        """Close the time partitions the watermarks have passed: their open shards are closed,
        and the next cut publishes them, then the partitions' markers."""
        for d in self.datasets.values():
            c = d.completion
            if c is None:
                continue
            for prefix in c.due():
                for key in [k for k in self.open if k[0] == d.name]:
                    if key[1] == prefix or key[1].startswith(prefix + "/"):
                        self._close(key)
                c.scheduled.add(prefix)
                self.unit.markers.append((d.name, prefix))
                self.cut_wanted = True
            self.metrics.partitions_pending.labels(d.name).set(len(c.pending))
            self.metrics.watermark.labels(d.name).set(c.watermark or 0)

    def _make_room(self, parts: list[Part]) -> bool:
        """Close the shards that a batch's ``parts`` would take past their caps, and the least
        recently written ones of a dataset that would pass ``max_open_shards``; whether any was
        (then a cut is wanted before the batch is written). A batch of more new folders than
        the cap still closes shards as it is written (:meth:`_open_shard`)."""
        closed = False
        new: dict[str, int] = {}
        keys = dict.fromkeys((p.dataset, p.folder) for p in parts)
        opened: set[ShardKey] = set()  # a joined batch may bring several parts to one folder
        for part in parts:
            key = (part.dataset, part.folder)
            entry = self.open.get(key)
            if entry is None:
                if key not in opened:
                    opened.add(key)
                    new[part.dataset] = new.get(part.dataset, 0) + 1
                continue
            limit = self.datasets[part.dataset].config.max_shard_records
            # Part by part: a shard that the next part fills is closed as it is written.
            if (limit and entry.shard.records + part.count > limit) or not entry.shard.fits(
                part.records
            ):
                self._close(key)
                closed = True
        for dataset, count in new.items():
            cap = self.datasets[dataset].config.max_open_shards
            here = [k for k in self.open if k[0] == dataset]
            others = [k for k in here if k not in keys]  # least recently written first
            for key in others[: max(0, len(here) + count - cap)]:
                self._close(key)
                closed = True
        return closed

    def _write_part(self, part: Part | Merged) -> _Open:
        """Write a part to its shard; the shard's entry (closed already if the part filled
        it)."""
        d = self.datasets[part.dataset]
        limit = d.config.max_shard_records
        key = (part.dataset, part.folder)
        entry = self.open.get(key)
        try:
            if entry is not None and (
                (limit and entry.shard.records + part.count > limit)
                or not entry.shard.fits(part.records)
            ):
                self._close(key)
                entry = None
            if entry is None:
                entry = self._open_shard(d, key)
            before_raw, before_file = entry.shard.raw_bytes, entry.shard.file_bytes
            entry.shard.write(part.records, part.times)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise DurabilityError(
                    "writing shard: no space left on the output file system (another writer "
                    "took the space under min_free_bytes); the shard is discarded and its events "
                    "replay after a restart"
                ) from e
            raise DurabilityError(f"writing shard: {e.strerror or e}") from e
        entry.written_at = time.monotonic()
        if d.completion is not None and not part.folder.startswith(LATE_TREE):
            d.completion.saw(part.times)
        # Least recently written first: the one to close at the cap.
        self.open[key] = self.open.pop(key)
        shard = entry.shard
        records, raw, written = self.counts.written(part.dataset)
        records.inc(part.count)
        raw.inc(shard.raw_bytes - before_raw)
        written.inc(shard.file_bytes - before_file)
        if limit and shard.records >= limit:
            self._close(key)
        return entry

    def _open_shard(self, d: DatasetOutput, key: ShardKey) -> _Open:
        if d.completion is not None and not key[1].startswith(LATE_TREE):
            d.completion.opening(key[1])
        open_here = [k for k in self.open if k[0] == d.name]
        if len(open_here) >= d.config.max_open_shards:
            self._close(open_here[0])
        out = d.config
        shard = OpenShard(
            d.output.staging_dir,
            d.namer.next(),
            out.compression,
            out.level,
            out.max_shard_bytes,
            self.fs,
            track_offsets=out.manifests,
            folder=key[1],
            executor=self.compressing,
        )
        crashpoints.reached("after-create")
        now = time.monotonic()
        entry = self.open[key] = _Open(d.name, shard, now, now)
        return entry

    def _close(self, key: ShardKey) -> None:
        """Take a shard out of the open ones: the next cut, which follows the current batch,
        finishes and publishes it."""
        entry = self.open.pop(key)
        self.unit.closing.append(Kept(entry.dataset, entry.shard, entry.positions))
        self.cut_wanted = True

    async def commit(self, *, everything: bool = False) -> None:
        """Cut a commit (see the module's docstring): the closed shards, those past their age
        cap (every open one with ``everything``) finished and published; every other open
        shard with new records made durable where it is; the positions of every batch since
        the last cut acknowledged once all that is done. The shards' fsyncs, the journal's,
        the publishing and the acks run in a task of their own while the next batches are
        written.

        One commit at a time, in order: this waits for the previous one to end first. Called
        from within :meth:`run` only, whose task group the commit runs in."""
        assert self._commits is not None
        if self._committed is not None:
            # The unit stays the stage's until then: if the previous commit fails, the clean-up
            # discards its shards.
            await self._committed.wait()
            if self._commit_failed:
                # Its error is on its way to the task group: nothing more is marked or written.
                await anyio.sleep_forever()
        self.cut_wanted = False
        now = time.monotonic()
        unit = self.unit
        for key, entry in list(self.open.items()):
            age_cap = self.datasets[entry.dataset].config.max_shard_age
            if everything or now - entry.first_at >= age_cap:
                self._close(key)
        self.cut_wanted = False
        dirty = [Kept(o.dataset, o.shard) for o in self.open.values() if o.shard.dirty]
        if dirty:
            unit.continuing = await anyio.to_thread.run_sync(_marked, dirty)
        if unit.empty():
            return
        await self.commit_gate.acquire()
        await anyio.to_thread.run_sync(self.committer.seal, unit)
        self.unit = CommitUnit()
        done = self._committed = anyio.Event()
        self._commits.start_soon(self._commit_unit, unit, done)

    async def _commit_unit(self, unit: CommitUnit, done: anyio.Event) -> None:
        try:
            await self.committer.commit(unit)
        except BaseException:
            self._commit_failed = True
            raise
        finally:
            self.commit_gate.release()
            done.set()


def _marked(shards: list[Kept]) -> list[Kept]:
    """Each shard with its compression unit ended where it is (the commit fsyncs it), all at
    once. Blocking."""
    each_at_once(Kept.mark, shards)
    return shards
