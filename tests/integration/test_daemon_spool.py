"""The daemon in-process on a spool directory: events in, shards and dead letters out."""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import pytest

from tests.support import (
    claimed_files,
    dead_letters,
    inprogress_files,
    metric_sum,
    movie_event,
    read_ids,
    shard_files,
    spool_drained,
    spool_file,
    write_config,
)
from tfrecordd.config import load_config
from tfrecordd.format.writer import Packed, pack
from tfrecordd.fsys import FileSystem
from tfrecordd.metrics import Metrics
from tfrecordd.outputs import manifest
from tfrecordd.outputs import shards as shards_module
from tfrecordd.pipeline import encoding, sourcerun
from tfrecordd.pipeline.encode import GROUP_BATCHES, EncodeStage
from tfrecordd.pipeline.encoding import EncodeRequest
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.pipeline.workers import EncodeWorkers
from tfrecordd.pipeline.write import WriteStage
from tfrecordd_plugins.sources.directory import DirectorySource

pytestmark = pytest.mark.anyio


def metric(m: Metrics, name: str, **labels: str) -> float:
    return metric_sum(m.registry, name, **labels)


async def until(predicate: object, timeout: float = 30.0) -> None:
    assert callable(predicate)
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)


async def run_until_drained(root: Path, daemon: Daemon, events: int, timeout: float = 30.0) -> None:
    """Run until ``events`` events were read and every file was acked, then stop."""
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        await until(
            lambda: (
                metric(daemon.metrics, "tfrecordd_events_received_total", source="spool") >= events
            ),
            timeout,
        )
        # A file is acked once the batch carrying its end is published: wait until the source
        # has sent every file's end, so that the drain publishes and acks them all.
        source = daemon.sources["spool"]
        assert isinstance(source, DirectorySource)
        spool = root / "spool"
        sent = source.positions.sent_eof
        await until(lambda: {f"test/{p.name}" for p in claimed_files(spool)} <= sent, timeout)
        daemon.request_stop()
    assert spool_drained(root / "spool")


@pytest.mark.parametrize("workers", [1, 2])
async def test_good_events_once_and_bad_ones_dead_lettered(tmp_path: Path, workers: int) -> None:
    # Two workers: the lines are split, and their failures placed, in a worker process.
    cfg = write_config(tmp_path, daemon={"encode_workers": workers})
    spool = tmp_path / "spool"
    events = [movie_event(i) for i in range(600)]
    spool_file(spool, "a.jsonl", events[:200])
    spool_file(
        spool,
        "b.jsonl",
        [*events[200:400], "{not json", "", {"id": 10_000, "age": "old"}, "x" * 5000],
    )
    spool_file(spool, "c.jsonl", events[400:])
    config = load_config(cfg)
    source = config.sources[0].model_copy(update={"max_line_bytes": 4096})
    config = config.model_copy(update={"sources": [source]})
    daemon = Daemon(config, handle_signals=False)
    await run_until_drained(tmp_path, daemon, 603)

    ids = read_ids(tmp_path / "shards")
    assert ids == dict.fromkeys(range(600), 1)
    assert not inprogress_files(tmp_path / "shards")
    letters = dead_letters(tmp_path / "state")
    assert sorted(d["reason"] for d in letters) == ["malformed", "rejected", "schema"]
    by_reason = {d["reason"]: d for d in letters}
    assert by_reason["malformed"]["raw"] == "{not json"
    assert "'age'" in by_reason["schema"]["detail"]
    assert "max_line_bytes" in by_reason["rejected"]["detail"]
    assert by_reason["rejected"]["raw"] == "x" * 4096
    assert all(d["source"] == "spool" for d in letters)
    start_of = {
        "malformed": b"{not json",
        "schema": b'{"id": 10000, "age": "old"}',
        "rejected": b"x" * 5000,
    }
    b_bytes = b"".join(json.dumps(e).encode() + b"\n" for e in events[200:400])
    b_bytes += b'{not json\n\n{"id": 10000, "age": "old"}\n' + b"x" * 5000 + b"\n"
    for reason, line in start_of.items():
        at = b_bytes.index(line)
        number = b_bytes.count(b"\n", 0, at) + 1
        assert by_reason[reason]["where"] == f"b.jsonl:line {number}:{at}"
    m = daemon.metrics
    assert metric(m, "tfrecordd_events_received_total", source="spool") == 603
    assert metric(m, "tfrecordd_records_written_total") == 600
    assert metric(m, "tfrecordd_events_dead_lettered_total", source="spool") == 3
    assert metric(m, "tfrecordd_events_invalid_total", source="spool", reason="schema") == 1
    assert metric(m, "tfrecordd_shards_published_total") == len(shard_files(tmp_path / "shards"))
    assert metric(m, "tfrecordd_events_acked_total", source="spool") == 603
    assert metric(m, "tfrecordd_compressed_bytes_written_total") == sum(
        p.stat().st_size for p in shard_files(tmp_path / "shards")
    )


