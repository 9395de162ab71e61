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

The datasets run (:func:`run_dataset_trials`) routes one spool into two datasets, one of them in
folders by event hour across a daylight-saving change and by country, with completion markers.
After every kill it also checks that every acknowledged spool file's records are published
(:class:`AckAudit`): recovery rolls a kept-open shard forward, so an acknowledgement given too
early shows only then. At the end it places each record (dataset, folder, ``ts``, worked out
from the event with zoneinfo) and checks the markers against the shards.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from tests.support import (
    SHARD_SUFFIXES,
    DaemonProcess,
    GlobOracle,
    ShardError,
    TfGlobber,
    claimed_files,
    count_ids,
    count_records,
    dataset_shards,
    decompress,
    example_int64,
    hour_folder,
    movie_event,
    published_shards,
    read_shard,
    record_id,
    run_tfrecordd,
    shard_suffix,
    split_records,
    spool_drained,
    spool_file,
    wait_for,
    write_config,
    write_datasets_config,
)
from tfrecordd.outputs.manifest import manifest_name
from tfrecordd.plugin import Registry
from tfrecordd_plugins.sources.spool_names import original

POINTS = Registry.from_entry_points().crash_points()
"""Every crash point: the daemon's and the built-in sources'."""

CRASH_PHASES = {
    "directory": tuple(p for p in POINTS if p not in ("mid-upload", "after-marker")),
    "redis-stream": tuple(
        p
        for p in POINTS
        if p not in ("mid-upload", "after-claim", "after-spool-ack", "after-marker")
    ),
    "datasets": tuple(p for p in POINTS if p != "mid-upload"),
}
"""The named crash points each run passes on a local output (``mid-upload`` is object
storage's; claims and spool acks are the spool directory's; ``after-marker`` is passed only by
the datasets run, whose partitions get completion markers)."""


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

    def extra(self) -> str:
        """What a kind of run audits beyond this, for the summary (ending in ``", "``)."""
        return ""


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
    r"(?:, (\d+) open shard\(s\) finished)?"
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
    recovered_finished: int = 0
    """Restarts that finished a shard kept open by a commit at its journalled prefix."""
    torn_journal: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    """Each crash phase the run must kill in → how many times a kill landed there."""
    glob_looks: int = 0
    """Looks of the reader-glob oracle (one after every kill and one at the end)."""
    reloads: int = 0
    """SIGHUPs sent between kills (``reloads``), each with a config that restarts a source."""
    reloads_applied: int = 0
    """Reloads the daemon said it applied before it was killed."""
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
            redone, dropped, discarded, finished = (int(g or 0) for g in m.groups())
            self.recovered_redone += redone > 0
            self.recovered_dropped += dropped > 0
            self.recovered_discarded += discarded > 0
            self.recovered_finished += finished > 0

    def summary(self) -> str:
        a = self.audit
        assert a is not None
        return (
            f"{self.source}/{self.compression}: {self.kills} SIGKILLs "
            f"({self.killed_before_ready} during start-up/recovery; restarts found "
            f"{self.recovered_discarded}x an in-progress shard, {self.recovered_dropped}x an "
            f"unpublished intent, {self.recovered_redone}x a published shard awaiting acks, "
            f"{self.recovered_finished}x a kept-open shard to finish, "
            f"{self.torn_journal}x a torn journal tail; crash phases hit "
            f"{sum(n > 0 for n in self.phases.values())}/{len(self.phases)}"
            f"{', missed ' + ' '.join(self.phases_missed) if self.phases_missed else ''}), "
            f"{a.events} events in {a.shards} shards: "
            f"lost {a.lost}, duplicated {a.duplicated}, unexpected {a.unexpected}, "
            f"unpublished files a reader's glob matched {a.reader_visible_unpublished} "
            f"({self.glob_looks} looks), problems {len(a.problems)}, "
            f"verify exit {a.verify_exit}, dead letters missing {self.dead_letters_missing}, "
            f"{a.extra()}"
            + (
                f"{self.reloads} SIGHUPs between kills ({self.reloads_applied} applied), "
                if self.reloads
                else ""
            )
            + f"{self.seconds:.0f}s"
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
    reloads: bool = False,
) -> Figures:
    """SIGKILL a daemon ``kills`` times while producers write, then drain and audit.

    ``phases``: the crash points to kill in at least once (every one the source passes by
    default; empty for random kills only). ``max_seconds``: stop killing after this long (the
    drain and the audit follow), for a time-bounded long mode. ``tf_globs``: TensorFlow's globs
    are among the reader globs looked through after every kill (a helper process imports it).
    ``reloads``: SIGHUPs between the kills (:func:`kill_one`)."""
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
                kill_one(cfg, rng, figs, max_delay, armed=n % 2 == 1, reloads=reloads)
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


