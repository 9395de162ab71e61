"""Start-up recovery: what the journal's unfinished intents become (:func:`recover`).

An intent without ``done`` is one of:

- positions only (no shard): its acks are redone;
- published (or its publishing can be finished from the staged copy): its manifest is rebuilt
  if missing, its acks are redone;
- not published: it is dropped (durably, before any in-progress file goes), and its events
  replay from their sources.

Then this node's remaining in-progress files are discarded, the output is made durable before
any ack is redone, the sources recover from their committed state and the tokens to redo, and
``done`` is written for each redone intent.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import anyio

from tfrecordd.format.compression import compression_from_name
from tfrecordd.fsys import FileSystem
from tfrecordd.metrics import Metrics
from tfrecordd.outputs import manifest
from tfrecordd.outputs.output import LocalOutput, Output
from tfrecordd.outputs.shards import RecordOffsets, leftovers, offsets_name, staged_path
from tfrecordd.pipeline.commit import Manifests
from tfrecordd.plugin import Source, Token
from tfrecordd.state.journal import Journal
from tfrecordd.state.records import Intent

log = logging.getLogger("tfrecordd")


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :func:`recover` did."""

    redone: tuple[Intent, ...]
    """Unfinished intents taken for committed: their acks were redone, ``done`` written."""
    dropped: tuple[Intent, ...]
    """Unfinished intents whose shard was never published: dropped, their events replay."""
    discarded: tuple[str, ...]
    """In-progress files of this node removed."""
    torn_at: int | None = None
    """Where a torn journal tail (a crash mid-append) was cut off, if there was one."""


async def recover(
    journal: Journal,
    output: Output,
    sources: Mapping[str, Source],
    *,
    fs: FileSystem,
    node_id: str,
    manifests: Manifests | None,
    metrics: Metrics,
) -> RecoveryReport:
    """Recover from ``journal`` (see the module's docstring): finish or drop each unfinished
    intent, discard this node's in-progress files in ``output``, and let each source recover.
    ``manifests`` is ``None`` when manifests are off (none is rebuilt)."""
    rec = await anyio.to_thread.run_sync(journal.recover)
    sorter = _Sorter(journal, output, fs, node_id, manifests)
    redo, dropped, discarded = await anyio.to_thread.run_sync(sorter.sort, rec.unfinished)
    metrics.shards_discarded.inc(len(discarded))
    if any(intent.shard is not None for intent in redo):
        # A shard linked just before a crash may not be durable yet: its directory is
        # fsynced before any of its acks is redone (a manifest rebuilt for it would do it
        # too, but not every redone shard needs one).
        await anyio.to_thread.run_sync(output.sync)
    pending: dict[str, list[Token]] = {}
    for intent in redo:
        for source, tokens in intent.positions.items():
            pending.setdefault(source, []).extend(tokens)
    for name, src in sources.items():
        await src.recover(rec.states.get(name), pending.get(name, []))
    for intent in redo:
        await anyio.to_thread.run_sync(journal.write_done, intent.seq)
    metrics.recovered.labels("redone").inc(len(redo))
    metrics.recovered.labels("dropped").inc(len(dropped))
    metrics.journal_bytes.set(journal.size)
    log.info(
        "recovered: %d commit(s) redone, %d dropped, %d in-progress file(s) discarded%s",
        len(redo),
        len(dropped),
        len(discarded),
        f", journal tail torn at byte {rec.torn_at}" if rec.torn_at is not None else "",
    )
    return RecoveryReport(tuple(redo), tuple(dropped), tuple(discarded), rec.torn_at)


@dataclass(frozen=True, slots=True)
class _Sorter:
    journal: Journal
    output: Output
    fs: FileSystem
    node_id: str
    manifests: Manifests | None

    def sort(self, unfinished: list[Intent]) -> tuple[list[Intent], list[Intent], list[str]]:
        """Split unfinished intents into redo and dropped (finishing the publishing of those
        that can be finished), then discard our remaining in-progress files."""
        out_dir, legacy = self.output.staging_dir, self.output.legacy_dir
        redo: list[Intent] = []
        dropped: list[Intent] = []
        foreign: list[str] = []  # our files in another node's folder (an earlier node_id)
        for intent in unfinished:
            staged = staged_path(out_dir, legacy, intent.shard or "")
            if intent.shard is not None and os.path.dirname(staged) not in (out_dir, legacy):
                foreign.append(staged)
            if intent.shard is None:
                redo.append(intent)
            elif self._was_published(intent, staged):
                self._ensure_manifest(intent)
                redo.append(intent)
            else:
                self.journal.drop(intent.seq, sync=False)
                dropped.append(intent)
        if dropped:
            # Durable before any in-progress file goes (see _was_published).
            self.journal.sync()
        left = leftovers(out_dir, legacy, self.node_id)
        left += [p for p in foreign if os.path.lexists(p)]
        for path in left:
            self.fs.remove(path)
        return redo, dropped, left

    def _was_published(self, intent: Intent, staged: str) -> bool:
        """Whether an unfinished intent's shard was published (finishing an interrupted upload
        from the staged copy where the output can).

        Decided from the journal, not from the shard's presence: a shipper may have moved the
        shard away since. Once its intent is journalled, a shard's in-progress file goes only
        when the shard is published, or after a durable ``drop`` of the intent (recovery's
        discard, a failed commit). So an intent whose in-progress file is gone was published,
        whether its shard is still there or not."""
        assert intent.shard is not None
        if self.output.is_published(intent):
            return True
        try:
            st = os.lstat(staged)
        except FileNotFoundError:
            if not intent.kept:
                return self.output.sidecar_exists(manifest.manifest_name(intent.shard))
            log.warning(
                "%s: published before the restart and moved away since (its in-progress file "
                "is gone too); its acknowledgements are redone, its events not written again",
                intent.shard,
            )
            return True
        if isinstance(self.output, LocalOutput) and st.st_nlink > 1:
            # Linked to its final name, then moved away before the in-progress name was removed.
            return True
        return self.output.resume(intent, staged)

    def _ensure_manifest(self, intent: Intent) -> None:
        """Rebuild the manifest of a shard published just before a crash, if it is missing."""
        assert intent.shard is not None
        name = manifest.manifest_name(intent.shard)
        if self.manifests is None or self.output.sidecar_exists(name):
            return
        if isinstance(self.output, LocalOutput) and not self.output.is_published(intent):
            log.info("%s: moved away; its manifest is not rebuilt", intent.shard)
            return
        # The offsets wait in a file as a shard's being written do: memory stays bounded
        # whatever the shard's record count.
        spill = os.path.join(self.output.staging_dir, offsets_name(intent.shard))
        offsets = RecordOffsets(self.fs, spill)
        try:
            if isinstance(self.output, LocalOutput):
                m = manifest.scan(self.output.final_path(intent.shard), offsets)
            else:
                # Streamed back from the store; an attempt cut short starts the offsets again.
                compression = compression_from_name(intent.shard)

                def scan(f: BinaryIO) -> dict[str, Any]:
                    nonlocal offsets
                    offsets.remove()
                    offsets = RecordOffsets(self.fs, spill)
                    return manifest.scan(f, offsets, compression=compression)

                m = self.output.read_published(intent.shard, scan)
                log.info("%s: manifest rebuilt from the published object", intent.shard)
            offsets.close()
            self.manifests.publish(
                intent.shard,
                intent.positions,
                records=m["records"],
                size=m["size"],
                sha256=m["sha256"],
                crc=m["crc32c"],
                offsets=offsets.chunks(),
                first_time=None,
                last_time=None,
            )
        finally:
            offsets.remove()
