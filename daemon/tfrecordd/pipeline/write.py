"""The write stage: encoded batches in, shards out; it decides when a unit is committed.

Batches are written in order, in as few trips to a worker thread as the shard's caps allow
(:data:`WRITE_RUN_BATCHES` at most), to the open shard of the current
:class:`~tfrecordd.pipeline.commit.CommitUnit`. A batch that would take the shard past
``max_shard_bytes`` or ``max_shard_records`` goes to the next one (:meth:`OpenShard.fits
<tfrecordd.outputs.shards.OpenShard.fits>`). Failures go to the dead letters first. While the
output's file system lacks room above ``min_free_bytes``, the stage waits (and so, by
backpressure, do the sources).

A unit is committed when its shard is full, when it is older than ``max_shard_age``, when a
flush is asked for, when the stream pauses with positions but no shard open, and at the end.
It is committed in a task of its own while the next unit fills; commits run one at a time, in
order (:meth:`WriteStage.commit`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from tfrecordd import crashpoints
from tfrecordd.config import OutputSection
from tfrecordd.errors import DurabilityError
from tfrecordd.format.compress import Compressor
from tfrecordd.format.framing import framed_size
from tfrecordd.format.writer import Packed
from tfrecordd.fsys import FileSystem
from tfrecordd.outputs.shards import OpenShard, ShardNamer
from tfrecordd.pipeline.commit import Committer, CommitUnit
from tfrecordd.pipeline.encode import take_waiting
from tfrecordd.pipeline.encoding import EncodedBatch

log = logging.getLogger("tfrecordd")

WRITE_RUN_BATCHES = 16
"""The most waiting batches the write stage takes at once: written in one trip to its thread
where the shard's caps allow (each trip costs the event loop and the thread a hand-off)."""

IDLE_COMMIT_AFTER = 1.0
"""Seconds without a batch after which positions that came with no records (a file's end, blank
lines, bad events) are committed on their own, when no shard is open to carry them."""

POSITIONS_ONLY_BATCHES = 16384
"""A commit without records is made at the latest when this many batches' positions wait (an
intent of about a megabyte), however fast batches without records keep coming."""


