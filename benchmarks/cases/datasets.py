"""Case 7: datasets. The whole daemon (as case 5 runs it) on the same events twice: all of them
to one dataset, and routed by their ``type`` into two datasets, one of them partitioned by event
hour with its events spread evenly over 24 hours (24 shards open at once). Then the daemon's peak
RSS with 1 to 64 hourly partitions open at once.

Every event is a movie event (:func:`~benchmarks.data.movie_lines`) with a ``type`` (``view`` and
``click`` in turn) and a ``ts`` (seconds since the epoch, an ``int64`` feature in milliseconds).
All datasets share one schema and gzip: the two runs encode and compress the same records, and
differ only by the routing, the partitioning and the number of shards. (The compiled JSON plan
takes ``ts`` with its ``time_unit``; a third run declares it a plain ``int64`` to show that
costs nothing.)

The daemon runs as in case 5: started on an empty spool; a warm-up shard of ``view`` events goes
through untimed; the measured files are renamed into the spool at once (t0), and the time taken
is until the last shard is published (t1). A run ends only by shards filling: each dataset's
``max_shard_records`` divides its events into whole shards (each hour's clicks are one shard), so
no shard waits for ``max_shard_age``. The 24 click shards stay open through the run: the commit
that publishes the first views shard, halfway, makes each of them durable where it is.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ..data import MOVIE_FEATURES, movie_lines
from ..harness import Context, Row, ratio_row
from .daemon import (
    RSS_TOLERANCE,
    Run,
    _children,
    _cpu,
    _free_port,
    _hwm_mib,
    _metric,
    _wait,
    daemon_head,
    start_daemon,
)

RATIO_TARGET = 0.9
HOURS = 24
"""Hourly partitions open at once in the throughput comparison."""
RSS_HOURS = (1, 8, 24, 32, 64)
"""Open partitions of the memory runs: up to the default ``max_open_shards`` (32), then past it
with the cap raised."""
DEFAULT_CAP = 32
MEMORY_RUNS = 3
"""Runs of each memory layout: a single run's peak varies by several MiB (the moment the
pipeline's queues are fullest), so each count of partitions is the median of these."""
WORKERS = 2
"""``encode_workers`` of every run: the daemon's encode thread and one worker process."""
EVENT_UNIT = 384
"""Run sizes are a multiple of this: every hour of every one of :data:`RSS_HOURS` then gets the
same number of clicks, and each hour's shard fills exactly at the end of the run."""
LINES_PER_FILE = 26 * EVENT_UNIT
DAY = int(datetime(2026, 11, 24, tzinfo=UTC).timestamp())
"""Hour ``h`` of the events is ``DAY`` + ``h`` hours (UTC)."""
FEATURES: dict[str, str | dict[str, str]] = {
    **MOVIE_FEATURES,
    "type": "bytes",
    "ts": {"type": "int64", "time_unit": "ms"},
}


@dataclass(frozen=True)
class Layout:
    """What a run's daemon writes: one dataset, or views and clicks with clicks in ``hours``
    hourly partitions (``None``: one dataset). ``time_unit``: whether ``ts`` is declared with
    its ``time_unit`` (else as a plain ``int64``, which one dataset can do without)."""

    hours: int | None
    time_unit: bool = True

    @property
    def label(self) -> str:
        if self.hours is None:
            return "one dataset" if self.time_unit else "one dataset, ts a plain int64"
        return f"2 datasets, {self.hours} open hourly partitions"

    @property
    def features(self) -> dict[str, str | dict[str, str]]:
        return FEATURES if self.time_unit else FEATURES | {"ts": "int64"}


ONE = Layout(None)
PLAIN = Layout(None, time_unit=False)


def _with_type(line: bytes, kind: str, ts: int) -> bytes:
    return line[:-1] + b', "type": "%s", "ts": %d}' % (kind.encode(), ts)


