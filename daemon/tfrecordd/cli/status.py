"""``tfrecordd status``: a live view of a running daemon, from its metrics endpoint.

``tfrecordd status [--url URL] [--once] [--json] [--interval 2s]`` scrapes the daemon's
``/metrics`` (and ``/readyz`` beside it) every ``--interval`` and shows, per source: the
**rate** of events received per second between the last two scrapes; **pending** events,
received but not yet in a published, durable shard (received minus acknowledged); **blocked**,
the share of the interval spent waiting on a full pipeline; its **state**: up, or down since
when and why, and its reconnect attempts. For the daemon: records written (in published shards,
and in open ones), shards published and the time since the last publish, the open shards, dead
letters, the batches queued in front of each stage and free bytes on the output; per dataset:
records, shards, open shards, time partitions pending and completed, late events, the watermark.

Live mode redraws in place on a terminal (ANSI home and erase, no curses) and prints one frame
after another elsewhere; Ctrl-C ends it with exit 0. ``--once`` scrapes twice, ``--interval``
apart, and prints one snapshot with real rates (``--interval 0``: one scrape, no rates).
``--json`` prints each snapshot as one JSON object per line. A daemon that cannot be reached on
the first scrape is an error (exit 1); later, live mode says so and keeps trying.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from prometheus_client.parser import text_string_to_metric_families

from tfrecordd.cli import help_of
from tfrecordd.cli.health import describe_state, readiness, source_state
from tfrecordd.endpoints import METRICS_URL, local_url
from tfrecordd.errors import EXIT_FAILURE, EXIT_OK
from tfrecordd.units import parse_duration

__all__ = ["DEFAULT_URL", "Snapshot", "add_commands", "scrape", "view"]

DEFAULT_URL = METRICS_URL
"""Where the daemon serves its metrics unless configured otherwise."""

_CLEAR = "\x1b[H\x1b[2J"
_MAX_BODY = 16 << 20

# A proxy from the environment must not stand between the view and a daemon on this host.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Unreachable(Exception):
    """The metrics endpoint did not answer with metrics."""


@dataclass(slots=True)
class SourceTotals:
    """One source's counters at one scrape."""

    received: float = 0.0
    acked: float = 0.0
    invalid: float = 0.0
    dead_lettered: float = 0.0
    dropped: float = 0.0
    refused: float = 0.0
    backpressure_seconds: float = 0.0


@dataclass(slots=True)
class DatasetTotals:
    """One dataset's figures at one scrape; ``None`` where its daemon exports none (the
    completion figures of a dataset without completion markers)."""

    records_written: float = 0.0
    compressed_bytes_written: float = 0.0
    shards_published: float = 0.0
    open_shards: float = 0.0
    open_shard_bytes: float = 0.0
    open_shard_records: float = 0.0
    open_shard_age: float = 0.0
    partitions_pending: float | None = None
    partitions_completed: float | None = None
    watermark: float | None = None
    events_late: float | None = None
    partition_fallbacks: float = 0.0


@dataclass(slots=True)
class Snapshot:
    """What one scrape of ``/metrics`` says, read into the figures the view needs."""

    taken: float
    """Monotonic time of the scrape."""
    wall: float
    """Unix time of the scrape."""
    version: str = "?"
    up: bool = False
    paused: bool | None = None
    shards_published: float = 0.0
    records_written: float = 0.0
    compressed_bytes_written: float = 0.0
    last_publish: float = 0.0
    open_shards: float = 0.0
    open_shard_bytes: float = 0.0
    open_shard_records: float = 0.0
    open_shard_age: float = 0.0
    output_free_bytes: float | None = None
    dead_letters_discarded: float = 0.0
    stream_depth: dict[str, float] = field(default_factory=dict)
    sources: dict[str, SourceTotals] = field(default_factory=dict)
    datasets: dict[str, DatasetTotals] = field(default_factory=dict)
    ready: dict[str, Any] | None = None  # /readyz's answer (None from a daemon before it)