async def test_on_done_move_keeps_finished_files(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, source={"on_done": "move"})
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(10)])
    daemon = Daemon(load_config(cfg), handle_signals=False)
    await run_until_drained(tmp_path, daemon, 10)
    assert [p.name for p in (tmp_path / "spool" / "done").iterdir()] == ["a.jsonl"]
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(10), 1)


@pytest.fixture
def write_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Each trip of the write stage to its thread: (batches offered, batches written)."""
    runs: list[tuple[int, int]] = []
    write_run = WriteStage.write_run

    def recorded(stage: WriteStage, run: list[Any]) -> int:
        written = write_run(stage, run)
        runs.append((len(run), written))
        return written

    monkeypatch.setattr(WriteStage, "write_run", recorded)
    return runs


async def test_record_cap_stops_a_run_of_batches_at_a_whole_batch(
    tmp_path: Path, write_runs: list[tuple[int, int]]
) -> None:
    cfg = write_config(tmp_path, daemon={"max_batch_events": 25}, output={"max_shard_records": 64})
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(1000)])
    await run_until_drained(tmp_path, Daemon(load_config(cfg), handle_signals=False), 1000)
    counts = [sum(1 for _ in read_ids_file(p)) for p in shard_files(tmp_path / "shards")]
    assert sum(counts) == 1000
    # Two batches of 25 fit under 64 and a third would not: every full shard holds 50.
    assert counts[:-1] == [50] * (len(counts) - 1)
    assert any(0 < written < offered for offered, written in write_runs), "a run was cut"


async def test_the_next_shard_fills_while_a_commit_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first shard's publish is held until the writer has written past that shard (or 10 s
    pass): with commits inline, nothing would be written meanwhile. Commits stay in order."""
    cfg = write_config(tmp_path, daemon={"max_batch_events": 25}, output={"max_shard_records": 100})
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(1000)])
    daemon = Daemon(load_config(cfg), handle_signals=False)
    (output,) = {type(out) for out in daemon.outputs.values()}
    publish = output.publish
    written_while_held: list[float] = []
    published: list[str] = []

    def held(self: Any, shard: Any) -> None:
        if not published:
            deadline = time.monotonic() + 10
            while (
                time.monotonic() < deadline
                and metric(daemon.metrics, "tfrecordd_records_written_total") < 150
            ):
                time.sleep(0.01)
            written_while_held.append(metric(daemon.metrics, "tfrecordd_records_written_total"))
        published.append(shard.name)
        publish(self, shard)

    monkeypatch.setattr(output, "publish", held)
    await run_until_drained(tmp_path, daemon, 1000)
    assert written_while_held[0] >= 150
    assert published == sorted(published)  # names carry a sequence number
    assert [p.name for p in shard_files(tmp_path / "shards")] == published
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(1000), 1)


async def test_signals_are_handled_once_the_daemon_says_it_started(tmp_path: Path) -> None:
    """A SIGTERM sent as soon as "started" is logged (or systemd is told READY=1) must drain,
    not kill the process with the default action: the handler is in place by then."""
    import signal

    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    class AtStarted(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("started:"):
                seen.append(signal.getsignal(signal.SIGTERM))

    handler = AtStarted()
    logger = logging.getLogger("tfrecordd")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        daemon = Daemon(load_config(write_config(tmp_path)), handle_signals=True)
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            daemon.request_stop()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert len(seen) == 1
    assert seen[0] not in (signal.SIG_DFL, before)
    assert signal.getsignal(signal.SIGTERM) == before


async def test_rotation_by_records(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, output={"max_shard_records": 64})
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(1000)])
    await run_until_drained(tmp_path, Daemon(load_config(cfg), handle_signals=False), 1000)
    counts = [sum(1 for _ in read_ids_file(p)) for p in shard_files(tmp_path / "shards")]
    assert sum(counts) == 1000
    assert max(counts) == 64
    assert counts[:-1] == [64] * (len(counts) - 1)


