"""``tfrecordd convert`` killed with SIGKILL at random moments, then run again with the same
arguments until it finishes: every input record is in the shards exactly once, every dead letter
in the dead-letter file exactly once, and the shards are byte for byte those of a run never
killed (a resumed run writes what an uninterrupted one writes)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import count_records, published_shards, write_datasets_config

LINES = 300_000
BAD_EVERY = 9973
"""Every this-many-th line is not JSON: dead letters spread over the whole run."""
KILLS = 6
ARGS = ("--workers", "2", "--progress-interval", "0.2")


def _argv(cfg: Path, src: Path, out: Path, shards: tuple[str, ...]) -> list[str]:
    command = [sys.executable, "-m", "tfrecordd", "convert", "--config", str(cfg), str(src)]
    return [*command, "--out", str(out), *ARGS, *shards]


def _run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _published(state_file: Path) -> int:
    try:
        return len(json.loads(state_file.read_bytes())["shards"])
    except (OSError, ValueError):
        return 0


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


@pytest.mark.parametrize(
    "shards", [("--shard-size", "96KiB"), ("--shards", "12")], ids=["by-size", "by-count"]
)
def test_killed_at_random_moments_then_resumed_writes_each_record_once(
    tmp_path: Path, shards: tuple[str, ...]
) -> None:
    cfg = write_datasets_config(
        tmp_path,
        {"events": {"encoder": "events", "dir": tmp_path / "unused"}},
        encoders={"events": {"id": "int64", "name": "bytes"}},
        sources=[{"name": "spool", "dataset": "events"}],
    )
    src = tmp_path / "in"
    src.mkdir()
    bad = set()
    for part in range(3):
        with (src / f"part{part}.jsonl").open("w") as f:
            for i in range(part * LINES // 3, (part + 1) * LINES // 3):
                if i % BAD_EVERY == 0:
                    f.write(f"broken line {i}\n")
                    bad.add(i)
                else:
                    f.write(json.dumps({"id": i, "name": f"n{i}"}) + "\n")
    # The run never killed: what every resumed run must end as, and how long a run takes.
    started = time.monotonic()
    ref = _run(_argv(cfg, src, tmp_path / "ref", shards))
    took = time.monotonic() - started
    assert ref.returncode == 65, ref.stderr  # dead letters
    reference = _files(tmp_path / "ref")
    assert len([n for n in reference if n.endswith(".gz")]) >= 10

    out = tmp_path / "out"
    state_file = out / ".tfrecordd-convert" / "state.json"
    total = len([n for n in reference if n.endswith(".gz")])
    rng = random.Random(25)
    killed = 0
    midway = []  # shards published when a kill landed in the middle of the conversion
    for k in range(KILLS):
        proc = subprocess.Popen(
            _argv(cfg, src, out, shards),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if k == 0:
            time.sleep(rng.uniform(0.05, took / 2))  # anywhere, start-up included
        else:
            # After a random shard (timing alone misses a run this short on a busy machine),
            # then a random moment more: inside a shard, a publish or a state save.
            target = rng.randint(1, total - 1)
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                if _published(state_file) >= target:
                    break
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.03))
        if proc.poll() is None:
            # The main process only, as the OOM killer would: its workers must go with it.
            os.kill(proc.pid, signal.SIGKILL)
            killed += 1
        proc.communicate(timeout=60)
        if state_file.exists():
            state = json.loads(state_file.read_bytes())
            if state["shards"] and not state["done"]:
                midway.append(len(state["shards"]))
    assert killed >= 3, f"only {killed} of {KILLS} runs were still running when killed"
    assert midway, "no kill landed between the first shard and the end"

    final = _run(_argv(cfg, src, out, shards))
    assert final.returncode == 65, final.stderr
    assert f"{LINES - len(bad)} records" in final.stderr

    count = count_records(out)
    assert count.problems == []
    assert count.no_id == 0
    assert set(count.ids) == set(range(LINES)) - bad
    assert set(count.ids.values()) == {1}, "a record was written twice"
    letters = (out / ".tfrecordd-convert" / "dead-letters.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["raw"] for x in letters) == sorted(f"broken line {i}" for i in bad)
    # Byte for byte the uninterrupted run's shards and manifests.
    assert _files(out) == reference
    assert [p.name for p in published_shards(out)] == sorted(
        n for n in reference if n.endswith(".gz")
    )
    assert os.listdir(out / ".unpublished" / "convert") == []


def test_ctrl_c_stops_with_130_and_the_same_command_resumes(tmp_path: Path) -> None:
    cfg = write_datasets_config(
        tmp_path,
        {"events": {"encoder": "events", "dir": tmp_path / "out"}},
        encoders={"events": {"id": "int64", "name": "bytes"}},
        sources=[{"name": "spool", "dataset": "events"}],
    )
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in range(LINES)))
    argv = [sys.executable, "-m", "tfrecordd", "convert", "--config", str(cfg), str(src)]
    argv += ["--shard-size", "64KiB", "--workers", "2"]
    state_file = tmp_path / "out" / ".tfrecordd-convert" / "state.json"
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while proc.poll() is None and _published(state_file) < 2 and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        # Finished before the signal came (a fast machine): nothing to resume.
        return
    assert proc.returncode == 130, err
    assert "interrupted; the same command again resumes it" in err
    assert "Traceback" not in err
    final = _run(argv)
    assert final.returncode == 0, final.stderr
    assert "(resumed)" in final.stderr
    count = count_records(tmp_path / "out")
    assert count.problems == []
    assert sorted(count.ids) == list(range(LINES))
    assert set(count.ids.values()) == {1}
