"""Case 5: the whole daemon, ``tfrecordd run`` in a subprocess, on a spool directory.

The daemon starts on an empty spool; once it logs that it started, the prepared JSON-lines files
are renamed into the spool at once (t0: interpreter start-up and recovery are not measured), and
the output directory is polled until the last shard is published (t1; a shard appears under its
final name only once complete and durable); the metrics endpoint then confirms the record count.
The spool files' acknowledgements are not waited for: a file's end-of-file token can arrive in a
batch of its own after the last full shard, and then waits ``max_shard_age`` to be committed.
``max_shard_records`` divides the run into full shards, so no shard waits for
``max_shard_age``. Peak RSS is each process's ``VmHWM`` once the last shard's manifest is
published too, just before the daemon is told to stop: the daemon's and, with
``encode_workers > 1``, its largest worker's.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data import MOVIE_FEATURES, movie_lines
from ..harness import Context, Row, ratio_row

WORKERS_TARGET = 1.7
RSS_TOLERANCE = 1.25
"""Peak RSS "does not grow" when the largest of the runs is within this factor of the smallest."""
LINES_PER_FILE = 10_000


@dataclass
class Run:
    events: int
    seconds: float
    rss_mib: float
    worker_rss_mib: float
    shards: int
    daemon_cpu: float = 0.0
    """CPU seconds the daemon's process (all its threads) spent between t0 and t1."""
    workers_cpu: float = 0.0
    """CPU seconds its encode workers spent between t0 and t1, summed."""

    def cpu_ms_per_1000(self) -> tuple[float, float]:
        """The daemon's and the workers' CPU milliseconds per 1000 events."""
        k = 1e6 / self.events
        return self.daemon_cpu * k, self.workers_cpu * k


def _command() -> list[str]:
    """The installed ``tfrecordd`` script, as users run it (``python -m tfrecordd`` where the
    script is missing)."""
    script = Path(sys.executable).parent / "tfrecordd"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tfrecordd"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def daemon_head(root: Path, port: int, workers: int) -> str:
    """The ``[daemon]`` and ``[metrics]`` tables of every benchmark daemon's config."""
    return f"""
[daemon]
node_id = "bench"
state_dir = "{root / "state"}"
encode_workers = {workers}
drain_timeout = "60s"

[metrics]
listen = "127.0.0.1:{port}"
"""


def _config(root: Path, port: int, workers: int, shard_records: int) -> Path:
    text = (
        daemon_head(root, port, workers)
        + f"""
[output]
dir = "{root / "shards"}"
compression = "gzip"
max_shard_records = {shard_records}
max_shard_bytes = "4GiB"
max_shard_age = "60s"
min_free_bytes = 0

[[sources]]
name = "spool"
type = "directory"
path = "{root / "spool"}"
encoder = "movies"
poll_interval = "20ms"

[encoders.movies]
type = "example"
[encoders.movies.features]
"""
    )
    text += "".join(f'{k} = "{v}"\n' for k, v in MOVIE_FEATURES.items())
    path = root / "tfrecordd.toml"
    path.write_text(text)
    return path


def _published(shards: Path, suffix: str = ".tfrecord.gz") -> int:
    """Shards (or, with ``suffix=".manifest.json"``, their manifests) published so far: each
    appears under its final name only when complete."""
    if not shards.exists():
        return 0
    return sum(1 for p in os.listdir(shards) if p.endswith(suffix) and p[0] != ".")


