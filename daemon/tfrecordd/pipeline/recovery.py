"""Start-up recovery: the journal's commits rolled forward (:func:`recover`).

Once its intent is in the journal, a commit is committed: every shard it publishes was complete
and fsynced before, and every shard it keeps open was fsynced up to the prefix it names. So an
intent without ``done`` is rolled forward: each of its shards not yet published is published from
its staged copy (one whose staged copy is gone was published, and moved away since), manifests
missing are rebuilt, and its acks are redone. The dead letters written after the latest
commit's cut (finished or rolled forward) are cut off: their events replay, and are
dead-lettered again (:func:`~tfrecordd.state.deadletter.cut_uncommitted`). Then each shard kept
open by a commit and not published since is finished at its durable prefix (what was written
after is cut: those records' positions were never acknowledged, and their events replay) and
published, and a commit saying so is journalled.

Only intents of versions before kept in-progress files can still be dropped: when nothing shows
that their shard was published (events replay). Then this node's remaining in-progress files are
discarded, the outputs are made durable before any ack is redone, the sources recover from their
committed state and the tokens to redo, and ``done`` is written for each redone intent.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import anyio

from tfrecordd.errors import ConfigError, StateError
from tfrecordd.format.compression import Compression, compression_from_name
from tfrecordd.fsys import FileSystem
from tfrecordd.metrics import Metrics
from tfrecordd.outputs import manifest
from tfrecordd.outputs.output import LocalOutput, Output
from tfrecordd.outputs.shards import (
    FinishedShard,
    Prefix,
    RecordOffsets,
    finish_prefix,
    leftovers,
    offsets_name,
    staged_path,
)
from tfrecordd.pipeline.commit import Manifests
from tfrecordd.pipeline.sourcerun import SourceRun
from tfrecordd.plugin import Source, Token
from tfrecordd.state.deadletter import cut_uncommitted, file_end
from tfrecordd.state.journal import Journal
from tfrecordd.state.records import Intent, OpenRef, ShardRef

log = logging.getLogger("tfrecordd")


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :func:`recover` did."""

    redone: tuple[Intent, ...]
    """Unfinished intents rolled forward: their shards published, their acks redone."""
    dropped: tuple[Intent, ...]
    """Unfinished intents (of older versions) whose shard was never published: dropped, their
    events replay."""
    discarded: tuple[str, ...]
    """In-progress files of this node removed."""
    torn_at: int | None = None
    """Where a torn journal tail (a crash mid-append) was cut off, if there was one."""
    finished: tuple[str, ...] = ()
    """Shards kept open by commits before the stop, finished at their durable prefix and
    published (as ``<dataset>:<name>``)."""


async def recover(
    journal: Journal,
    outputs: Mapping[str, Output],
    sources: Mapping[str, Source],
    *,
    contexts: Mapping[str, SourceRun] | None = None,
    fs: FileSystem,
    node_id: str,
    manifests: Mapping[str, Manifests],
    metrics: Metrics,
) -> RecoveryReport:
    """Recover from ``journal`` (see the module's docstring) into the datasets' ``outputs``;
    ``manifests`` of the datasets that publish them; the sources' ``contexts`` make their
    state folders once the journal's recovery has finished any interrupted ``state`` command
    (which may rename one), before any source recovers."""
    rec = await anyio.to_thread.run_sync(journal.recover)
    roller = _Roller(journal, dict(outputs), fs, node_id, dict(manifests))
    redo, dropped = await anyio.to_thread.run_sync(
        roller.roll, rec.unfinished, rec.open, rec.last_commit
    )
    discarded = await anyio.to_thread.run_sync(roller.discard_leftovers)
    metrics.shards_discarded.inc(len(discarded))
    if roller.folders:
        # A shard linked just before a crash may not be durable yet: its folder is fsynced
        # before any of its acks is redone.
        for dataset, folders in roller.folders.items():
            await anyio.to_thread.run_sync(outputs[dataset].sync, folders)
    pending: dict[str, list[Token]] = {}
    for intent in redo:
        for source, tokens in intent.positions.items():
            pending.setdefault(source, []).extend(tokens)
    for ctx in (contexts or {}).values():
        await anyio.to_thread.run_sync(ctx.make_state_dir)
    for name, src in sources.items():
        await src.recover(rec.states.get(name), pending.get(name, []))
    for intent in redo:
        await anyio.to_thread.run_sync(journal.write_done, intent.seq)
    metrics.recovered.labels("redone").inc(len(redo))
    metrics.recovered.labels("dropped").inc(len(dropped))
    metrics.journal_bytes.set(journal.size)
    log.info(
        "recovered: %d commit(s) redone, %d dropped, %d in-progress file(s) discarded, %d "
        "open shard(s) finished%s",
        len(redo),
        len(dropped),
        len(discarded),
        len(roller.finished),
        f", journal tail torn at byte {rec.torn_at}" if rec.torn_at is not None else "",
    )
    return RecoveryReport(
        tuple(redo), tuple(dropped), tuple(discarded), rec.torn_at, tuple(roller.finished)
    )