def read_ids_file(path: Path) -> list[int]:
    from tfrecordd.format.reader import iter_examples

    return [int(ex["id"][0]) for ex in iter_examples(path)]


@pytest.mark.parametrize("compression", ["none", "gzip", "zlib", "zstd"])
async def test_rotation_by_bytes_never_exceeds_the_cap(
    tmp_path: Path, compression: str, write_runs: list[tuple[int, int]]
) -> None:
    cap = 8192
    cfg = write_config(tmp_path, output={"max_shard_bytes": cap, "compression": compression})
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(3000)])
    await run_until_drained(tmp_path, Daemon(load_config(cfg), handle_signals=False), 3000)
    shards = shard_files(tmp_path / "shards")
    sizes = [p.stat().st_size for p in shards]
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(3000), 1)
    assert len(shards) > 2
    assert max(sizes) <= cap
    # Shards are filled, not cut early: all but the last use at least half the cap.
    assert min(sizes[:-1]) >= cap // 2
    # Batches written together in one trip stop at the cap too.
    assert any(0 < written < offered for offered, written in write_runs)


# 100,000 events per compressed case: the rule itself (OpenShard.fits) is unit-tested for every
# compression in test_shards; the daemon proves it by default for none and gzip.
@pytest.mark.parametrize(
    "compression",
    [
        "none",
        "gzip",
        pytest.param("zlib", marks=pytest.mark.slow),
        pytest.param("zstd", marks=pytest.mark.slow),
    ],
)
async def test_packed_batches_keep_the_cap_too(
    tmp_path: Path, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches of about 64 KiB (a quarter of the cap) are compressed as units of their own
    # before the writer sees them; the cap still holds, and shards are still filled.
    packed: list[int] = []

    def counting_pack(records: list[bytes], *args: Any) -> Packed:
        packed.append(len(records))
        return pack(records, *args)

    monkeypatch.setattr(encoding, "pack", counting_pack)
    cap = 256 << 10
    n = 10_000 if compression == "none" else 100_000
    cfg = write_config(tmp_path, output={"max_shard_bytes": cap, "compression": compression})
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(n)])
    await run_until_drained(tmp_path, Daemon(load_config(cfg), handle_signals=False), n)
    shards = shard_files(tmp_path / "shards")
    sizes = [p.stat().st_size for p in shards]
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(n), 1)
    assert sum(packed) > n // 2, "most batches were packed"
    assert len(shards) > 2
    assert max(sizes) <= cap
    assert min(sizes[:-1]) >= cap // 2


async def test_rotation_by_age_publishes_while_idle(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, output={"max_shard_age": "300ms"})
    daemon = Daemon(load_config(cfg), handle_signals=False)
    out = tmp_path / "shards"
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(5)])
        t0 = time.monotonic()
        await until(lambda: len(shard_files(out)) == 1, 10)
        assert time.monotonic() - t0 < 5
        spool_file(tmp_path / "spool", "b.jsonl", [movie_event(i) for i in range(5, 9)])
        await until(lambda: len(shard_files(out)) == 2, 10)
        await anyio.sleep(0.5)
        assert len(shard_files(out)) == 2, "no empty shard is published"
        daemon.request_stop()
    assert read_ids(out) == dict.fromkeys(range(9), 1)


async def test_flush_request_publishes_now(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, output={"max_shard_age": "1h"})
    daemon = Daemon(load_config(cfg), handle_signals=False)
    out = tmp_path / "shards"
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(5)])
        await until(lambda: metric(daemon.metrics, "tfrecordd_open_shard_records") == 5, 10)
        assert shard_files(out) == []
        daemon.request_flush()
        await until(lambda: len(shard_files(out)) == 1, 10)
        await until(lambda: spool_drained(tmp_path / "spool"), 10)
        daemon.request_stop()