def reload_variant(text: str) -> str:
    """``text`` (a harness config) with its first source changed in a setting a reload takes
    live: applying it stops that source, drains it and starts it again."""
    m = re.search(r'^"?(?:poll_interval|block)"? = "([^"]*)"', text, re.MULTILINE)
    if m is None:
        raise ValueError("no poll_interval or block in the config to change")
    other = "97ms" if m.group(1) != "97ms" else "93ms"
    return text[: m.start(1)] + other + text[m.end(1) :]


def _reloading(
    d: DaemonProcess, cfg: Path, rng: random.Random, figs: Figures, seconds: float
) -> None:
    """For ``seconds``, SIGHUP the running daemon at random moments, each time with ``cfg``
    switched between its text and :func:`reload_variant` of it (replaced atomically)."""
    original = cfg.read_text()
    variant = reload_variant(original)
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        pause = rng.uniform(0.05, 0.4)
        if pause >= left:
            time.sleep(left)
            return
        time.sleep(pause)
        if d.proc.poll() is not None or " started: " not in d.output():
            continue
        tmp = cfg.with_name(cfg.name + ".new")
        tmp.write_text(variant if cfg.read_text() == original else original)
        tmp.replace(cfg)
        d.signal(signal.SIGHUP)
        figs.reloads += 1


def kill_one(
    cfg: Path,
    rng: random.Random,
    figs: Figures,
    max_delay: float,
    *,
    armed: bool,
    reloads: bool = False,
) -> None:
    """One run of the daemon, ended by SIGKILL after a random delay, or (``armed``, while a
    phase of ``figs.phases`` is still missed) by the next missed crash point, reached for the
    1st to 3rd time; a crash point not reached within a few seconds is SIGKILLed too, and
    tried again by the next armed run. ``reloads``: until a random kill, SIGHUPs with a config
    that restarts a source (:func:`_reloading`), so that kills land in reloads too."""
    missed = figs.phases_missed
    point = missed[0] if armed and missed else None
    env = {"TFRECORDD_CRASH_AT": f"{point}:{rng.randint(1, 3)}"} if point else None
    # A random kill may land in start-up itself, imports included: that run starts cold. An
    # armed run dies at its crash point, however it started.
    d = DaemonProcess(cfg, env=env, cold=point is None)
    if point is None and reloads:
        _reloading(d, cfg, rng, figs, rng.uniform(0.0, max_delay))
    elif point is None:
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
    figs.reloads_applied += out.count("reload: applied")


def dead_letter_places(state: Path) -> set[str]:
    """Where each dead letter in ``state`` (and its rotated file) came from."""
    places: set[str] = set()
    for name in ("dead-letters.jsonl", "dead-letters.jsonl.1"):
        path = state / name
        if path.exists():
            places.update(
                dead_letter_place(json.loads(line)["where"])
                for line in path.read_text().splitlines()
            )
    return places


# -- two datasets, routed, one in event-hour partitions with markers (--datasets) -------------

DST_ZONE = "Europe/Berlin"
DATASETS_T0 = int(datetime(2026, 10, 24, 23, 0, tzinfo=UTC).timestamp())
"""The first event's time: 01:00 in Berlin, two hours before its clocks go back (03:00 CEST
becomes 02:00 CET at 01:00 UTC on 2026-10-25), so the events pass the repeated hour."""
EVENT_STEP = 0.5
"""Seconds of event time between two events: an hour of it is 7,200 events, a few seconds of
writing."""
TYPES = ("click", "impression", "other")
"""An event's ``type``, by ``id % 3``: ``other`` is routed nowhere (dead-lettered)."""
COUNTRIES = ("de", "fr", "../x")
"""The clicks' folder field; the last value is no safe folder name: ``country=_other``."""
TS = {"type": "int64", "time_unit": "ms"}
CLICKS = {"id": "int64", "type": "bytes", "ts": TS, "country": "bytes", "url": "bytes"}
IMPRESSIONS = {"id": "int64", "type": "bytes", "ts": TS, "slot": "int64"}
ROUTE = {"field": "type", "to": {"click": "clicks", "impression": "impressions"}}
DATASETS = ("clicks", "impressions")

