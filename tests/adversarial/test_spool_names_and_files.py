"""A spool directory under attack: odd names, files that cannot be opened, files still growing.

Every bad file is either read or refused once (counted, logged, moved into the rejected folder
with its reason), and every other file still flows.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support import (
    claimed_files,
    dead_letters,
    movie_event,
    read_ids,
    spool_file,
    write_config,
)
from tfrecordd.config import load_config
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.plugin import RawBatch
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.sources.directory import (
    CLAIM_DIR,
    NAME_MAX,
    REASONS,
    REJECT_DIR,
    DirectorySourceConfig,
)
from tfrecordd_plugins.sources.spool_names import claim_name, original


def _refused(daemon: Daemon, reason: str) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "tfrecordd_inputs_refused_total", {"source": "spool", "reason": reason}
    )
    return value or 0.0


def _run_daemon(root: Path, done: Any, *, settle: float = 0.5, **source: Any) -> Daemon:
    """The daemon in-process on ``root``'s spool until ``done()``, a little longer (nothing more
    may happen), then stopped."""
    cfg = write_config(root, output={"max_shard_age": "100ms"}, source=source)
    daemon = Daemon(load_config(cfg), handle_signals=False)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            with anyio.fail_after(20):
                while not done():
                    await anyio.sleep(0.05)
            await anyio.sleep(settle)
            daemon.request_stop()

    anyio.run(run)
    return daemon


def _events(first: int, n: int) -> list[dict[str, Any]]:
    return [movie_event(i) for i in range(first, first + n)]


def _reasons(spool: Path) -> list[dict[str, Any]]:
    path = spool / REJECT_DIR / REASONS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _spool_empty(spool: Path) -> bool:
    visible = [p for p in spool.iterdir() if not p.name.startswith(".")]
    return not visible and not claimed_files(spool)


# -- 1. names: any name the kernel takes is read, or refused once ----------------------------


@given(st.lists(st.binary(min_size=1, max_size=60), min_size=1, max_size=3))
def test_claim_names_keep_any_bytes_and_stay_one_component(parts: list[bytes]) -> None:
    parts = [p.replace(b"/", b"_").replace(b"\0", b"_") for p in parts]
    parts = [b"_" + p if p in (b".", b"..") else p for p in parts]
    rel = os.fsdecode(b"/".join(parts))
    claim = claim_name(time.time_ns(), rel)
    claim.encode("utf-8")  # a valid token and dead-letter position, whatever the name was
    assert "/" not in claim
    assert original(claim) == rel
    raw = os.fsencode(rel)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        plain = b"%" not in raw and b"/" not in raw and all(b >= 0x20 and b != 0x7F for b in raw)
        if plain:  # a UTF-8 name is not lengthened (CJK names stay short enough to claim)
            assert len(claim.encode()) == 21 + len(raw)


def test_a_name_that_is_not_utf8_is_read_with_the_rest(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    bad = os.fsdecode(b"caf\xe9.jsonl")
    spool_file(spool, "a.jsonl", _events(0, 50))
    spool_file(spool, bad, [*_events(50, 50), "{broken"])
    spool_file(spool, "z.jsonl", _events(100, 50))
    daemon = _run_daemon(tmp_path, lambda: _spool_empty(spool))
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(150), 1)
    [letter] = dead_letters(tmp_path / "state")
    assert letter["where"].startswith("caf\\xe9.jsonl:")
    assert _refused(daemon, "name_too_long") == 0


def test_non_utf8_folders_and_names_move_to_done_with_their_bytes(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    (spool / os.fsdecode(b"d\xff")).mkdir(parents=True)
    name = os.fsdecode(b"\xfe\x80%2F..x.jsonl")
    spool_file(spool / os.fsdecode(b"d\xff"), name, _events(0, 20))
    cjk = "数据" * 15 + ".jsonl"  # 96 bytes of UTF-8: 288 once url-quoted
    spool_file(spool, cjk, _events(20, 20))
    done = tmp_path / "done"
    _run_daemon(
        tmp_path,
        lambda: len(list(done.rglob("*.jsonl"))) == 2 and not claimed_files(spool),
        recursive=True,
        on_done="move",
        done_dir=done,
    )
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(40), 1)
    assert (done / os.fsdecode(b"d\xff") / name).is_file()
    assert (done / cjk).is_file()


@pytest.mark.parametrize(
    "name",
    [
        "a" * 240 + ".jsonl",  # fits the kernel, not a claim name
        os.fsdecode(b"\xff" * 120 + b".jsonl"),  # bytes that must be escaped in a claim name
    ],
    ids=["long", "long-not-utf8"],
)
def test_a_name_too_long_to_claim_is_refused_once_and_kept(tmp_path: Path, name: str) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    assert len(os.fsencode(name)) <= NAME_MAX
    spool_file(spool, name, _events(0, 10))
    spool_file(spool, "ok.jsonl", _events(10, 10))
    daemon = _run_daemon(tmp_path, lambda: _spool_empty(spool), settle=1.0)
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(10, 20), 1)
    assert _refused(daemon, "name_too_long") == 1
    [kept] = [p for p in (spool / REJECT_DIR).iterdir() if not p.name.startswith(".")]
    assert kept.read_bytes().count(b"\n") == 10
    [why] = _reasons(spool)
    assert why["file"] == kept.name
    assert "too long" in why["reason"]
    assert why["path"] == os.fsencode(name).decode("utf-8", "backslashreplace")


# -- 2. files in the claim folder that cannot be opened --------------------------------------


class _Ctx(RecordingContext):
    def __init__(self) -> None:
        super().__init__(name="spool", node_id="n1", max_batch_events=50)


async def _run_source(spool: Path, seconds: float, **options: Any) -> tuple[_Ctx, Any]:
    config = DirectorySourceConfig.model_validate(
        {"name": "spool", "encoder": "e", "path": spool, "poll_interval": 0.05} | options
    )
    source = config.build()
    ctx = _Ctx()
    await source.recover(None, [])
    async with anyio.create_task_group() as tg:
        tg.start_soon(source.run, ctx)
        await anyio.sleep(seconds)
        tg.cancel_scope.cancel()
    await source.ack([b.token for b in ctx.batches])
    await source.aclose()
    return ctx, source


def _good_ids(ctx: RecordingContext) -> list[int]:
    return [json.loads(p)["id"] for p in ctx.payloads()]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
async def test_what_cannot_be_opened_in_the_claim_folder_is_moved_aside_once(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Put straight into the claim folder (where only the daemon should write): refused once,
    moved into the rejected folder with a reason, counted; no busy loop; files still flow."""
    spool = tmp_path / "spool"
    claims = spool / CLAIM_DIR
    claims.mkdir(parents=True)
    planted = claims / f"{1:020d}-planted.jsonl"
    if kind == "fifo":
        os.mkfifo(planted)
    elif kind == "directory":
        planted.mkdir()
        (claims / "n1").mkdir(mode=0o700)
        planted.rename(claims / "n1" / planted.name)  # in this node's own claim folder
    else:
        secret = tmp_path / "secret.jsonl"
        secret.write_text(json.dumps(movie_event(999)) + "\n")
        planted.symlink_to(secret)
    spool_file(spool, "ok.jsonl", _events(0, 30))
    ctx, _ = await _run_source(spool, 1.5)
    assert sorted(_good_ids(ctx)) == list(range(30))
    assert ctx.refused == {"not_regular_file": 1}, ctx.refused
    refusals = [r for r in caplog.records if planted.name in r.getMessage()]
    assert len(refusals) <= 2, "logged again and again"
    [aside] = [p for p in (spool / REJECT_DIR).iterdir() if not p.name.startswith(".")]
    assert aside.name == planted.name
    assert {"fifo": stat.S_ISFIFO, "directory": stat.S_ISDIR, "symlink": stat.S_ISLNK}[kind](
        aside.lstat().st_mode
    )
    [why] = _reasons(spool)
    assert why["file"] == planted.name
    assert why["reason"].startswith("cannot be read")
    assert not claimed_files(spool)
    if kind == "symlink":
        assert 999 not in _good_ids(ctx)


