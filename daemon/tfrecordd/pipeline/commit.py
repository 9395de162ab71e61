"""The commit protocol of one cut: what makes shards' records and their sources' positions
durable, visible and acknowledged, in an order that a crash at any step leaves recoverable.

A cut (:class:`CommitUnit`) covers the positions of every batch since the last cut, the shards
closed since (to publish) and the open shards that took records since (to keep open, made
durable where they are).

1. each shard to publish: its stream ended, the file fsynced and closed (crash point
   ``after-fsync``); each shard kept open: fsynced up to the compression unit the write stage
   ended there (:meth:`~tfrecordd.outputs.shards.OpenShard.mark`);
2. the dead letters written so far are fsynced;
3. the intent (the positions; each shard to publish with its size and digest; each shard kept
   open with its durable prefix) is appended to the journal and fsynced (``after-intent``);
4. each shard is published, and its folder fsynced (``after-publish``, ``after-dir-fsync``, in
   :meth:`~tfrecordd.outputs.output.Output.publish`), then its manifest (when ``manifests`` is
   on);
5. once every shard holding records of the cut's batches is published (those kept open are
   published by later cuts), and every earlier cut is acknowledged, each source acks its tokens
   (``after-ack``);
6. ``done`` is appended to the journal (``after-done``).

The shards of a step are handled at once, in threads (:func:`each_at_once`): a cut of dozens of
partitions' shards waits for the slowest of their fsyncs, not for all of them in turn. Each step
still ends, for every shard, before the next begins; an output whose publishing may not run in
several threads at once (:attr:`~tfrecordd.outputs.output.Output.concurrent_publish`) publishes
its shards one after the other.

Once step 3 returns, the cut is committed: a crash after it is rolled forward by the next start
(:mod:`tfrecordd.pipeline.recovery`), which publishes what is not yet published (a kept shard
finished at its durable prefix) and redoes the acks. If a step fails, the daemon stops with the
files as they are, and the next start decides from the journal: nothing of a cut whose intent is
not in it was acknowledged, and its events replay. Acknowledgements wait for the publish, not
only for the durable prefix: a published shard may already be off the machine (an object
store), where a node lost for good does not take it along.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from tfrecordd import crashpoints
from tfrecordd.errors import DurabilityError
from tfrecordd.format.compression import Compression
from tfrecordd.metrics import Metrics, Stopwatch
from tfrecordd.outputs import manifest
from tfrecordd.outputs.output import Output
from tfrecordd.outputs.shards import FinishedShard, OpenShard, Prefix
from tfrecordd.pipeline.completion import Completion
from tfrecordd.pipeline.encoding import EncodedBatch
from tfrecordd.plugin import Source, Token
from tfrecordd.state.deadletter import DeadLetters
from tfrecordd.state.journal import Journal
from tfrecordd.state.records import Intent, OpenRef, ShardRef

log = logging.getLogger("tfrecordd")

Compact = Callable[[list[Token]], list[Token]]

_T = TypeVar("_T")
_R = TypeVar("_R")

COMMIT_THREADS = 8
"""Threads that finish, make durable, mark or publish the shards of one cut at once: with many
partitions open, a cut holds dozens of shards, and one after the other their fsyncs and last
compressions stalled the pipeline for as long as they took together."""


def each_at_once(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``fn`` of each of ``items``, in up to :data:`COMMIT_THREADS` threads at once (the same
    threads from call to call; ``fn`` must not call this again); the results in order. Every
    call has ended when this returns or raises: the first error raised (in the order of
    ``items``) is raised again after all of them, and any other logged."""
    if len(items) < 2:
        return [fn(item) for item in items]
    futures: list[Future[_R]] = []
    try:
        pool = _threads()
        futures.extend(pool.submit(fn, item) for item in items)
    finally:
        wait(futures)
    errors = [e for f in futures if (e := f.exception()) is not None]
    for other in errors[1:]:
        log.error("commit: %s as well", other, exc_info=other)
    if errors:
        raise errors[0]
    return [f.result() for f in futures]


