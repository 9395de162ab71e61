"""Case 8: ``tfrecordd convert`` on a folder of JSON-lines files, against the loop every TensorFlow
tutorial shows and against the daemon, on the same files, in the same run.

The files: ``daemon_events`` movie events in files of 10,000 lines, the same files case 5 gives
the daemon. The three ways to write them as gzip TFRecords:

- ``tfrecordd convert`` as a user runs it, a subprocess timed from its start to its exit
  (interpreter start-up, listing, fsyncs and manifests included), with ``--workers 1`` and with
  every core;
- TensorFlow's loop, in this process: each line ``json.loads``-ed, a ``tf.train.Example`` built
  feature by feature, ``SerializeToString``, ``tf.io.TFRecordWriter.write`` into one gzip file
  (what tutorials and most one-off scripts do; no fsync, no manifest);
- the daemon (case 5's ``run_daemon``, ``encode_workers = 2``), timed from the files' arrival in
  its spool to the last shard published (its start-up not counted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..data import MOVIE_FEATURES, movie_lines
from ..harness import Context, Row, ratio_row
from .daemon import LINES_PER_FILE, run_daemon

TF_TARGET = 3.0
"""Convert on every core against TensorFlow's loop on one."""


def _config(root: Path) -> Path:
    text = f"""
[daemon]
node_id = "bench"
state_dir = "{root / "state"}"

[metrics]
enabled = false

[datasets.movies]
dir = "{root / "unused"}"
encoder = "movies"
compression = "gzip"

[[sources]]
name = "spool"
type = "directory"
path = "{root / "spool"}"
dataset = "movies"

[encoders.movies]
type = "example"
[encoders.movies.features]
"""
    text += "".join(f'{k} = "{v}"\n' for k, v in MOVIE_FEATURES.items())
    path = root / "tfrecordd.toml"
    path.write_text(text)
    return path


def _files(root: Path, events: int, seed: int) -> tuple[Path, int]:
    per_file = min(LINES_PER_FILE, events)
    block = b"\n".join(movie_lines(per_file, seed)) + b"\n"
    folder = root / "in"
    folder.mkdir()
    files = max(events // per_file, 1)
    for i in range(files):
        (folder / f"events-{i:05d}.jsonl").write_bytes(block)
    return folder, files * per_file


def _convert(config: Path, folder: Path, out: Path, workers: int) -> tuple[float, dict[str, Any]]:
    script = Path(sys.executable).parent / "tfrecordd"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "tfrecordd"]
    argv = [*command, "convert", "--config", str(config), str(folder), "--out", str(out)]
    argv += ["--workers", str(workers), "--quiet", "--json"]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"convert exited {done.returncode}:\n{done.stderr}")
    summary: dict[str, Any] = json.loads(done.stdout)
    return seconds, summary


def _tf_loop(tf: Any, folder: Path, out: Path) -> int:
    """The tutorial loop: one Example per JSON line, written by TFRecordWriter (gzip)."""

    def feature(kind: str, value: Any) -> Any:
        values = value if isinstance(value, list) else [value]
        if kind == "bytes":
            return tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[v.encode() for v in values])
            )
        if kind == "int64":
            return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))

    n = 0
    with tf.io.TFRecordWriter(str(out), options="GZIP") as writer:
        for path in sorted(folder.iterdir()):
            with path.open() as f:
                for line in f:
                    event = json.loads(line)
                    features = {k: feature(t, event[k]) for k, t in MOVIE_FEATURES.items()}
                    example = tf.train.Example(features=tf.train.Features(feature=features))
                    writer.write(example.SerializeToString())
                    n += 1
    return n


def run(ctx: Context) -> list[Row]:
    case = "8 convert"
    cores = len(os.sched_getaffinity(0))
    rows: list[Row] = []
    with ctx.tmpdir("convert") as root:
        folder, events = _files(root, ctx.daemon_events, ctx.seed)
        config = _config(root)
        best: dict[int, float] = {}
        for attempt in range(1 if ctx.quick else ctx.repeat):
            for workers in sorted({1, cores}):
                out = root / f"out-{workers}-{attempt}"
                seconds, summary = _convert(config, folder, out, workers)
                if summary["records"] != events:
                    raise RuntimeError(f"convert wrote {summary['records']} of {events}")
                best[workers] = min(best.get(workers, seconds), seconds)
        rate_all, rate_one = events / best[cores], events / best[1]
        tf_rate = None
        if ctx.tf is not None:
            tf_best = None
            for _ in range(1 if ctx.quick else min(ctx.repeat, 2)):
                t0 = time.perf_counter()
                written = _tf_loop(ctx.tf, folder, root / "tf.tfrecord.gz")
                seconds = time.perf_counter() - t0
                if written != events:
                    raise RuntimeError(f"the TensorFlow loop wrote {written} of {events}")
                tf_best = seconds if tf_best is None else min(tf_best, seconds)
            assert tf_best is not None
            tf_rate = events / tf_best
        note = f"{events:,} events in {events // min(LINES_PER_FILE, events)} files, gzip"
        rows.append(
            ratio_row(
                case,
                f"events/s, --workers {cores} (every core)",
                "events/s",
                rate_all,
                tf_rate,
                "TensorFlow loop",
                TF_TARGET if tf_rate else None,
                f"{note}; convert timed as a process (start-up, fsyncs, manifests included)",
            )
        )
        rows.append(
            ratio_row(
                case,
                "events/s, --workers 1",
                "events/s",
                rate_one,
                tf_rate,
                "TensorFlow loop",
                None,
                "one encode process against TensorFlow's loop on one core",
            )
        )
        daemon = run_daemon(ctx, events, 2, max(events // 5, min(LINES_PER_FILE, events)))
        rows.append(
            ratio_row(
                case,
                f"events/s, --workers {cores} against the daemon",
                "events/s",
                rate_all,
                daemon.events / daemon.seconds,
                "daemon, encode_workers=2",
                None,
                "the same files; the daemon's start-up not counted, convert's counted",
            )
        )
    return rows
