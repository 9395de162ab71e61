"""Prometheus metrics on a registry of tfrecordd's own, served over anyio with ``/healthz`` (the
daemon lives) and ``/readyz`` (and every source serves).

Names follow Prometheus conventions: prefix ``tfrecordd_``, counters end in ``_total``, sizes in
bytes, times in seconds. Labels come from configuration (source, encoder, stage, reason),
never from event content or file names.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias

import anyio
import orjson
from anyio.abc import SocketListener, SocketStream, TaskGroup
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from tfrecordd import __version__, descriptors

if TYPE_CHECKING:
    from tfrecordd.plugin import SourceState

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    """Every metric the daemon exports, on one registry (a fresh one per daemon: tests stay
    independent of each other)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry(auto_describe=True)
        self.build_info = Info("tfrecordd_build", "Version of the running daemon.", registry=r)
        self.build_info.info({"version": __version__})
        self.events_received = Counter(
            "tfrecordd_events_received_total",
            "Events read by sources (JSON lines read in bulk: counted as they are split).",
            ["source"],
            registry=r,
        )
        self.events_invalid = Counter(
            "tfrecordd_events_invalid_total",
            "Events that could not be encoded, by reason.",
            ["source", "reason"],
            registry=r,
        )
        self.events_dead_lettered = Counter(
            "tfrecordd_events_dead_lettered_total",
            "Events written to the dead-letter file.",
            ["source"],
            registry=r,
        )
        self.events_dropped = Counter(
            "tfrecordd_events_dropped_total",
            "Events dropped on purpose (a datagram source facing a full pipeline), by reason.",
            ["source", "reason"],
            registry=r,
        )
        self.inputs_refused = Counter(
            "tfrecordd_inputs_refused_total",
            "Inputs refused before they became events (symlinks, FIFOs in a spool; connections "
            "refused or closed idle by a socket source), by reason.",
            ["source", "reason"],
            registry=r,
        )
        self.events_acked = Counter(
            "tfrecordd_events_acked_total",
            "Events whose source positions were acknowledged after publishing.",
            ["source"],
            registry=r,
        )
        self.dead_letters_discarded = Counter(
            "tfrecordd_dead_letters_discarded_total",
            "Dead letters deleted when the dead-letter files rotated past their cap.",
            registry=r,
        )
        self.records_written = Counter(
            "tfrecordd_records_written_total",
            "Records written to shards.",
            ["dataset"],
            registry=r,
        )
        self.raw_bytes_written = Counter(
            "tfrecordd_raw_bytes_written_total",
            "Framed record bytes written, before compression.",
            ["dataset"],
            registry=r,
        )
        self.file_bytes_written = Counter(
            "tfrecordd_compressed_bytes_written_total",
            "Bytes written to shard files, after compression.",
            ["dataset"],
            registry=r,
        )
        self.shards_published = Counter(
            "tfrecordd_shards_published_total", "Shards published.", ["dataset"], registry=r
        )
        self.shards_discarded = Counter(
            "tfrecordd_shards_discarded_total",
            "In-progress shards discarded (at recovery or after a write error).",
            registry=r,
        )
        self.partition_fallbacks = Counter(
            "tfrecordd_partition_fallbacks_total",
            "Records filed under a partition field's fallback value (_other): the value was "
            "missing, not a safe folder name, or past max_partitions.",
            ["dataset", "reason"],
            registry=r,
        )
        self.events_late = Counter(
            "tfrecordd_events_late_total",
            "Records whose time partition was already marked complete: dead-lettered (reason "
            "late) or written under _late/, as completion.late says.",
            ["dataset"],
            registry=r,
        )
        self.partitions_completed = Counter(
            "tfrecordd_partitions_completed_total",
            "Time partitions closed and marked complete (their marker published).",
            ["dataset"],
            registry=r,
        )
        self.partitions_pending = Gauge(
            "tfrecordd_partitions_pending",
            "Time partitions holding (or about to hold) shards and not yet marked complete.",
            ["dataset"],
            registry=r,
        )
        self.watermark = Gauge(
            "tfrecordd_watermark_timestamp_seconds",
            "The latest record time seen in a dataset with completion markers (event or "
            "arrival time; 0 before the first).",
            ["dataset"],
            registry=r,
        )
        self.last_publish = Gauge(
            "tfrecordd_last_publish_timestamp_seconds",
            "Unix time of the last shard published (0 before the first).",
            registry=r,
        )
        self.open_shards = Gauge(
            "tfrecordd_open_shards",
            "Shards open (one per partition folder written to; at most max_open_shards).",
            ["dataset"],
            registry=r,
        )
        self.open_shard_bytes = Gauge(
            "tfrecordd_open_shard_bytes",
            "Bytes on disk of the open shards.",
            ["dataset"],
            registry=r,
        )
        self.open_shard_records = Gauge(
            "tfrecordd_open_shard_records",
            "Records in the open shards.",
            ["dataset"],
            registry=r,
        )
        self.open_shard_age = Gauge(
            "tfrecordd_open_shard_age_seconds",
            "Age of the oldest open shard's first record (0 when none is open).",
            ["dataset"],
            registry=r,
        )
        self.publish_duration = Histogram(
            "tfrecordd_publish_duration_seconds",
            "Time to commit a shard: end stream, fsync, journal, publish, directory fsync.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.fsync_duration = Histogram(
            "tfrecordd_fsync_duration_seconds",
            "Time spent in one fsync of a shard, the journal or a directory.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ack_duration = Histogram(
            "tfrecordd_ack_duration_seconds",
            "Time for a source to acknowledge the positions of one published shard.",
            ["source"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stream_depth = Gauge(
            "tfrecordd_stream_depth_batches",
            "Batches waiting in the stream in front of a stage.",
            ["stage"],
            registry=r,
        )
        self.backpressure = Counter(
            "tfrecordd_backpressure_seconds_total",
            "Time sources spent waiting on a full pipeline.",
            ["source"],
            registry=r,
        )
        self.output_free_bytes = Gauge(
            "tfrecordd_output_free_bytes",
            "Free bytes (for unprivileged users) on the file system of the dataset's output "
            "directory (its staging folder, for an object store).",
            ["dataset"],
            registry=r,
        )
        self.paused = Gauge(
            "tfrecordd_paused",
            "1 while the daemon holds its sources back because the output cannot take more "
            "(a full disk), else 0.",
            registry=r,
        )
        self.disk_full_pauses = Counter(
            "tfrecordd_disk_full_pauses_total",
            "Times the daemon paused because the output's file system was nearly full.",
            registry=r,
        )
        self.upload_errors = Counter(
            "tfrecordd_upload_errors_total",
            "Object-store upload failures by kind: transient (retried), exhausted (retries past "
            "[output].retry_for, or cut short by a drain), permanent, exists (another object "
            "under a shard's name), verify (read-back mismatch), staged (staged copy damaged).",
            ["kind"],
            registry=r,
        )
        self.upload_retries = Counter(
            "tfrecordd_upload_retries_total",
            "Object-store uploads retried after a transient error.",
            registry=r,
        )
        self.journal_bytes = Gauge(
            "tfrecordd_journal_bytes", "Size of the commit journal.", registry=r
        )
        self.recovered = Counter(
            "tfrecordd_recovery_commits_total",
            "Commits found at start-up, by outcome (redone, dropped).",
            ["outcome"],
            registry=r,
        )
        self.endpoint_errors = Counter(
            "tfrecordd_metrics_endpoint_errors_total",
            "Troubles of the metrics endpoint, by reason: accept_failed (accept() failed, out "
            "of file descriptors say; retried after a pause), descriptors (closed at once: "
            "fewer than 32 file descriptors left, kept for commits), evicted (an unanswered "
            "connection closed to make room for a newer one), timeout (a connection that did "
            "not send its request and read the answer in time).",
            ["reason"],
            registry=r,
        )
        self.up = Gauge(
            "tfrecordd_up", "1 while the pipeline runs, 0 while starting or stopping.", registry=r
        )
        self._reconnects: dict[str, int] = {}
        self.source_up = Gauge(
            "tfrecordd_source_up",
            "1 while a source runs and serves, 0 while it reports that it cannot read, "
            "acknowledge or accept its clients (/readyz says why).",
            ["source"],
            registry=r,
        )
        self.source_errors = Counter(
            "tfrecordd_source_errors_total",
            "Failures a source reported, by what failed: reading (its server or input out of "
            "reach), acking (published positions not acknowledged), accepting (its listener).",
            ["source", "what"],
            registry=r,
        )
        self.source_last_error = Gauge(
            "tfrecordd_source_last_error_timestamp_seconds",
            "Unix time of a source's last reported failure (0 before the first).",
            ["source"],
            registry=r,
        )
        self.source_reconnects = Counter(
            "tfrecordd_source_reconnects_total",
            "Attempts to bring back a source that was down: reconnects, retried acks, a "
            "listener opened again (each failed retry, and the one that worked).",
            ["source"],
            registry=r,
        )
        self.watch_repairs = Counter(
            "tfrecordd_watch_repairs_total",
            "Files the daemon keeps open that were removed or replaced while it ran and were "
            "made again at their path, by what: dead_letters (later dead letters go to the new "
            "file, those that may have gone to the old one are copied), state_lock (the lock "
            "taken again on the new file).",
            ["what"],
            registry=r,
        )
        for what in ("dead_letters", "state_lock"):
            self.watch_repairs.labels(what)
        self.watch_checked = Gauge(
            "tfrecordd_watch_last_check_timestamp_seconds",
            "Unix time of the last check that every file and folder the daemon keeps open is "
            "still the one its path names (once a second; 0 before the first).",
            registry=r,
        )
        self.config_reloads = Counter(
            "tfrecordd_config_reloads_total",
            "Config reloads (SIGHUP), by result: applied (the new config runs), unchanged (the "
            "file says what runs already), failed (invalid, or a key that cannot change live: "
            "the old config keeps running).",
            ["result"],
            registry=r,
        )
        for result in ("applied", "unchanged", "failed"):
            self.config_reloads.labels(result)
        self.config_reload_success = Gauge(
            "tfrecordd_config_last_reload_success_timestamp_seconds",
            "Unix time the config running now was loaded (at start, or by the last reload "
            "that applied).",
            registry=r,
        )

    def show_source(self, state: SourceState, failed: str | None = None) -> None:
        """Set a source's series from its state, at start and at every change (``failed``: what
        failed just now, if that is the change)."""
        name = state.name
        self.source_up.labels(name).set(1 if state.up else 0)
        self.source_last_error.labels(name).set(state.last_error_at)
        if failed is not None:
            self.source_errors.labels(name, failed).inc()
        seen = self._reconnects.get(name, 0)
        self.source_reconnects.labels(name).inc(state.reconnects - seen)
        self._reconnects[name] = state.reconnects

    def render(self) -> bytes:
        """The metrics in Prometheus text format."""
        return generate_latest(self.registry)


MAX_CONNECTIONS = 32
"""Connections the metrics endpoint serves at once: a newer one closes the oldest still sending
its request."""

REQUEST_TIMEOUT = 5.0
"""Seconds a connection has to send its request and read the answer."""

_KEEP_DESCRIPTORS = 32
"""A connection leaving fewer descriptors free is closed at once (they are for commits)."""


async def serve(
    host: str,
    port: int,
    metrics: Metrics,
    healthy: Callable[[], bool],
    sources: Callable[[], Sequence[SourceState]] = tuple,
    held: Callable[[], Sequence[str]] = tuple,
    *,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/metrics``, ``/healthz`` (``healthy``) and ``/readyz`` (:func:`readiness`) over
    HTTP/1.0 until cancelled; reports the bound port.

    No client can end the daemon through it: at most :data:`MAX_CONNECTIONS` are served at once
    (a new one closes the oldest still sending its request), each for at most
    :data:`REQUEST_TIMEOUT`, and a failing ``accept()`` (out of file descriptors) is retried
    after a pause. Each case is counted in ``tfrecordd_metrics_endpoint_errors_total``."""
    errors = metrics.endpoint_errors
    for reason in ("accept_failed", "descriptors", "evicted", "timeout"):
        errors.labels(reason)
    conns: dict[int, anyio.CancelScope] = {}  # oldest first
    answering: set[int] = set()
    ids = iter(range(1 << 62))

    async def handle(stream: SocketStream, cid: int, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                async with stream:
                    ask = lambda: answering.add(cid)  # noqa: E731
                    await _answer(stream, metrics, (healthy, sources, held), ask)
            if scope.cancelled_caught and cid in conns:
                errors.labels("timeout").inc()
        finally:
            conns.pop(cid, None)
            answering.discard(cid)

    def evict() -> None:
        # The oldest still sending its request: a scrape being answered is left to finish.
        cid = next((c for c in conns if c not in answering), next(iter(conns)))
        conns.pop(cid).cancel()
        errors.labels("evicted").inc()

    async def accept_loop(listener: SocketListener, tg: TaskGroup) -> None:
        backoff = descriptors.Backoff()
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:
                if backoff.failures == 0:
                    log.warning("metrics endpoint: accept failed (%s); retrying", e)
                errors.labels("accept_failed").inc()
                if conns:
                    evict()  # frees a descriptor
                await anyio.sleep(backoff.failed())
                continue
            if failures := backoff.succeeded():
                log.info("metrics endpoint: accepting again after %d failure(s)", failures)
            fd = stream.extra(anyio.abc.SocketAttribute.raw_socket).fileno()
            if descriptors.scarce(fd, _KEEP_DESCRIPTORS):
                # The last descriptors are for commits: a scrape is worth less than a shard.
                errors.labels("descriptors").inc()
                await stream.aclose()
                await anyio.sleep(0.05)
                continue
            while len(conns) >= MAX_CONNECTIONS:
                evict()
            cid = next(ids)
            scope = conns[cid] = anyio.CancelScope(deadline=anyio.current_time() + REQUEST_TIMEOUT)
            tg.start_soon(handle, stream, cid, scope)

    multi = await anyio.create_tcp_listener(local_host=host, local_port=port)
    bound = multi.extra(anyio.abc.SocketAttribute.local_port)
    log.info("metrics listening on %s:%d", host, bound)
    task_status.started(bound)
    async with multi, anyio.create_task_group() as tg:
        for listener in multi.listeners:
            assert isinstance(listener, SocketListener)
            tg.start_soon(accept_loop, listener, tg)


_Checks: TypeAlias = (
    "tuple[Callable[[], bool], Callable[[], Sequence[SourceState]], Callable[[], Sequence[str]]]"
)
_Ready: TypeAlias = tuple[bool, bytes]


async def _answer(
    stream: SocketStream,
    metrics: Metrics,
    checks: _Checks,
    requested: Callable[[], None],
) -> None:
    try:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 8192:
            head += await stream.receive(4096)
    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
        return
    requested()
    parts = head.split(b"\r\n", 1)[0].split()
    target = parts[1].decode("latin-1") if len(parts) >= 2 else ""
    path = target.split("?", 1)[0]
    if path == "/metrics":
        status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, metrics.render()
    elif path in ("/healthz", "/readyz"):
        healthy, sources, held = checks
        if path == "/healthz":
            ok = healthy()
            ctype, body = "text/plain; charset=utf-8", b"ok\n" if ok else b"unhealthy\n"
        else:
            ok, body = readiness(healthy(), sources(), held())
            ctype = "application/json"
        status = "200 OK" if ok else "503 Service Unavailable"
    else:
        status, ctype, body = "404 Not Found", "text/plain; charset=utf-8", b"not found\n"
    resp = (
        f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1") + body
    with contextlib.suppress(anyio.BrokenResourceError, OSError):
        await stream.send(resp)


def readiness(healthy: bool, sources: Sequence[SourceState], held: Sequence[str] = ()) -> _Ready:
    """Whether the daemon is ready (healthy, nothing ``held``: draining, paused for disk space;
    every source up), and ``/readyz``'s JSON body: ``ready``, ``healthy``, each source's state
    (:meth:`SourceState.as_dict`), and ``not_ready``, one line for each thing not and why."""
    not_ready = [] if healthy else ["daemon: not running, or its pipeline is stuck (/healthz)"]
    not_ready += held
    for s in sources:
        why = "; ".join(f"{what}: {reason}" for what, (reason, _) in sorted(s.down.items()))
        not_ready += [f"source {s.name}: {why}"] if why else []
    body = {
        "ready": not not_ready,
        "healthy": healthy,
        "not_ready": not_ready,
        "sources": {s.name: s.as_dict() for s in sources},
    }
    return not not_ready, orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE)


class Stopwatch:
    """Measures elapsed monotonic time into a histogram."""

    __slots__ = ("_h", "_t")

    def __init__(self, histogram: Histogram) -> None:
        self._h = histogram
        self._t = 0.0

    def __enter__(self) -> Stopwatch:
        self._t = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self._h.observe(time.monotonic() - self._t)
