"""What a running source gets from the daemon: :class:`SourceRun`, the daemon's
:class:`~tfrecordd.plugin.SourceContext`, one per source (a reload makes a new one)."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from tfrecordd.boundary import PipelineClosedError
from tfrecordd.errors import DurabilityError, StateError
from tfrecordd.fsys import sync_folders
from tfrecordd.plugin import RawBatch, SourceContext, SourceState

if TYPE_CHECKING:
    from tfrecordd.pipeline.runtime import Daemon

__all__ = ["PAUSE_LOG_AFTER", "SourceRun"]

log = logging.getLogger("tfrecordd")

PAUSE_LOG_AFTER = 5.0
"""A source held back longer than this by a full pipeline is logged as paused (and resumed)."""


class SourceRun(SourceContext):
    """A source's context in the daemon: its batches go into the pipeline (waiting for room,
    counted), its state folder is made durable before it recovers (:meth:`make_state_dir`)."""

    def __init__(self, daemon: Daemon, name: str) -> None:
        cfg = daemon.config
        self.fs = daemon.fs
        self.name = name
        self.node_id = cfg.daemon.node_id
        self.state_root = str(cfg.daemon.state_dir)
        self.fsync = daemon.fsync
        self.state_dir = os.path.join(self.state_root, "sources", name)
        source = next(s for s in cfg.sources if s.name == name)
        fed = [cfg.datasets[d] for d in cfg.fed_datasets(source)]
        self.max_batch_events = min(
            [
                cfg.daemon.max_batch_events,
                *(d.max_shard_records for d in fed if d.max_shard_records),
            ]
        )
        self.max_batch_bytes = min(
            [cfg.daemon.max_batch_bytes, *(d.max_shard_bytes // 4 for d in fed)]
        )
        self.sent = 0  # batches sent into the pipeline: a reload waits for them to be acked
        self._send: MemoryObjectSendStream[RawBatch] | None = None
        """The pipeline's stream, set when the source starts running."""
        self._m = daemon.metrics
        self._received = daemon.metrics.events_received.labels(name)
        self._backpressure = daemon.metrics.backpressure.labels(name)
        self._state = SourceState(name, on_change=daemon.metrics.show_source)

    def make_state_dir(self) -> None:
        """Make :attr:`state_dir`, durable in its parents down from the daemon's ``state_dir``
        (found or made: a folder left by a process killed before its parent's fsync is not
        durable yet), as :attr:`SourceContext.state_dir` promises: after recovery's journal, before
        the source recovers. Raises :class:`StateError` if a folder cannot be made or is a
        symbolic link (never followed in ``state_dir``), :class:`DurabilityError` if an fsync
        fails (never retried: a failed fsync may have lost what it was to keep)."""
        try:
            os.makedirs(self.state_dir, exist_ok=True)
        except OSError as e:
            raise StateError(self.state_dir, f"cannot be made: {e.strerror or e}") from e
        for folder in (os.path.dirname(self.state_dir), self.state_dir):
            if os.path.islink(folder):
                raise StateError(
                    folder, "is a symbolic link: tfrecordd never follows one in state_dir"
                )
        if not self.fsync:
            return
        try:
            sync_folders(self.fs, self.state_root, os.path.join(self.state_dir, "-"))
        except OSError as e:
            raise DurabilityError(
                f"source {self.name}: fsync of its state folder {self.state_dir}: {e.strerror or e}"
            ) from e

    def connect(self, send: MemoryObjectSendStream[RawBatch]) -> None:
        """Send into ``send`` from now on (the source's own clone of the pipeline's stream)."""
        self._send = send
        self._m.show_source(self.source_state)  # running: up unless it says otherwise

    async def send(self, batch: RawBatch) -> None:
        assert self._send is not None, "send before run"
        # A source cancelled since its last send stops here, before the pipeline (which may be
        # closing) is touched: its previous send returned without raising it (below).
        await anyio.lowlevel.checkpoint_if_cancelled()
        try:
            try:
                self._send.send_nowait(batch)
            except anyio.WouldBlock:
                await self._send_when_room(batch, self._send)
                waited = True
            else:
                waited = False
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as e:
            # The daemon is stopping: no input boundary may take this for its input's fault.
            raise PipelineClosedError(f"source {self.name}: the pipeline is closed") from e
        self.sent += 1
        self._received.inc(len(batch.events))
        # A source that finds room keeps making batches without waiting: let the other stages
        # run between two batches (the workers' results, the writer's trips to its thread), or a
        # source with a big chunk of input holds the event loop for all of it. Shielded: the
        # batch is the pipeline's now, and a cancellation raised here would tell the source it
        # was not sent (the UDP source counted such events as dropped at shutdown, yet they
        # were written). The source meets the cancellation at its next send or wait.
        if not waited:
            await anyio.lowlevel.cancel_shielded_checkpoint()

    async def _send_when_room(
        self, batch: RawBatch, stream: MemoryObjectSendStream[RawBatch]
    ) -> None:
        t0 = time.monotonic()
        try:
            with anyio.move_on_after(PAUSE_LOG_AFTER) as scope:
                await stream.send(batch)
            if scope.cancelled_caught:
                log.info("source %s: paused by backpressure (the output is behind)", self.name)
                await stream.send(batch)
                log.info("source %s: resumed after %.1fs", self.name, time.monotonic() - t0)
        finally:
            self._backpressure.inc(time.monotonic() - t0)

    def count_dropped(self, reason: str, n: int = 1) -> None:
        self._m.events_dropped.labels(self.name, reason).inc(n)

    def count_refused(self, reason: str, n: int = 1) -> None:
        self._m.inputs_refused.labels(self.name, reason).inc(n)
