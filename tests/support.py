"""Helpers shared by the daemon tests: configs, spool files, shard read-back, a daemon process."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import crc32c
import pytest
import zstandard

from tests.launcher import LAUNCHER, LaunchedProcess
from tfrecordd.format.reader import iter_examples
from tfrecordd.fsys import FileSystem

MOVIES_FEATURES = {
    "id": "int64",
    "user": "bytes",
    "age": "int64",
    "movie": "bytes",
    "movie_ratings": "float",
    "suggestion": "bytes",
    "suggestion_purchased": "float",
    "purchase_price": "float",
}


async def run_source_until(
    source: Any, ctx: Any, done: Callable[[], bool] | None = None, within: float = 30.0
) -> None:
    """Run ``source`` with ``ctx`` until ``done()`` (default: a batch carried a file's end,
    ``token["eof"]``), at most ``within`` seconds, then cancel it."""
    import anyio

    def ended() -> bool:
        return any(b.token and b.token.get("eof") for b in ctx.batches)

    async with anyio.create_task_group() as tg:
        tg.start_soon(source.run, ctx)
        with anyio.fail_after(within):
            while not (done or ended)():
                await anyio.sleep(0.005)
        tg.cancel_scope.cancel()


def run_daemon_with(daemon: Any, body: Callable[[], Awaitable[None]]) -> BaseException | None:
    """Run ``daemon`` in-process with ``body`` beside it (``body`` ends it with
    ``request_stop``, or waits for it to stop on an error of its own). Returns what the run
    raised, ``None`` after a clean stop; ``tfrecordd.errors.find_error`` unwraps it as
    ``tfrecordd run`` does."""
    import anyio

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            await body()

    try:
        anyio.run(run)
    except BaseException as e:
        return e
    return None


def examples(short: int, long: int) -> int:
    """A property's example count: ``short`` in the default suite, ``long`` in the long mode
    (``--run-slow``, which selects the ``reliability-long`` hypothesis profile; ``.ci/run``)."""
    return long if os.environ.get("TFRECORDD_HYPOTHESIS_PROFILE") == "reliability-long" else short


CI_DERANDOMIZED = os.environ.get("CI") == "true"
"""Under CI (``.ci/run`` sets ``CI=true``) the generative class tests draw the same examples at
every run, so a submission's verdict does not depend on the draw; run them without ``CI`` (as
the suite does on a developer's machine) and each run explores new ones."""


def movie_event(i: int) -> dict[str, Any]:
    """A movie-recommendation event with a unique ``id``."""
    return {
        "id": i,
        "user": f"user-{i % 97}",
        "age": 18 + i % 60,
        "movie": [f"movie-{i % 13}", f"movie-{(i * 7) % 13}"],
        "movie_ratings": [float(i % 5), 2.5],
        "suggestion": f"movie-{(i * 3) % 13}",
        "suggestion_purchased": float(i % 2),
        "purchase_price": 9.5,
    }


_PORTS_PER_WORKER = 1500
_PORT_BASE = 20000
"""Below Linux's ephemeral range (32768 and up), so no connection's local port takes a port
handed out here between the check and the daemon's bind."""
_next_port = 0