@pytest.mark.anyio
async def test_an_unreadable_file_is_moved_aside_once(tmp_path: Path) -> None:
    """A producer's umask left a file the daemon's user cannot read. Run as an unprivileged
    user when the tests run as root (root reads anything)."""
    base = tmp_path
    spool = base / "spool"
    spool.mkdir()
    spool_file(spool, "ok.jsonl", _events(0, 20))
    spool_file(spool, "locked.jsonl", _events(100, 20)).chmod(0)
    as_root = os.geteuid() == 0
    if as_root:
        nobody = 65534
        for p in [spool, *spool.iterdir()]:
            os.chown(p, nobody, nobody)
        for parent in [base, *base.parents]:
            if parent.stat().st_mode & 0o001 == 0:
                parent.chmod(parent.stat().st_mode | 0o001)  # traversable by nobody
        groups = os.getgroups()
        os.setgroups([])
        os.setegid(nobody)
        os.seteuid(nobody)
    try:
        ctx, _ = await _run_source(spool, 1.5)
    finally:
        if as_root:
            os.seteuid(0)
            os.setegid(0)
            os.setgroups(groups)
    assert sorted(_good_ids(ctx)) == list(range(20))
    assert ctx.refused == {"unreadable": 1}, ctx.refused
    [aside] = [p for p in (spool / REJECT_DIR).iterdir() if not p.name.startswith(".")]
    assert aside.name.endswith("-locked.jsonl")
    assert "Permission denied" in _reasons(spool)[0]["reason"]


# -- 5. a file still being written after it was published ------------------------------------


class _GatedCtx(RecordingContext):
    """Holds the first batch until ``gate`` is set (the file is being read meanwhile)."""

    def __init__(self) -> None:
        super().__init__(name="spool", node_id="n1", max_batch_events=10)
        self.gate = anyio.Event()
        self.first = anyio.Event()

    async def send(self, batch: RawBatch) -> None:
        if not self.first.is_set():
            self.first.set()
            await self.gate.wait()
        await super().send(batch)


