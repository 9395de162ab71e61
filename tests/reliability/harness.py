"""The crash harness: producers, a daemon SIGKILLed at random instants, an independent audit.

Everything here reads the daemon's output without tfrecordd's own reader (the independent
reader of :mod:`tests.support` parses TFRecord framing and CRCs, gzip/zlib/zstd streams and the
``tf.train.Example`` wire format), so a bug shared by the daemon's writer and reader cannot hide
itself. ``tfrecordd verify`` is run on top, as a second opinion.

A trial: start ``tfrecordd run`` as a subprocess, let producers write, SIGKILL it after a delay
drawn uniformly from ``[0, max_delay)`` (which spans start-up and recovery, reading, writing and
committing), restart, repeat. Every other run is instead armed with a named crash point
(``TFRECORDD_CRASH_AT``) not yet reached in this run, so that every phase of the commit protocol
is killed in at least once whatever the seed. After every kill, before the restart, whatever a
reader's shard glob matches must be a published shard (:class:`tests.support.GlobOracle`). At the
end a clean daemon drains the input and is stopped with SIGTERM, and the audit counts lost,
duplicated and unexpected events.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tests.support import (
    SHARD_SUFFIXES,
    DaemonProcess,
    GlobOracle,
    ShardError,
    TfGlobber,
    count_ids,
    count_records,
    decompress,
    example_int64,
    movie_event,
    published_shards,
    read_shard,
    run_tfrecordd,
    shard_suffix,
    split_records,
    spool_drained,
    spool_file,
    wait_for,
    write_config,
)
from tfrecordd.plugin import Registry

POINTS = Registry.from_entry_points().crash_points()
"""Every crash point: the daemon's and the built-in sources'."""

CRASH_PHASES = {
    "directory": tuple(p for p in POINTS if p not in ("mid-upload", "after-marker")),
    "redis-stream": tuple(
        p
        for p in POINTS
        if p not in ("mid-upload", "after-claim", "after-spool-ack", "after-marker")
    ),
}
"""The named crash points each source passes on a local output (``mid-upload`` is object
storage's; claims and spool acks are the spool directory's)."""


def tfrecordd_verify(paths: list[Path]) -> tuple[int, str]:
    """``tfrecordd verify`` on the given shards: exit code and output."""
    if not paths:
        return 0, ""
    done = run_tfrecordd("verify", *map(str, paths), timeout=600)
    return done.returncode, done.stdout + done.stderr


@dataclass
class Audit:
    """What the output holds compared with what producers wrote."""

    events: int
    lost: int
    duplicated: int
    unexpected: int
    """Records of an id no producer wrote, and records without an id."""
    shards: int
    reader_visible_unpublished: int
    """What a reader's shard glob matched that was not a published shard, at any look (after
    every kill and at the end); :attr:`problems` names each."""
    problems: list[str]
    verify_exit: int

    @property
    def ok(self) -> bool:
        return (self.lost, self.duplicated, self.unexpected) == (0, 0, 0) and (
            self.reader_visible_unpublished == 0 and not self.problems and self.verify_exit == 0
        )


def audit(
    out: Path, expected: set[int], *, verify: bool = True, globs: GlobOracle | None = None
) -> Audit:
    """Count the published shards of ``out`` against ``expected``; ``globs``: the oracle that
    looked after every kill (a fresh one looks once now otherwise)."""
    count = count_records(out)
    shards = published_shards(out)
    rc = tfrecordd_verify(shards)[0] if verify else 0
    if globs is None:
        globs = GlobOracle(out)
    globs.look("at the end")
    globs.finish()
    return Audit(
        events=len(expected),
        lost=len(expected - count.ids.keys()),
        duplicated=sum(c - 1 for i, c in count.ids.items() if c > 1 and i in expected),
        unexpected=sum(c for i, c in count.ids.items() if i not in expected) + count.no_id,
        shards=len(shards),
        reader_visible_unpublished=len(globs.violations),
        problems=count.problems + globs.violations,
        verify_exit=rc,
    )


# -- producers -------------------------------------------------------------------------------

BAD_EVERY = 97
"""Every this-many-th input is malformed: it must be dead-lettered, never written."""


class Producer(threading.Thread):
    """Writes batches of events with unique ids until stopped or ``max_events`` is reached."""

    def __init__(self, batch: int, interval: float, max_events: int) -> None:
        super().__init__(daemon=True)
        self.batch = batch
        self.interval = interval
        self.max_events = max_events
        self.ids: set[int] = set()
        self.bad: set[str] = set()
        """Where each malformed input is (as the dead letters name it)."""
        self.next_id = 0
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    def write_batch(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        try:
            while not self._stop_event.is_set() and self.next_id < self.max_events:
                with self._lock:
                    self.write_batch()
                self._stop_event.wait(self.interval)
        except BaseException as e:  # reported by stop()
            self.error = e

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)
        assert not self.is_alive(), "producer did not stop"
        if self.error is not None:
            raise self.error

    def _lines(self) -> list[tuple[int | None, bytes]]:
        out: list[tuple[int | None, bytes]] = []
        for _ in range(self.batch):
            i = self.next_id
            self.next_id += 1
            out.append((i, orjson.dumps(movie_event(i))))
            if i % BAD_EVERY == BAD_EVERY - 1:
                out.append((None, b"{broken"))
        return out


class SpoolProducer(Producer):
    """Spool files published by rename, one per batch."""

    def __init__(self, spool: Path, batch: int = 100, interval: float = 0.05, **kw: Any):
        super().__init__(batch, interval, kw.get("max_events", 10**9))
        self.spool = spool
        self.files = 0

    def write_batch(self) -> None:
        name = f"p{self.files:06d}.jsonl"
        self.files += 1
        lines = self._lines()
        offset = 0
        for i, line in lines:
            if i is None:
                self.bad.add(f"{name}:{offset}")
            else:
                self.ids.add(i)
            offset += len(line) + 1
        spool_file(self.spool, name, [line for _, line in lines])


class RedisProducer(Producer):
    """Entries XADDed to a stream, one pipeline per batch."""

    def __init__(self, url: str, stream: str = "events", batch: int = 100, **kw: Any):
        super().__init__(batch, kw.get("interval", 0.05), kw.get("max_events", 10**9))
        from redis import Redis

        self.client = Redis.from_url(url)
        self.stream = stream

    def write_batch(self) -> None:
        lines = self._lines()
        pipe = self.client.pipeline(transaction=False)
        for _, line in lines:
            pipe.xadd(self.stream, {"data": line})
        entry_ids = pipe.execute()
        for (i, _), entry_id in zip(lines, entry_ids, strict=True):
            if i is None:
                self.bad.add(f"{self.stream}:{entry_id.decode()}")
            else:
                self.ids.add(i)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.client.close()


# -- the kill loop ---------------------------------------------------------------------------

_RECOVERED = re.compile(
    r"recovered: (\d+) commit\(s\) redone, (\d+) dropped, (\d+) in-progress file\(s\) discarded"
)


@dataclass
class Figures:
    """What one harness run did and found."""

    source: str
    compression: str
    kills: int = 0
    killed_before_ready: int = 0
    """Kills during start-up and recovery (before the pipeline ran)."""
    recovered_redone: int = 0
    """Restarts that found a published shard whose acks were not done (killed mid-commit)."""
    recovered_dropped: int = 0
    """Restarts that found an intent whose shard was not published (killed mid-commit)."""
    recovered_discarded: int = 0
    """Restarts that found an in-progress shard (killed while writing)."""
    torn_journal: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    """Each crash phase the run must kill in → how many times a kill landed there."""
    glob_looks: int = 0
    """Looks of the reader-glob oracle (one after every kill and one at the end)."""
    dead_letters_missing: int = 0
    seconds: float = 0.0
    audit: Audit | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.audit is not None
            and self.audit.ok
            and self.dead_letters_missing == 0
            and not self.phases_missed
        )

    @property
    def phases_missed(self) -> list[str]:
        """Crash phases no kill of the run landed in."""
        return [p for p, n in self.phases.items() if n == 0]

    def count_recovery(self, log: str) -> None:
        """Count what a restart's recovery line in ``log`` says it found, if there is one."""
        m = _RECOVERED.search(log)
        if m:
            redone, dropped, discarded = map(int, m.groups())
            self.recovered_redone += redone > 0
            self.recovered_dropped += dropped > 0
            self.recovered_discarded += discarded > 0

    def summary(self) -> str:
        a = self.audit
        assert a is not None
        return (
            f"{self.source}/{self.compression}: {self.kills} SIGKILLs "
            f"({self.killed_before_ready} during start-up/recovery; restarts found "
            f"{self.recovered_discarded}x an in-progress shard, {self.recovered_dropped}x an "
            f"unpublished intent, {self.recovered_redone}x a published shard awaiting acks, "
            f"{self.torn_journal}x a torn journal tail; crash phases hit "
            f"{sum(n > 0 for n in self.phases.values())}/{len(self.phases)}"
            f"{', missed ' + ' '.join(self.phases_missed) if self.phases_missed else ''}), "
            f"{a.events} events in {a.shards} shards: "
            f"lost {a.lost}, duplicated {a.duplicated}, unexpected {a.unexpected}, "
            f"unpublished files a reader's glob matched {a.reader_visible_unpublished} "
            f"({self.glob_looks} looks), problems {len(a.problems)}, "
            f"verify exit {a.verify_exit}, dead letters missing {self.dead_letters_missing}, "
            f"{self.seconds:.0f}s"
        )