class WriteStage:
    """Writes encoded batches to shards in ``directory`` and hands full units to ``committer``."""

    def __init__(
        self,
        output: OutputSection,
        directory: str,
        namer: ShardNamer,
        committer: Committer,
        *,
        fs: FileSystem,
    ) -> None:
        self.config = output
        self.directory = directory
        self.namer = namer
        self.committer = committer
        # One dead-letter file and one set of metrics for the whole pipeline: the committer's.
        self.dead_letters = committer.dead_letters
        self.metrics = committer.metrics
        self.fs = fs
        self.unit = CommitUnit()
        """What the next commit covers. A unit being committed stays here until its commit
        has begun: if the one before fails, the daemon's clean-up discards its shard."""
        self.beat = time.monotonic()
        """``time.monotonic()`` when the stage last showed it is alive (the watchdog's view)."""
        self._flush_requested = False
        self._commits: TaskGroup | None = None
        self._committed: anyio.Event | None = None
        self._statvfs_at = 0.0

    def request_flush(self) -> None:
        """Commit the open unit at the next turn of the loop."""
        self._flush_requested = True

    async def run(self, recv: MemoryObjectReceiveStream[EncodedBatch]) -> None:
        """Write what ``recv`` brings until it ends, then commit what is left and wait for the
        last commit."""
        depth = self.metrics.stream_depth.labels("write")
        max_age = self.config.max_shard_age
        # Leaving the commits' group waits for the last commit.
        async with recv, anyio.create_task_group() as self._commits:
            ended = False
            while not ended:
                wait = IDLE_COMMIT_AFTER
                if self.unit.first_at is not None:
                    wait = min(wait, self.unit.first_at + max_age - time.monotonic())
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
                self._update_open_gauges()
                if self.unit.empty():
                    self._flush_requested = False
                    continue
                first = self.unit.first_at
                # Positions without records ride with the next shard's commit; with no shard
                # open, they are committed when the stream pauses.
                idle = batch is None and self.unit.shard is None
                if (
                    idle
                    or self._flush_requested
                    or (first is not None and self.beat - first >= max_age)
                ):
                    self._flush_requested = False
                    await self.commit()
            if not self.unit.empty():
                await self.commit()

    async def discard(self) -> bool:
        """Discard the open unit's shard, if any (the daemon stops on an error); whether there
        was one."""
        if self.unit.shard is None:
            return False
        await anyio.to_thread.run_sync(self.unit.shard.discard)
        self.unit = CommitUnit()
        return True

    def _update_open_gauges(self) -> None:
        shard = self.unit.shard
        m = self.metrics
        now = time.monotonic()
        if now - self._statvfs_at >= 5:
            self._statvfs_at = now
            with contextlib.suppress(OSError):
                st = os.statvfs(self.directory)
                m.output_free_bytes.set(st.f_bavail * st.f_frsize)
        m.open_shard_bytes.set(shard.file_bytes if shard else 0)
        m.open_shard_records.set(shard.records if shard else 0)
        first = self.unit.first_at
        m.open_shard_age.set(time.monotonic() - first if first is not None else 0)

    async def _write_batches(self, batches: list[EncodedBatch]) -> None:
        """Write batches in order, in as few trips to a worker thread as the shard's caps allow,
        committing each shard that fills. Positions that came with no records wait in the unit
        for its commit: a storm of blank lines must not cost a journal fsync per batch."""
        failed = [b for b in batches if b.failures]
        if failed:
            await anyio.to_thread.run_sync(self._dead_letter, failed)
        limit = self.config.max_shard_records
        # The free-space check holds back one batch at a time.
        step = 1 if self.config.min_free_bytes else len(batches)
        at = 0
        while at < len(batches):
            run = batches[at : at + step]
            if any(b.count for b in run):
                await self._wait_for_space(run[0])
                written = await anyio.to_thread.run_sync(self.write_run, run)
                if not written:
                    await self.commit()
                    written = await anyio.to_thread.run_sync(self.write_run, run)
            else:
                written = len(run)
            unit = self.unit
            sources = self.committer.sources
            for batch in run[:written]:
                unit.add(batch, sources[batch.source].compact)
            if unit.first_at is None:
                unit.first_at = time.monotonic()
            at += written
            shard = unit.shard
            if shard is None:
                full = sum(map(len, unit.tokens.values())) >= POSITIONS_ONLY_BATCHES
            else:
                full = bool(limit) and shard.records >= limit
            if full:
                await self.commit()

    async def _wait_for_space(self, batch: EncodedBatch) -> None:
        """Hold the writer (and so, by backpressure, the sources) while the output's file
        system lacks room for the batch above ``min_free_bytes``."""
        reserve = self.config.min_free_bytes
        if not reserve:
            return
        records = batch.records
        if isinstance(records, Packed):
            needed = reserve + len(records.unit.data)
        else:
            raw = framed_size(records)
            needed = reserve + Compressor.bound(self.config.compression, raw)
        paused_at: float | None = None
        while (free := self.free_bytes()) is not None and free < needed:
            if paused_at is None:
                paused_at = time.monotonic()
                self.metrics.paused.set(1)
                self.metrics.disk_full_pauses.inc()
                log.warning(
                    "output nearly full (%d bytes free, %d needed): sources paused", free, needed
                )
            self.beat = time.monotonic()
            await anyio.sleep(1.0)
        if paused_at is not None:
            self.metrics.paused.set(0)
            log.info("output has room again: resumed after %.1fs", time.monotonic() - paused_at)

    def free_bytes(self) -> int | None:
        """Bytes free for this process on the shards' file system (``None`` if unknown)."""
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return None
        free = st.f_bavail * st.f_frsize
        self.metrics.output_free_bytes.set(free)
        return free

    def _dead_letter(self, batches: list[EncodedBatch]) -> None:
        discarded = 0
        for batch in batches:
            for ev, reason, detail in batch.failures:
                where, payload = ev.where, ev.payload
                discarded += self.dead_letters.write(batch.source, where, reason, detail, payload)
                self.metrics.events_invalid.labels(batch.source, reason).inc()
            self.metrics.events_dead_lettered.labels(batch.source).inc(len(batch.failures))
        if discarded:
            self.metrics.dead_letters_discarded.inc(discarded)
            log.warning("dead letters rotated: %d older dead letter(s) deleted", discarded)

    def write_run(self, run: list[EncodedBatch]) -> int:
        """Write the first batches of ``run`` to the open shard (opening one if none is), up to
        one that would take it past its size or record cap, or through one that fills it to the
        record cap; the count written, ``0`` when the first does not fit. Blocking."""
        limit = self.config.max_shard_records
        for n, batch in enumerate(run):
            shard = self.unit.shard
            if shard is not None and limit and shard.records + batch.count > limit:
                return n
            if batch.count and not self._write_records(batch.records, batch.count):
                return n
            shard = self.unit.shard
            if limit and shard is not None and shard.records >= limit:
                return n + 1
        return len(run)

    def _write_records(self, records: list[bytes] | Packed, count: int) -> bool:
        """Write a batch to the open shard (opening one if none is); ``False``, with nothing
        written, when the batch would take the open shard past its size cap."""
        shard = self.unit.shard
        try:
            if shard is not None and not shard.fits(records):
                return False
            if shard is None:
                out = self.config
                shard = OpenShard(
                    self.directory,
                    self.namer.next(),
                    out.compression,
                    out.level,
                    out.max_shard_bytes,
                    self.fs,
                    track_offsets=out.manifests,
                )
                self.unit.shard = shard
                crashpoints.reached("after-create")
            before_raw, before_file = shard.raw_bytes, shard.file_bytes
            shard.write(records)
            crashpoints.reached("mid-write")
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise DurabilityError(
                    "writing shard: no space left on the output file system (another writer "
                    "took the space under min_free_bytes); the shard is discarded and its events "
                    "replay after a restart"
                ) from e
            raise DurabilityError(f"writing shard: {e.strerror or e}") from e
        self.metrics.records_written.inc(count)
        self.metrics.raw_bytes_written.inc(shard.raw_bytes - before_raw)
        self.metrics.file_bytes_written.inc(shard.file_bytes - before_file)
        return True

    async def commit(self) -> None:
        """Close the current unit and commit it while the next one fills: its shard's fsync, the
        journal's, the publish and the acks overlap the writing of the next shard's batches.

        One commit at a time, in order: this waits for the previous one to end first. Called
        from within :meth:`run` only, whose task group the commit runs in."""
        assert self._commits is not None
        if self._committed is not None:
            # The unit stays the stage's until then: if the previous commit fails, the clean-up
            # discards its shard.
            await self._committed.wait()
        unit, self.unit = self.unit, CommitUnit()
        done = self._committed = anyio.Event()
        self._commits.start_soon(self._commit_unit, unit, done)

    async def _commit_unit(self, unit: CommitUnit, done: anyio.Event) -> None:
        try:
            await self.committer.commit(unit)
        finally:
            done.set()
