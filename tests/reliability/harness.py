"""The crash harness: producers, a daemon SIGKILLed at random instants, an independent audit.

Everything here reads the daemon's output without tfrecordd's own reader: TFRecord framing and
CRCs, gzip/zlib/zstd streams and the ``tf.train.Example`` wire format are parsed below, so a bug
shared by the daemon's writer and reader cannot hide itself. ``tfrecordd verify`` is run on top,
as a second opinion.

A trial: start ``tfrecordd run`` as a subprocess, let producers write, SIGKILL it after a delay
drawn uniformly from ``[0, max_delay)`` (which spans start-up and recovery, reading, writing and
committing), restart, repeat. At the end a clean daemon drains the input and is stopped with
SIGTERM, and the audit counts lost, duplicated and unexpected events.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import orjson
import zstandard

from tests.support import DaemonProcess, movie_event, spool_file, wait_for, write_config

# -- an independent TFRecord reader ----------------------------------------------------------


class ShardError(Exception):
    """A shard that does not read back whole."""


def _masked_crc(data: bytes) -> int:
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def decompress(data: bytes, suffix: str) -> bytes:
    """The record stream of a shard file, by its name's suffix; every stream must end cleanly."""
    if suffix == ".tfrecord":
        return data
    out: list[bytes] = []
    rest = data
    try:
        if suffix == ".tfrecord.gz":
            while rest:  # one gzip member per sync point
                d = zlib.decompressobj(zlib.MAX_WBITS | 16)
                out.append(d.decompress(rest))
                if not d.eof:
                    raise ShardError("gzip member cut short")
                rest = d.unused_data
        elif suffix == ".tfrecord.zz":
            d = zlib.decompressobj()
            out.append(d.decompress(rest))
            if not d.eof or d.unused_data:
                raise ShardError("zlib stream not ended")
        elif suffix == ".tfrecord.zst":
            while rest:  # one zstd frame per sync point
                z = zstandard.ZstdDecompressor().decompressobj()
                out.append(z.decompress(rest))
                if not z.eof:
                    raise ShardError("zstd frame cut short")
                rest = z.unused_data
        else:
            raise ShardError(f"unknown shard suffix {suffix!r}")
    except (zlib.error, zstandard.ZstdError) as e:
        raise ShardError(f"compressed stream: {e}") from e
    return b"".join(out)


def split_records(stream: bytes) -> Iterator[bytes]:
    """Each record of a TFRecord stream, both CRCs checked."""
    at, n = 0, len(stream)
    while at < n:
        if n - at < 12:
            raise ShardError(f"header cut short at {at}")
        header = stream[at : at + 8]
        length = int.from_bytes(header, "little")
        if _u32(stream[at + 8 : at + 12]) != _masked_crc(header):
            raise ShardError(f"length CRC mismatch at {at}")
        end = at + 12 + length
        if end + 4 > n:
            raise ShardError(f"record cut short at {at}")
        data = stream[at + 12 : end]
        if _u32(stream[end : end + 4]) != _masked_crc(data):
            raise ShardError(f"data CRC mismatch at {at}")
        yield data
        at = end + 4


