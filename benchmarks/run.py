"""Run the benchmark suite: ``python -m benchmarks.run [--quick] [--events N] [--cases ...]``.

Prints the table. A full run (every case, default sizes) writes ``results/latest.md`` and
``results/latest.json``, the recorded figures the README links to; a partial run (``--quick``,
``--cases``, other sizes) leaves them alone and writes only where ``--out`` says.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .harness import Context, Row, as_json, machine, markdown, text_table

CASES = (
    "movies",
    "passthrough",
    "images",
    "sequence",
    "daemon",
    "large_inputs",
    "datasets",
    "convert",
)
RESULTS = Path(__file__).parent / "results"


def _load_tf(want: bool) -> object | None:
    if not want:
        return None
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow
    except ImportError:
        return None
    tf: object = tensorflow
    return tf


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.run", description=__doc__)
    p.add_argument("--quick", action="store_true", help="tiny sizes, one timing: a smoke run")
    p.add_argument("--events", type=int, help="JSON events per in-process case (default 50000)")
    p.add_argument("--images", type=int, help="image files (default 300)")
    p.add_argument("--steps", type=int, default=50, help="steps per SequenceExample")
    p.add_argument("--daemon-events", type=int, help="events per daemon run (default 1000000)")
    p.add_argument("--repeat", type=int, help="timed runs per measurement, best kept (default 5)")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--no-tensorflow", action="store_true", help="skip TensorFlow's baselines")
    p.add_argument(
        "--out",
        type=Path,
        help="where latest.md/.json go (default: results/ for a full run, none for a partial one)",
    )
    args = p.parse_args(argv)
    full = (
        not args.quick
        and list(args.cases) == list(CASES)
        and not (args.events or args.images or args.daemon_events or args.repeat)
        and args.steps == 50
        and not args.no_tensorflow
    )
    out: Path | None = args.out or (RESULTS if full else None)

    quick = args.quick
    settings = {
        "events": args.events or (300 if quick else 50_000),
        "images": args.images or (6 if quick else 300),
        "steps": args.steps,
        "daemon_events": args.daemon_events or (2_000 if quick else 1_000_000),
        "repeat": args.repeat or (1 if quick else 5),
    }
    tf = _load_tf(not args.no_tensorflow)
    info = machine()
    info["load average at start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows: list[Row] = []
    notes: list[str] = []
    if tf is None:
        notes.append("TensorFlow not used: no TensorFlow baselines, no read-back checks.")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfrecordd-bench-") as scratch:
        ctx = Context(quick=quick, scratch=Path(scratch), tf=tf, **settings)
        for name in args.cases:
            t0 = time.perf_counter()
            module = importlib.import_module(f".cases.{name}", __package__)
            got = module.run(ctx)
            rows += got
            print(f"[{name}: {time.perf_counter() - t0:.1f}s]", file=sys.stderr)
            print(text_table(got), file=sys.stderr)
        notes += ctx.notes
    info["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    info["suite took"] = f"{time.perf_counter() - started:.0f}s"
    print(text_table(rows))
    if out is None:
        print(
            f"a partial run: {RESULTS}/latest.* kept (--out DIR writes this run's)", file=sys.stderr
        )
        return 0
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.md").write_text(markdown(rows, info, settings, notes))
    (out / "latest.json").write_text(
        json.dumps(as_json(rows, info, settings, notes), indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
