"""The cap on distinct combinations of a dataset's field partitions (``max_partitions``)."""

from __future__ import annotations

from tfrecordd.datasets import PartitionSection
from tfrecordd.outputs.fieldvalues import OTHER
from tfrecordd.outputs.partitions import time_prefix

__all__ = ["PartitionCap"]


class PartitionCap:
    """At most ``spec.max_partitions`` distinct combinations of field values get folders of
    their own (for this run, in the order they first come); a later new combination goes to
    ``_other`` for every field (counted as ``over-cap``). The all-``_other`` combination is
    the fallback itself and takes no place. Kept in the daemon's main process, where every
    record's folder passes."""

    def __init__(self, spec: PartitionSection) -> None:
        self.spec = spec
        self._other = "/".join(f"{name}={OTHER}" for name in spec.fields)
        self._seen: set[str] = set()

    def place(self, folder: str) -> tuple[str, str | None]:
        """The folder to use for a record of ``folder`` (from :meth:`Partitioner.assign`), and
        ``"over-cap"`` when it was changed."""
        if not self._other:
            return folder, None
        prefix = time_prefix(self.spec, folder)
        combination = folder[len(prefix) + 1 :] if prefix else folder
        if combination in self._seen or combination == self._other:
            return folder, None
        if len(self._seen) < self.spec.max_partitions:
            self._seen.add(combination)
            return folder, None
        return (f"{prefix}/{self._other}" if prefix else self._other), "over-cap"