async def test_only_regular_files_are_read(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    spool = tmp_path / "spool"
    outside = tmp_path / "secret.jsonl"
    outside.write_text('{"id": 999}\n')
    os.symlink(outside, spool / "link.jsonl")
    os.mkfifo(spool / "fifo.jsonl")
    (spool / "dir.jsonl").mkdir()
    spool_file(spool, "ok.jsonl", [movie_event(1)])
    daemon = Daemon(load_config(cfg), handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        await until(
            lambda: metric(daemon.metrics, "tfrecordd_events_received_total", source="spool") == 1
        )
        daemon.request_stop()
    assert not claimed_files(spool)
    assert read_ids(tmp_path / "shards") == {1: 1}
    assert (spool / "link.jsonl").is_symlink()
    assert outside.exists()
    refused = metric(
        daemon.metrics, "tfrecordd_inputs_refused_total", source="spool", reason="not_regular_file"
    )
    assert refused == 3


async def test_ignores_hidden_and_temporary_names(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, output={"max_shard_age": "200ms"})
    spool = tmp_path / "spool"
    (spool / ".hidden.jsonl").write_text('{"id": 1}\n')
    (spool / "partial.jsonl.tmp").write_text('{"id": 2}\n')
    (spool / "other.txt").write_text('{"id": 3}\n')
    spool_file(spool, "real.jsonl", [movie_event(4)])
    daemon = Daemon(load_config(cfg), handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        await until(lambda: len(shard_files(tmp_path / "shards")) == 1, 10)
        daemon.request_stop()
    assert read_ids(tmp_path / "shards") == {4: 1}
    assert {p.name for p in spool.iterdir()} >= {".hidden.jsonl", "partial.jsonl.tmp", "other.txt"}


@pytest.mark.parametrize("in_memory", [None, 7], ids=["offsets-in-memory", "offsets-spilled"])
async def test_manifests_describe_their_shards(
    tmp_path: Path, in_memory: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if in_memory is not None:
        # Offsets past the limit wait in a file beside the shard until the manifest is written.
        monkeypatch.setattr(shards_module, "OFFSETS_IN_MEMORY", in_memory)
    cfg = write_config(tmp_path, output={"max_shard_records": 100, "compression": "none"})
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(250)])
    t0 = time.time()
    await run_until_drained(tmp_path, Daemon(load_config(cfg), handle_signals=False), 250)
    shards = shard_files(tmp_path / "shards")
    assert len(shards) == 3
    for shard in shards:
        assert manifest.check(str(shard)) == []
        doc = json.loads((tmp_path / "shards" / manifest.manifest_name(shard.name)).read_text())
        assert doc["records"] == len(doc["record_offsets"]) == len(read_ids_file(shard))
        assert doc["schemas"]["spool"]
        assert doc["compression"] == "none"
        assert t0 <= doc["time_range"][0] <= doc["time_range"][1] <= time.time()
        [token] = doc["positions"]["spool"][-1:]
        assert token["f"].endswith("a.jsonl")
        # Random access: the offsets point at records (for "none", straight into the file).
        data = shard.read_bytes()
        for offset in doc["record_offsets"][:5]:
            (length,) = struct.unpack_from("<Q", data, offset)
            assert ex_id(data[offset + 12 : offset + 12 + length]) in range(250)
    manifests = list((tmp_path / "shards").glob("*.manifest.json"))
    assert len(manifests) == 3
    assert not set(manifests) & set((tmp_path / "shards").glob("*.tfrecord*"))
    assert [p.name for p in (tmp_path / "shards").iterdir() if p.name.startswith(".")] == [
        shards_module.STAGING_DIR
    ]
    assert not inprogress_files(tmp_path / "shards")


def ex_id(record: bytes) -> int:
    from tfrecordd.format.proto import parse_example

    return int(parse_example(record)["id"][0])


def _requests_counted(monkeypatch: pytest.MonkeyPatch, method: str) -> list[int]:
    """The size of each request list passed to ``EncodeWorkers.<method>``, as calls come."""
    sizes: list[int] = []
    original = getattr(EncodeWorkers, method)

    async def counted(pool: EncodeWorkers, *args: Any) -> list[Any]:
        requests: list[EncodeRequest] = args[-1]
        sizes.append(len(requests))
        result: list[Any] = await original(pool, *args)
        return result

    monkeypatch.setattr(EncodeWorkers, method, counted)
    return sizes


async def test_encode_workers_keep_order_and_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = _requests_counted(monkeypatch, "call_on")
    local = _requests_counted(monkeypatch, "_call_local")
    cfg = write_config(
        tmp_path,
        daemon={"encode_workers": 2, "max_batch_events": 25},
        output={"compression": "none", "max_shard_records": 400},
    )
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(2000)])
    spool_file(
        tmp_path / "spool", "b.jsonl", ["{bad", *[movie_event(i) for i in range(2000, 2100)]]
    )
    daemon = Daemon(load_config(cfg), handle_signals=False)
    await run_until_drained(tmp_path, daemon, 2101, timeout=60)
    ids = [i for shard in shard_files(tmp_path / "shards") for i in read_ids_file(shard)]
    assert ids == list(range(2100)), "batches reach the shards in the order they were read"
    assert [d["reason"] for d in dead_letters(tmp_path / "state")] == ["malformed"]
    # 2000 and 101 lines in batches of 25: 80 + 5 requests, those waiting sent together.
    assert sum(sizes) == 80 + 5
    assert max(sizes) == GROUP_BATCHES
    # Both encoders took requests: the daemon's thread and the worker process.
    assert 0 < len(local) < len(sizes)