_pool: ThreadPoolExecutor | None = None
_pool_made = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_made:
        if _pool is None:
            _pool = ThreadPoolExecutor(COMMIT_THREADS, "tfrecordd-commit")
        return _pool


@dataclass(slots=True)
class Positions:
    """Source tokens gathered in the order written, compacted as they grow."""

    tokens: dict[str, list[Token]] = field(default_factory=dict)
    compacted: dict[str, int] = field(default_factory=dict)
    """Per source, how many tokens it had after they were last compacted."""

    def add(self, source: str, token: Token, compact: Compact | None) -> None:
        """Append ``token``; ``compact`` is the source's
        :meth:`~tfrecordd.plugin.Source.compact`."""
        tokens = self.tokens.setdefault(source, [])
        tokens.append(token)
        if compact is not None and len(tokens) >= 2 * self.compacted.get(source, 1):
            # Merged each time they double: a constant cost per batch, amortized.
            tokens = self.tokens[source] = compact(tokens)
            self.compacted[source] = max(1, len(tokens))

    def extend(self, source: str, tokens: Sequence[Token], compact: Compact | None) -> None:
        """:meth:`add` each of ``tokens``, in order."""
        for token in tokens:
            self.add(source, token, compact)


@dataclass(slots=True)
class Kept:
    """A shard of a dataset that a cut publishes (:attr:`CommitUnit.closing`) or keeps open
    (:attr:`CommitUnit.continuing`, with the prefix it makes durable)."""

    dataset: str
    shard: OpenShard
    positions: Positions = field(default_factory=Positions)
    """The positions of the batches whose records it holds (for its manifest)."""
    prefix: Prefix | None = None

    def mark(self) -> None:
        """Mark the shard where it is (:meth:`OpenShard.mark`): the prefix a cut keeps it at."""
        self.prefix = self.shard.mark()


@dataclass(slots=True)
class CommitUnit:
    """What one cut covers: the positions of its batches, and its shards."""

    positions: Positions = field(default_factory=Positions)
    events: dict[str, int] = field(default_factory=dict)
    """Per source, the events the tokens cover (for ``events_acked``)."""
    closing: list[Kept] = field(default_factory=list)
    """Shards to finish and publish."""
    continuing: list[Kept] = field(default_factory=list)
    """Shards that stay open, with the prefix to make durable."""
    markers: list[tuple[str, str]] = field(default_factory=list)
    """``(dataset, time partition)`` of the closed partitions to mark complete, once the
    cut's shards are published."""
    first_at: float | None = None
    """``time.monotonic()`` when the first batch came."""
    dead_letters: list[int] | None = None
    """Where the dead letters ended at the cut (:meth:`DeadLetters.end`): what comes after is
    of later batches."""
    completion: dict[str, tuple[float | None, float]] = field(default_factory=dict)
    """Per dataset with markers, its watermark and closed line at the cut
    (:meth:`Completion.at_cut`)."""
    intent: Intent | None = None
    """Set once the commit's intent may be in the journal."""

    @property
    def tokens(self) -> dict[str, list[Token]]:
        """Per source, the tokens in the order written: what the intent journals and the acks
        hand back."""
        return self.positions.tokens

    def empty(self) -> bool:
        """Whether there is nothing to commit."""
        return (
            not self.closing
            and not self.continuing
            and not self.markers
            and not self.positions.tokens
        )

    def add(self, batch: EncodedBatch, compact: Compact | None = None) -> None:
        """Take a batch's position (its records are in shards already); ``compact`` is the
        source's :meth:`~tfrecordd.plugin.Source.compact`."""
        self.positions.extend(batch.source, batch.tokens, compact)
        self.events[batch.source] = self.events.get(batch.source, 0) + batch.events