@dataclass(slots=True)
class _Roller:
    journal: Journal
    outputs: dict[str, Output]
    fs: FileSystem
    node_id: str
    manifests: dict[str, Manifests]
    folders: dict[str, set[str]] = field(default_factory=dict)
    """Per dataset, the folders of shards published by the commits rolled forward."""
    finished: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    """This node's in-progress files found in another node's folder (an earlier node id)."""

    def dataset(self, name: str) -> str:
        """The configured dataset a journal record names (``""``: the config's only one)."""
        if name in self.outputs:
            return name
        if name == "" and len(self.outputs) == 1:
            return next(iter(self.outputs))
        configured = ", ".join(sorted(self.outputs))
        what = repr(name) if name else "the one dataset of a config before [datasets]"
        raise ConfigError(
            [
                f"datasets: state_dir holds commits of dataset {what}, not configured (have: "
                f"{configured}): start once with the config that wrote them so they finish, or "
                "restore the dataset's table"
            ]
        )

    def roll(
        self,
        unfinished: list[Intent],
        kept_open: list[OpenRef],
        last_commit: tuple[int, list[int] | None] | None = None,
    ) -> tuple[list[Intent], list[Intent]]:
        """Roll every unfinished intent forward, cut the dead letters back to where the latest
        commit (of ``last_commit``, the latest finished one, and those redone) ended them, then
        finish the shards left open; the intents redone and those dropped. Blocking."""
        open_shards = {(self.dataset(o.dataset), o.name): o for o in kept_open}
        redo: list[Intent] = []
        dropped: list[Intent] = []
        for intent in unfinished:
            if not self._publish(intent):
                self.journal.drop(intent.seq, sync=False)
                dropped.append(intent)
                continue
            redo.append(intent)
            for ref in intent.shards:
                open_shards.pop((self.dataset(ref.dataset), ref.name), None)
            for o in intent.open:
                open_shards[(self.dataset(o.dataset), o.name)] = o
        if dropped:
            # Durable before any in-progress file goes.
            self.journal.sync()
        for intent in redo:
            if last_commit is None or intent.seq > last_commit[0]:
                last_commit = intent.seq, intent.dead_letters
        end = None if last_commit is None else last_commit[1]
        if end is not None and (cut := cut_uncommitted(self.fs, self.journal.state_dir, end)):
            log.info("dead letters: %d byte(s) of events no commit covers cut off", cut)
        # With no commit that says where they ended (a new state_dir, an earlier version's),
        # the dead letters are taken as they stand: a commit of nothing records it, so that a
        # crash before the first commit cuts back to it.
        baseline = end is None and (end := file_end(self.journal.state_dir)) is not None
        refs = [self._finish_open(d, o) for (d, _), o in open_shards.items()]
        if open_shards or baseline:
            # The shards are published: the next start must not look for them again (and the
            # dead letters' end is on record).
            intent = self.journal.next_intent({}, refs, dead_letters=end)
            self.journal.write_intent(intent)
            self.journal.write_done(intent.seq)
        return redo, dropped

    def _staged(self, dataset: str, name: str) -> str:
        out = self.outputs[dataset]
        staged = staged_path(
            out.staging_dir, out.legacy_dir, os.path.basename(name), out.staging_roots
        )
        if os.path.dirname(staged) not in (out.staging_dir, out.legacy_dir):
            self.foreign.append(staged)
        return staged

    def _publish(self, intent: Intent) -> bool:
        """Publish every shard of an unfinished intent that is not yet; ``False`` when the
        intent must be dropped instead (an older version's intent, of a shard never
        published)."""
        todo: list[tuple[str, ShardRef, FinishedShard]] = []
        for ref in intent.shards:
            dataset = self.dataset(ref.dataset)
            out = self.outputs[dataset]
            self.folders.setdefault(dataset, set()).add(os.path.dirname(ref.name))
            if out.is_published(ref):
                self._ensure_manifest(dataset, ref, intent.positions)
                continue
            staged = self._staged(dataset, ref.name)
            try:
                st = os.lstat(staged)
            except FileNotFoundError:
                if intent.kept or out.sidecar_exists(manifest.manifest_name(ref.name)):
                    log.warning(
                        "%s: published before the restart and moved away since (its in-progress "
                        "file is gone too); its acknowledgements are redone, its events not "
                        "written again",
                        ref.name,
                    )
                    continue
                return False
            if isinstance(out, LocalOutput) and st.st_nlink > 1:
                # Linked to its final name, then moved away before the in-progress name went.
                self.fs.remove(staged)
                continue
            finished = self._scan_staged(dataset, ref.name, staged)
            if finished.size != ref.size or (ref.sha256 and finished.sha256 != ref.sha256):
                finished.offsets.remove()
                if len(intent.shards) == 1:
                    log.warning("staged copy of %s differs from its intent: dropped", ref.name)
                    return False
                raise StateError(
                    staged,
                    f"holds {finished.size} bytes (SHA-256 {finished.sha256}), not the "
                    f"{ref.size} bytes its commit journalled: the staged copy was damaged",
                    "move it aside and start again: its records are lost, the rest of the "
                    "commit is published",
                )
            todo.append((dataset, ref, finished))
        for dataset, _, finished in todo:
            try:
                self.outputs[dataset].resume(finished)
                self._publish_manifest(dataset, finished, intent.positions)
            finally:
                finished.offsets.remove()
        return True

    def _finish_open(self, dataset: str, ref: OpenRef) -> ShardRef:
        """Finish a shard left open at its durable prefix and publish it (unless it is already);
        its ref, for the commit that says so."""
        out = self.outputs[dataset]
        staged = self._staged(dataset, ref.name)
        self.folders.setdefault(dataset, set()).add(os.path.dirname(ref.name))
        gone = ShardRef(dataset, ref.name, ref.records)
        published = isinstance(out, LocalOutput) and os.path.lexists(out.final_path(ref.name))
        try:
            st = os.lstat(staged)
        except FileNotFoundError:
            if published or not isinstance(out, LocalOutput):
                # Published by a start killed before its manifest was.
                try:
                    self._ensure_manifest(dataset, gone, {})
                except FileNotFoundError:
                    log.warning("%s: no manifest rebuilt: the object is gone", ref.name)
            else:
                log.error(
                    "%s: kept open by a commit, and its in-progress file is gone: published and "
                    "moved away before the restart, or lost",
                    ref.name,
                )
            return gone
        if isinstance(out, LocalOutput) and (st.st_nlink > 1 or published):
            # Published by a start before this one (linked, then killed before the in-progress
            # name went): the published file is never cut again.
            self.fs.remove(staged)
            if published:
                self._ensure_manifest(dataset, gone, {})
            return gone
        compression = compression_from_name(ref.name) or Compression.NONE
        finish_prefix(
            self.fs, staged, Prefix(ref.size, ref.records, ref.adler32), compression, None
        )
        finished = self._scan_staged(dataset, ref.name, staged)
        try:
            if finished.records != ref.records:
                raise StateError(
                    staged,
                    f"holds {finished.records} records up to its durable prefix, not the "
                    f"{ref.records} its commit journalled",
                    "move it aside and start again",
                )
            out.resume(finished)
            self._publish_manifest(dataset, finished, {})
        finally:
            finished.offsets.remove()
        self.finished.append(f"{dataset}:{ref.name}")
        log.info("%s: finished at its last commit (%d records), published", ref.name, ref.records)
        return ShardRef(dataset, ref.name, finished.records, finished.size, finished.sha256)

    def _scan_staged(self, dataset: str, name: str, staged: str) -> FinishedShard:
        """A staged shard measured (blocking): it is read whole."""
        out = self.outputs[dataset]
        spill = os.path.join(out.staging_dir, offsets_name(os.path.basename(name)))
        offsets = RecordOffsets(self.fs, spill)
        m = manifest.scan(staged, offsets)
        offsets.close()
        return FinishedShard(
            name=name,
            tmp_path=staged,
            records=m["records"],
            size=m["size"],
            raw_bytes=0,
            sha256=m["sha256"],
            crc32c=m["crc32c"],
            offsets=offsets,
            first_time=0.0,
            last_time=0.0,
        )

    def _publish_manifest(
        self, dataset: str, f: FinishedShard, positions: Mapping[str, list[Token]]
    ) -> None:
        manifests = self.manifests.get(dataset)
        if manifests is None:
            return
        manifests.publish(
            f.name,
            positions,
            records=f.records,
            size=f.size,
            sha256=f.sha256,
            crc=f.crc32c,
            offsets=f.offsets.chunks(),
            first_time=None,
            last_time=None,
            event_times=None,
        )

    def _ensure_manifest(
        self, dataset: str, ref: ShardRef, positions: Mapping[str, list[Token]]
    ) -> None:
        """Rebuild the manifest of a shard published just before a crash, if it is missing."""
        out = self.outputs[dataset]
        name = manifest.manifest_name(ref.name)
        manifests = self.manifests.get(dataset)
        if manifests is None or out.sidecar_exists(name):
            return
        # The offsets wait in a file as a shard's being written do: memory stays bounded
        # whatever the shard's record count.
        spill = os.path.join(out.staging_dir, offsets_name(os.path.basename(ref.name)))
        offsets = RecordOffsets(self.fs, spill)
        try:
            if isinstance(out, LocalOutput):
                m = manifest.scan(out.final_path(ref.name), offsets)
            else:
                # Streamed back from the store; an attempt cut short starts the offsets again.
                compression = compression_from_name(ref.name)

                def scan(f: BinaryIO) -> dict[str, Any]:
                    nonlocal offsets
                    offsets.remove()
                    offsets = RecordOffsets(self.fs, spill)
                    return manifest.scan(f, offsets, compression=compression)

                m = out.read_published(ref.name, scan)
                log.info("%s: manifest rebuilt from the published object", ref.name)
            offsets.close()
            manifests.publish(
                ref.name,
                positions,
                records=m["records"],
                size=m["size"],
                sha256=m["sha256"],
                crc=m["crc32c"],
                offsets=offsets.chunks(),
                first_time=None,
                last_time=None,
                event_times=None,
            )
        finally:
            offsets.remove()

    def discard_leftovers(self) -> list[str]:
        """Remove this node's in-progress files that no commit holds (blocking); their
        paths."""
        left: list[str] = []
        for out in self.outputs.values():
            left += leftovers(out.staging_dir, out.legacy_dir, self.node_id)
        left += [p for p in self.foreign if os.path.lexists(p)]
        for path in left:
            self.fs.remove(path)
        return left
