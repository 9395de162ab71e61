"""The commit protocol of one unit: what makes a shard's records and its sources' positions durable,
visible and acknowledged, in an order that a crash at any step leaves recoverable.

1. the shard's stream is ended, the file fsynced and closed (crash point ``after-fsync``);
2. the dead letters written so far are fsynced;
3. the intent (shard, positions, size, digest) is appended to the journal and fsynced
   (``after-intent``);
4. the shard is published, and the output directory fsynced (``after-publish``,
   ``after-dir-fsync``, in :meth:`~tfrecordd.outputs.output.Output.publish`);
5. its manifest is published (when ``manifests`` is on);
6. each source acks its tokens (``after-ack``);
7. ``done`` is appended to the journal (``after-done``).

A unit with no records (positions only: a file's end, blank lines, bad events) skips 1, 4 and 5.
If a step before the acks fails, the shard is discarded (:meth:`Committer._abandon`) and nothing
is acked: the events replay after a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from tfrecordd import crashpoints
from tfrecordd.errors import DurabilityError, UploadError
from tfrecordd.format.compression import Compression
from tfrecordd.metrics import Metrics, Stopwatch
from tfrecordd.outputs import manifest
from tfrecordd.outputs.output import Output
from tfrecordd.outputs.shards import FinishedShard, OpenShard
from tfrecordd.pipeline.encoding import EncodedBatch
from tfrecordd.plugin import Source, Token
from tfrecordd.state.deadletter import DeadLetters
from tfrecordd.state.journal import Journal
from tfrecordd.state.records import Intent

log = logging.getLogger("tfrecordd")


@dataclass(slots=True)
class CommitUnit:
    """What one commit covers: an open shard (if any records came) and the batches' tokens."""

    shard: OpenShard | None = None
    tokens: dict[str, list[Token]] = field(default_factory=dict)
    """Per source, in the order written: what the intent journals, the manifest lists and the
    acks hand back (:meth:`add` gathers them)."""
    compacted: dict[str, int] = field(default_factory=dict)
    """Per source, how many tokens it had after they were last compacted."""
    events: dict[str, int] = field(default_factory=dict)
    """Per source, the events the tokens cover (for ``events_acked``)."""
    first_at: float | None = None
    """``time.monotonic()`` when the first batch came (for ``max_shard_age``)."""
    intent: Intent | None = None
    """Set once the commit's intent may be in the journal."""

    def empty(self) -> bool:
        """Whether there is nothing to commit."""
        return self.shard is None and not self.tokens

    def add(
        self, batch: EncodedBatch, compact: Callable[[list[Token]], list[Token]] | None = None
    ) -> None:
        """Take a batch's position (its records are in :attr:`shard` already); ``compact`` is
        the source's :meth:`~tfrecordd.plugin.Source.compact`."""
        tokens = self.tokens.setdefault(batch.source, [])
        tokens.append(batch.token)
        if compact is not None and len(tokens) >= 2 * self.compacted.get(batch.source, 1):
            # Merged each time they double: a constant cost per batch, amortized.
            tokens = self.tokens[batch.source] = compact(tokens)
            self.compacted[batch.source] = max(1, len(tokens))
        self.events[batch.source] = self.events.get(batch.source, 0) + batch.events


@dataclass(frozen=True, slots=True)
class Manifests:
    """Publishes a shard's manifest beside it (``output.manifests``)."""

    output: Output
    compression: Compression
    schemas: Mapping[str, str]
    """Each source's schema fingerprint."""

    def publish(self, shard: str, positions: dict[str, list[Token]], **facts: Any) -> None:
        """Publish the manifest of ``shard`` (blocking); ``facts`` as :func:`manifest.parts`
        takes them."""
        parts = manifest.parts(
            shard=shard,
            compression=self.compression,
            schemas=self.schemas,
            positions=positions,
            **facts,
        )
        self.output.publish_sidecar(manifest.manifest_name(shard), parts)


