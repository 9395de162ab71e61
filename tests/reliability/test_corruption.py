"""Damaged shards are always detected; a damaged journal keeps every commit before the damage.

Shards written by the daemon in each compression get random truncations and bit flips, and
``tfrecordd verify`` (run in-process through the CLI entry point) must reject every one. What
catches what: inside gzip/zlib/zstd data, the stream's checksum or a record CRC; in an
uncompressed shard, the record CRCs. A truncation exactly at a record boundary of an
uncompressed shard leaves a well-formed shorter file: framing alone cannot see it, and only the
manifest beside the shard (size, record count, digests) does. The same goes for a flip in bytes
no checksum covers (a gzip header's time stamp). The figures say how many each layer caught.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import shutil
from collections import Counter
from pathlib import Path

import anyio
import pytest

from tests.reliability.harness import count_ids, read_shard
from tests.support import movie_event, shard_files, spool_file, write_config
from tests.unit.test_journal import commit, journal, recovered, tok
from tfrecordd import cli
from tfrecordd.config import load_config
from tfrecordd.errors import StateError, TfrecorddError
from tfrecordd.format.reader import iter_records
from tfrecordd.outputs import manifest
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.state.records import JOURNAL

COMPRESSIONS = ["none", "gzip", "zlib", "zstd"]


def _write_shard(root: Path, compression: str) -> Path:
    """One shard of 200 records in several sync units, written by the daemon."""
    cfg = write_config(
        root,
        output={"compression": compression, "max_shard_records": 200, "max_shard_age": "1h"},
        daemon={"max_batch_events": 20},
        source={"poll_interval": "20ms"},
    )
    spool_file(root / "spool", "a.jsonl", [movie_event(i) for i in range(200)])

    async def run() -> None:
        daemon = Daemon(load_config(cfg), handle_signals=False)
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            with anyio.fail_after(30):
                while not shard_files(root / "shards"):
                    await anyio.sleep(0.02)
            daemon.request_stop()

    anyio.run(run)
    (shard,) = shard_files(root / "shards")
    return shard


def _verify(path: Path) -> int:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        return cli.main(["verify", str(path)])


def _framing_detects(path: Path) -> bool:
    try:
        for _ in iter_records(path):
            pass
    except TfrecorddError:
        return True
    return False


def corrupt_and_verify(root: Path, compression: str, mutations: int, seed: int) -> Counter[str]:
    shard = _write_shard(root / "daemon", compression)
    pristine = shard.read_bytes()
    man = root / "daemon" / "shards" / manifest.manifest_name(shard.name)
    work = root / "work"
    work.mkdir()
    target = work / shard.name
    shutil.copy(man, work / man.name)
    target.write_bytes(pristine)
    assert _verify(target) == 0, "the pristine shard verifies"
    assert len(read_shard(target)) == 200
    rng = random.Random(seed)
    figures: Counter[str] = Counter()
    for n in range(mutations):
        data = bytearray(pristine)
        if n % 2:
            kind = "truncation"
            del data[rng.randrange(len(data)) :]
        else:
            kind = "bit flip"
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
        figures[kind] += 1
        rc = _verify(target)
        if rc == 0:
            figures[f"{kind} undetected"] += 1
        elif _framing_detects(target):
            figures[f"{kind} caught by checksums"] += 1
        else:
            figures[f"{kind} caught only by the manifest"] += 1
    print(f"{compression}: {dict(sorted(figures.items()))}")
    return figures


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_damaged_shard_is_detected(tmp_path: Path, compression: str) -> None:
    figures = corrupt_and_verify(tmp_path, compression, 1000, seed=COMPRESSIONS.index(compression))
    assert figures["truncation undetected"] == figures["bit flip undetected"] == 0, figures
    assert figures["truncation"] + figures["bit flip"] == 1000
    if compression == "none":
        # Without the manifest, record-boundary truncations would pass: the check is needed.
        assert figures["truncation caught only by the manifest"] > 0, figures


@pytest.mark.slow
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_damaged_shard_is_detected_long(tmp_path: Path, compression: str) -> None:
    figures = corrupt_and_verify(tmp_path, compression, 10_000, seed=100 + len(compression))
    assert figures["truncation undetected"] == figures["bit flip undetected"] == 0, figures


def test_a_record_boundary_truncation_of_an_uncompressed_shard_needs_the_manifest(
    tmp_path: Path,
) -> None:
    shard = _write_shard(tmp_path / "daemon", "none")
    records = read_shard(shard)
    cut = sum(len(r) + 16 for r in records[:150])
    work = tmp_path / "work"
    work.mkdir()
    target = work / shard.name
    target.write_bytes(shard.read_bytes()[:cut])
    assert not _framing_detects(target), "framing alone sees a shorter, well-formed file"
    assert _verify(target) == 0, "without a manifest, verify cannot tell"
    man = manifest.manifest_name(shard.name)
    shutil.copy(shard.parent / man, work / man)
    assert _verify(target) != 0, "with the manifest beside it, verify rejects the file"
    ids, problems = count_ids(work)
    assert len(ids) == 150
    assert problems == [f"{shard.name}: manifest disagrees"]


def _journal_with_commits(path: Path, n: int) -> tuple[bytes, list[int]]:
    j = journal(path)
    j.recover()
    ends = []
    for i in range(n):
        commit(j, f"s{i}", [tok("a", i + 1)])
        ends.append(os.path.getsize(path / JOURNAL))
    j.close()
    return (path / JOURNAL).read_bytes(), ends


def test_journal_truncated_at_every_byte_keeps_every_whole_commit(tmp_path: Path) -> None:
    pristine, ends = _journal_with_commits(tmp_path, 20)
    for size in range(len(pristine) + 1):
        (tmp_path / JOURNAL).write_bytes(pristine[:size])
        rec = recovered(tmp_path)
        intact = [e for e in ends if e <= size]
        assert rec.states.get("spool", {}) == ({"a": len(intact)} if intact else {}), size
        assert os.path.getsize(tmp_path / JOURNAL) <= size, "a torn tail is cut off"


@pytest.mark.slow
def test_journal_bit_flips_long(tmp_path: Path) -> None:
    """Thousands of flips (the unit tests do 300): in the last commit, recovery keeps the commits
    before the flip; anywhere else committed intents follow the damage and recovery refuses to
    start rather than forget them."""
    pristine, ends = _journal_with_commits(tmp_path, 40)
    rng = random.Random(99)
    for _ in range(5000):
        data = bytearray(pristine)
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        (tmp_path / JOURNAL).write_bytes(bytes(data))
        intact = [e for e in ends if e <= pos]
        if len(intact) < len(ends) - 1:
            with pytest.raises(StateError):
                recovered(tmp_path)
            continue
        rec = recovered(tmp_path)
        assert rec.states.get("spool", {}) == ({"a": len(intact)} if intact else {})
        assert rec.torn_at is not None
        assert rec.torn_at <= pos