Place = tuple[str, str, int]
"""Where a record belongs: its dataset, its partition folder, and its ``ts`` as written (ms)."""


def dataset_event(i: int, step: float = EVENT_STEP, disorder: int = 0) -> dict[str, Any]:
    """Event ``i`` of a datasets run (``ts``: seconds since the epoch, written as ms), dated up
    to ``disorder`` seconds before its place in the sequence (scattered, not random: a rerun
    makes the same events)."""
    return {
        "id": i,
        "type": TYPES[i % 3],
        "ts": DATASETS_T0 + int(i * step) - i * 2654435761 % (disorder + 1),
        "country": COUNTRIES[i // 3 % 3],
        "url": f"https://example.com/{i}",
        "slot": i % 7,
    }


def dst_hour_folder(seconds: int) -> str:
    """:func:`tests.support.hour_folder` in the datasets runs' zone."""
    return hour_folder(seconds, DST_ZONE)


def expected_place(event: Mapping[str, Any]) -> Place | None:
    """Where an event's record belongs; ``None`` for an event routed nowhere."""
    if event["type"] == "impression":
        return ("impressions", "", event["ts"] * 1000)
    if event["type"] != "click":
        return None
    country = event["country"]
    if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}", country):
        country = "_other"
    return ("clicks", f"{dst_hour_folder(event['ts'])}/country={country}", event["ts"] * 1000)


