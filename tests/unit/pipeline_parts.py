"""Real parts for testing the committer and recovery without a daemon: an output directory, a
journal, a recording source, and a :class:`FileSystem` that logs the durable steps and fails
the one it is told to."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from tfrecordd.format.compression import Compression
from tfrecordd.format.writer import frame
from tfrecordd.fsys import FileSystem
from tfrecordd.metrics import Metrics
from tfrecordd.outputs.output import LocalOutput
from tfrecordd.outputs.shards import OpenShard, ShardNamer
from tfrecordd.pipeline.commit import Committer, CommitUnit, Kept, Manifests
from tfrecordd.pipeline.encoding import EncodedBatch, Part
from tfrecordd.pipeline.recovery import RecoveryReport, recover
from tfrecordd.plugin import Source, SourceContext, Token
from tfrecordd.state.deadletter import DeadLetters
from tfrecordd.state.journal import Journal
from tfrecordd.state.records import JOURNAL

NODE = "n1"
SOURCE = "s"
DATASET = "d"


class StepFs(FileSystem):
    """Logs ``(operation, kind)`` for each durable step into ``log`` and raises EIO on the
    first step equal to ``fail`` (kinds: ``shard``, ``journal``, ``staging``: this node's
    folder, ``dir``: another directory, ``other``)."""

    def __init__(self, log: list[tuple[str, str]], fail: tuple[str, str] | None = None) -> None:
        self.log = log
        self.fail = fail

    def _step(self, op: str, path: str) -> None:
        name = os.path.basename(path)
        if name == JOURNAL:
            kind = "journal"
        elif name.endswith(".inprogress"):
            kind = "shard"
        elif os.path.isdir(path):
            kind = "staging" if name == NODE else "dir"
        else:
            kind = "other"
        self.log.append((op, kind))
        if (op, kind) == self.fail:
            self.fail = None
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    def write(self, f: BinaryIO, data: bytes | memoryview) -> None:
        self._step("write", os.readlink(f"/proc/self/fd/{f.fileno()}"))
        super().write(f, data)

    def fsync(self, f: BinaryIO) -> None:
        self._step("fsync", os.readlink(f"/proc/self/fd/{f.fileno()}"))
        super().fsync(f)

    def fsync_dir(self, path: str) -> None:
        self._step("fsync", path)
        super().fsync_dir(path)

    def publish(self, src: str, dst: str) -> None:
        self._step("publish", src)
        super().publish(src, dst)


class RecordingSource(Source):
    """Records its acks (into the shared step log too) and what recovery handed it; its state
    is the list of committed tokens."""

    def __init__(self, log: list[tuple[str, str]] | None = None, *, fail_ack: bool = False):
        self.log = log if log is not None else []
        self.fail_ack = fail_ack
        self.acked: list[Token] = []
        self.recovered: tuple[Any, list[Token]] | None = None

    async def run(self, ctx: SourceContext) -> None:
        del ctx

    async def ack(self, tokens: Sequence[Token]) -> None:
        self.log.append(("ack", SOURCE))
        if self.fail_ack:
            raise OSError(errno.EIO, "ack failed")
        self.acked.extend(tokens)

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        self.recovered = (state, list(pending))

    @staticmethod
    def fold(state: Any, tokens: Sequence[Token]) -> Any:
        return [*(state or []), *tokens]


@dataclass
class Parts:
    """An output directory and a state directory under ``root``, with a journal over them."""

    root: Path
    fs: FileSystem = field(default_factory=FileSystem)
    manifests: bool = False

    def __post_init__(self) -> None:
        self.output = LocalOutput(str(self.root / "out"), self.fs, node_id=NODE)
        os.makedirs(self.output.staging_dir, exist_ok=True)
        self.state = str(self.root / "state")
        self.journal = Journal(self.state, self.fs, folds={SOURCE: RecordingSource.fold})
        self.metrics = Metrics()

    def open(self) -> None:
        """Open the journal as a start does (before any commit)."""
        self.journal.recover()

    def committer(self, source: Source) -> Committer:
        return Committer(
            outputs={DATASET: self.output},
            journal=self.journal,
            sources={SOURCE: source},
            dead_letters=DeadLetters(self.state, self.fs, 1 << 20),
            metrics=self.metrics,
            fsync=True,
            manifests=self.manifests_writer(),
        )

    def manifests_writer(self) -> dict[str, Manifests]:
        if not self.manifests:
            return {}
        return {DATASET: Manifests(self.output, Compression.NONE, "fingerprint")}

    def shard(self, records: list[bytes]) -> OpenShard:
        """A shard in the staging folder holding ``records``."""
        shard = OpenShard(
            self.output.staging_dir,
            ShardNamer("part", NODE, Compression.NONE).next(),
            Compression.NONE,
            None,
            1 << 20,
            self.fs,
            track_offsets=self.manifests,
        )
        shard.write(records)
        return shard

    def unit(self, records: list[bytes], token: Token) -> CommitUnit:
        """A unit that publishes a shard holding ``records`` (none if empty), with ``token``."""
        unit = CommitUnit()
        if records:
            unit.closing.append(Kept(DATASET, self.shard(records)))
        unit.add(EncodedBatch(SOURCE, [Part(DATASET, "", frame(records))], token, len(records), []))
        return unit

    def published(self) -> list[str]:
        """The shards published in the output directory."""
        out = self.root / "out"
        return sorted(p.name for p in out.iterdir() if p.is_file() and ".manifest" not in p.name)

    def staged(self) -> list[str]:
        """Files left in this node's staging folder (in-progress shards, offsets)."""
        return sorted(os.listdir(self.output.staging_dir))

    async def restart(self, source: RecordingSource) -> RecoveryReport:
        """What the next start does: a fresh journal over the same state, recovered."""
        self.journal.close()
        fresh = Parts(self.root, manifests=self.manifests)
        try:
            return await recover(
                fresh.journal,
                {DATASET: fresh.output},
                {SOURCE: source},
                fs=fresh.fs,
                node_id=NODE,
                manifests=fresh.manifests_writer(),
                metrics=fresh.metrics,
            )
        finally:
            fresh.journal.close()