def _lines(first: int, n: int) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in _events(first, n))


@pytest.mark.anyio
async def test_a_file_that_grows_after_publish_is_read_on_to_its_real_end(
    tmp_path: Path,
) -> None:
    """A producer appends after the file was published: once while it is being read, once
    more just after the source got to its end. Both tails are read, once each."""
    spool = tmp_path / "spool"
    spool.mkdir()
    path = spool / "growing.jsonl"
    path.write_bytes(_lines(0, 100))
    config = DirectorySourceConfig.model_validate(
        {"name": "spool", "encoder": "e", "path": spool, "poll_interval": 0.5, "read_size": 4096}
    )
    source = config.build()
    ctx = _GatedCtx()
    await source.recover(None, [])
    claimed = spool / CLAIM_DIR / "n1"
    async with anyio.create_task_group() as tg:
        tg.start_soon(source.run, ctx)
        with anyio.fail_after(10):
            await ctx.first.wait()
        [held] = list(claimed.iterdir())  # the producer's file, now claimed
        with held.open("ab") as f:
            f.write(_lines(100, 50))
        ctx.gate.set()
        await anyio.sleep(0.15)
        with held.open("ab") as f:
            f.write(_lines(150, 50))
        with anyio.fail_after(10):
            while not any(b.token["eof"] for b in ctx.batches):
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    await source.ack([b.token for b in ctx.batches])
    await source.aclose()
    assert _good_ids(ctx) == list(range(200))
    assert ctx.refused == {"grew_after_publish": 1}
    assert not claimed_files(spool)


@pytest.mark.anyio
async def test_a_file_that_never_stops_growing_keeps_its_unread_tail(tmp_path: Path) -> None:
    """A producer that never stops writing into a published file: what was read is delivered,
    the rest is refused with a reason, and the file is kept (moved aside), never deleted."""
    spool = tmp_path / "spool"
    spool.mkdir()
    path = spool / "endless.jsonl"
    path.write_bytes(_lines(0, 40))
    stop = threading.Event()
    written = [40]

    out = path.open("ab")  # opened before the claim: follows the file wherever it is renamed

    def write() -> None:
        with out:
            while not stop.is_set() and written[0] < 2000:
                out.write(_lines(written[0], 1))
                out.flush()
                written[0] += 1
                time.sleep(0.01)

    config = DirectorySourceConfig.model_validate(
        {"name": "spool", "encoder": "e", "path": spool, "poll_interval": 0.05, "read_size": 4096}
    )
    source = config.build()
    ctx = _GatedCtx()
    await source.recover(None, [])
    writer = threading.Thread(target=write)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, ctx)
            with anyio.fail_after(10):
                await ctx.first.wait()
            writer.start()
            await anyio.sleep(0.2)
            ctx.gate.set()
            with anyio.fail_after(10):
                while not any(b.token["eof"] for b in ctx.batches):
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        await source.ack([b.token for b in ctx.batches])
        await source.aclose()
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        out.close()
    [letter] = [e for b in ctx.batches for e in b.expand() if e.error is not None]
    assert "still being written" in str(letter.error)
    offset = int(letter.where.rpartition(":")[2])
    [kept] = [p for p in (spool / REJECT_DIR).iterdir() if not p.name.startswith(".")]
    body = kept.read_bytes()
    assert body == _lines(0, written[0])  # nothing lost
    delivered = _good_ids(ctx)
    assert delivered == [json.loads(line)["id"] for line in body[:offset].splitlines()]
    assert len(delivered) > 40  # it was read on while it grew
    assert "still being written" in _reasons(spool)[0]["reason"]
    assert ctx.refused.get("grew_after_publish") == 1


@pytest.mark.anyio
async def test_a_compressed_file_that_changed_while_read_is_kept(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "c.jsonl.gz").write_bytes(gzip.compress(_lines(0, 100)))
    config = DirectorySourceConfig.model_validate(
        {"name": "spool", "encoder": "e", "path": spool, "poll_interval": 0.05}
        | {"pattern": "*.jsonl.gz", "read_size": 4096}
    )
    source = config.build()
    ctx = _GatedCtx()
    await source.recover(None, [])
    async with anyio.create_task_group() as tg:
        tg.start_soon(source.run, ctx)
        with anyio.fail_after(10):
            await ctx.first.wait()
        [held] = list((spool / CLAIM_DIR / "n1").iterdir())
        with held.open("ab") as f:
            f.write(gzip.compress(_lines(100, 10)))
        ctx.gate.set()
        with anyio.fail_after(10):
            while not any(b.token["eof"] for b in ctx.batches):
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    await source.ack([b.token for b in ctx.batches])
    await source.aclose()
    assert ctx.batches[-1].token.get("bad")
    [kept] = [p for p in (spool / REJECT_DIR).iterdir() if not p.name.startswith(".")]
    assert gzip.decompress(kept.read_bytes()) == _lines(0, 110)
    assert "changed while it was read" in _reasons(spool)[0]["reason"]
