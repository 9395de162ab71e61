"""Helpers shared by the daemon tests: configs, spool files, shard read-back, a daemon process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tfrecordd.reader import iter_examples

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    lines.append("[[sources]]")
    lines += [f"{k} = {_toml(v)}" for k, v in src.items()]
    lines += ["[encoders.movies]", 'type = "example"', "[encoders.movies.features]"]
    lines += [f"{json.dumps(k)} = {_toml(v)}" for k, v in (features or MOVIES_FEATURES).items()]
    (root / "spool").mkdir(parents=True, exist_ok=True)
    path = root / "tfrecordd.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


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


def shard_files(out: Path) -> list[Path]:
    """Published shards (what a ``*.tfrecord*`` glob sees), sorted by name."""
    return sorted(p for p in out.glob("*.tfrecord*") if not p.name.startswith("."))


def inprogress_files(out: Path) -> list[Path]:
    """In-progress files under the output: in its staging folders (or beside the shards, where
    older versions wrote them)."""
    return sorted(out.rglob(".*.inprogress"))


def read_ids(out: Path) -> Counter[int]:
    """How many times each event id appears across every published shard."""
    ids: Counter[int] = Counter()
    for shard in shard_files(out):
        for ex in iter_examples(shard):
            ids[int(ex["id"][0])] += 1
    return ids


def read_examples(out: Path) -> Iterator[dict[str, list[Any]]]:
    for shard in shard_files(out):
        yield from iter_examples(shard)


def dead_letters(state: Path) -> list[dict[str, Any]]:
    path = state / "dead-letters.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(interval)


class DaemonProcess:
    """``tfrecordd run`` as a subprocess."""

    def __init__(
        self, config: Path, env: Mapping[str, str] | None = None, *, own_group: bool = False
    ) -> None:
        """``own_group``: in a process group of its own, as a shell's foreground job is (see
        :meth:`interrupt_group`)."""
        self.config = config
        self.log = config.parent / "daemon.log"
        full_env = {k: v for k, v in os.environ.items() if k != "TFRECORDD_CRASH_AT"}
        full_env |= {"PYTHONUNBUFFERED": "1"} | dict(env or {})
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tfrecordd", "run", "--config", str(config)],
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
