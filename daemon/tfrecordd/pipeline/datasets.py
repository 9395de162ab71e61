"""Each dataset's side of the write stage: where its shards go, how they are named, and where a
part of a batch is written (:meth:`DatasetOutput.place`): its folder of field values capped
(``max_partitions``), and a part of a closed time partition handled as late
(:meth:`DatasetOutput.account` counts it and writes its dead letters, once).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfrecordd.config import DaemonConfig
from tfrecordd.datasets import DatasetSection
from tfrecordd.events import FailureReason
from tfrecordd.format.writer import unpack
from tfrecordd.fsys import FileSystem
from tfrecordd.metrics import Metrics
from tfrecordd.outputs.output import Output
from tfrecordd.outputs.partitioncap import PartitionCap
from tfrecordd.outputs.shards import ShardNamer
from tfrecordd.pipeline.commit import Manifests
from tfrecordd.pipeline.completion import Completion
from tfrecordd.pipeline.encoding import EventFailure, Part
from tfrecordd.state.deadletter import DeadLetters

log = logging.getLogger("tfrecordd")

__all__ = [
    "DatasetOutput",
    "Placed",
    "account_all",
    "completions",
    "dataset_outputs",
    "dead_letter",
    "manifest_writers",
]


@dataclass(frozen=True, slots=True)
class DatasetOutput:
    """One dataset's side of the write stage: its settings, where its shards are published and
    how they are named, and its partitions' caps and completion."""

    name: str
    config: DatasetSection
    output: Output
    namer: ShardNamer
    cap: PartitionCap | None = None
    """Caps the folders of field values (``partition.fields``), if the dataset has any."""
    completion: Completion | None = None
    """Its watermark and markers (``[datasets.NAME.completion]``), if it has them."""

    def place(self, part: Part) -> Placed:
        """Where a part is written: its folder capped, a late part moved under ``_late/`` or
        to be dead-lettered. No side effect but the cap's memory of the folders seen: a batch
        placed again after a cut is placed the same (:meth:`account` does the rest, once)."""
        fallback = None
        if self.cap is not None:
            folder, fallback = self.cap.place(part.folder)
            if fallback is not None:
                part = Part(part.dataset, folder, part.records, part.times)
        c = self.completion
        if c is None or not c.late(part.folder):
            return Placed(part, fallback)
        if c.config.late == "late-partition":
            return Placed(
                Part(part.dataset, c.late_folder(part.folder), part.records, part.times),
                fallback,
                late=True,
            )
        return Placed(part, fallback, late=True, refused=True)

    def account(
        self, placed: Placed, source: str, metrics: Metrics, dead_letters: DeadLetters
    ) -> None:
        """Count a placed part, and dead-letter it if it is late and refused. Blocking."""
        part = placed.part
        if placed.fallback is not None:
            metrics.partition_fallbacks.labels(self.name, placed.fallback).inc(part.count)
        if placed.late:
            metrics.events_late.labels(self.name).inc(part.count)
        if not placed.refused:
            return
        c = self.completion
        assert c is not None
        detail = (
            f"dataset {self.name}: partition {part.folder} was marked complete (watermark "
            f"{c.closed_through + c.config.allowed_lateness:.3f}); the dead letter holds the "
            "encoded record"
        )
        where = f"{self.name}/{part.folder}"
        payloads = unpack(part.records)
        for payload in payloads:
            dead_letters.write(source, where, FailureReason.LATE, detail, payload)
        metrics.events_invalid.labels(source, FailureReason.LATE).inc(len(payloads))
        metrics.events_dead_lettered.labels(source).inc(len(payloads))


@dataclass(frozen=True, slots=True)
class Placed:
    """A part as :meth:`DatasetOutput.place` placed it."""

    part: Part
    fallback: str | None = None
    """Why its folder of field values was replaced by the fallback one, if it was."""
    late: bool = False
    refused: bool = False
    """Late and to be dead-lettered, not written."""


def account_all(
    datasets: Mapping[str, DatasetOutput],
    placed: Sequence[Placed],
    source: str,
    metrics: Metrics,
    dead_letters: DeadLetters,
) -> None:
    """:meth:`DatasetOutput.account` of each placed part of one batch, by its dataset."""
    for p in placed:
        datasets[p.part.dataset].account(p, source, metrics, dead_letters)


def dead_letter(
    source: str, failures: Sequence[EventFailure], dead_letters: DeadLetters, metrics: Metrics
) -> None:
    """Write a batch's failures to the dead letters, counted. Blocking."""
    discarded = 0
    for ev, reason, detail in failures:
        discarded += dead_letters.write(source, ev.where, reason, detail, ev.payload)
        metrics.events_invalid.labels(source, reason).inc()
    metrics.events_dead_lettered.labels(source).inc(len(failures))
    if discarded:
        metrics.dead_letters_discarded.inc(discarded)
        log.warning("dead letters rotated: %d older dead letter(s) deleted", discarded)


def completions(
    config: DaemonConfig, outputs: Mapping[str, Output], state_dir: str, fs: FileSystem
) -> dict[str, Completion]:
    """The completion of each dataset that publishes markers."""
    return {
        name: Completion(name, d, outputs[name], state_dir, fs)
        for name, d in config.datasets.items()
        if d.completion is not None
    }


def manifest_writers(config: DaemonConfig, outputs: Mapping[str, Output]) -> dict[str, Manifests]:
    """The manifest writer of each dataset that publishes manifests (a config of the older
    form names no dataset in them)."""
    return {
        name: Manifests(
            outputs[name],
            d.compression,
            config.encoders[d.encoder].schema_fingerprint(),
            None if config.output is not None else name,
        )
        for name, d in config.datasets.items()
        if d.manifests
    }


def dataset_outputs(
    config: DaemonConfig, outputs: Mapping[str, Output], completions: Mapping[str, Completion]
) -> dict[str, DatasetOutput]:
    """Each dataset's side of the write stage."""
    return {
        name: DatasetOutput(
            name,
            d,
            outputs[name],
            ShardNamer(d.prefix, config.daemon.node_id, d.compression),
            PartitionCap(d.partition) if d.partition.fields else None,
            completions.get(name),
        )
        for name, d in config.datasets.items()
    }
