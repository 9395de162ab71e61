#!/usr/bin/env python3
"""Long-run crash harness: SIGKILL tfrecordd at random instants while producers write, then audit.

    python scripts/crash_harness.py --source directory --kills 300
    python scripts/crash_harness.py --source redis-stream --kills 300 --compression gzip
    python scripts/crash_harness.py --kills 10000 --max-seconds 150 --tf-globs
    python scripts/crash_harness.py --datasets --kills 10000 --max-seconds 90
    python scripts/crash_harness.py --kills 300 --reloads

Every other run is armed with a named crash point until each phase of the commit protocol has
been killed in. Prints the figures (kills per phase, events, shards, lost / duplicated /
unexpected) and exits 0 only when nothing was lost, duplicated or unexpected, every crash phase
was hit, nothing a reader's shard glob matched after any kill was unpublished, every shard reads
back with an independent reader and ``tfrecordd verify`` accepts every shard.
The redis-stream source starts its own redis-server (it must be on PATH).

``--datasets``: one spool source routed by ``type`` into two datasets, one of them in folders
by event hour across a daylight-saving change (Europe/Berlin, 2026-10-25) and by country, with
completion markers and shards kept open across commits. After every kill, every acknowledged
spool file's records must be in published shards; at the end each record must be in its
dataset and folder, every event routed nowhere dead-lettered, and every marker must list
exactly its partition's shards.

``--reloads``: between kills, SIGHUP at random moments with the config switched between two
versions that differ in the source's polling, so each reload drains the source, publishes the
open shards and starts it again; kills then land before, during and after reloads.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.reliability.harness import Figures, run_crash_trials, run_dataset_trials


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--source", choices=["directory", "redis-stream"], default="directory")
    p.add_argument("--kills", type=int, default=300)
    p.add_argument("--compression", choices=["none", "gzip", "zlib", "zstd"], default="zstd")
    p.add_argument("--seed", type=int, default=None, help="default: the current time")
    p.add_argument("--max-delay", type=float, default=1.5, help="kill within [0, this) seconds")
    p.add_argument("--keep", type=Path, default=None, help="work here and keep it (default: tmp)")
    p.add_argument(
        "--packed",
        action="store_true",
        help="batches of 1000 events, packed into units by two encode workers",
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop killing after this long (then drain and audit): a time-bounded long mode",
    )
    p.add_argument(
        "--datasets",
        action="store_true",
        help="two datasets from one routed spool source, time partitions and markers",
    )
    p.add_argument(
        "--reloads",
        action="store_true",
        help="SIGHUP the daemon at random moments between kills, each time with a config "
        "that restarts its source: kills land in reloads too",
    )
    p.add_argument(
        "--tf-globs",
        action="store_true",
        help="look with TensorFlow's globs too after every kill (needs tensorflow)",
    )
    args = p.parse_args()
    seed = args.seed if args.seed is not None else int(time.time())
    print(f"seed {seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tfrecordd-crash-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        server = None
        url = None
        if args.source == "redis-stream":
            from tests.redis_server import RedisServer

            server = RedisServer(root / "redis")
            server.start()
            url = server.url
        try:
            if args.datasets:
                if args.source != "directory" or args.packed:
                    p.error("--datasets runs a spool directory, without --packed")
                figs = run_dataset_trials(
                    root / "run",
                    kills=args.kills,
                    seed=seed,
                    compression=args.compression,
                    max_delay=args.max_delay,
                    progress=lambda s: print(s, flush=True),
                    max_seconds=args.max_seconds,
                    tf_globs=args.tf_globs,
                    reloads=args.reloads,
                )
                return report(figs)
            figs = run_crash_trials(
                root / "run",
                source=args.source,
                kills=args.kills,
                seed=seed,
                compression=args.compression,
                max_delay=args.max_delay,
                redis_url=url,
                progress=lambda s: print(s, flush=True),
                packed=args.packed,
                max_seconds=args.max_seconds,
                tf_globs=args.tf_globs,
                reloads=args.reloads,
            )
        finally:
            if server is not None:
                server.stop()
    return report(figs)


def report(figs: Figures) -> int:
    print(figs.summary())
    for note in figs.notes:
        print(f"note: {note}")
    return 0 if figs.ok else 1


if __name__ == "__main__":
    sys.exit(main())
