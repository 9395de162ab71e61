"""The out-of-tree example plugin (``examples/tfrecordd-example-plugin``), installed as a third
party installs one: pip into a directory of its own, found through its entry points. A real
daemon runs its source and encoder end to end (shards read back with tests/support's reader),
and both pass tfrecordd.testing's contract checks."""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support import (
    DaemonProcess,
    example_int64,
    published_shards,
    read_shard,
    wait_for,
)
from tfrecordd.format import proto
from tfrecordd.plugin import RawEvent, Registry
from tfrecordd.testing import RecordingContext, check_encoder, check_source

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tfrecordd-example-plugin"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example package installed (offline, no dependencies) into a directory of its own."""
    work = tmp_path_factory.mktemp("example-plugin")
    src = work / "src"
    shutil.copytree(EXAMPLE, src)  # pip builds in the tree: not in the repository's
    target = work / "site"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"),
            *("--no-index", "--target", str(target), str(src)),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    return target


def _env(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def _config(root: Path, lines: Path) -> Path:
    path = root / "tfrecordd.toml"
    path.write_text(
        f"""
[daemon]
state_dir = "{root / "state"}"
node_id = "test"
[metrics]
enabled = false
[output]
dir = "{root / "shards"}"
max_shard_records = 40
max_shard_age = "200ms"
[[sources]]
name = "lines"
type = "example-lines"
path = "{lines}"
encoder = "text"
[encoders.text]
type = "example-text"
"""
    )
    return path


def _texts(out: Path) -> Counter[bytes]:
    texts: Counter[bytes] = Counter()
    for shard in published_shards(out):
        for record in read_shard(shard):
            example: Any = proto.Example.FromString(record)
            (text,) = example.features.feature["text"].bytes_list.value
            assert example_int64(record, "length") == [len(text)]
            texts[text] += 1
    return texts


def test_a_daemon_runs_the_installed_example_plugin_end_to_end(site: Path, tmp_path: Path) -> None:
    env = _env(site)
    listed = subprocess.run(
        [sys.executable, "-m", "tfrecordd", "plugins"],
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "example-lines" in listed, listed
    assert "(exactly-once)" in listed, listed
    assert "example-text" in listed, listed
    starter = tmp_path / "starter.toml"
    for argv in (
        ["init", "--source", "example-lines", "-o", str(starter), "--dir", str(tmp_path / "b")],
        ["check-config", str(starter)],
    ):
        run = subprocess.run(
            [sys.executable, "-m", "tfrecordd", *argv],
            env=os.environ | env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 0, run.stdout + run.stderr
    assert "type example-lines, routes by 'type' to clicks, impressions" in run.stdout
    lines = tmp_path / "events.txt"
    expected = [f"line {i} \u00e9".encode() for i in range(120)]
    with lines.open("wb") as f:
        f.write(b"\n".join(expected[:60]) + b"\n\n")  # an empty line: dead-lettered
    daemon = DaemonProcess(_config(tmp_path, lines), env)
    try:
        daemon.wait_started()
        with lines.open("ab") as f:
            f.write(b"\n".join(expected[60:]) + b"\n")
        wait_for(lambda: sum(_texts(tmp_path / "shards").values()) >= 120, 60)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(60) == 0, daemon.output()
    finally:
        daemon.kill()
    assert _texts(tmp_path / "shards") == Counter(expected)
    assert (tmp_path / "events.txt.acked").read_text() == str(lines.stat().st_size)
    # A restart reads nothing again.
    daemon = DaemonProcess(_config(tmp_path, lines), env)
    try:
        daemon.wait_started()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(60) == 0, daemon.output()
    finally:
        daemon.kill()
    assert _texts(tmp_path / "shards") == Counter(expected)


def test_the_example_plugin_passes_the_contract_checks(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(site))
    registry = Registry.from_entry_points()
    source_config = registry.sources["example-lines"]
    encoder_config = registry.encoders["example-text"]
    assert (
        source_config.__module__
        == importlib.import_module("tfrecordd_example_plugin.lines").__name__
    )
    lines = tmp_path / "events.txt"

    async def produce(payloads: list[bytes]) -> None:
        with lines.open("ab") as f:
            f.write(b"".join(p + b"\n" for p in payloads))

    config = source_config.model_validate({"name": "lines", "encoder": "text", "path": str(lines)})
    anyio.run(lambda: check_source(config, produce, state_dir=str(tmp_path / "state"), settle=0.3))
    good = [RawEvent(b"hello", "x:0"), RawEvent("\u00e9t\u00e9".encode(), "x:6")]
    bad = [RawEvent(b"   ", "x:1"), RawEvent(b"\xff\xfe", "x:2")]
    records = check_encoder(encoder_config.model_validate({}), good, bad)
    assert [example_int64(r, "length") for r in records] == [[len(e.payload)] for e in good]


def test_a_line_over_the_limit_is_one_refused_event_and_reading_goes_on_after_it(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line longer than a whole read (four times ``max_line_bytes``) is refused once, and the
    next line is read whole: none of the long line's bytes become events of their own."""
    monkeypatch.syspath_prepend(str(site))
    source_config = Registry.from_entry_points().sources["example-lines"]
    lines = tmp_path / "events.txt"
    long_line = b"x" * 1000  # 15 reads of 64 bytes and a bit
    lines.write_bytes(b"first\n" + long_line + b"\nafter\n" + b"y" * 20 + b"\nlast\n")
    config = source_config.model_validate(
        {"name": "lines", "encoder": "text", "path": str(lines), "max_line_bytes": 16}
    )
    source = config.build()
    ctx = RecordingContext(name="lines", state_dir=str(tmp_path / "state"))

    async def run() -> None:
        source.attach(ctx)
        await source.recover(None, [])
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, ctx)
            with anyio.fail_after(10):
                while not any(ev.payload == b"last" for b in ctx.batches for ev in b.events):
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        await source.aclose()

    anyio.run(run)
    events = [ev for b in ctx.batches for ev in b.events]
    assert [(ev.payload, ev.error is not None) for ev in events] == [
        (b"first", False),
        (b"x" * 16, True),
        (b"after", False),
        (b"y" * 16, True),
        (b"last", False),
    ]
    assert ctx.batches[-1].token == lines.stat().st_size