def harness_config(
    root: Path,
    source: str,
    compression: str,
    redis_url: str | None,
    packed: bool = False,
    *,
    drain: bool = False,
) -> Path:
    """Small shards and batches, so commits come every few milliseconds; ``packed``: batches of
    1000 events (about 170 KiB, so encode workers frame and compress them as units of their
    own), two encode workers, and shards of 5000 records. ``drain``: batches and shards of
    1000 events, for the clean run that drains the backlog the kills left (at a commit per 50
    events, that run was most of a trial's time)."""
    output = {
        "compression": compression,
        "max_shard_records": 5000 if packed else 1000 if drain else 50,
        "max_shard_age": "100ms",
        "min_free_bytes": 0,
    }
    daemon: dict[str, Any] = {"max_batch_events": 10, "drain_timeout": "30s"}
    if packed or drain:
        daemon |= {"max_batch_events": 1000}
    if packed:
        daemon |= {"encode_workers": 2}
    if source == "directory":
        return write_config(root, output=output, daemon=daemon)
    from tests.redis_server import write_redis_config

    assert redis_url is not None
    return write_redis_config(root, redis_url, output=output, daemon=daemon)


def redis_drained(url: str, stream: str = "events") -> bool:
    from redis import Redis

    with Redis.from_url(url) as r:
        groups = r.xinfo_groups(stream)
        return bool(groups) and groups[0]["pending"] == 0 and groups[0]["lag"] == 0


