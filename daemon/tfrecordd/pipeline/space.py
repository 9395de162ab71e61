"""Free space on the outputs: the write stage holds a batch (and so, by backpressure, the
sources) while a dataset's file system lacks room for it above its ``min_free_bytes``."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping

import anyio

from tfrecordd.format.compress import Compressor
from tfrecordd.metrics import Metrics
from tfrecordd.pipeline.datasets import DatasetOutput
from tfrecordd.pipeline.encoding import EncodedBatch

__all__ = ["FreeSpace"]

log = logging.getLogger("tfrecordd")


class FreeSpace:
    """Looks at the outputs' file systems, and waits for room (see the module's docstring)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.paused: str | None = None
        """The dataset whose file system holds the writer back now, if any."""

    async def wait(
        self,
        batch: EncodedBatch,
        datasets: Mapping[str, DatasetOutput],
        alive: Callable[[], None],
    ) -> None:
        """Return once every dataset ``batch`` writes to has room for it (``alive`` is called
        at each look while it waits)."""
        incoming: dict[str, int] = {}
        for part in batch.parts:
            d = datasets[part.dataset]
            if not d.config.min_free_bytes:
                continue
            unit = part.records.unit
            if unit.compression is d.config.compression:
                size = len(unit.data)
            else:  # framed only: the shard's writer compresses it
                size = Compressor.bound(d.config.compression, unit.raw_size)
            incoming[d.name] = incoming.get(d.name, 0) + size
        # One look at each dataset's file system a batch, however many parts it has there.
        for name, size in incoming.items():
            await self._wait_for_room(datasets[name], size, alive)

    async def _wait_for_room(
        self, d: DatasetOutput, incoming: int, alive: Callable[[], None]
    ) -> None:
        needed = d.config.min_free_bytes + incoming
        paused_at: float | None = None
        while (free := self.free_bytes(d)) is not None and free < needed:
            if paused_at is None:
                paused_at = time.monotonic()
                self.paused = d.name
                self.metrics.paused.set(1)
                self.metrics.disk_full_pauses.inc()
                log.warning(
                    "output of dataset %s nearly full (%d bytes free, %d needed): sources paused",
                    d.name,
                    free,
                    needed,
                )
            alive()
            await anyio.sleep(1.0)
        if paused_at is not None:
            self.paused = None
            self.metrics.paused.set(0)
            log.info("output has room again: resumed after %.1fs", time.monotonic() - paused_at)

    def free_bytes(self, d: DatasetOutput) -> int | None:
        """Bytes free for this process on the file system of dataset ``d``'s shards; ``None`` if
        unknown."""
        try:
            st = os.statvfs(d.output.staging_dir)
        except OSError:
            return None
        free = st.f_bavail * st.f_frsize
        self.metrics.output_free_bytes.labels(d.name).set(free)
        return free