def _u32(b: bytes) -> int:
    return int.from_bytes(b, "little")


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(buf):
            raise ShardError("varint cut short")
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ShardError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of a protobuf message (varint or length-delimited)."""
    at = 0
    while at < len(buf):
        key, at = _varint(buf, at)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, at = _varint(buf, at)
        elif wire == 2:
            size, at = _varint(buf, at)
            value, at = buf[at : at + size], at + size
        elif wire == 5:
            value, at = buf[at : at + 4], at + 4
        elif wire == 1:
            value, at = buf[at : at + 8], at + 8
        else:
            raise ShardError(f"wire type {wire}")
        yield number, wire, value


def example_int64(record: bytes, name: str) -> list[int]:
    """The int64 values of feature ``name`` in a serialized ``tf.train.Example``
    (Example.features=1 → Features.feature=1 map<string, Feature> → Feature.int64_list=3)."""
    key = name.encode()
    for num, _, features in _fields(record):
        if num != 1:
            continue
        for fnum, _, entry in _fields(features):
            if fnum != 1:
                continue
            parts = {n: v for n, _, v in _fields(entry)}
            if parts.get(1) != key:
                continue
            for lnum, _, int64_list in _fields(parts.get(2, b"")):
                if lnum != 3:
                    continue
                values: list[int] = []
                for vnum, wire, v in _fields(int64_list):
                    if vnum != 1:
                        continue
                    if wire == 0:
                        values.append(v - (1 << 64) if v >= 1 << 63 else v)
                    else:  # packed
                        at = 0
                        while at < len(v):
                            x, at = _varint(v, at)
                            values.append(x - (1 << 64) if x >= 1 << 63 else x)
                return values
    return []


SHARD_SUFFIXES = (".tfrecord", ".tfrecord.gz", ".tfrecord.zz", ".tfrecord.zst")


def published_shards(out: Path) -> list[Path]:
    """What a reader of the output directory may open: visible names ending in a shard suffix."""
    if not out.exists():
        return []
    return sorted(
        p for p in out.iterdir() if not p.name.startswith(".") and p.name.endswith(SHARD_SUFFIXES)
    )


def shard_suffix(name: str) -> str:
    return next(s for s in sorted(SHARD_SUFFIXES, key=len, reverse=True) if name.endswith(s))


def read_shard(path: Path) -> list[bytes]:
    """Every record of a shard, read independently of tfrecordd."""
    return list(split_records(decompress(path.read_bytes(), shard_suffix(path.name))))


def unpublished_visible(out: Path) -> list[Path]:
    """Paths under the output, other than published shards, that a shard glob finds: pathlib's
    globs, like TensorFlow's and fsspec's, do not skip hidden names, and ``rglob`` looks into
    every folder."""
    if not out.exists():
        return []
    published = set(published_shards(out))
    return sorted(p for p in out.rglob("*.tfrecord*") if p not in published)


def count_ids(out: Path) -> tuple[Counter[int], list[str]]:
    """How often each event id appears in the published shards, and the problems found
    (unreadable shards, a manifest whose record count or size disagrees)."""
    ids: Counter[int] = Counter()
    problems: list[str] = []
    for shard in published_shards(out):
        try:
            records = read_shard(shard)
        except ShardError as e:
            problems.append(f"{shard.name}: {e}")
            continue
        if not records:
            problems.append(f"{shard.name}: empty shard published")
        for rec in records:
            ids.update(example_int64(rec, "id"))
        man = out / (shard.name[: -len(shard_suffix(shard.name))] + ".manifest.json")
        if man.exists():
            doc = json.loads(man.read_bytes())
            if doc.get("records") != len(records) or doc.get("size") != shard.stat().st_size:
                problems.append(f"{shard.name}: manifest disagrees")
    return ids, problems


def tfrecordd_verify(paths: list[Path]) -> tuple[int, str]:
    """``tfrecordd verify`` on the given shards: exit code and output."""
    if not paths:
        return 0, ""
    done = subprocess.run(
        [sys.executable, "-m", "tfrecordd", "verify", *map(str, paths)],
        capture_output=True,
        timeout=600,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


@dataclass
class Audit:
    """What the output holds compared with what producers wrote."""

    events: int
    lost: int
    duplicated: int
    unexpected: int
    shards: int
    inprogress_visible: int
    problems: list[str]
    verify_exit: int

    @property
    def ok(self) -> bool:
        return (self.lost, self.duplicated, self.unexpected, self.inprogress_visible) == (
            0,
            0,
            0,
            0,
        ) and (not self.problems and self.verify_exit == 0)


def audit(out: Path, expected: set[int], *, verify: bool = True) -> Audit:
    ids, problems = count_ids(out)
    shards = published_shards(out)
    rc = tfrecordd_verify(shards)[0] if verify else 0
    return Audit(
        events=len(expected),
        lost=len(expected - ids.keys()),
        duplicated=sum(c - 1 for i, c in ids.items() if c > 1 and i in expected),
        unexpected=sum(c for i, c in ids.items() if i not in expected),
        shards=len(shards),
        inprogress_visible=len(unpublished_visible(out)),
        problems=problems,
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
    dead_letters_missing: int = 0
    seconds: float = 0.0
    audit: Audit | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.audit is not None and self.audit.ok and self.dead_letters_missing == 0

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
            f"{self.torn_journal}x a torn journal tail), {a.events} events in {a.shards} shards: "
            f"lost {a.lost}, duplicated {a.duplicated}, unexpected {a.unexpected}, "
            f"in-progress visible {a.inprogress_visible}, unreadable {len(a.problems)}, "
            f"verify exit {a.verify_exit}, dead letters missing {self.dead_letters_missing}, "
            f"{self.seconds:.0f}s"
        )


def harness_config(
    root: Path, source: str, compression: str, redis_url: str | None, packed: bool = False
) -> Path:
    """Small shards and batches, so commits come every few milliseconds; ``packed``: batches of
    1000 events (about 170 KiB, so encode workers frame and compress them as units of their
    own), two encode workers, and shards of 5000 records."""
    output = {
        "compression": compression,
        "max_shard_records": 5000 if packed else 50,
        "max_shard_age": "100ms",
        "min_free_bytes": 0,
    }
    daemon: dict[str, Any] = {"max_batch_events": 10, "drain_timeout": "30s"}
    if packed:
        daemon |= {"max_batch_events": 1000, "encode_workers": 2}
    if source == "directory":
        return write_config(root, output=output, daemon=daemon)
    from tests.redis_server import write_redis_config

    assert redis_url is not None
    return write_redis_config(root, redis_url, output=output, daemon=daemon)


def spool_drained(spool: Path) -> bool:
    claim = spool / ".tfrecordd-claimed"
    pending = [p for p in spool.iterdir() if p.is_file() and not p.name.startswith(".")]
    return not pending and (not claim.exists() or not any(claim.iterdir()))


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
) -> Figures:
    """SIGKILL a daemon ``kills`` times while producers write, then drain and audit."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    cfg = harness_config(root, source, compression, redis_url, packed)
    figs = Figures(source, compression)
    producer: Producer
    per_file = 1000 if packed else 100
    if source == "directory":
        producer = SpoolProducer(root / "spool", batch=per_file, interval=0.05)
        drained: Callable[[], bool] = lambda: spool_drained(root / "spool")  # noqa: E731
    else:
        assert redis_url is not None
        producer = RedisProducer(redis_url, batch=100, interval=0.05)
        drained = lambda: redis_drained(redis_url)  # noqa: E731
    producer.start()
    try:
        for n in range(kills):
            d = DaemonProcess(cfg)
            time.sleep(rng.uniform(0.0, max_delay))
            d.kill()
            figs.kills += 1
            out = d.output()
            figs.killed_before_ready += " started: " not in out
            figs.count_recovery(out)
            figs.torn_journal += "journal tail torn" in out
            if progress and (n + 1) % 10 == 0:
                progress(f"{source}: {n + 1}/{kills} kills")
    finally:
        producer.stop()
    # The last restart's recovery is counted too, then a clean daemon drains everything.
    d = DaemonProcess(cfg)
    try:
        d.wait_started(60)
        figs.count_recovery(d.output())
        wait_for(drained, timeout=600, interval=0.2)
        rc = d.stop(120)
        if rc != 0:
            figs.notes.append(f"final stop exited {rc}: {d.output()[-2000:]}")
    finally:
        d.kill()
    figs.audit = audit(root / "shards", producer.ids)
    letters = _dead_letter_places(root / "state")
    figs.dead_letters_missing = len(producer.bad - letters)
    figs.seconds = time.monotonic() - t0
    if figs.audit.problems:
        figs.notes.extend(figs.audit.problems[:10])
    return figs


def _dead_letter_places(state: Path) -> set[str]:
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
    "Audit",
    "Figures",
    "RedisProducer",
    "ShardError",
    "SpoolProducer",
    "audit",
    "count_ids",
    "example_int64",
    "published_shards",
    "read_shard",
    "rss_high_water",
    "run_crash_trials",
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
    from tfrecordd.runtime import Daemon

    cfg = load_config(config)
    logs.setup("text")
    anyio.run(Daemon(cfg, fs=slow_output_fs(delay)).run)
    return 0


if __name__ == "__main__":
    # python -m tests.reliability.harness slow-daemon CONFIG DELAY
    if len(sys.argv) == 4 and sys.argv[1] == "slow-daemon":
        sys.exit(_slow_daemon_main(sys.argv[2], float(sys.argv[3])))
    sys.exit("usage: python -m tests.reliability.harness slow-daemon CONFIG FSYNC_DELAY")