def run_crash_trials(
    root: Path,
    *,
    source: str,
    kills: int,
    seed: int,
    compression: str = "zstd",
    max_delay: float = 1.5,
    redis_url: str | None = None,
    progress: Callable[[str], None] | None = None,
    packed: bool = False,
    phases: Sequence[str] | None = None,
    max_seconds: float | None = None,
    tf_globs: bool = False,
) -> Figures:
    """SIGKILL a daemon ``kills`` times while producers write, then drain and audit.

    ``phases``: the crash points to kill in at least once (every one the source passes by
    default; empty for random kills only). ``max_seconds``: stop killing after this long (the
    drain and the audit follow), for a time-bounded long mode. ``tf_globs``: TensorFlow's globs
    are among the reader globs looked through after every kill (a helper process imports it)."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    cfg = harness_config(root, source, compression, redis_url, packed)
    figs = Figures(source, compression)
    figs.phases = dict.fromkeys(CRASH_PHASES[source] if phases is None else phases, 0)
    producer: Producer
    per_file = 1000 if packed else 100
    if source == "directory":
        producer = SpoolProducer(root / "spool", batch=per_file, interval=0.05)
        drained: Callable[[], bool] = lambda: spool_drained(root / "spool")  # noqa: E731
    else:
        assert redis_url is not None
        producer = RedisProducer(redis_url, batch=100, interval=0.05)
        drained = lambda: redis_drained(redis_url)  # noqa: E731
    tf = TfGlobber() if tf_globs else None
    killing_since = time.monotonic()
    try:
        globs = GlobOracle(root / "shards", tf)
        producer.start()
        try:
            for n in range(kills):
                if max_seconds is not None and time.monotonic() - killing_since > max_seconds:
                    figs.notes.append(f"stopped after {n} kills: {max_seconds:.0f}s bound")
                    break
                kill_one(cfg, rng, figs, max_delay, armed=n % 2 == 1)
                globs.look(f"after kill {n + 1}")
                figs.glob_looks += 1
                if progress and (n + 1) % 10 == 0:
                    progress(f"{source}: {n + 1}/{kills} kills")
        finally:
            producer.stop()
        # The last restart's recovery is counted too, then a clean daemon drains everything.
        d = DaemonProcess(harness_config(root, source, compression, redis_url, packed, drain=True))
        try:
            d.wait_started(60)
            figs.count_recovery(d.output())
            wait_for(drained, timeout=600, interval=0.2)
            rc = d.stop(120)
            if rc != 0:
                figs.notes.append(f"final stop exited {rc}: {d.output()[-2000:]}")
        finally:
            d.kill()
        figs.glob_looks += 1
        figs.audit = audit(root / "shards", producer.ids, globs=globs)
    finally:
        if tf is not None:
            tf.close()
    letters = dead_letter_places(root / "state")
    figs.dead_letters_missing = len(producer.bad - letters)
    figs.seconds = time.monotonic() - t0
    if figs.audit.problems:
        figs.notes.extend(figs.audit.problems[:10])
    return figs


def kill_one(
    cfg: Path, rng: random.Random, figs: Figures, max_delay: float, *, armed: bool
) -> None:
    """One run of the daemon, ended by SIGKILL after a random delay, or (``armed``, while a
    phase of ``figs.phases`` is still missed) by the next missed crash point, reached for the
    1st to 3rd time; a crash point not reached within a few seconds is SIGKILLed too, and
    tried again by the next armed run."""
    missed = figs.phases_missed
    point = missed[0] if armed and missed else None
    env = {"TFRECORDD_CRASH_AT": f"{point}:{rng.randint(1, 3)}"} if point else None
    # A random kill may land in start-up itself, imports included: that run starts cold. An
    # armed run dies at its crash point, however it started.
    d = DaemonProcess(cfg, env=env, cold=point is None)
    if point is None:
        time.sleep(rng.uniform(0.0, max_delay))
    else:
        with contextlib.suppress(subprocess.TimeoutExpired):
            d.wait(max_delay + 10)
    d.kill()
    if point is not None and d.proc.returncode == 137:
        figs.phases[point] += 1
    figs.kills += 1
    out = d.output()
    figs.killed_before_ready += " started: " not in out
    figs.count_recovery(out)
    figs.torn_journal += "journal tail torn" in out


def dead_letter_places(state: Path) -> set[str]:
    """Where each dead letter in ``state`` (and its rotated file) came from."""
    places: set[str] = set()
    for name in ("dead-letters.jsonl", "dead-letters.jsonl.1"):
        path = state / name
        if path.exists():
            places.update(json.loads(line)["where"] for line in path.read_text().splitlines())
    return places


def rss_high_water(pid: int) -> int:
    """Peak resident set size of a process, in bytes (``VmHWM`` from /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


__all__ = [
    "SHARD_SUFFIXES",
    "Audit",
    "Figures",
    "RedisProducer",
    "ShardError",
    "SpoolProducer",
    "audit",
    "count_ids",
    "count_records",
    "decompress",
    "example_int64",
    "published_shards",
    "read_shard",
    "rss_high_water",
    "run_crash_trials",
    "shard_suffix",
    "split_records",
    "tfrecordd_verify",
]


# -- a daemon process with a slow output -----------------------------------------------------


def slow_output_fs(delay: float) -> Any:
    """A FileSystem whose fsyncs (file and directory) each take ``delay`` seconds longer: an
    output device slower than the input."""
    from tfrecordd.fsys import FileSystem

    class SlowFs(FileSystem):
        def fsync(self, f: Any) -> None:
            time.sleep(delay)
            super().fsync(f)

        def fsync_dir(self, path: str) -> None:
            time.sleep(delay)
            super().fsync_dir(path)

    return SlowFs()


def _slow_daemon_main(config: str, delay: float) -> int:
    """``tfrecordd run`` with a slow output: SIGTERM stops it (exit 0)."""
    import anyio

    from tfrecordd import logs
    from tfrecordd.config import load_config
    from tfrecordd.pipeline.runtime import Daemon

    cfg = load_config(config)
    logs.setup("text")
    anyio.run(Daemon(cfg, fs=slow_output_fs(delay)).run)
    return 0


if __name__ == "__main__":
    # python -m tests.reliability.harness slow-daemon CONFIG DELAY
    if len(sys.argv) == 4 and sys.argv[1] == "slow-daemon":
        sys.exit(_slow_daemon_main(sys.argv[2], float(sys.argv[3])))
    sys.exit("usage: python -m tests.reliability.harness slow-daemon CONFIG FSYNC_DELAY")
