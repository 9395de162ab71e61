"""``tfrecordd --version``, ``--help`` and ``healthcheck`` (Docker runs it every few seconds)
import none of the heavy dependencies: each command's module loads only when it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_server import write_redis_config
from tests.support import free_port, write_config
from tfrecordd.cli import COMMANDS

HEAVY = ("pydantic", "redis", "PIL", "zstandard", "fsspec", "anyio", "google.protobuf")


def _imported(*args: str) -> tuple[int, str, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tfrecordd", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return proc.returncode, proc.stdout, modules


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["healthcheck", "--url", "http://127.0.0.1:{port}/healthz", "--timeout", "1"],
    ],
    ids=["version", "help", "healthcheck"],
)
def test_light_commands_import_no_heavy_dependency(args: list[str]) -> None:
    port = str(free_port())
    rc, out, modules = _imported(*(a.replace("{port}", port) for a in args))
    heavy = sorted(m for m in modules if m.split(".")[0] in {h.split(".")[0] for h in HEAVY})
    assert heavy == []
    if args == ["--help"]:
        assert rc == 0
        assert all(name in out for name in COMMANDS)
    elif args[0] == "healthcheck":
        assert rc == 1  # nothing listens there


def test_the_check_can_fail() -> None:
    """A command that needs the config models does import pydantic."""
    _, _, modules = _imported("check-config", "/nonexistent.toml")
    assert "pydantic" in modules


def _loaded_by(config: Path) -> set[str]:
    """The modules a fresh interpreter has imported once it loaded ``config`` as ``run`` does."""
    code = (
        "import sys; from tfrecordd.config import load_config; "
        f"load_config({str(config)!r}); print(chr(10).join(sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return set(proc.stdout.split())


def test_a_config_imports_only_the_plugins_it_names(tmp_path: Path) -> None:
    """Plugins are imported when a config names them: a spool directory's daemon never imports
    the Redis client, the socket sources or the image encoder."""
    modules = _loaded_by(write_config(tmp_path / "spool"))
    assert {"tfrecordd_plugins.sources.directory", "tfrecordd_plugins.encoders.example"} <= modules
    unused = (
        "redis",
        "tfrecordd_plugins.sources.redis_stream",
        "tfrecordd_plugins.sources.socket",
        "tfrecordd_plugins.encoders.image",
        "PIL",
    )
    assert sorted(m for m in modules if m.startswith(unused)) == []

    modules = _loaded_by(write_redis_config(tmp_path / "stream", "redis://127.0.0.1:1/0"))
    assert {"redis", "tfrecordd_plugins.sources.redis_stream"} <= modules