class Committer:
    """Commits units against an output, a journal and the sources (:meth:`commit`)."""

    def __init__(
        self,
        *,
        output: Output,
        journal: Journal,
        sources: Mapping[str, Source],
        dead_letters: DeadLetters,
        metrics: Metrics,
        fsync: bool,
        manifests: Manifests | None,
    ) -> None:
        self.output = output
        self.journal = journal
        self.sources = sources
        self.dead_letters = dead_letters
        self.metrics = metrics
        self.fsync = fsync
        self.manifests = manifests

    async def commit(self, unit: CommitUnit) -> None:
        """Run the protocol's steps for ``unit``; on a failure before the acks, discard its
        shard (durably dropping its intent first if it may be journalled) and raise."""
        counted = unit.shard.file_bytes if unit.shard is not None else 0
        with Stopwatch(self.metrics.publish_duration):
            try:
                intent, finished = await anyio.to_thread.run_sync(self._publish, unit)
            except UploadError:
                # The intent is journalled and the staged copy is whole: the next start resumes
                # the upload instead of replaying the events.
                raise
            except BaseException:
                if unit.shard is not None:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(self._abandon, unit)
                    self.metrics.shards_discarded.inc()
                raise
        if finished is not None:
            self.metrics.shards_published.inc()
            self.metrics.file_bytes_written.inc(finished.size - counted)
            self.metrics.last_publish.set(time.time())
            log.info(
                "published %s: %d records, %d bytes", finished.name, finished.records, finished.size
            )
        for source, tokens in intent.positions.items():
            with Stopwatch(self.metrics.ack_duration.labels(source)):
                await self.sources[source].ack(tokens)
            self.metrics.events_acked.labels(source).inc(unit.events.get(source, 0))
            crashpoints.reached("after-ack")
        await anyio.to_thread.run_sync(self.journal.write_done, intent.seq)
        crashpoints.reached("after-done")
        self.metrics.journal_bytes.set(self.journal.size)

    def _abandon(self, unit: CommitUnit) -> None:
        """Discard a failed commit's shard. Once its intent may be journalled, the in-progress
        file goes only after a durable ``drop`` (recovery takes an intent without one for
        published): if the journal cannot take it, the file stays for recovery to drop."""
        assert unit.shard is not None
        intent = unit.intent
        try:
            if intent is not None and not self.output.is_published(intent):
                self.journal.drop(intent.seq)
        except Exception as e:
            log.error(
                "%s: left in progress for the next start to decide on (%s)", unit.shard.name, e
            )
            unit.shard.offsets.remove()
            return
        unit.shard.discard()

    def _publish(self, unit: CommitUnit) -> tuple[Intent, FinishedShard | None]:
        """Steps 1 to 5 (blocking): the shard durable, the intent journalled, the shard and its
        manifest published."""
        finished: FinishedShard | None = None
        if unit.shard is not None:
            with Stopwatch(self.metrics.fsync_duration):
                finished = unit.shard.finish(fsync=self.fsync)
            crashpoints.reached("after-fsync")
        try:
            self.dead_letters.sync()
        except OSError as e:
            raise DurabilityError(f"dead letters: fsync failed: {e.strerror or e}") from e
        intent = self.journal.next_intent(
            finished.name if finished else None,
            unit.tokens,
            records=finished.records if finished else 0,
            size=finished.size if finished else 0,
            sha256=finished.sha256 if finished else None,
        )
        unit.intent = intent
        try:
            with Stopwatch(self.metrics.fsync_duration):
                self.journal.write_intent(intent)
        except OSError as e:
            raise DurabilityError(f"journal: {e.strerror or e}") from e
        crashpoints.reached("after-intent")
        if finished is not None:
            try:
                self.output.publish(finished)
                if self.manifests is not None:
                    self.manifests.publish(
                        finished.name,
                        intent.positions,
                        records=finished.records,
                        size=finished.size,
                        sha256=finished.sha256,
                        crc=finished.crc32c,
                        offsets=finished.offsets.chunks(),
                        first_time=finished.first_time,
                        last_time=finished.last_time,
                    )
            finally:
                # A manifest lost to a crash or an error here is rebuilt from the shard itself.
                finished.offsets.remove()
        return intent, finished