def free_port() -> int:
    """A loopback port free for TCP and UDP now, from a range of its own per xdist worker: two
    workers never hand out the same port, and the kernel hands none of these to an outgoing
    connection meanwhile."""
    global _next_port
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    base = _PORT_BASE + (int(worker or 0) % 8) * _PORTS_PER_WORKER
    start = os.getpid() % _PORTS_PER_WORKER
    for _ in range(_PORTS_PER_WORKER):
        port = base + (start + _next_port) % _PORTS_PER_WORKER
        _next_port += 1
        try:
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                with socket.socket(socket.AF_INET, kind) as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free loopback port left in this worker's range")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def write_config(
    root: Path,
    *,
    output: Mapping[str, Any] | None = None,
    daemon: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
    features: Mapping[str, Any] | None = None,
    metrics_port: int | None = None,
) -> Path:
    """A config for one spool-directory source under ``root``; returns its path."""
    sections = {
        "daemon": {"node_id": "test", "state_dir": root / "state", "drain_timeout": "20s"}
        | dict(daemon or {}),
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"} if metrics_port else {"enabled": False},
        "output": {
            "dir": root / "shards",
            "compression": "gzip",
            "max_shard_age": "1m",
            "min_free_bytes": 0,
        }
        | dict(output or {}),
    }
    lines = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
    src = {
        "name": "spool",
        "type": "directory",
        "path": root / "spool",
        "encoder": "movies",
        "poll_interval": "100ms",
    } | dict(source or {})
    if src["type"] != "directory":
        src.pop("poll_interval")
    lines.append("[[sources]]")
    lines += [f"{k} = {_toml(v)}" for k, v in src.items()]
    lines += ["[encoders.movies]", 'type = "example"', "[encoders.movies.features]"]
    lines += [f"{json.dumps(k)} = {_toml(v)}" for k, v in (features or MOVIES_FEATURES).items()]
    (root / "spool").mkdir(parents=True, exist_ok=True)
    path = root / "tfrecordd.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_tcp_config(
    root: Path,
    tcp_port: int,
    metrics_port: int | None = None,
    *,
    kind: str = "tcp",
    host: str = "127.0.0.1",
    **tcp: object,
) -> Path:
    """A config for one tcp source (or ``kind``: udp; ``<kind>-in`` on ``host:tcp_port``, more
    of its settings in ``tcp``) under ``root``, shards published after 200ms; returns its
    path."""
    features = "\n".join(f"{k} = {json.dumps(v)}" for k, v in MOVIES_FEATURES.items())
    extra = "\n".join(f"{k} = {json.dumps(v)}" for k, v in tcp.items())
    metrics = f'listen = "127.0.0.1:{metrics_port}"' if metrics_port else "enabled = false"
    path = root / "tfrecordd.toml"
    path.write_text(
        f"""
[daemon]
node_id = "test"
state_dir = "{root / "state"}"
[metrics]
{metrics}
[output]
dir = "{root / "shards"}"
max_shard_age = "200ms"

[[sources]]
name = "{kind}-in"
type = "{kind}"
listen = "{host}:{tcp_port}"
encoder = "movies"
{extra}

[encoders.movies]
type = "example"
[encoders.movies.features]
{features}
"""
    )
    return path


def write_datasets_config(
    root: Path,
    datasets: Mapping[str, Mapping[str, Any]],
    *,
    encoders: Mapping[str, Mapping[str, Any]],
    sources: Iterable[Mapping[str, Any]],
    daemon: Mapping[str, Any] | None = None,
) -> Path:
    """A config with ``[datasets.NAME]`` tables under ``root``: each dataset's ``dir`` defaults
    to ``root/<name>``; each encoder is an ``example`` encoder of the features given; each
    source is a spool directory under ``root`` unless it says otherwise. Returns its path."""
    lines = ["[daemon]"]
    table = {"node_id": "test", "state_dir": root / "state", "drain_timeout": "20s"}
    lines += [f"{k} = {_toml(v)}" for k, v in (table | dict(daemon or {})).items()]
    lines += ["[metrics]", "enabled = false"]
    for name, dataset in datasets.items():
        defaults = {"dir": root / name, "max_shard_age": "2s", "min_free_bytes": 0}
        lines.append(f"[datasets.{name}]")
        lines += [f"{k} = {_toml(v)}" for k, v in (defaults | dict(dataset)).items()]
    for source in sources:
        src = {"type": "directory"} | dict(source)
        if src["type"] == "directory":
            src.setdefault("poll_interval", "100ms")
            src.setdefault("path", root / str(src["name"]))
            Path(src["path"]).mkdir(parents=True, exist_ok=True)
        lines.append("[[sources]]")
        lines += [f"{k} = {_toml(v)}" for k, v in src.items()]
    for name, features in encoders.items():
        lines += [f"[encoders.{name}]", 'type = "example"', f"[encoders.{name}.features]"]
        lines += [f"{json.dumps(k)} = {_toml(v)}" for k, v in features.items()]
    path = root / "tfrecordd.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def metric_sum(registry: Any, name: str, **labels: str) -> float:
    """The sum of every sample of ``name`` in a Prometheus ``registry`` whose labels include
    ``labels`` (a metric with a ``dataset`` label summed over the datasets, say)."""
    total = 0.0
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def intent_shards(record: Mapping[str, Any]) -> list[str]:
    """The names of the shards a journal intent publishes (in either state format)."""
    if record.get("shard"):
        return [record["shard"]]
    return [ref[1] for ref in record.get("shards", ())]