_SOURCE_COUNTERS = {
    "tfrecordd_events_received_total": "received",
    "tfrecordd_events_acked_total": "acked",
    "tfrecordd_events_invalid_total": "invalid",
    "tfrecordd_events_dead_lettered_total": "dead_lettered",
    "tfrecordd_events_dropped_total": "dropped",
    "tfrecordd_inputs_refused_total": "refused",
    "tfrecordd_backpressure_seconds_total": "backpressure_seconds",
}
_SHARD_FIGURES = {
    "tfrecordd_shards_published_total": "shards_published",
    "tfrecordd_records_written_total": "records_written",
    "tfrecordd_compressed_bytes_written_total": "compressed_bytes_written",
    "tfrecordd_open_shards": "open_shards",
    "tfrecordd_open_shard_bytes": "open_shard_bytes",
    "tfrecordd_open_shard_records": "open_shard_records",
    "tfrecordd_open_shard_age_seconds": "open_shard_age",
}
_SCALARS = _SHARD_FIGURES | {
    "tfrecordd_last_publish_timestamp_seconds": "last_publish",
    "tfrecordd_output_free_bytes": "output_free_bytes",
    "tfrecordd_dead_letters_discarded_total": "dead_letters_discarded",
}
_DATASET_FIGURES = _SHARD_FIGURES | {
    "tfrecordd_partitions_pending": "partitions_pending",
    "tfrecordd_partitions_completed_total": "partitions_completed",
    "tfrecordd_watermark_timestamp_seconds": "watermark",
    "tfrecordd_events_late_total": "events_late",
    "tfrecordd_partition_fallbacks_total": "partition_fallbacks",
}


_COMBINE: dict[str, Callable[[float, float], float]] = {
    "open_shard_age": max, "output_free_bytes": min, "last_publish": max
}  # fmt: skip


def _add(a: float, b: float) -> float:
    return a + b


def _total(snap: Snapshot, attr: str, value: float, per_dataset: bool) -> None:
    """Add one sample to a daemon-wide figure: datasets' figures are summed, but for the oldest
    shard's age, the latest publish and the least free space."""
    before = getattr(snap, attr)
    if per_dataset and before is not None:
        combine = _COMBINE.get(attr, _add)
        value = combine(before, value)
    setattr(snap, attr, value)


def parse(text: str, taken: float, wall: float) -> Snapshot:
    """Read a Prometheus text exposition into a :class:`Snapshot`."""
    snap = Snapshot(taken=taken, wall=wall)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name, labels, value = s.name, s.labels, float(s.value)
            if name in _DATASET_FIGURES and "dataset" in labels:
                figures = snap.datasets.setdefault(labels["dataset"], DatasetTotals())
                attr = _DATASET_FIGURES[name]
                setattr(figures, attr, (getattr(figures, attr) or 0.0) + value)
            if name in _SOURCE_COUNTERS and "source" in labels:
                totals = snap.sources.setdefault(labels["source"], SourceTotals())
                attr = _SOURCE_COUNTERS[name]
                setattr(totals, attr, getattr(totals, attr) + value)
            elif name in _SCALARS:
                _total(snap, _SCALARS[name], value, "dataset" in labels)
            elif name == "tfrecordd_stream_depth_batches" and "stage" in labels:
                snap.stream_depth[labels["stage"]] = value
            elif name == "tfrecordd_up":
                snap.up = value == 1
            elif name == "tfrecordd_paused":
                snap.paused = value == 1
            elif name == "tfrecordd_build_info":
                snap.version = labels.get("version", "?")
    return snap


