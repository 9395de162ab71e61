"""The daemon: sources → encoder → shard writer → committer, under one anyio task group.

This plays the role TensorFlow's ``QueueRunner`` threads and ``Coordinator`` once did. Bounded
memory object streams are the queues (a full stream pauses the producers), each source owns a
clone of the send side (the stream ends by itself when the last source stops), and stopping is
a cancel scope, not a flag. Blocking work (file writes, compression, fsync, encoding) runs in
worker threads so the event loop keeps serving sockets and metrics.

The stages are modules of :mod:`tfrecordd.pipeline`: encode (:class:`EncodeStage`), write
(:class:`WriteStage`), commit (:class:`Committer`) and recovery. A batch large enough
(:data:`~tfrecordd.pipeline.encoding.PACK_MIN_BYTES` framed) is framed and compressed where it
was encoded into a compression unit of its own, which the shard appends as it is: compression
grows with ``encode_workers`` like encoding does. A shard is committed (fsync, journal, publish,
acks) in a task of its own while the writer fills the next one; commits run one at a time, in
order (:meth:`WriteStage.commit`).

:class:`Daemon` keeps the lifecycle (locks, start, drain, clean-up), signals, the watchdog, the
wiring of the stages, and each source's task (stopped alone by a reload: :mod:`.reload`).
"""

from __future__ import annotations

import logging
import os
import signal
import time

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from tfrecordd import crashpoints, descriptors
from tfrecordd.config import DaemonConfig
from tfrecordd.endpoints import split_host_port
from tfrecordd.errors import DurabilityError
from tfrecordd.fsys import LOCAL, FileSystem
from tfrecordd.metrics import Metrics, serve
from tfrecordd.notify import SystemdNotifier
from tfrecordd.outputs import make_output
from tfrecordd.pipeline import heldfiles
from tfrecordd.pipeline.commit import Committer
from tfrecordd.pipeline.datasets import completions, dataset_outputs, manifest_writers
from tfrecordd.pipeline.encode import EncodeStage
from tfrecordd.pipeline.encodeplan import plan_encoding
from tfrecordd.pipeline.encoding import EncodedBatch
from tfrecordd.pipeline.recovery import recover
from tfrecordd.pipeline.reload import Reloader
from tfrecordd.pipeline.sourcerun import SourceRun
from tfrecordd.pipeline.write import WriteStage
from tfrecordd.plugin import RawBatch, Registry, Source, SourceState
from tfrecordd.state import statelock
from tfrecordd.state.deadletter import DeadLetters
from tfrecordd.state.journal import Journal

log = logging.getLogger("tfrecordd")

STATE_CHECK_INTERVAL = 1.0
"""Seconds between checks that the journal and checkpoint are still the files this daemon writes:
one removed or replaced (``state_dir`` deleted, a backup put back) stops the daemon (exit 74)
within about this long, even when no commit comes. The same check covers everything else the
daemon keeps open (:meth:`Daemon.check_held`)."""

CHECK_STALE_AFTER = 30.0
"""``/healthz`` answers 503 once the periodic check has not finished for this long (a ``stat``
hanging on a lost network file system, say)."""

ACKS_STUCK_AFTER = 120.0
"""``/healthz`` answers 503 once a source has failed to acknowledge for this long: every later
commit, of every source, waits behind those acks (as with a writer stuck that long)."""