def hour_folder(seconds: float, zone: str) -> str:
    """The hour folder of an instant by the rule the docs state, worked out from zoneinfo
    alone (the tests' oracle for tfrecordd.outputs.partitions): the local date and hour; the
    second pass of a repeated hour gets its UTC offset."""
    local = datetime.fromtimestamp(seconds, ZoneInfo(zone))
    hour = f"{local.hour:02d}"
    if local.fold:
        offset = local.utcoffset()
        assert offset is not None
        minutes = int(offset.total_seconds()) // 60
        hour += f"+{minutes // 60:02d}{minutes % 60:02d}"
    return f"dt={local.date().isoformat()}/hour={hour}"


def dataset_shards(out: Path) -> list[Path]:
    """Every published shard of a dataset's output, in its partition folders too (folders
    whose name starts with ``.`` or ``_`` are not partitions)."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(out):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        found += [
            Path(folder) / f
            for f in files
            if not f.startswith((".", "_")) and f.endswith(SHARD_SUFFIXES)
        ]
    return sorted(found)


def spool_file(spool: Path, name: str, lines: Iterable[str | bytes | dict[str, Any]]) -> Path:
    """Write a spool file the way producers should: under a hidden name, then rename."""
    tmp = spool / f".{name}.tmp"
    with tmp.open("wb") as f:
        for line in lines:
            if isinstance(line, dict):
                line = json.dumps(line)
            f.write(line.encode() if isinstance(line, str) else line)
            f.write(b"\n")
    final = spool / name
    os.rename(tmp, final)
    return final


def claimed_files(spool: Path) -> list[Path]:
    """Files claimed from ``spool`` and not yet acknowledged: those in each daemon's claim
    folder, and any left directly in the claim folder by the layout before node folders."""
    root = spool / ".tfrecordd-claimed"
    if not root.exists():
        return []
    found: list[Path] = []
    for p in root.iterdir():
        found += list(p.iterdir()) if p.is_dir() and not p.is_symlink() else [p]
    return sorted(found)


def spool_drained(spool: Path) -> bool:
    """Nothing left for a daemon to read: no published file in ``spool`` and no claim in any
    node's claim folder (a claimed file is acknowledged, and removed, only once committed)."""
    left = [p for p in spool.iterdir() if p.is_file() and not p.name.startswith(".")]
    return not left and not claimed_files(spool)


def shard_files(out: Path) -> list[Path]:
    """Published shards (what a ``*.tfrecord*`` glob sees), sorted by name."""
    return sorted(p for p in out.glob("*.tfrecord*") if not p.name.startswith("."))


def inprogress_files(out: Path) -> list[Path]:
    """In-progress files under the output: in its staging folders (or beside the shards, where
    older versions wrote them)."""
    return sorted(out.rglob(".*.inprogress"))


def read_ids(out: Path) -> Counter[int]:
    """How many times each event id appears across every published shard, read with the
    independent reader below; a shard that does not read whole or a record without an id
    fails the test."""
    count = count_records(out)
    assert count.problems == [], count.problems[:10]
    assert count.no_id == 0, f"{count.no_id} record(s) without an id"
    return count.ids


def read_examples(out: Path) -> Iterator[dict[str, list[Any]]]:
    for shard in shard_files(out):
        yield from iter_examples(shard)


