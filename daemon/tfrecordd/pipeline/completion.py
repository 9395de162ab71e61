"""Partition completion: the watermark of a dataset, and the marker that says a time partition
can receive no more events (``[datasets.NAME.completion]``).

The watermark is the latest time seen in the dataset's records (event time, or arrival time for
``partition.time = "arrival"``), never past the daemon's clock. When no record has come for
``idle_close``, it moves on with the clock. A time partition is *closed* once the watermark, less
``allowed_lateness``, has passed its end: from then on its records are late (dead-lettered with the
reason ``late``, or written under ``_late/<partition>/``, as ``late`` says), its open shards are
published, and then its marker is published in it: ``<partition>/_SUCCESS`` (``marker``), JSON
naming every shard under the partition (field folders included) with its record count, size and
SHA-256, the partition's time range and the watermark that closed it. A marker is published after
every shard it lists, never before, and a partition once marked is never written again.

What survives a restart is kept in ``state_dir/datasets/<name>/completion.json``: the watermark
and the line of closed partitions as of the last commit (:meth:`Completion.committed`; records
written since may replay, and must not find their partitions closed by their own first
reading), and every partition that holds (or may come to hold) a shard and has no marker yet,
added before the first shard of a partition is opened. So a partition that closed before a
crash is marked by the next start, and one whose shards recovery publishes is not forgotten.

Markers assume one daemon writes a dataset's partitions: daemons sharing an output directory
each see only their own records' times.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import orjson

from tfrecordd.datasets import DatasetSection
from tfrecordd.errors import DurabilityError
from tfrecordd.format.compression import compression_from_name
from tfrecordd.fsys import FileSystem, read_nofollow, sync_folders, write_atomically
from tfrecordd.outputs import manifest
from tfrecordd.outputs.output import Output
from tfrecordd.outputs.partitions import TimeRange, folder_range, time_prefix

log = logging.getLogger("tfrecordd")

LATE_TREE = "_late"
"""The folder, in a dataset's output, where late records go with ``late = "late-partition"``."""

MARKER_VERSION = 1

_RANGES_KEPT = 100_000
_UNKNOWN = object()