class Daemon:
    """One tfrecordd process's pipeline. ``await run()`` until stopped."""

    def __init__(
        self,
        config: DaemonConfig,
        *,
        fs: FileSystem = LOCAL,
        metrics: Metrics | None = None,
        notifier: SystemdNotifier | None = None,
        handle_signals: bool = True,
        config_path: str | None = None,
    ) -> None:
        """``config_path``: the file a reload (SIGHUP) reads (``None``: ``config.path``)."""
        self.config = config
        self.config_path = config_path or (str(config.path) if config.path else None)
        self.fs = fs
        self.metrics = metrics or Metrics()
        self.notifier = notifier or SystemdNotifier()
        self.handle_signals = handle_signals
        self.outputs = {
            name: make_output(config, fs, self.metrics, name) for name in config.datasets
        }
        self.state_dir = str(config.daemon.state_dir)
        self.fsync = any(d.fsync for d in config.datasets.values())
        self.sources: dict[str, Source] = {s.name: s.build() for s in config.sources}
        if crashpoints.armed() is not None:
            declared = [p for s in config.sources for p in type(s).crash_points]
            crashpoints.check_armed([*Registry.from_entry_points().crash_points(), *declared])
        self.contexts: dict[str, SourceRun] = {}
        for name, src in list(self.sources.items()):
            self.attach(name, src)
        self.encode = EncodeStage(
            plan_encoding(config), workers=config.daemon.encode_workers, metrics=self.metrics
        )
        # Kept by reference in the journal: a reload adds its new sources' folds and types.
        self.folds = {name: type(src).fold for name, src in self.sources.items()}
        self.source_types = {s.name: s.type for s in config.sources}
        self.journal = Journal(
            self.state_dir, fs, folds=self.folds, fsync=self.fsync, types=self.source_types
        )
        self.dead_letters = DeadLetters(
            self.state_dir,
            fs,
            config.daemon.dead_letter_max_bytes,
            fsync=self.fsync,
            on_repair=self.metrics.watch_repairs.labels("dead_letters").inc,
        )
        descriptors.reserve_for_shards(sum(d.max_open_shards for d in config.datasets.values()))
        self.completions = completions(config, self.outputs, self.state_dir, fs)
        self.committer = Committer(
            outputs=self.outputs,
            journal=self.journal,
            sources=self.sources,
            dead_letters=self.dead_letters,
            metrics=self.metrics,
            fsync=self.fsync,
            manifests=manifest_writers(config, self.outputs),
            completions=self.completions,
            fsyncs={name: d.fsync for name, d in config.datasets.items()},
        )
        self.write = WriteStage(
            dataset_outputs(config, self.outputs, self.completions), self.committer, fs=fs
        )
        self.metrics_port: int | None = None
        self._sources_scope: anyio.CancelScope | None = None
        self.sources_tg: TaskGroup | None = None
        self._raw_send: MemoryObjectSendStream[RawBatch] | None = None
        self._source_scopes: dict[str, tuple[anyio.CancelScope, anyio.Event]] = {}
        """Per running source, the scope that stops it alone and the event set once it has."""
        self.reloader = Reloader(self)
        self._pipeline_scope: anyio.CancelScope | None = None
        self._stopping = False
        self._running = False
        self._state_lock = -1
        self._node_locks: dict[str, int] = {}
        """Per dataset, the lock held on this node's staging folder."""
        self._checked_at = time.monotonic()

    def attach(self, name: str, src: Source) -> None:
        """Make ``src`` the source ``name``, with a context of its own (made of :attr:`config`)."""
        self.sources[name] = src
        self.contexts[name] = ctx = SourceRun(self, name)
        src.attach(ctx)

    # -- control ---------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop reading, drain, publish what is open within ``drain_timeout``, then return."""
        if self._stopping:
            return
        self._stopping = self.write.draining = True
        log.info("stopping: draining within %.1fs", self.config.daemon.drain_timeout)
        self.notifier.stopping("draining")
        if self._sources_scope is not None:
            self._sources_scope.cancel()
        deadline = time.monotonic() + self.config.daemon.drain_timeout
        # An upload retrying in the committer's thread cannot be cancelled: its budget is cut,
        # whichever dataset's output it goes to.
        for out in self.outputs.values():
            out.stop_retrying_at(deadline)
        if self._pipeline_scope is not None:
            self._pipeline_scope.deadline = deadline

    def request_flush(self) -> None:
        """Publish the open shards now (what SIGUSR1 does)."""
        self.write.request_flush()

    def healthy(self, now: float | None = None) -> bool:
        """True while the pipeline runs, the writer loop is not stuck, the periodic check of
        what the daemon keeps open finishes (as of ``now``, a :func:`time.monotonic` reading;
        default: the present) and no source has failed to acknowledge for 2 minutes."""
        now = time.monotonic() if now is None else now
        return (
            self._running
            and now - self.write.beat < 120
            and now - self._checked_at < CHECK_STALE_AFTER
            and all(s.down_for("acking") < ACKS_STUCK_AFTER for s in self.source_states())
        )

    def source_states(self) -> list[SourceState]:
        """Each source's state, as it reports it (``/readyz``)."""
        return [ctx.source_state for ctx in self.contexts.values()]

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Recover, start everything, and run until stopped (or until every source ends)."""
        self._sources_scope = anyio.CancelScope()
        self._pipeline_scope = anyio.CancelScope()
        if self._stopping:
            self._sources_scope.cancel()
        os.makedirs(self.state_dir, exist_ok=True)
        self._state_lock = statelock.acquire(self.state_dir)
        try:
            await self._run_locked(self._pipeline_scope, task_status)
        finally:
            os.close(self._state_lock)

    async def _run_locked(
        self, pipeline_scope: anyio.CancelScope, task_status: TaskStatus[None]
    ) -> None:
        try:
            for name, out in self.outputs.items():
                os.makedirs(out.staging_dir, exist_ok=True)
                self._node_locks[name] = statelock.acquire_folder(
                    out.staging_dir, self.config.daemon.node_id
                )
            await self._run_pipeline(pipeline_scope, task_status)
        finally:
            for fd in self._node_locks.values():
                os.close(fd)
            self._node_locks.clear()

    async def _run_pipeline(
        self, pipeline_scope: anyio.CancelScope, task_status: TaskStatus[None]
    ) -> None:
        if self.fsync:
            # Each staging folder's own entry (and its parent's) durable before any shard in it
            # is journalled.
            for out in self.outputs.values():
                for parent in (
                    os.path.dirname(out.staging_dir),
                    os.path.dirname(os.path.dirname(out.staging_dir)),
                ):
                    try:
                        self.fs.fsync_dir(parent)
                    except OSError as e:
                        raise DurabilityError(f"{parent}: fsync: {e.strerror or e}") from e
        raw_send, raw_recv = anyio.create_memory_object_stream[RawBatch](
            self.config.daemon.queue_batches
        )
        enc_send, enc_recv = anyio.create_memory_object_stream[EncodedBatch](
            self.config.daemon.queue_batches
        )
        try:
            await recover(
                self.journal,
                self.outputs,
                self.sources,
                contexts=self.contexts,
                fs=self.fs,
                node_id=self.config.daemon.node_id,
                manifests=self.committer.manifests,
                metrics=self.metrics,
            )
            async with anyio.create_task_group() as services:
                if self.config.metrics.enabled:
                    host, port = split_host_port(self.config.metrics.listen)
                    checks = (self.healthy, self.source_states, self.write.held_back)
                    self.metrics_port = await services.start(
                        serve, host, port, self.metrics, *checks
                    )
                if self.handle_signals:
                    await services.start(self._signals)
                services.start_soon(self.reloader.run)
                services.start_soon(self._watchdog)
                services.start_soon(self._watch_state)
                self._checked_at = time.monotonic()
                self._running = True
                self.metrics.up.set(1)
                self.metrics.config_reload_success.set(time.time())
                self.notifier.ready(f"running {len(self.sources)} source(s)")
                log.info(
                    "started: node %s, %d source(s), %s",
                    self.config.daemon.node_id,
                    len(self.sources),
                    ", ".join(
                        f"dataset {n} to {o.location} ({self.config.datasets[n].compression})"
                        for n, o in self.outputs.items()
                    ),
                )
                task_status.started()
                if self._stopping:
                    pipeline_scope.deadline = time.monotonic() + self.config.daemon.drain_timeout
                with pipeline_scope:
                    async with anyio.create_task_group() as pipeline:
                        pipeline.start_soon(self._run_sources, raw_send)
                        pipeline.start_soon(self.encode.run, raw_recv, enc_send)
                        pipeline.start_soon(self.write.run, enc_recv)
                if pipeline_scope.cancelled_caught:
                    log.error("drain did not finish within drain_timeout; open work will replay")
                services.cancel_scope.cancel()
        finally:
            self._running = False
            self.metrics.up.set(0)
            for stream in (raw_send, raw_recv, enc_send, enc_recv):
                stream.close()
            with anyio.CancelScope(shield=True):
                await self._cleanup()

    async def _cleanup(self) -> None:
        if await self.write.discard():
            self.metrics.shards_discarded.inc()
        for name, src in self.sources.items():
            try:
                await src.aclose()
            except Exception:
                log.exception("source %s: error while closing", name)
        try:
            await anyio.to_thread.run_sync(self.dead_letters.close)
        except OSError as e:
            # Only dead letters of uncommitted batches can be unsynced here: their events were
            # not acknowledged and replay. Raising would hide the error that stopped the daemon.
            log.error("dead letters: fsync at close failed: %s", e.strerror or e)
        self.journal.close()

    async def _signals(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
        with anyio.open_signal_receiver(*handled) as signals:
            # Started only now: a SIGTERM sent as soon as "started" is logged (or READY=1 sent)
            # drains, rather than killing the process with the default action.
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGUSR1:
                    log.info("SIGUSR1: publishing open shards")
                    self.request_flush()
                elif signum == signal.SIGHUP:
                    self.reloader.request()
                elif self._stopping:
                    # 128 + the signal's number, as a shell reports a process the signal killed.
                    name = signal.Signals(signum).name
                    log.warning("second %s: exiting at once (status %d)", name, 128 + signum)
                    os._exit(128 + signum)
                else:
                    log.info("%s received", signal.Signals(signum).name)
                    self.request_stop()

    async def _watch_state(self) -> None:
        # A state_dir removed or replaced while the daemon is idle would otherwise go unnoticed
        # until the next commit, which may be hours away (or never, before a SIGKILL).
        while True:
            await anyio.sleep(STATE_CHECK_INTERVAL)
            await anyio.to_thread.run_sync(self.check_held)
            self._checked_at = time.monotonic()
            self.metrics.watch_checked.set(time.time())

    def check_held(self) -> None:
        """Check that every file and folder the daemon keeps open is still the one its path
        names (blocking; run once a second). The journal and checkpoint removed or replaced,
        and the staging folder, stop the daemon (:class:`DurabilityError`, exit 74); the
        dead-letter file and the state lock are made again at their path."""
        self.journal.check_files()
        self.dead_letters.check()
        self._check_state_lock()
        self._check_staging()

    def _check_state_lock(self) -> None:
        self._state_lock = heldfiles.relock_state(self.state_dir, self._state_lock, self.metrics)

    def _check_staging(self) -> None:
        heldfiles.check_staging(self._node_locks, self.outputs)

    async def _watchdog(self) -> None:
        interval = self.notifier.watchdog_interval()  # already half of WatchdogSec
        if not interval:
            return
        while True:
            await anyio.sleep(interval)
            if self.healthy():
                self.notifier.watchdog()

    # -- stages ----------------------------------------------------------------------------

    async def _run_sources(self, raw_send: MemoryObjectSendStream[RawBatch]) -> None:
        assert self._sources_scope is not None
        async with raw_send:
            with self._sources_scope:
                async with anyio.create_task_group() as self.sources_tg:
                    self._raw_send = raw_send
                    for name in self.sources:
                        self.start_source(name)
                self.sources_tg = self._raw_send = None

    def start_source(self, name: str) -> bool:
        """Start running source ``name`` (as :attr:`sources` and the contexts hold it); whether
        it was (not once the sources have stopped)."""
        if self.sources_tg is None or self._raw_send is None:
            return False
        scope, done = self._source_scopes[name] = (anyio.CancelScope(), anyio.Event())
        src, send = self.sources[name], self._raw_send.clone()
        self.sources_tg.start_soon(self._run_source, name, src, send, scope, done)
        return True

    async def stop_source(self, name: str) -> None:
        """Stop reading source ``name`` and wait until it has stopped (what it sent before goes
        through the pipeline as usual)."""
        if (entry := self._source_scopes.pop(name, None)) is not None:
            entry[0].cancel()
            await entry[1].wait()

    async def _run_source(
        self,
        name: str,
        src: Source,
        send: MemoryObjectSendStream[RawBatch],
        scope: anyio.CancelScope,
        done: anyio.Event,
    ) -> None:
        ctx = self.contexts[name]
        try:
            with scope:
                async with send:
                    ctx.connect(send)
                    await src.run(ctx)
                log.info("source %s: finished", name)
        finally:
            done.set()