def skip_or_fail(reason: str) -> None:
    """Skip a test whose privilege, tool or plugin is missing here; under ``CI=true`` (where
    everything a test needs is provided) fail instead, so that nothing is skipped silently."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a missing requirement fails instead of skipping)")
    pytest.skip(reason)


def dead_letters(state: Path) -> list[dict[str, Any]]:
    path = state / "dead-letters.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


CLOSE_CALLS = "CLOSE_CALLS_FILE"
"""The environment variable naming the file where :func:`wait_for` notes each wait that took
more than :data:`CLOSE_CALL` of its timeout (the suite's summary lists them). Not named
``TFRECORDD_...``: those are the daemon's, and the test launcher compares them."""

CLOSE_CALL = 0.5
"""The share of its timeout past which a wait that still succeeded is a close call: it passes
here and may time out on a slower or busier machine (as one once did in CI, at 60.4 s of 60)."""


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds. A wait that takes more
    than :data:`CLOSE_CALL` of its timeout is noted for the suite's summary."""
    start = time.monotonic()
    deadline = start + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(interval)
    took = time.monotonic() - start
    if took > CLOSE_CALL * timeout and (notes := os.environ.get(CLOSE_CALLS)):
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rpartition(" ")[0]
        with open(notes, "a") as f:
            f.write(json.dumps({"test": test, "took": round(took, 1), "timeout": timeout}) + "\n")


def run_tfrecordd(
    *args: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m tfrecordd ARGS...`` run to its end, its output and errors captured (as
    ``subprocess.run(..., capture_output=True, text=True)``); ``env`` is its whole environment
    (default: this process's). In the suite it is forked from the warm interpreter, as a
    :class:`DaemonProcess` is."""
    full_env = dict(os.environ if env is None else env)
    argv = [sys.executable, "-m", "tfrecordd", *args]
    if not LAUNCHER.forkable(full_env):
        return subprocess.run(
            argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
        )
    with tempfile.TemporaryDirectory(prefix="tfrecordd-cli-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        out.touch()
        err.touch()
        proc = LAUNCHER.launch(args, full_env, out, stderr=err, cwd=cwd)
        try:
            code = proc.wait(timeout)
        finally:
            proc.kill()
        return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())


class DirSyncs(FileSystem):
    """The local file system, listing the folders fsynced, by path or descriptor (real paths, in
    order)."""

    def __init__(self) -> None:
        self.folders: list[str] = []

    def fsync_dir(self, path: str) -> None:
        super().fsync_dir(path)
        self.folders.append(os.path.realpath(path))

    def fsync_dir_fd(self, fd: int) -> None:
        super().fsync_dir_fd(fd)
        self.folders.append(os.path.realpath(f"/proc/self/fd/{fd}"))


class DaemonProcess:
    """``tfrecordd run`` as a process of its own: inside the test suite forked from a warm
    interpreter (:mod:`tests.launcher`), else, or with ``cold``, ``python -m tfrecordd``."""

    def __init__(
        self,
        config: Path,
        env: Mapping[str, str] | None = None,
        *,
        own_group: bool = False,
        cold: bool = False,
    ) -> None:
        """``own_group``: in a process group of its own, as a shell's foreground job is (see
        :meth:`interrupt_group`). ``cold``: a fresh interpreter even in the suite, for tests
        that time kills against start-up itself."""
        self.config = config
        self.log = config.parent / "daemon.log"
        full_env = {k: v for k, v in os.environ.items() if k != "TFRECORDD_CRASH_AT"}
        full_env |= {"PYTHONUNBUFFERED": "1"} | dict(env or {})
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        argv = ["run", "--config", str(config)]
        self.proc: subprocess.Popen[bytes] | LaunchedProcess
        if not cold and LAUNCHER.forkable(full_env):
            self.log.touch()
            self.proc = LAUNCHER.launch(argv, full_env, self.log, own_group=own_group)
            return
        with self.log.open("ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tfrecordd", *argv],
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=own_group,
            )

    def interrupt_group(self) -> None:
        """What a terminal's Ctrl-C does: SIGINT to every process of the foreground group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def wait_started(self, timeout: float = 30.0) -> None:
        """Wait until the daemon logged that its pipeline runs (signal handlers installed)."""
        wait_for(lambda: " started: " in self.output() or self.proc.poll() is not None, timeout)
        assert self.proc.poll() is None, self.output()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)

    def output(self) -> str:
        """What this process logged (the log file is shared with earlier runs)."""
        with self.log.open("rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")


@contextmanager
def daemon_process(config: Path, env: Mapping[str, str] | None = None) -> Iterator[DaemonProcess]:
    d = DaemonProcess(config, env)
    try:
        yield d
    finally:
        d.kill()


def crash_cases(points: Iterable[str], *, flip: bool = False) -> list[Any]:
    """``(point, nth)`` parameters for a test that arms ``TFRECORDD_CRASH_AT=point:nth``: a
    crash at the first commit (nth 1, nothing before it) or the third (two behind it). Each of
    the daemon's own points (``crashpoints.POINTS``) gets one count, 1 and 3 alternating in
    protocol order; ``flip`` swaps them, so two sources' tests (the spool's and the Redis
    stream's) cross every daemon point at both counts between them. A source's own points get
    both. The commit protocol's steps are unit-tested one by one, and the crash harness kills
    in every phase at counts 1 to 3: here each case is a whole daemon run and a restart."""
    from tfrecordd.crashpoints import POINTS

    cases = []
    for point in points:
        counts = [1 + 2 * ((POINTS.index(point) + flip) % 2)] if point in POINTS else [1, 3]
        cases += [pytest.param(point, nth, id=f"{nth}-{point}") for nth in counts]
    return cases


def run_clean_until(config: Path, done: Any, timeout: float = 60.0) -> str:
    """Run a daemon (no crash point armed) until ``done()``, then SIGTERM it and expect exit 0;
    returns what it logged."""
    d = DaemonProcess(config)
    try:
        d.wait_started()
        wait_for(done, timeout)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    return d.output()


def tf_features(tf: Any, description: dict[str, Any]) -> dict[str, Any]:
    """``tf.io`` feature objects built from the JSON description."""
    out = {}
    for name, d in description.items():
        dtype = tf.dtypes.as_dtype(d["dtype"])
        if d["kind"] == "VarLenFeature":
            out[name] = tf.io.VarLenFeature(dtype)
        elif d["kind"] == "FixedLenFeature":
            out[name] = tf.io.FixedLenFeature(d["shape"], dtype, d.get("default_value"))
        else:
            assert d["kind"] == "FixedLenSequenceFeature"
            out[name] = tf.io.FixedLenSequenceFeature(
                d["shape"], dtype, allow_missing=d["allow_missing"]
            )
    return out


# -- an independent TFRecord reader ----------------------------------------------------------
#
# TFRecord framing and CRCs, gzip/zlib/zstd streams and the ``tf.train.Example`` wire format are
# parsed here without tfrecordd's own reader, so a bug shared by the daemon's writer and reader
# cannot hide itself. Every exactly-once assertion of the suite reads shards through it.


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
    for suffix in sorted(SHARD_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix
    raise ShardError(f"{name!r} does not end in a shard suffix")


def read_shard(path: Path) -> list[bytes]:
    """Every record of a shard, read independently of tfrecordd."""
    return read_shard_bytes(path.read_bytes(), path.name)


def read_shard_bytes(data: bytes, name: str) -> list[bytes]:
    """Every record of a shard's bytes (the compression taken from ``name``'s suffix)."""
    return list(split_records(decompress(data, shard_suffix(name))))


def record_id(record: bytes) -> int | None:
    """The event id of a record: its one int64 ``id`` value, or None when it has not exactly
    one (such a record is unexpected wherever exactly once is asserted)."""
    try:
        values = example_int64(record, "id")
    except ShardError:
        return None
    return values[0] if len(values) == 1 else None


@dataclass
class IdCount:
    """What the published shards of a directory hold, read with the independent reader."""

    ids: Counter[int] = field(default_factory=Counter)
    """How often each event id appears."""
    no_id: int = 0
    """Records without exactly one int64 ``id``."""
    problems: list[str] = field(default_factory=list)
    """Unreadable or empty shards, manifests that disagree with their shard."""

    def add_shard(self, name: str, data: bytes) -> list[bytes]:
        try:
            records = read_shard_bytes(data, name)
        except ShardError as e:
            self.problems.append(f"{name}: {e}")
            return []
        if not records:
            self.problems.append(f"{name}: empty shard published")
        for rec in records:
            i = record_id(rec)
            if i is None:
                self.no_id += 1
            else:
                self.ids[i] += 1
        return records


def count_records(out: Path) -> IdCount:
    """Read every published shard of ``out`` (visible names with a shard suffix) and the
    manifest beside each, if there is one."""
    count = IdCount()
    for shard in published_shards(out):
        data = shard.read_bytes()
        records = count.add_shard(shard.name, data)
        man = out / (shard.name[: -len(shard_suffix(shard.name))] + ".manifest.json")
        if man.exists():
            doc = json.loads(man.read_bytes())
            if doc.get("records") != len(records) or doc.get("size") != len(data):
                count.problems.append(f"{shard.name}: manifest disagrees")
    return count


def count_ids(out: Path) -> tuple[Counter[int], list[str]]:
    """How often each event id appears in the published shards, and the problems found
    (unreadable shards, a manifest whose record count or size disagrees, records without an
    id)."""
    count = count_records(out)
    if count.no_id:
        count.problems.append(f"{count.no_id} record(s) without exactly one int64 id")
    return count.ids, count.problems


# -- what a reader's glob sees ---------------------------------------------------------------

SHARD_GLOBS = ("*.tfrecord*", "**/*.tfrecord*")
"""The patterns (relative to the output directory) a reader globs for shards."""

TF_SHARD_GLOBS = ("*.tfrecord*", "*/*.tfrecord*", "*/*/*.tfrecord*")
"""The same for TensorFlow, whose globs have no recursive ``**``: down to two folders deep."""

_TF_GLOB_HELPER = """
import json, sys
import tensorflow as tf
print("ready", flush=True)
for line in sys.stdin:
    pattern = line.rstrip("\\n")
    found = {"tf.io.gfile.glob": sorted(tf.io.gfile.glob(pattern))}
    try:
        found["tf.io.matching_files"] = sorted(
            p.decode() for p in tf.io.matching_files(pattern).numpy()
        )
    except tf.errors.NotFoundError:
        found["tf.io.matching_files"] = []
    print(json.dumps(found), flush=True)
"""


class TfGlobber:
    """``tf.io.gfile.glob`` and ``tf.io.matching_files`` in a long-lived helper process:
    TensorFlow is imported once, not once per look."""

    def __init__(self) -> None:
        env = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "3"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _TF_GLOB_HELPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        assert ready == "ready\n", f"the TensorFlow glob helper did not start: {ready!r}"

    def glob(self, pattern: str) -> dict[str, list[str]]:
        """Globber name → the paths it matches for ``pattern``."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(pattern + "\n")
        self.proc.stdin.flush()
        found: dict[str, list[str]] = json.loads(self.proc.stdout.readline())
        return found

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def reader_glob(out: Path, tf: TfGlobber | None = None) -> dict[Path, set[str]]:
    """Every path a reader's shard glob of ``out`` matches, with the globbers that match it:
    Python's ``glob`` (hidden names skipped), ``pathlib`` and fsspec's local file system
    (hidden names matched), and TensorFlow's two globs when ``tf`` is given."""
    from fsspec.implementations.local import LocalFileSystem

    found: dict[Path, set[str]] = {}

    def add(who: str, paths: Iterable[str | Path]) -> None:
        for p in paths:
            found.setdefault(Path(p), set()).add(who)

    if not out.exists():
        return found
    local = LocalFileSystem()
    for pattern in SHARD_GLOBS:
        add("glob", glob.glob(str(out / pattern), recursive=True))
        add("pathlib", out.glob(pattern))
        add("fsspec", local.glob(str(out / pattern)))
    if tf is not None:
        for pattern in TF_SHARD_GLOBS:
            for who, paths in tf.glob(str(out / pattern)).items():
                add(who, paths)
    return found


class GlobOracle:
    """Whatever a reader's shard glob matches must be a published shard: a regular file that
    reads to its end with the independent reader, and is still there with the same bytes at
    the end of the run. :meth:`look` at any instant (after every kill); :meth:`finish` at the
    end; :attr:`violations` says what broke the rule."""

    def __init__(self, out: Path, tf: TfGlobber | None = None) -> None:
        self.out = out
        self.tf = tf
        self.seen: dict[Path, str] = {}
        """Each file a glob matched → the SHA-256 of its bytes when it was read whole."""
        self.looks = 0
        self.violations: list[str] = []
        self._reported: set[tuple[Path, str]] = set()

    def look(self, when: str) -> None:
        self.looks += 1
        for path, who in sorted(reader_glob(self.out, self.tf).items()):
            by = "/".join(sorted(who))
            rel = path.relative_to(self.out) if path.is_relative_to(self.out) else path
            if not path.is_file() or path.is_symlink():
                if path.exists():
                    self.violations.append(f"{when}: {rel} ({by}) is not a regular file")
                continue
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            digest = hashlib.sha256(data).hexdigest()
            before = self.seen.get(path)
            if before == digest or (path, digest) in self._reported:
                continue
            self._reported.add((path, digest))
            if before is not None:
                self.violations.append(f"{when}: {rel} ({by}) changed after a reader saw it")
                continue
            try:
                if not read_shard_bytes(data, path.name):
                    self.violations.append(f"{when}: {rel} ({by}) is an empty shard")
            except ShardError as e:
                self.violations.append(f"{when}: {rel} ({by}) is not a published shard: {e}")
                continue
            self.seen[path] = digest

    def finish(self) -> None:
        """Every shard a reader saw is still there, unchanged."""
        for path, digest in sorted(self.seen.items()):
            rel = path.relative_to(self.out)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                self.violations.append(f"at the end: {rel}, seen by a reader, is gone")
                continue
            if hashlib.sha256(data).hexdigest() != digest:
                self.violations.append(f"at the end: {rel}, seen by a reader, changed")


def assert_exactly_once(
    out: Path | str,
    expected: set[int],
    *,
    manifests: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Every expected event id is in exactly one record of what a reader's shard glob of
    ``out`` (a directory, or an fsspec URL with ``storage_options``) matches, and nothing else
    is: no other id, no record without one. Every match is read to its end with the
    independent reader and must be a complete, non-empty shard. ``manifests``: every shard
    also has a manifest that agrees with it."""
    count = IdCount()
    names: list[str] = []
    if isinstance(out, Path):
        oracle = GlobOracle(out)
        oracle.look("at the end")
        assert oracle.violations == [], oracle.violations[:10]
        for path in sorted(oracle.seen):
            names.append(path.name)
            records = count.add_shard(path.name, path.read_bytes())
            if manifests:
                man = path.with_name(path.name[: -len(shard_suffix(path.name))] + ".manifest.json")
                assert man.exists(), f"{path.name} has no manifest"
                doc = json.loads(man.read_bytes())
                data = path.read_bytes()
                assert (doc.get("records"), doc.get("size"), doc.get("sha256")) == (
                    len(records),
                    len(data),
                    hashlib.sha256(data).hexdigest(),
                ), f"{path.name} and its manifest disagree"
    else:
        import fsspec

        fs, root = fsspec.core.url_to_fs(out, **dict(storage_options or {}))
        matched: set[str] = set()
        for pattern in SHARD_GLOBS:
            matched.update(fs.glob(f"{root.rstrip('/')}/{pattern}"))
        for key in sorted(matched):
            name = key.rpartition("/")[2]
            names.append(name)
            with fs.open(key, "rb") as f:
                count.add_shard(name, f.read())
    assert count.problems == [], count.problems[:10]
    lost = expected - count.ids.keys()
    duplicated = {i: c for i, c in count.ids.items() if c > 1}
    unexpected = set(count.ids) - expected
    assert (len(lost), len(duplicated), len(unexpected), count.no_id) == (0, 0, 0, 0), (
        f"lost {sorted(lost)[:10]}, duplicated {list(duplicated.items())[:10]}, "
        f"unexpected {sorted(unexpected)[:10]}, {count.no_id} record(s) without an id "
        f"(in {len(names)} shards)"
    )
