"""``verify``'s check of a dataset's completion markers against their partitions.

Each marker of the dataset (in the partitions ``--partition`` selects) is checked with
:func:`tfrecordd.reader.check_partition`: every shard it lists exists with the listed size,
SHA-256 and record count, and no shard of the partition is left unlisted. A marker that does not
read is a problem of its own; it never stops the check of the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tfrecordd.cli.datasetargs import DatasetDir
from tfrecordd.errors import TfrecorddError
from tfrecordd.reader import check_partition
from tfrecordd.readers.layout import parse_marker, partition_selected
from tfrecordd.readers.store import Store, subpath

__all__ = ["MarkerReport", "check_markers", "marker_folders"]


@dataclass(slots=True)
class MarkerReport:
    """What one completion marker says, and what is wrong with it."""

    path: str
    partition: str
    """Its folder, relative to the dataset."""
    shards: int | None = None
    """How many shards it lists (``None``: it does not read)."""
    records: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the marker matches its partition."""
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        """The report as ``verify --json`` prints it."""
        return {
            "path": self.path,
            "partition": self.partition,
            "ok": self.ok,
            "shards": self.shards,
            "records": self.records,
            "problems": self.problems,
        }


def marker_folders(d: DatasetDir) -> tuple[Store, list[str]]:
    """The dataset's store and the folders (relative) that hold a marker, sorted; only those
    ``--partition`` selects. The ``_late`` tree and hidden folders hold none."""
    store = Store(d.location, d.storage_options)
    folders = store.walk(lambda sub: not sub.rpartition("/")[2].startswith((".", "_")))
    found = [f for f, files in folders.items() if f and d.marker_name in files]
    if d.partitions is not None:
        selectors = [p.strip("/") for p in d.partitions]
        found = [f for f in found if partition_selected(f, selectors)]
    return store, sorted(found)


def check_markers(d: DatasetDir) -> list[MarkerReport]:
    """Every marker of ``d`` checked against its partition."""
    store, folders = marker_folders(d)
    reports = []
    for folder in folders:
        where = subpath(folder, d.marker_name)
        report = MarkerReport(path=store.path(where), partition=folder)
        try:
            marker = parse_marker(store.read(where), store.path(where), folder)
            report.shards = len(marker.shards)
            report.records = marker.records
            report.problems = check_partition(
                store.path(folder), marker_name=d.marker_name, storage_options=d.storage_options
            )
        except TfrecorddError as e:
            report.problems = [str(e)]
        reports.append(report)
    return reports