def _metric(port: int, name: str) -> float:
    for attempt in range(20):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                body = r.read().decode()
            break
        except OSError:
            if attempt == 19:
                raise
            time.sleep(0.1)
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _hwm_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid``, all its threads (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the daemon ``pid`` and of its children (the encode workers), summed."""
    return _cpu_seconds(pid), sum(_cpu_seconds(c) for c in _children(pid))


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def start_daemon(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """``tfrecordd run`` on ``config``, logging to ``log``, once it says it started (killed
    if it does not)."""
    with log.open("wb") as logf:
        proc = subprocess.Popen(
            [*_command(), "run", "--config", str(config)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
    try:
        _wait(
            lambda: b" started: " in log.read_bytes() or proc.poll() is not None,
            120,
            "start-up",
            log,
        )
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited at start-up:\n{log.read_text()}")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def _wait(predicate: Callable[[], bool], timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"daemon: timed out waiting for {what}; log:\n{log.read_text()}")
        time.sleep(0.005)


def run_daemon(
    ctx: Context, events: int, workers: int, shard_records: int, warmup: bool = True
) -> Run:
    """One daemon run on ``events`` events; returns its timing and memory.

    With ``warmup``, one shard's worth of other events goes through first, untimed: the start of
    the pipeline (encode worker processes included) is not measured.
    """
    with ctx.tmpdir(f"daemon-w{workers}") as root:
        (root / "spool").mkdir()
        staging = root / "staging"
        staging.mkdir()
        per_file = min(LINES_PER_FILE, events)
        lines = movie_lines(per_file, ctx.seed)
        block = b"\n".join(lines) + b"\n"
        names = []
        for i in range(events // per_file):
            name = f"events-{i:05d}.jsonl"
            (staging / name).write_bytes(block)
            names.append(name)
        port = _free_port()
        config = _config(root, port, workers, shard_records)
        log = root / "daemon.log"
        proc = start_daemon(config, log)
        try:
            done = 0
            if warmup:
                (staging / "warmup.jsonl").write_bytes(
                    b"\n".join(movie_lines(shard_records, ctx.seed + 1)) + b"\n"
                )
                os.rename(staging / "warmup.jsonl", root / "spool" / "warmup.jsonl")
                _wait(lambda: _published(root / "shards") >= 1, 120, "the warm-up shard", log)
                done = 1
            cpu0 = _cpu(proc.pid)
            t0 = time.perf_counter()
            for name in names:
                os.rename(staging / name, root / "spool" / name)
            total = len(names) * per_file
            expected = done + total // shard_records

            def acked() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"daemon exited early:\n{log.read_text()}")
                return _published(root / "shards") >= expected

            _wait(
                acked,
                600,
                "every shard published",
                log,
            )
            seconds = time.perf_counter() - t0
            cpu1 = _cpu(proc.pid)
            # The peak is read once the last shard's manifest is out too: writing a manifest
            # (each record's offset) is part of the daemon's work for a shard.
            _wait(
                lambda: _published(root / "shards", ".manifest.json") >= expected,
                120,
                "every manifest",
                log,
            )
            rss = _hwm_mib(proc.pid)
            worker_rss = max((_hwm_mib(c) for c in _children(proc.pid)), default=0.0)
            shards = int(_metric(port, "tfrecordd_shards_published_total"))
            written = _metric(port, "tfrecordd_records_written_total")
            if written != total + done * shard_records:
                raise RuntimeError(f"daemon wrote {written} records of {total}")
            proc.send_signal(signal.SIGTERM)
            if proc.wait(180) != 0:
                raise RuntimeError(f"daemon exited with {proc.returncode}:\n{log.read_text()}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return Run(
        total,
        seconds,
        rss,
        worker_rss,
        shards - done,
        daemon_cpu=cpu1[0] - cpu0[0],
        workers_cpu=cpu1[1] - cpu0[1],
    )


CEILING_BATCHES = 300
"""Batches of 1000 events each process encodes for the parallel-ceiling row (about a second)."""


def _encode_loop(seed: int, batches: int, start: Any, results: Any) -> None:
    """One encode worker's work (split the lines, encode, frame and gzip them into a unit) on the
    same batch over and over, with nothing else: its events per second go to ``results``."""
    from tfrecordd.format.compression import Compression
    from tfrecordd.pipeline.encoding import encode_events
    from tfrecordd.plugin import Lines
    from tfrecordd_plugins.encoders.example import ExampleEncoderConfig

    lines = Lines(b"\n".join(movie_lines(1000, seed)) + b"\n", "bench.jsonl", 0, 1 << 20)
    encoder = ExampleEncoderConfig.model_validate({"features": MOVIE_FEATURES}).build()
    encode_events(encoder, [], lines, Compression.GZIP, None)
    start.wait()
    t0 = time.perf_counter()
    for _ in range(batches):
        encode_events(encoder, [], lines, Compression.GZIP, None)
    results.put(batches * 1000 / (time.perf_counter() - t0))


def _parallel_rate(seed: int, batches: int, processes: int) -> float:
    """Events per second of :func:`_encode_loop` in ``processes`` processes at once, summed."""
    mp = multiprocessing.get_context("spawn")
    start = mp.Barrier(processes)
    results = mp.Queue()
    procs = [
        mp.Process(target=_encode_loop, args=(seed, batches, start, results))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    total = sum(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    return float(total)


def _cpu_rows(case: str, one: Run, two: Run) -> list[Row]:
    """CPU per 1000 events in the two runs kept, and the cores each kept busy: the ratio of
    events per second is (cores busy with two encoders / with one) * (CPU per event with one /
    with two). One encoder's process keeps somewhat more than one core busy (its threads' I/O
    and gzip release the interpreter lock), so two encoders must spend no more CPU per event."""
    d1, _ = one.cpu_ms_per_1000()
    d2, w2 = two.cpu_ms_per_1000()
    busy1 = (one.daemon_cpu + one.workers_cpu) / one.seconds
    busy2 = (two.daemon_cpu + two.workers_cpu) / two.seconds
    return [
        Row(
            case,
            "CPU per 1000 events, encode_workers=1",
            "ms",
            d1,
            note=f"all in the daemon's process (encode thread included); {busy1:.2f} cores busy",
        ),
        Row(
            case,
            "CPU per 1000 events, encode_workers=2",
            "ms",
            d2 + w2,
            d1,
            "encode_workers=1",
            (d2 + w2) / d1 if d1 else None,
            note=f"the daemon's process (one encoder) {d2:.2f}, its worker process {w2:.2f}; "
            f"{busy2:.2f} cores busy",
        ),
    ]


def run(ctx: Context) -> list[Row]:
    n = ctx.daemon_events
    small = max(n // 5, min(LINES_PER_FILE, n))
    case = "5 daemon end to end"
    runs: dict[int, Run] = {}
    # Interleaved, one worker then two, so that a change in the machine's speed during the case
    # falls on both sides alike.
    for _ in range(ctx.repeat if not ctx.quick else 1):
        for workers in (1, 2):
            r = run_daemon(ctx, n, workers, small)
            if workers not in runs or r.seconds < runs[workers].seconds:
                runs[workers] = r
    one, two = runs[1], runs[2]
    rows = [
        Row(
            case,
            "events/s, encode_workers=1",
            "events/s",
            one.events / one.seconds,
            note=f"{one.events:,} events in {one.events // min(LINES_PER_FILE, n)} files, "
            f"{one.shards} gzip shards, fsync on",
        ),
        ratio_row(
            case,
            "events/s, encode_workers=2",
            "events/s",
            two.events / two.seconds,
            one.events / one.seconds,
            "encode_workers=1",
            WORKERS_TARGET,
            f"{os.cpu_count()} cores; the daemon's own process reads, encodes in its thread, moves "
            "batches to and from its worker process, writes and commits",
        ),
    ]
    rows += _cpu_rows(case, one, two)
    batches = 20 if ctx.quick else CEILING_BATCHES
    one_loop = two_loops = 0.0
    for _ in range(1 if ctx.quick else 3):
        one_loop = max(one_loop, _parallel_rate(ctx.seed, batches, 1))
        two_loops = max(two_loops, _parallel_rate(ctx.seed, batches, 2))
    rows.append(
        ratio_row(
            case,
            "the encode loop alone, two processes at once",
            "events/s",
            two_loops,
            one_loop,
            "one process",
            None,
            "an encoder's work with no daemon around it (split, encode, gzip): what the "
            "machine's cores give two encoders at best",
        )
    )
    big = run_daemon(ctx, n, 1, n, warmup=False)
    long = run_daemon(ctx, 3 * n, 1, small)
    memory = [
        (f"{n:,} events, {small:,}-record shards", one),
        (f"{n:,} events, {n:,}-record shard", big),
        (f"{3 * n:,} events, {small:,}-record shards", long),
    ]
    low = min(r.rss_mib for _, r in memory)
    for label, r in memory:
        rows.append(
            Row(
                case,
                f"peak RSS, workers=1, {label}",
                "MiB",
                r.rss_mib,
                low,
                "smallest of these 3 runs",
                r.rss_mib / low,
                f"<= {RSS_TOLERANCE:g}x",
                r.rss_mib / low <= RSS_TOLERANCE,
            )
        )
    rows.append(
        Row(
            case,
            "peak RSS, workers=2: daemon / its worker process",
            "MiB",
            two.rss_mib,
            note=f"worker process {two.worker_rss_mib:.0f} MiB",
        )
    )
    return rows