@dataclass(frozen=True, slots=True)
class Manifests:
    """Publishes a dataset's shard manifests beside them (``manifests = true``)."""

    output: Output
    compression: Compression
    schema: str
    """The dataset's schema fingerprint."""
    dataset: str | None = None
    """The dataset's name (``None``: a config of the older form, whose manifests name none)."""

    def publish(self, shard: str, positions: Mapping[str, list[Token]], **facts: Any) -> None:
        """Publish the manifest of ``shard`` (its name relative to the output; blocking);
        ``facts`` as :func:`manifest.parts` takes them."""
        parts = manifest.parts(
            shard=shard.rpartition("/")[2],
            compression=self.compression,
            schemas=dict.fromkeys(positions, self.schema),
            positions=positions,
            dataset=self.dataset,
            partition=shard.rpartition("/")[0],
            **facts,
        )
        self.output.publish_sidecar(manifest.manifest_name(shard), parts)


class Committer:
    """Commits cuts against the datasets' outputs, a journal and the sources (:meth:`commit`)."""

    def __init__(
        self,
        *,
        outputs: Mapping[str, Output],
        journal: Journal,
        sources: Mapping[str, Source],
        dead_letters: DeadLetters,
        metrics: Metrics,
        fsync: bool,
        manifests: Mapping[str, Manifests],
        completions: Mapping[str, Completion] | None = None,
        fsyncs: Mapping[str, bool] | None = None,
    ) -> None:
        """``outputs``, ``manifests`` and ``completions`` by dataset (the last two only of the
        datasets that publish manifests, and markers)."""
        self.outputs = dict(outputs)
        self.journal = journal
        self.sources = sources
        self.dead_letters = dead_letters
        self.metrics = metrics
        self.fsync = fsync
        self.fsyncs = dict(fsyncs or {})
        """Per dataset, whether its shards are fsynced (``fsync`` where not given)."""
        self.manifests = dict(manifests)
        self.completions = dict(completions or {})
        self.unacked: deque[_Unacked] = deque()
        """Committed cuts not yet acknowledged, oldest first."""

    async def commit(self, unit: CommitUnit) -> None:
        """Run the protocol's steps for ``unit``, and acknowledge every committed cut whose
        shards are all published now. On a failure, raise: the files stay as they are for the
        next start (see the module's docstring)."""
        counted = {k.shard.name: k.shard.file_bytes for k in unit.closing}
        with Stopwatch(self.metrics.publish_duration):
            try:
                intent, finished = await anyio.to_thread.run_sync(self._publish, unit)
            except BaseException:
                # Closed, not removed: whether the intent made it to the journal is the next
                # start's to decide.
                for kept in unit.closing:
                    kept.shard.leave()
                raise
        for dataset, f in finished:
            self.metrics.shards_published.labels(dataset).inc()
            # The stream's ending, written by the finish.
            self.metrics.file_bytes_written.labels(dataset).inc(f.size - counted[f.name])
            self.metrics.last_publish.set(time.time())
            log.info("published %s: %d records, %d bytes", f.name, f.records, f.size)
        published = {(d, f.name) for d, f in finished}
        for waiting in self.unacked:
            waiting.shards -= published
        kept_open = {(k.dataset, k.shard.name) for k in unit.continuing}
        self.unacked.append(_Unacked(intent, kept_open, unit.events))
        while self.unacked and not self.unacked[0].shards:
            await self._acknowledge(self.unacked[0])
            self.unacked.popleft()

    async def _acknowledge(self, cut: _Unacked) -> None:
        for source, tokens in cut.intent.positions.items():
            with Stopwatch(self.metrics.ack_duration.labels(source)):
                await self.sources[source].ack(tokens)
            self.metrics.events_acked.labels(source).inc(cut.events.get(source, 0))
            crashpoints.reached("after-ack")
        await anyio.to_thread.run_sync(self.journal.write_done, cut.intent.seq)
        crashpoints.reached("after-done")
        self.metrics.journal_bytes.set(self.journal.size)

    def seal(self, unit: CommitUnit) -> None:
        """Note, at a cut (no write under way), where the dead letters of the unit's batches end
        and how far its records moved each dataset's watermark. Blocking: a commit's fsync holds
        the dead letters' lock."""
        unit.dead_letters = self.dead_letters.end()
        unit.completion = {name: c.at_cut() for name, c in self.completions.items()}

    def _publish(self, unit: CommitUnit) -> tuple[Intent, list[tuple[str, FinishedShard]]]:
        """Steps 1 to 4 (blocking): the shards durable, the intent journalled, the shards and
        their manifests published."""
        with Stopwatch(self.metrics.fsync_duration):
            finished = each_at_once(self._finish, unit.closing)
            if finished:
                crashpoints.reached("after-fsync")
            each_at_once(self._make_durable, unit.continuing)
        try:
            self.dead_letters.sync()
        except OSError as e:
            raise DurabilityError(f"dead letters: fsync failed: {e.strerror or e}") from e
        intent = self.journal.next_intent(
            unit.tokens,
            [ShardRef(d, f.name, f.records, f.size, f.sha256) for d, f in finished],
            [_open_ref(k) for k in unit.continuing],
            unit.dead_letters,
        )
        unit.intent = intent
        try:
            with Stopwatch(self.metrics.fsync_duration):
                self.journal.write_intent(intent)
        except OSError as e:
            raise DurabilityError(f"journal: {e.strerror or e}") from e
        crashpoints.reached("after-intent")
        for dataset, at in unit.completion.items():
            self.completions[dataset].committed(at)
        shards = list(zip(finished, unit.closing, strict=True))
        at_once = [s for s in shards if self.outputs[s[0][0]].concurrent_publish]
        for one in [s for s in shards if not self.outputs[s[0][0]].concurrent_publish]:
            self._publish_shard(one)
        each_at_once(self._publish_shard, at_once)
        for dataset, prefix in unit.markers:
            self.completions[dataset].mark(prefix)
            self.metrics.partitions_completed.labels(dataset).inc()
            crashpoints.reached("after-marker")
        return intent, finished

    def _finish(self, kept: Kept) -> tuple[str, FinishedShard]:
        fsync = self.fsyncs.get(kept.dataset, self.fsync)
        return kept.dataset, kept.shard.finish(fsync=fsync)

    def _make_durable(self, kept: Kept) -> None:
        kept.shard.make_durable(fsync=self.fsyncs.get(kept.dataset, self.fsync))

    def _publish_shard(self, shard: tuple[tuple[str, FinishedShard], Kept]) -> None:
        """Step 4 for one shard: published, then its manifest."""
        (dataset, f), kept = shard
        try:
            self.outputs[dataset].publish(f)
            manifests = self.manifests.get(dataset)
            if manifests is not None:
                manifests.publish(
                    f.name,
                    kept.positions.tokens,
                    records=f.records,
                    size=f.size,
                    sha256=f.sha256,
                    crc=f.crc32c,
                    offsets=f.offsets.chunks(),
                    first_time=f.first_time,
                    last_time=f.last_time,
                    event_times=f.event_times,
                )
        finally:
            # A manifest lost to a crash or an error here is rebuilt from the shard itself.
            f.offsets.remove()


@dataclass(slots=True)
class _Unacked:
    """A committed cut waiting for its acknowledgements: until the shards it kept open, which
    hold records of its batches, are published."""

    intent: Intent
    shards: set[tuple[str, str]]
    """``(dataset, name)`` of the shards still to be published."""
    events: dict[str, int]


def _open_ref(kept: Kept) -> OpenRef:
    p = kept.prefix
    assert p is not None
    return OpenRef(kept.dataset, kept.shard.name, p.size, p.records, p.adler32)