class Completion:
    """One dataset's watermark and partitions waiting for their marker. The write stage tells it
    the times it sees and the folders it opens; the committer publishes the markers."""

    def __init__(
        self, name: str, dataset: DatasetSection, output: Output, state_dir: str, fs: FileSystem
    ) -> None:
        assert dataset.completion is not None
        self.name = name
        self.spec = dataset.partition
        self.config = dataset.completion
        self.output = output
        self.fs = fs
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "datasets", name, "completion.json")
        self.watermark: float | None = None
        """The latest record time seen (epoch seconds), or ``None`` before the first."""
        self.pending: set[str] = set()
        """Time partitions that may hold shards and have no marker yet."""
        self.closed_through = float("-inf")
        """Partitions ending at or before this are closed (never lowered)."""
        self.scheduled: set[str] = set()
        """Closed partitions whose marker a commit will publish."""
        self._durable: tuple[float | None, float] = (None, float("-inf"))
        """The watermark and the closed line as of the last commit: what the state file keeps."""
        self._ranges: dict[str, object] = {}
        self._last_record = time.monotonic()
        self._lock = threading.Lock()
        """Held while the state file is written: the writer's thread (a new partition) and the
        committer's (a marker) both write it."""
        self._load()

    def _load(self) -> None:
        try:
            sync_folders(self.fs, self.state_dir, self.path)
            raw = orjson.loads(read_nofollow(self.path))
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError) as e:
            raise DurabilityError(f"{self.path}: cannot be read ({e})") from e
        self.watermark = raw.get("watermark")
        self.pending = set(raw.get("pending", ()))
        closed = raw.get("closed_through")
        self.closed_through = float("-inf") if closed is None else float(closed)
        self._durable = (self.watermark, self.closed_through)

    def at_cut(self) -> tuple[float | None, float]:
        """The watermark and the closed line now: a commit cut here makes them durable once its
        intent is (:meth:`committed`)."""
        return self.watermark, self.closed_through

    def committed(self, at: tuple[float | None, float]) -> None:
        """A commit cut at ``at`` (:meth:`at_cut`) is durable: the state file may keep them
        (written with the next partition or marker)."""
        with self._lock:
            self._durable = at

    def _save(self) -> None:
        with self._lock:
            watermark, closed = self._durable
            doc = {
                "watermark": watermark,
                "pending": sorted(self.pending),
                "closed_through": closed if closed > float("-inf") else None,
            }
            try:
                self._make_folder()
                write_atomically(self.fs, self.path, orjson.dumps(doc))
            except OSError as e:
                raise DurabilityError(f"{self.path}: {e.strerror or e}") from e

    def _make_folder(self) -> None:
        """``state_dir/datasets/<name>/``, each level made durable in its parent when made."""
        folder = os.path.dirname(self.path)
        missing = []
        while not os.path.isdir(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        for path in reversed(missing):
            os.mkdir(path)
            self.fs.fsync_dir(os.path.dirname(path))

    def saw(self, times: tuple[float, float] | None) -> None:
        """Records of these times (earliest, latest) were written. The watermark never passes
        the daemon's clock: one event from a wrong clock, dated ahead, must not close the
        partitions of the present (its own partition waits for its time to come)."""
        self._last_record = time.monotonic()
        if times is None:
            return
        latest = min(times[1], time.time())
        if self.watermark is None or latest > self.watermark:
            self.watermark = latest

    def opening(self, folder: str) -> None:
        """A shard is about to be opened in ``folder``: its time partition is remembered first
        (blocking, when it is new)."""
        prefix = time_prefix(self.spec, folder)
        if prefix and prefix not in self.pending:
            self.pending.add(prefix)
            self._save()

    def _range(self, prefix: str) -> TimeRange | None:
        """:func:`folder_range` of a time partition, worked out once (each costs zone
        conversions, and every part of every batch asks)."""
        r = self._ranges.get(prefix, _UNKNOWN)
        if r is _UNKNOWN:
            if len(self._ranges) >= _RANGES_KEPT:
                self._ranges.clear()
            r = self._ranges[prefix] = folder_range(self.spec, prefix)
        return r if isinstance(r, TimeRange) else None

    def late(self, folder: str) -> bool:
        """Whether records of ``folder`` are late: its time partition is closed."""
        r = self._range(time_prefix(self.spec, folder))
        return r is not None and r.end <= self.closed_through

    def due(self, now: float | None = None) -> list[str]:
        """Move the line of closed partitions up to the watermark (the clock's, after
        ``idle_close`` without records), less ``allowed_lateness``; the pending partitions now
        closed, oldest first."""
        watermark = self.watermark
        if time.monotonic() - self._last_record >= self.config.idle_close:
            wall = time.time() if now is None else now
            watermark = wall if watermark is None else max(watermark, wall)
        if watermark is not None:
            self.closed_through = max(self.closed_through, watermark - self.config.allowed_lateness)
        found = []
        for prefix in self.pending - self.scheduled:
            r = self._range(prefix)
            if r is not None and r.end <= self.closed_through:
                found.append((r.start, prefix))
        return [prefix for _, prefix in sorted(found)]

    def late_folder(self, folder: str) -> str:
        """Where a late record of ``folder`` goes with ``late = "late-partition"``."""
        return f"{LATE_TREE}/{folder}"

    def mark(self, prefix: str) -> dict[str, Any]:
        """Publish the marker of the closed time partition ``prefix``, listing every shard
        published under it, and forget the partition (blocking); the marker's content."""
        r = self._range(prefix)
        assert r is not None
        # The line past this partition is durable before its marker is published: after a crash
        # in between, the partition stays closed (its records late), and the next start
        # publishes the same marker again.
        self._save()
        shards = [self._described(name) for name in self.output.list_shards(prefix)]
        doc = {
            "version": MARKER_VERSION,
            "dataset": self.name,
            "partition": prefix,
            "start": r.start,
            "end": r.end,
            "start_local": r.start_local,
            "end_local": r.end_local,
            "watermark": self.closed_through + self.config.allowed_lateness,
            "records": sum(s["records"] for s in shards),
            "shards": [s | {"name": s["name"][len(prefix) + 1 :]} for s in shards],
        }
        self.output.publish_sidecar(f"{prefix}/{self.config.marker}", [orjson.dumps(doc)])
        self.pending.discard(prefix)
        self.scheduled.discard(prefix)
        self._save()
        log.info(
            "dataset %s: partition %s complete (%d shards, %d records)",
            self.name,
            prefix,
            len(shards),
            doc["records"],
        )
        return doc

    def _described(self, name: str) -> dict[str, Any]:
        """A published shard's name, records, size and SHA-256: from its manifest, or measured
        from the shard where it has none."""
        man = manifest.manifest_name(name)
        if self.output.sidecar_exists(man):
            doc = self.output.read_published(man, lambda f: orjson.loads(f.read()))
            return {k: doc[k] for k in ("records", "size", "sha256")} | {"name": name}
        compression = compression_from_name(name)
        m = self.output.read_published(name, lambda f: manifest.scan(f, compression=compression))
        return {"name": name, "records": m["records"], "size": m["size"], "sha256": m["sha256"]}