def spool_block(seed: int, lines: int, hours: int) -> bytes:
    """A spool file's JSON lines: views and clicks in turn, the clicks' hours in turn over
    ``hours`` hours (``lines`` is a multiple of ``2 * hours``: each hour gets as many)."""
    out = []
    for i, line in enumerate(movie_lines(lines, seed)):
        j = i // 2
        hour = j % hours
        ts = DAY + hour * 3600 + (j // hours) % 3600
        out.append(_with_type(line, ("view", "click")[i % 2], ts))
    return b"\n".join(out) + b"\n"


def warmup_block(seed: int, lines: int) -> bytes:
    """``lines`` view events: the warm-up shard, which opens no click partition."""
    out = [_with_type(line, "view", DAY) for line in movie_lines(lines, seed)]
    return b"\n".join(out) + b"\n"


def _toml(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


@dataclass(frozen=True)
class Sizes:
    """A run's events and its shards' record caps."""

    events: int
    per_file: int

    @property
    def shard_records(self) -> int:
        """The record cap of the one dataset's shards, and of the views' (4 and 2 shards)."""
        return self.events // 4

    def click_records(self, hours: int) -> int:
        """Each hour's clicks: one shard."""
        return self.events // 2 // hours


def sizes(events: int) -> Sizes:
    """The run's sizes: ``events`` rounded down to whole files of a multiple of
    :data:`EVENT_UNIT` lines."""
    per_file = max(EVENT_UNIT, min(LINES_PER_FILE, events // EVENT_UNIT * EVENT_UNIT))
    return Sizes(max(1, events // per_file) * per_file, per_file)


def _slope(points: list[tuple[int, float]]) -> float:
    """The least-squares slope of ``(x, y)`` points: every count's peak counts, not two."""
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def _config(root: Path, port: int, workers: int, layout: Layout, s: Sizes) -> Path:
    output = {
        "compression": "gzip",
        "max_shard_bytes": "4GiB",
        "max_shard_age": "60s",
        "min_free_bytes": 0,
    }
    text = daemon_head(root, port, workers)
    datasets: dict[str, dict[str, object]] = {}
    if layout.hours is None:
        datasets["events"] = {"max_shard_records": s.shard_records}
        target = 'dataset = "events"'
    else:
        datasets["views"] = {"max_shard_records": s.shard_records}
        datasets["clicks"] = {
            "max_shard_records": s.click_records(layout.hours),
            "max_open_shards": max(DEFAULT_CAP, layout.hours),
            "partition": {
                "time": "event",
                "time_field": "ts",
                "granularity": "hour",
                "zone": "UTC",
            },
        }
        target = 'route = { field = "type", to = { view = "views", click = "clicks" } }'
    for name, settings in datasets.items():
        text += f'\n[datasets.{name}]\nencoder = "events"\ndir = "{root / name}"\n'
        text += "".join(f"{k} = {_toml(v)}\n" for k, v in (output | settings).items())
    text += f"""
[[sources]]
name = "spool"
type = "directory"
path = "{root / "spool"}"
poll_interval = "20ms"
{target}

[encoders.events]
type = "example"
[encoders.events.features]
"""
    text += "".join(f"{k} = {_toml(v)}\n" for k, v in layout.features.items())
    path = root / "tfrecordd.toml"
    path.write_text(text)
    return path


def _folders(root: Path, layout: Layout) -> list[tuple[Path, int]]:
    """Every folder shards are published into, and how many the run publishes there (the
    warm-up shard's included)."""
    if layout.hours is None:
        return [(root / "events", 1 + 4)]
    hours = []
    for h in range(layout.hours):
        at = datetime.fromtimestamp(DAY + h * 3600, UTC)
        hours.append((root / "clicks" / f"dt={at:%Y-%m-%d}" / f"hour={at:%H}", 1))
    return [(root / "views", 1 + 2), *hours]


def _count(folder: Path, suffix: str) -> int:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    return sum(1 for n in names if n.endswith(suffix) and n[0] != ".")


def _all_there(folders: list[tuple[Path, int]], suffix: str) -> Callable[[], bool]:
    """A check that every folder holds its count of files ending in ``suffix``; a folder found
    complete is not listed again, so that each poll lists about one folder."""
    left = list(folders)

    def check() -> bool:
        while left:
            folder, n = left[-1]
            if _count(folder, suffix) < n:
                return False
            left.pop()
        return True

    return check


def run_daemon(ctx: Context, layout: Layout, workers: int, s: Sizes, block: bytes) -> Run:
    """One daemon run of ``layout`` on ``s.events`` events (``block`` in each file)."""
    with ctx.tmpdir(f"datasets-w{workers}") as root:
        (root / "spool").mkdir()
        staging = root / "staging"
        staging.mkdir()
        names = [f"events-{i:05d}.jsonl" for i in range(s.events // s.per_file)]
        for name in names:
            (staging / name).write_bytes(block)
        (staging / "warmup.jsonl").write_bytes(warmup_block(ctx.seed + 1, s.shard_records))
        port = _free_port()
        config = _config(root, port, workers, layout, s)
        folders = _folders(root, layout)
        log = root / "daemon.log"
        proc = start_daemon(config, log)
        try:
            os.rename(staging / "warmup.jsonl", root / "spool" / "warmup.jsonl")
            _wait(lambda: _count(folders[0][0], ".tfrecord.gz") >= 1, 120, "the warm-up", log)
            cpu0 = _cpu(proc.pid)
            t0 = time.perf_counter()
            for name in names:
                os.rename(staging / name, root / "spool" / name)
            published = _all_there(folders, ".tfrecord.gz")

            def done() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"daemon exited early:\n{log.read_text()}")
                return published()

            _wait(done, 600, "every shard published", log)
            seconds = time.perf_counter() - t0
            cpu1 = _cpu(proc.pid)
            _wait(_all_there(folders, ".manifest.json"), 120, "every manifest", log)
            rss = _hwm_mib(proc.pid)
            worker_rss = max((_hwm_mib(c) for c in _children(proc.pid)), default=0.0)
            written = _metric(port, "tfrecordd_records_written_total")
            if written != s.events + s.shard_records:
                raise RuntimeError(f"daemon wrote {written} records of {s.events}")
            proc.send_signal(signal.SIGTERM)
            if proc.wait(180) != 0:
                raise RuntimeError(f"daemon exited with {proc.returncode}:\n{log.read_text()}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return Run(
        s.events,
        seconds,
        rss,
        worker_rss,
        sum(n for _, n in folders) - 1,
        daemon_cpu=cpu1[0] - cpu0[0],
        workers_cpu=cpu1[1] - cpu0[1],
    )


def _compressor_growth(count: int) -> float:
    from tfrecordd.format.compress import Compressor
    from tfrecordd.format.compression import Compression

    data = b"\n".join(movie_lines(500, 7))

    def rss() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    before = rss()
    kept = []
    for _ in range(count):
        c = Compressor(Compression.GZIP)
        c.compress(data)
        kept.append(c)
    return (rss() - before) / count / (1 << 20)


def compressor_mib(count: int = 64) -> float:
    """The memory one open gzip shard's compressor holds: ``count`` compressors each fed a
    batch's records in a fresh process (whose heap has no freed memory to reuse), the growth
    of its RSS divided by ``count``."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return float(pool.apply(_compressor_growth, (count,)))


def _rounds(
    ctx: Context, layouts: tuple[Layout, ...], workers: int, s: Sizes, blocks: dict[int, bytes]
) -> list[dict[Layout, Run]]:
    """``ctx.repeat`` rounds, each a run of every layout in turn."""
    return [
        {
            layout: run_daemon(ctx, layout, workers, s, blocks[layout.hours or HOURS])
            for layout in layouts
        }
        for _ in range(ctx.repeat if not ctx.quick else 1)
    ]


def _median_round(
    case: str, rounds: list[dict[Layout, Run]], layout: Layout, baseline: Layout
) -> Row:
    """The round whose ratio of ``layout`` to ``baseline`` is the median: the fastest runs of
    each side may come from different moments of a host whose speed drifts, a round's two runs
    from one."""

    def eps(r: Run) -> float:
        return r.events / r.seconds

    by_ratio = sorted(rounds, key=lambda r: eps(r[layout]) / eps(r[baseline]))
    mid = by_ratio[(len(by_ratio) - 1) // 2]
    ratios = ", ".join(f"{eps(r[layout]) / eps(r[baseline]):.2f}" for r in by_ratio)
    return ratio_row(
        case,
        f"events/s, {layout.label}, the median round",
        "events/s",
        eps(mid[layout]),
        eps(mid[baseline]),
        baseline.label,
        None,
        f"each round runs both, one after the other; the {len(rounds)} rounds' ratios: {ratios}",
    )


def run(ctx: Context) -> list[Row]:
    case = "7 datasets"
    s = sizes(ctx.daemon_events)
    blocks = {h: spool_block(ctx.seed, s.per_file, h) for h in RSS_HOURS}
    two = Layout(HOURS)
    rounds = _rounds(ctx, (ONE, two, PLAIN), WORKERS, s, blocks)
    a, b, plain = (
        min((r[x] for r in rounds), key=lambda run: run.seconds) for x in (ONE, two, PLAIN)
    )
    rows = [
        Row(
            case,
            f"events/s, {ONE.label}",
            "events/s",
            a.events / a.seconds,
            note=f"{a.events:,} events in {a.events // s.per_file} files, {a.shards} gzip shards, "
            f"encode_workers={WORKERS} on both sides",
        ),
        ratio_row(
            case,
            f"events/s, {two.label}",
            "events/s",
            b.events / b.seconds,
            a.events / a.seconds,
            ONE.label,
            RATIO_TARGET,
            "the same events routed by type: views (2 shards), clicks by event hour "
            f"({b.shards - 2} shards, one per hour, all open at once); the fastest of "
            f"{len(rounds)} runs of each",
        ),
        _median_round(case, rounds, two, ONE),
        ratio_row(
            case,
            f"events/s, {PLAIN.label}",
            "events/s",
            plain.events / plain.seconds,
            a.events / a.seconds,
            ONE.label,
            None,
            "the same events and shards, ts declared without time_unit (which the compiled "
            "JSON plan takes: whole seconds are multiplied in C)",
        ),
    ]
    for label, r in ((ONE.label, a), (two.label, b), (PLAIN.label, plain)):
        daemon, worker = r.cpu_ms_per_1000()
        rows.append(
            Row(
                case,
                f"CPU per 1000 events, {label}",
                "ms",
                daemon + worker,
                note=f"the daemon's process {daemon:.2f}, its worker process {worker:.2f}; "
                f"{(r.daemon_cpu + r.workers_cpu) / r.seconds:.2f} cores busy",
            )
        )
    runs = 1 if ctx.quick else MEMORY_RUNS
    memory: list[tuple[int, float, float]] = []
    for h in RSS_HOURS:
        measured = [run_daemon(ctx, Layout(h), WORKERS, s, blocks[h]) for _ in range(runs)]
        memory.append(
            (
                h,
                statistics.median(r.rss_mib for r in measured),
                statistics.median(r.worker_rss_mib for r in measured),
            )
        )
    low = memory[0][1]
    for h, rss, worker_rss in memory:
        rows.append(
            Row(
                case,
                f"peak RSS of the daemon, {h} open hourly partition{'s' if h > 1 else ''}",
                "MiB",
                rss,
                low,
                f"{RSS_HOURS[0]} open partition",
                rss / low,
                note=f"max_open_shards={max(DEFAULT_CAP, h)}; {s.click_records(h):,} records in "
                f"each hour's shard; worker process {worker_rss:.0f} MiB; median of {runs} "
                f"run{'s' if runs > 1 else ''}",
            )
        )
    if ctx.quick:
        # Tiny shards: the peak's growth is noise, and may come out below zero.
        return rows
    per_shard = _slope([(h, rss) for h, rss, _ in memory])
    state = compressor_mib()
    rows.append(
        Row(
            case,
            f"peak RSS per open shard, {RSS_HOURS[0]} to {RSS_HOURS[-1]} partitions",
            "MiB",
            per_shard,
            state,
            "a gzip compressor's state, alone",
            per_shard / state,
            f"<= {RSS_TOLERANCE:g}x",
            per_shard / state <= RSS_TOLERANCE,
            note="the growth of the daemon's peak per open partition: the least-squares slope "
            f"of the medians over {len(RSS_HOURS)} counts ({', '.join(map(str, RSS_HOURS))}); "
            "flat is no more than each open shard's compressor",
        )
    )
    return rows
