"""The write stage's metrics: what each dataset's shards took (records, raw and file bytes),
and the gauges of its open shards and of its output's free space."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping
from typing import Protocol

from prometheus_client import Counter

from tfrecordd.metrics import Metrics
from tfrecordd.outputs.shards import OpenShard
from tfrecordd.pipeline.datasets import DatasetOutput

__all__ = ["OpenEntry", "WriteCounts"]

STATVFS_EVERY = 5.0
"""Seconds between two reads of each output's free space."""


class OpenEntry(Protocol):
    """What the gauges read of an open shard's entry."""

    dataset: str
    shard: OpenShard
    first_at: float


class WriteCounts:
    """The write stage's counters, looked up by label once per dataset (a partitioned batch
    counts into them once per shard it writes), and its gauges."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._counters: dict[str, tuple[Counter, Counter, Counter]] = {}
        self._statvfs_at = 0.0

    def written(self, dataset: str) -> tuple[Counter, Counter, Counter]:
        """The dataset's counters of records, raw bytes and file bytes written."""
        counters = self._counters.get(dataset)
        if counters is None:
            m = self.metrics
            counters = self._counters[dataset] = (
                m.records_written.labels(dataset),
                m.raw_bytes_written.labels(dataset),
                m.file_bytes_written.labels(dataset),
            )
        return counters

    def update_open(
        self, datasets: Mapping[str, DatasetOutput], entries: Iterable[OpenEntry]
    ) -> None:
        """Set each dataset's gauges of open shards (and, every :data:`STATVFS_EVERY` seconds,
        of its output's free space)."""
        m = self.metrics
        now = time.monotonic()
        if now - self._statvfs_at >= STATVFS_EVERY:
            self._statvfs_at = now
            for d in datasets.values():
                with contextlib.suppress(OSError):
                    st = os.statvfs(d.output.staging_dir)
                    m.output_free_bytes.labels(d.name).set(st.f_bavail * st.f_frsize)
        entries = list(entries)
        for name in datasets:
            here = [o for o in entries if o.dataset == name]
            m.open_shards.labels(name).set(len(here))
            m.open_shard_bytes.labels(name).set(sum(o.shard.file_bytes for o in here))
            m.open_shard_records.labels(name).set(sum(o.shard.records for o in here))
            oldest = min((o.first_at for o in here), default=None)
            m.open_shard_age.labels(name).set(now - oldest if oldest is not None else 0)