def datasets_config(
    root: Path,
    compression: str = "zstd",
    *,
    drain: bool = False,
    closing: bool = False,
    lateness: str = "20m",
    manifests: bool = True,
    daemon: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
    datasets: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """Two datasets fed by one spool source (``root/spool``) routed by ``type``: ``clicks`` in
    folders by event hour in Europe/Berlin and by country, with completion markers, 20 records
    a shard and at most 4 open (3 countries a hour: the cap closes shards at each new hour);
    ``impressions`` unpartitioned, 200 records a shard or 500 ms, so its shard stays open
    across the cuts the clicks' rotation makes. ``drain``: shards and batches of 1000, for the
    clean run that drains the backlog. ``closing``: the watermark moves on with the clock once
    no event came for a second, closing every partition (the clock is past them all).
    ``datasets``: keys to change in each dataset's table."""
    partition = {"time": "event", "time_field": "ts", "zone": DST_ZONE, "fields": ["country"]}
    clicks = {
        "encoder": "clicks",
        "compression": compression,
        "max_shard_records": 1000 if drain else 20,
        "max_shard_age": "1s",
        "max_open_shards": 4,
        "manifests": manifests,
        "partition": partition,
        "completion": {"allowed_lateness": lateness, "idle_close": "1s" if closing else "1h"},
    }
    impressions = {
        "encoder": "impressions",
        "compression": compression,
        "max_shard_records": 1000 if drain else 200,
        "max_shard_age": "500ms",
        "manifests": manifests,
    }
    change = dict(datasets or {})
    return write_datasets_config(
        root,
        {
            "clicks": clicks | dict(change.get("clicks", {})),
            "impressions": impressions | dict(change.get("impressions", {})),
        },
        encoders={"clicks": CLICKS, "impressions": IMPRESSIONS},
        sources=[{"name": "spool", "path": root / "spool", "route": ROUTE} | dict(source or {})],
        daemon={"max_batch_events": 1000 if drain else 10, "drain_timeout": "30s"}
        | dict(daemon or {}),
    )


class DatasetProducer(SpoolProducer):
    """Spool files of :func:`dataset_event` events, one per batch; knows where each event's
    record belongs, and which files hold which."""

    def __init__(
        self,
        spool: Path,
        batch: int = 100,
        interval: float = 0.05,
        step: float = EVENT_STEP,
        disorder: int = 0,
        **kw: Any,
    ) -> None:
        super().__init__(spool, batch, interval, **kw)
        self.step = step
        self.disorder = disorder
        self.places: dict[int, Place] = {}
        """Each id a shard must hold, and where."""
        self.unrouted: set[str] = set()
        """Where each event routed nowhere is (as the dead letters name it)."""
        self.contents: dict[str, list[int]] = {}
        """Each file published into the spool → the ids of its records."""

    def write_batch(self) -> None:
        name = f"p{self.files:06d}.jsonl"
        self.files += 1
        lines: list[bytes] = []
        ids: list[int] = []
        offset = 0
        for _ in range(self.batch):
            i = self.next_id
            self.next_id += 1
            event = dataset_event(i, self.step, self.disorder)
            line = orjson.dumps(event)
            place = expected_place(event)
            if place is None:
                self.unrouted.add(f"{name}:{offset}")
            else:
                self.places[i] = place
                ids.append(i)
            lines.append(line)
            offset += len(line) + 1
            if i % BAD_EVERY == BAD_EVERY - 1:
                self.bad.add(f"{name}:{offset}")
                lines.append(b"{broken")
                offset += len(b"{broken") + 1
        spool_file(self.spool, name, lines)
        self.ids.update(ids)
        self.contents[name] = ids

    def written(self) -> dict[str, list[int]]:
        """The files in the spool so far (a consistent snapshot)."""
        with self._lock:
            return dict(self.contents)

    def click_hours(self) -> set[str]:
        """The time partitions holding clicks: each must get a marker."""
        return {p[1].rpartition("/")[0] for p in self.places.values() if p[0] == "clicks"}


Read = tuple[int | None, int | None]
"""A record's id and ``ts`` (``None`` where it has not exactly one)."""


@dataclass
class Placement:
    """What the published shards of the datasets hold, against where each record belongs."""

    ids: Counter[int]
    misplaced: list[str]
    """Each record in another dataset or folder than its own (or with another ``ts``)."""
    unexpected: int
    """Records of no produced id, of an event routed nowhere, or without an id."""
    shards: int


class ShardIndex:
    """The published shards of the datasets' outputs, each read once: a published shard never
    changes (the glob oracle holds the run to that)."""

    def __init__(self, outs: Mapping[str, Path]) -> None:
        self.outs = dict(outs)
        self.shards: dict[Path, tuple[str, str, list[Read]]] = {}
        """Each shard read → its dataset, its folder, its records."""
        self.ids: set[int] = set()
        self.problems: list[str] = []

    def refresh(self) -> None:
        """Read the shards published since the last call."""
        for dataset, out in self.outs.items():
            for shard in dataset_shards(out):
                if shard not in self.shards:
                    self._read(dataset, out, shard)

    def _read(self, dataset: str, out: Path, shard: Path) -> None:
        folder = shard.parent.relative_to(out).as_posix()
        rel = shard.relative_to(out.parent)
        try:
            records = read_shard(shard)
        except ShardError as e:
            self.problems.append(f"{rel}: {e}")
            records = []
        if not records:
            self.problems.append(f"{rel}: no records")
        found: list[Read] = []
        for r in records:
            ts = example_int64(r, "ts")
            found.append((record_id(r), ts[0] if len(ts) == 1 else None))
        self.shards[shard] = (dataset, "" if folder == "." else folder, found)
        self.ids.update(i for i, _ in found if i is not None)

    def check_manifests(self) -> None:
        """Each shard's manifest (once the daemon has stopped: a kill may come between a shard
        and its manifest, which the restart rebuilds) agrees with the shard."""
        for shard, (_, _, records) in sorted(self.shards.items()):
            man = shard.with_name(manifest_name(shard.name))
            if not man.exists():
                self.problems.append(f"{shard.name}: no manifest")
                continue
            doc = json.loads(man.read_bytes())
            data = shard.read_bytes()
            if (doc.get("records"), doc.get("size"), doc.get("sha256")) != (
                len(records),
                len(data),
                hashlib.sha256(data).hexdigest(),
            ):
                self.problems.append(f"{shard.name}: manifest disagrees")

    def placement(self, places: Mapping[int, Place]) -> Placement:
        ids: Counter[int] = Counter()
        misplaced: list[str] = []
        unexpected = 0
        for dataset, folder, records in self.shards.values():
            for i, ts in records:
                want = places.get(i) if i is not None else None
                if i is None or want is None:
                    unexpected += 1
                    continue
                ids[i] += 1
                if (dataset, folder, ts) != want:
                    where = "/".join(map(str, want))
                    misplaced.append(f"id {i} in {dataset}/{folder} (ts {ts}), its place {where}")
        return Placement(ids, misplaced, unexpected, len(self.shards))


@dataclass
class AckAudit:
    """After every kill, before the restart: every record of a spool file acknowledged by then
    (gone from the spool and from the claim folders) is in a published shard. A record still in
    an open shard (durable, journalled, but not published) breaks ack-after-publish."""

    state: Path | None = None
    """The daemon's ``state_dir``: records it dead-lettered as late are counted by the audit as
    such, not here."""
    files: int = 0
    """Acknowledged files checked."""
    unpublished: int = 0
    """Records of acknowledged files not in a published shard."""
    problems: list[str] = field(default_factory=list)
    checked: set[str] = field(default_factory=set)

    def look(
        self, contents: Mapping[str, list[int]], spool: Path, index: ShardIndex, when: str
    ) -> None:
        """``contents``: each file published into ``spool`` before this look → its ids."""
        present = {p.name for p in spool.iterdir()}
        present |= {original(c.name) for c in claimed_files(spool)}
        acked = [n for n in contents if n not in present and n not in self.checked]
        if not acked:
            return
        index.refresh()
        # The daemon was killed just now (or runs): its last dead letter may be cut short.
        late = late_ids(self.state, partial=True) if self.state is not None else set()
        for name in acked:
            self.checked.add(name)
            self.files += 1
            missing = [i for i in contents[name] if i not in index.ids and i not in late]
            self.unpublished += len(missing)
            if missing:
                self.problems.append(
                    f"{when}: {name} acknowledged, {len(missing)} of its records not published "
                    f"(ids {missing[:5]})"
                )


@dataclass
class DatasetAudit(Audit):
    """:class:`Audit`, and where each record is, the markers, and acknowledgements."""

    misplaced: int = 0
    late: int = 0
    """Records dead-lettered as late: each of them was on time when first read."""
    markers: int = 0
    unrouted: int = 0
    """Events routed to no dataset (each must be dead-lettered)."""
    acked_files: int = 0
    acked_unpublished: int = 0
    dead_letters_duplicated: int = 0
    """Dead letters written again: a kill after their fsync and before their commit's intent
    replays their events, and recovery must first cut off the dead letters no commit covers."""

    @property
    def ok(self) -> bool:
        return super().ok and (
            self.misplaced,
            self.late,
            self.acked_unpublished,
            self.dead_letters_duplicated,
        ) == (0, 0, 0, 0)

    def extra(self) -> str:
        return (
            f"misplaced {self.misplaced}, late {self.late}, markers {self.markers}, "
            f"routed nowhere {self.unrouted}, "
            f"acknowledged files checked after kills {self.acked_files} ({self.acked_unpublished} "
            f"records acknowledged before their shard was published), dead letters written "
            f"twice {self.dead_letters_duplicated}, "
        )


def dead_letter_place(where: str) -> str:
    """A spool dead letter's ``where`` as ``file:offset``: the line number it may also carry
    (``file:line N:offset``) dropped, so it compares with the producer's own record."""
    name, sep, rest = where.partition(":line ")
    if not sep:
        return where
    return f"{name}:{rest.rpartition(':')[2]}"


def dead_letter_entries(state: Path, *, partial: bool = False) -> list[dict[str, Any]]:
    """Every dead letter in ``state`` (and its rotated file). ``partial``: the daemon runs, or
    was killed just now, so the last line may be cut short: a line is one ``write()``, but
    Linux copies a write into the page cache a page at a time and stops at the next page when
    the writer is being killed (``generic_perform_write``), so a SIGKILL leaves the part of a
    line before the first page boundary it crosses (a restart cuts the file back to the last
    commit's end). Such a line is left out."""
    found: list[dict[str, Any]] = []
    for name in ("dead-letters.jsonl.1", "dead-letters.jsonl"):
        path = state / name
        if path.exists():
            text = path.read_text()
            lines = text.splitlines()
            if partial and lines and not text.endswith("\n"):
                lines.pop()
            found += [json.loads(line) for line in lines]
    return found


def late_ids(state: Path, *, partial: bool = False) -> set[int]:
    """The ids of the records dead-lettered as late (the dead letter holds the record);
    ``partial`` as :func:`dead_letter_entries` says."""
    found: set[int] = set()
    for letter in dead_letter_entries(state, partial=partial):
        if letter["reason"] == "late":
            raw = letter.get("raw_base64")
            i = record_id(base64.b64decode(raw) if raw else letter["raw"].encode())
            if i is not None:
                found.add(i)
    return found


def markers_present(out: Path, marker: str = "_SUCCESS") -> set[str]:
    """The time partitions of ``out`` holding a completion marker."""
    return {p.parent.relative_to(out).as_posix() for p in out.glob(f"dt=*/hour=*/{marker}")}


def audit_markers(out: Path, partitions: set[str], marker: str = "_SUCCESS") -> list[str]:
    """A marker in each of ``partitions`` and in no other, listing exactly the shards under its
    partition (field folders included), each with its records, size and SHA-256; problems."""
    problems: list[str] = []
    found = markers_present(out, marker)
    problems += [f"{p}: no marker" for p in sorted(partitions - found)]
    problems += [f"{p}: a marker, and no clicks belong there" for p in sorted(found - partitions)]
    for partition in sorted(found):
        doc = json.loads((out / partition / marker).read_bytes())
        listed = {s["name"]: s for s in doc["shards"]}
        shards = {
            p.relative_to(out / partition).as_posix(): p for p in dataset_shards(out / partition)
        }
        if sorted(listed) != sorted(shards):
            problems.append(
                f"{partition}: the marker lists {sorted(listed)}, it holds {sorted(shards)}"
            )
        total = 0
        for name, path in shards.items():
            data = path.read_bytes()
            records = len(read_shard(path))
            total += records
            want = (records, len(data), hashlib.sha256(data).hexdigest())
            s = listed.get(name, {})
            if (s.get("records"), s.get("size"), s.get("sha256")) != want:
                problems.append(f"{partition}/{name}: the marker says {s}, the shard {want}")
        if (doc.get("partition"), doc.get("dataset"), doc.get("records")) != (
            partition,
            out.name,
            total,
        ):
            problems.append(
                f"{partition}: the marker names {doc.get('partition')}/{doc.get('records')} records"
            )
    return problems


def audit_datasets(
    root: Path,
    producer: DatasetProducer,
    acks: AckAudit,
    oracles: Sequence[GlobOracle],
    *,
    verify: bool = True,
) -> DatasetAudit:
    """The output of a datasets run against what ``producer`` wrote, once the daemon stopped."""
    index = ShardIndex({d: root / d for d in DATASETS})
    index.refresh()
    index.check_manifests()
    placed = index.placement(producer.places)
    rc = tfrecordd_verify(sorted(index.shards))[0] if verify else 0
    for oracle in oracles:
        oracle.look("at the end")
        oracle.finish()
    letters = dead_letter_entries(root / "state")
    late = [d for d in letters if d["reason"] == "late"]
    places = Counter(dead_letter_place(d["where"]) for d in letters if d["reason"] != "late")
    problems = index.problems + [v for o in oracles for v in o.violations]
    problems += audit_markers(root / "clicks", producer.click_hours())
    problems += acks.problems
    expected = set(producer.places)
    return DatasetAudit(
        events=len(expected),
        lost=len(expected - placed.ids.keys()),
        duplicated=sum(c - 1 for c in placed.ids.values() if c > 1),
        unexpected=placed.unexpected,
        shards=placed.shards,
        reader_visible_unpublished=sum(len(o.violations) for o in oracles),
        problems=problems + placed.misplaced[:10],
        verify_exit=rc,
        misplaced=len(placed.misplaced),
        late=len(late),
        markers=len(markers_present(root / "clicks")),
        unrouted=len(producer.unrouted),
        acked_files=acks.files,
        acked_unpublished=acks.unpublished,
        dead_letters_duplicated=sum(c - 1 for c in places.values() if c > 1),
    )


def run_dataset_trials(
    root: Path,
    *,
    kills: int,
    seed: int,
    compression: str = "zstd",
    max_delay: float = 1.5,
    progress: Callable[[str], None] | None = None,
    phases: Sequence[str] | None = None,
    max_seconds: float | None = None,
    tf_globs: bool = False,
    reloads: bool = False,
    step: float = EVENT_STEP,
    disorder: int = 0,
    datasets: Mapping[str, Mapping[str, Any]] | None = None,
) -> Figures:
    """:func:`run_crash_trials` with two datasets (:func:`datasets_config`): after every kill,
    besides the reader globs, every acknowledged spool file's records must be published
    (:class:`AckAudit`); at the end a clean daemon drains the spool, another closes every
    partition, and the audit adds where each record is and the markers
    (:func:`audit_datasets`). Events are ``step`` seconds apart, each dated up to ``disorder``
    seconds early (:func:`dataset_event`); the allowed lateness is then ``disorder`` seconds,
    so that no event is late when first read, and none may be after any kill (else 20
    minutes). ``datasets``: keys to change in each dataset's table, for the killed runs."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    lateness = f"{disorder}s" if disorder else "20m"
    cfg = datasets_config(root, compression, lateness=lateness, datasets=datasets)
    figs = Figures("datasets", compression)
    figs.phases = dict.fromkeys(CRASH_PHASES["datasets"] if phases is None else phases, 0)
    spool = root / "spool"
    producer = DatasetProducer(spool, batch=100, interval=0.05, step=step, disorder=disorder)
    index = ShardIndex({d: root / d for d in DATASETS})
    acks = AckAudit(root / "state")
    tf = TfGlobber() if tf_globs else None
    killing_since = time.monotonic()
    try:
        oracles = [GlobOracle(root / d, tf) for d in DATASETS]
        producer.start()
        try:
            for n in range(kills):
                if max_seconds is not None and time.monotonic() - killing_since > max_seconds:
                    figs.notes.append(f"stopped after {n} kills: {max_seconds:.0f}s bound")
                    break
                kill_one(cfg, rng, figs, max_delay, armed=n % 2 == 1, reloads=reloads)
                for oracle in oracles:
                    oracle.look(f"after kill {n + 1}")
                figs.glob_looks += 1
                acks.look(producer.written(), spool, index, f"after kill {n + 1}")
                if progress and (n + 1) % 10 == 0:
                    progress(f"datasets: {n + 1}/{kills} kills")
        finally:
            producer.stop()
        clean_run(
            datasets_config(root, compression, drain=True, lateness=lateness),
            figs,
            lambda: spool_drained(spool),
        )
        hours = producer.click_hours()
        clean_run(
            datasets_config(root, compression, drain=True, closing=True, lateness=lateness),
            figs,
            lambda: hours <= markers_present(root / "clicks"),
            timeout=60,
        )
        figs.glob_looks += 1
        a = figs.audit = audit_datasets(root, producer, acks, oracles)
    finally:
        if tf is not None:
            tf.close()
    places = {dead_letter_place(d["where"]) for d in dead_letter_entries(root / "state")}
    figs.dead_letters_missing = len((producer.bad | producer.unrouted) - places)
    figs.seconds = time.monotonic() - t0
    figs.notes.extend(a.problems[:10])
    return figs


def clean_run(cfg: Path, figs: Figures, until: Callable[[], bool], timeout: float = 600) -> None:
    """A daemon with no crash point armed, run until ``until()``, then stopped with SIGTERM;
    what its recovery found is counted, and a stop that fails or a wait that times out noted."""
    d = DaemonProcess(cfg)
    try:
        d.wait_started(60)
        figs.count_recovery(d.output())
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                figs.notes.append(f"{cfg.name}: still waiting after {timeout:.0f}s")
                break
            time.sleep(0.2)
        rc = d.stop(120)
        if rc != 0:
            figs.notes.append(f"clean stop exited {rc}: {d.output()[-2000:]}")
    finally:
        d.kill()


def rss_high_water(pid: int) -> int:
    """Peak resident set size of a process, in bytes (``VmHWM`` from /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


__all__ = [
    "SHARD_SUFFIXES",
    "AckAudit",
    "Audit",
    "DatasetAudit",
    "DatasetProducer",
    "Figures",
    "RedisProducer",
    "ShardError",
    "ShardIndex",
    "SpoolProducer",
    "audit",
    "audit_datasets",
    "audit_markers",
    "clean_run",
    "count_ids",
    "count_records",
    "dataset_event",
    "datasets_config",
    "dead_letter_entries",
    "decompress",
    "example_int64",
    "expected_place",
    "hour_folder",
    "late_ids",
    "markers_present",
    "published_shards",
    "read_shard",
    "rss_high_water",
    "run_crash_trials",
    "run_dataset_trials",
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