def scrape(url: str, timeout: float = 5.0) -> Snapshot:
    """Fetch and parse ``url``; raises :class:`Unreachable` with the reason on any failure."""
    try:
        with _opener.open(url, timeout=timeout) as response:
            body = response.read(_MAX_BODY).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        e.close()
        raise Unreachable(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise Unreachable(str(e.reason)) from None
    except (OSError, ValueError) as e:
        raise Unreachable(str(e) or type(e).__name__) from None
    try:
        snap = parse(body, time.monotonic(), time.time())
    except ValueError as e:
        raise Unreachable(f"not Prometheus metrics: {e}") from None
    if not snap.sources and snap.version == "?" and not snap.up:
        raise Unreachable("no tfrecordd metrics in the answer")
    if url.endswith("/metrics"):
        snap.ready = readiness(url.removesuffix("/metrics") + "/readyz", timeout)
    return snap


def view(cur: Snapshot, prev: Snapshot | None) -> dict[str, Any]:
    """The figures shown for ``cur``; rates against ``prev`` (``None``: no rates)."""
    dt = cur.taken - prev.taken if prev is not None else 0.0
    sources: dict[str, Any] = {}
    states = (cur.ready or {}).get("sources", {})
    cur.sources = {name: SourceTotals() for name in states} | cur.sources
    for name, t in sorted(cur.sources.items()):
        before = prev.sources.get(name) if prev is not None else None
        rate = blocked = None
        if dt > 0:
            b = before or SourceTotals()
            # A restarted daemon's counters start over: show no rate rather than a negative one.
            if t.received >= b.received and t.backpressure_seconds >= b.backpressure_seconds:
                rate = (t.received - b.received) / dt
                blocked = min((t.backpressure_seconds - b.backpressure_seconds) / dt, 1.0)
        sources[name] = {
            "rate_per_second": rate,
            "pending": max(int(t.received - t.acked), 0),
            "blocked_ratio": blocked,
            "received": int(t.received),
            "acked": int(t.acked),
            "invalid": int(t.invalid),
            "dead_lettered": int(t.dead_lettered),
            "dropped": int(t.dropped),
            "refused": int(t.refused),
            "state": source_state(states.get(name)),
        }
    return {
        "time": round(cur.wall, 3),
        "interval_seconds": round(dt, 3) if dt > 0 else None,
        "version": cur.version,
        "up": cur.up,
        "ready": None if cur.ready is None else bool(cur.ready.get("ready")),
        "paused": cur.paused,
        "shards_published": int(cur.shards_published),
        "last_publish_seconds_ago": (
            round(max(cur.wall - cur.last_publish, 0.0), 3) if cur.last_publish > 0 else None
        ),
        "open_shards": int(cur.open_shards),
        "open_shard": {
            "bytes": int(cur.open_shard_bytes),
            "records": int(cur.open_shard_records),
            "age_seconds": round(cur.open_shard_age, 3),
        },
        "records_written": int(cur.records_written),
        "records_published": max(int(cur.records_written - cur.open_shard_records), 0),
        "compressed_bytes_written": int(cur.compressed_bytes_written),
        "dead_lettered": sum(s["dead_lettered"] for s in sources.values()),
        "stream_depth_batches": {k: int(v) for k, v in sorted(cur.stream_depth.items())},
        "output_free_bytes": (
            int(cur.output_free_bytes) if cur.output_free_bytes is not None else None
        ),
        "sources": sources,
        "datasets": {name: _dataset_view(d) for name, d in sorted(cur.datasets.items())},
    }


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _dataset_view(d: DatasetTotals) -> dict[str, Any]:
    out = {k: _int(v) for k, v in asdict(d).items() if k != "open_shard_age"}
    return out | {
        "open_shard_age_seconds": round(d.open_shard_age, 3),
        "watermark": d.watermark or None,
    }


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _time(epoch: float | None) -> str:
    return "-" if epoch is None else datetime.fromtimestamp(epoch, UTC).strftime("%FT%TZ")


def _dataset_rows(datasets: dict[str, Any]) -> list[str]:
    if not datasets:
        return []
    rows = [
        "",
        f"{'DATASET':<16} {'WRITTEN':>11} {'PUBLISHED':>9} {'OPEN':>5} {'PENDING':>8} "
        f"{'COMPLETE':>9} {'LATE':>6}  WATERMARK (UTC)",
    ]
    for name, d in datasets.items():
        rows.append(
            f"{name:<16} {d['records_written']:>11} {d['shards_published']:>9} "
            f"{d['open_shards']:>5} {_or_dash(d['partitions_pending']):>8} "
            f"{_or_dash(d['partitions_completed']):>9} {_or_dash(d['events_late']):>6}  "
            f"{_time(d['watermark'])}"
        )
    return rows


def render(v: dict[str, Any], url: str) -> str:
    """The text view of :func:`view`'s figures."""
    state = "up" if v["up"] else "starting or stopping"
    state += ", NOT READY (a source is down)" if v["up"] and v["ready"] is False else ""
    if v["paused"]:
        state += ", PAUSED (output full)"
    ago = v["last_publish_seconds_ago"]
    shard = v["open_shard"]
    depth = ", ".join(f"{k} {n}" for k, n in v["stream_depth_batches"].items()) or "-"
    free = _bytes(v["output_free_bytes"]) if v["output_free_bytes"] is not None else "-"
    interval = v["interval_seconds"]
    # Before datasets, the metrics had no open shard count: one shard, if it held anything.
    opened = v["open_shards"] or int(shard["records"] > 0)
    oldest = f", oldest {_ago(shard['age_seconds'])}" if opened else ""
    lines = [
        f"tfrecordd {v['version']} at {url}: {state}"
        + (f"  (rates over {interval:g}s)" if interval else "  (totals; rates need two scrapes)"),
        f"written     {_plural(v['records_written'], 'record')} "
        f"({_bytes(v['compressed_bytes_written'])} compressed): "
        f"{v['records_published']} in published shards, {shard['records']} in open shards",
        f"published   {_plural(v['shards_published'], 'shard')}, last "
        + (f"{_ago(ago)} ago" if ago is not None else "never"),
        f"open        {_plural(opened, 'shard')} holding {_plural(shard['records'], 'record')} "
        f"not yet published, {_bytes(shard['bytes'])}{oldest}",
        f"queued      {depth} (batches)    output free {free}",
        f"dead letters {v['dead_lettered']}",
        *_dataset_rows(v["datasets"]),
        "",
        f"{'SOURCE':<16} {'RATE/s':>10} {'PENDING':>9} {'BLOCKED':>8} {'RECEIVED':>11} "
        f"{'INVALID':>8} {'DEAD':>7} {'DROPPED':>8}",
    ]
    for name, s in v["sources"].items():
        rate = f"{s['rate_per_second']:.1f}" if s["rate_per_second"] is not None else "-"
        blocked = f"{s['blocked_ratio']:.0%}" if s["blocked_ratio"] is not None else "-"
        lines.append(
            f"{name:<16} {rate:>10} {s['pending']:>9} {blocked:>8} {s['received']:>11} "
            f"{s['invalid']:>8} {s['dead_lettered']:>7} {s['dropped']:>8}"
        )
    if not v["sources"]:
        lines.append("(no source has read anything yet)")
    else:
        lines += ["", f"{'SOURCE':<16} STATE"]
        lines += [
            f"{n:<16} {describe_state(s['state'], v['time'])}" for n, s in v["sources"].items()
        ]
    return "\n".join(lines) + "\n"


def _bytes(n: float) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{int(n)} B"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


@dataclass
class _Output:
    stream: TextIO
    as_json: bool
    redraw: bool
    url: str

    def show(self, snap: Snapshot, prev: Snapshot | None) -> None:
        v = view(snap, prev)
        if self.as_json:
            text = json.dumps({"url": self.url} | v) + "\n"
        else:
            text = render(v, self.url)
            text = _CLEAR + text if self.redraw else text + "\n"
        self.stream.write(text)
        self.stream.flush()

    def problem(self, reason: str) -> None:
        if self.as_json:
            text = json.dumps({"url": self.url, "time": round(time.time(), 3), "error": reason})
            self.stream.write(text + "\n")
        else:
            text = f"tfrecordd status: cannot reach {self.url}: {reason} (retrying)\n"
            self.stream.write(_CLEAR + text if self.redraw else text)
        self.stream.flush()


def run(
    url: str,
    *,
    once: bool,
    interval: float,
    as_json: bool,
    stream: TextIO,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """The ``status`` command's loop; returns the exit code."""
    out = _Output(stream, as_json, redraw=not as_json and _isatty(stream), url=url)
    try:
        cur, prev = scrape(url), None
        if once and interval > 0:
            sleep(interval)
            cur, prev = scrape(url), cur
    except Unreachable as e:
        print(f"tfrecordd status: cannot reach the daemon at {url}: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK
    out.show(cur, prev)
    last: Snapshot | None = cur
    try:
        while not once:
            sleep(max(interval, 0.1))
            try:
                cur = scrape(url)
            except Unreachable as e:
                out.problem(str(e))
                last = None
                continue
            out.show(cur, last)
            last = cur
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _interval(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _cmd_status(args: argparse.Namespace) -> int:
    url = args.url
    if args.config is not None:
        from tfrecordd.config import load_config

        url = local_url(load_config(args.config).metrics.listen)
    return run(url, once=args.once, interval=args.interval, as_json=args.json, stream=sys.stdout)


def add_commands(sub: Any) -> None:
    """Register ``status`` on the CLI's subparsers."""
    help_text = help_of("status")
    p = sub.add_parser("status", help=help_text, description=help_text)
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--url", default=DEFAULT_URL, help="the daemon's metrics (default: %(default)s)"
    )
    where.add_argument(
        "--config", "-c", help="the config file the daemon runs: its [metrics] listen address"
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="print one snapshot and exit (two scrapes --interval apart, for rates)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per snapshot and line")
    p.add_argument(
        "--interval",
        type=_interval,
        default=2.0,
        metavar="DURATION",
        help="time between scrapes, e.g. 500ms, 2s (default: 2s)",
    )
    p.set_defaults(func=_cmd_status)
