"""A real redis-server for tests: its own port on loopback, its own data dir, stopped after."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support import MOVIES_FEATURES, free_port


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 (no persistence; ``restart`` keeps the port)."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.log = data_dir / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING."""
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.skip("redis-server is not installed")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.data_dir), "--logfile", str(self.log)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, *, save: bool = False) -> None:
        """Stop the server and wait for it: ``save`` writes a snapshot that the next ``start``
        loads; otherwise it is killed and its data is gone."""
        if self.proc is None:
            return
        if save and self.proc.poll() is None:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                s.sendall(b"SHUTDOWN SAVE\r\n")
                s.recv(64)
        if self.proc.poll() is None and not save:
            self.proc.kill()
        self.proc.wait(10)
        self.proc = None


def running_redis(data_dir: Path) -> Iterator[RedisServer]:
    """Start a server in ``data_dir``, yield it, stop it."""
    server = RedisServer(data_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server for one test."""
    yield from running_redis(tmp_path / "redis")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    return str(value)


def write_redis_config(
    root: Path,
    url: str,
    *,
    source: Mapping[str, Any] | None = None,
    output: Mapping[str, Any] | None = None,
    daemon: Mapping[str, Any] | None = None,
    features: Mapping[str, str] | None = None,
) -> Path:
    """A config under ``root`` for one redis-stream source named ``events`` on stream
    ``events``, group ``tfrecordd``, encoded by ``movies``; returns its path."""
    sections: dict[str, Mapping[str, Any]] = {
        "daemon": {"node_id": "test", "state_dir": root / "state", "drain_timeout": "20s"}
        | dict(daemon or {}),
        "metrics": {"enabled": False},
        "output": {"dir": root / "shards", "compression": "gzip", "max_shard_age": "1m"}
        | dict(output or {}),
        "[sources]": {
            "name": "events",
            "type": "redis-stream",
            "url": url,
            "stream": "events",
            "group": "tfrecordd",
            "field": "data",
            "encoder": "movies",
            "block": "100ms",
        }
        | dict(source or {}),
        "encoders.movies": {"type": "example"},
        "encoders.movies.features": dict(features or MOVIES_FEATURES),
    }
    lines: list[str] = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{json.dumps(k)} = {_toml(v)}" for k, v in table.items()]
    root.mkdir(parents=True, exist_ok=True)
    path = root / "tfrecordd.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