async def test_the_encode_thread_takes_waiting_batches_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    encode_all = EncodeStage.encode_all

    def counted(stage: EncodeStage, batches: list[Any]) -> list[Any]:
        sizes.append(len(batches))
        return encode_all(stage, batches)

    monkeypatch.setattr(EncodeStage, "encode_all", counted)
    cfg = write_config(
        tmp_path,
        daemon={"max_batch_events": 25},
        output={"compression": "none", "max_shard_records": 400},
    )
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(2000)])
    daemon = Daemon(load_config(cfg), handle_signals=False)
    await run_until_drained(tmp_path, daemon, 2000, timeout=60)
    ids = [i for shard in shard_files(tmp_path / "shards") for i in read_ids_file(shard)]
    assert ids == list(range(2000))
    assert sum(sizes) == 80
    assert max(sizes) == GROUP_BATCHES


async def test_a_failed_start_releases_everything(tmp_path: Path) -> None:
    spool = tmp_path / "not-a-dir"
    spool.mkdir()
    cfg = write_config(tmp_path, source={"path": spool})
    config = load_config(cfg)  # checked while the spool is a directory; replaced after
    spool.rmdir()
    spool.write_text("a file where the spool directory should be")
    daemon = Daemon(config, handle_signals=False)
    with pytest.raises(OSError, match="not-a-dir"):
        await daemon.run()
    assert not daemon.journal.is_open
    assert metric(daemon.metrics, "tfrecordd_up") == 0


async def test_verify_checks_shards_against_their_manifests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tfrecordd.cli import main

    cfg = write_config(tmp_path, output={"max_shard_records": 50, "compression": "none"})
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(100)])
    await run_until_drained(tmp_path, Daemon(load_config(cfg), handle_signals=False), 100)
    first, second = (str(p) for p in shard_files(tmp_path / "shards"))
    assert main(["verify", first, second]) == 0
    # Cut the first shard exactly at a record boundary: the framing alone cannot tell, the
    # manifest can.
    doc = json.loads((tmp_path / "shards" / manifest.manifest_name(Path(first).name)).read_text())
    os.truncate(first, doc["record_offsets"][-1])
    capsys.readouterr()
    assert main(["verify", first, second]) == 65
    out = capsys.readouterr().out
    assert "does not match its manifest" in out
    assert "records: manifest says 50, the shard has 49" in out
    assert main(["verify", "--no-manifest", first]) == 0


class _SlowFsync(FileSystem):
    """A file system whose fsyncs take a while: an output that falls behind."""

    def fsync(self, f: BinaryIO) -> None:
        time.sleep(0.2)
        super().fsync(f)


async def test_backpressure_pauses_and_resumes_a_source_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sourcerun, "PAUSE_LOG_AFTER", 0.1)
    cfg = write_config(
        tmp_path,
        daemon={"queue_batches": 1, "max_batch_events": 10},
        output={"max_shard_records": 10},
    )
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(100)])
    daemon = Daemon(load_config(cfg), handle_signals=False, fs=_SlowFsync())
    with caplog.at_level(logging.INFO, logger="tfrecordd"):
        await run_until_drained(tmp_path, daemon, 100)
    messages = [r.getMessage() for r in caplog.records]
    assert "source spool: paused by backpressure (the output is behind)" in messages
    assert any(m.startswith("source spool: resumed after") for m in messages)
    assert metric(daemon.metrics, "tfrecordd_backpressure_seconds_total", source="spool") > 0.5
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(100), 1)
