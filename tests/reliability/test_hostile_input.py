"""Hostile input: every decoder takes any bytes without crashing or hanging, and every event it
cannot use leaves with a reason (for the dead letters); the spool refuses what is not a regular
file and a claim name cannot lead a file out of its folder.

Property tests run under the hypothesis profile named by ``TFRECORDD_HYPOTHESIS_PROFILE``:
``reliability`` (default, quick) or ``reliability-long`` (thousands of examples per decoder),
which ``--run-slow`` selects when no profile is named.
"""

from __future__ import annotations

import gzip
import itertools
import os
import stat
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support import (
    claimed_files,
    dead_letters,
    movie_event,
    read_ids,
    skip_or_fail,
    spool_file,
    write_config,
)
from tfrecordd.config import load_config
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.plugin import Encoder, RawEvent
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig
from tfrecordd_plugins.encoders.image import ImageEncoderConfig
from tfrecordd_plugins.sources.directory import (
    CLAIM_DIR,
    DirectorySource,
    DirectorySourceConfig,
)
from tfrecordd_plugins.sources.redis_stream import RedisStreamSource, RedisStreamSourceConfig
from tfrecordd_plugins.sources.redis_stream.scripts import Entry
from tfrecordd_plugins.sources.socket.framing import Deframer
from tfrecordd_plugins.sources.spool_names import original

settings.register_profile(
    "reliability",
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "reliability-long",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
hostile = settings(
    settings.get_profile(os.environ.get("TFRECORDD_HYPOTHESIS_PROFILE", "reliability"))
)


def test_run_slow_reaches_the_long_profile(pytestconfig: pytest.Config) -> None:
    named = os.environ.get("TFRECORDD_HYPOTHESIS_PROFILE")
    if pytestconfig.getoption("--run-slow") and named in (None, "reliability-long"):
        assert hostile.max_examples == 5000
    elif named in (None, "reliability"):
        assert hostile.max_examples == 150


FEATURES = {"id": "int64", "user": "bytes", "score": "float"}
EXAMPLE = ExampleEncoderConfig.model_validate({"type": "example", "features": FEATURES}).build()
IMAGE = ImageEncoderConfig.model_validate({"type": "image"}).build()


def account(events: list[RawEvent], encoder: Encoder) -> tuple[int, int]:
    """Encode what the source let through; every event must end as a record or as a failure
    with a reason. Returns (records, failures)."""
    good = [e for e in events if e.error is None]
    for e in events:
        if e.error is not None:
            assert e.error.strip(), "a rejected event carries its reason"
    result = encoder.encode_batch(good) if good else None
    records = len(result.records) if result else 0
    failures = list(result.failures) if result else []
    for _, reason, _detail in failures:
        assert reason.strip()
    assert records + len(failures) == len(good)
    assert len({i for i, _, _ in failures}) == len(failures)
    return records, len(events) - records


def _json_ish() -> st.SearchStrategy[bytes]:
    good = st.builds(
        lambda i, u, s: b'{"id": %d, "user": "%s", "score": %r}' % (i, u.encode(), s),
        st.integers(-(2**70), 2**70),
        st.text(alphabet='abc\\"é\x00', max_size=8),
        st.floats(allow_nan=True, allow_infinity=True),
    )
    return st.one_of(good, st.binary(max_size=64), st.just(b"{broken"), st.just(b"[1,2]"))


@st.composite
def spool_inputs(draw: st.DrawFn) -> tuple[str, str, bytes]:
    fmt = draw(st.sampled_from(["jsonl", "csv"]))
    if fmt == "jsonl":
        lines = draw(st.lists(_json_ish(), max_size=30))
        body = b"\n".join(lines) + draw(st.sampled_from([b"", b"\n", b"\r\n"]))
    else:
        rows = draw(st.lists(st.binary(max_size=40), max_size=20))
        body = b"id,user,score\n" + b"\n".join(rows)
    wrap = draw(st.sampled_from(["plain", "gzip", "gzip-cut", "zstd", "zstd-cut", "garbage-gz"]))
    name = "in." + fmt
    if wrap.startswith("gzip"):
        name += ".gz"
        body = gzip.compress(body)
    elif wrap.startswith("zstd"):
        name += ".zst"
        body = zstandard.ZstdCompressor(write_checksum=True).compress(body)
    elif wrap == "garbage-gz":
        name += ".gz"
    if wrap.endswith("-cut") and len(body) > 1:
        body = body[: draw(st.integers(1, len(body) - 1))]
    return fmt, name, body


async def _read_spool(
    spool: Path, name: str, body: bytes, cfg: dict[str, Any]
) -> tuple[RecordingContext, DirectorySource]:
    (spool / name).write_bytes(body)
    config = DirectorySourceConfig.model_validate(
        {"name": "s", "encoder": "e", "path": spool, "poll_interval": 0.01, "pattern": "*"}
        | {"max_line_bytes": 256, "max_decompressed_bytes": 1 << 16}
        | cfg
    )
    source = config.build()
    await source.recover(None, [])
    ctx = RecordingContext(max_batch_events=7)
    with anyio.fail_after(10):  # no hang
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, ctx)
            while not any(b.token.get("eof") for b in ctx.batches if isinstance(b.token, dict)):
                await anyio.sleep(0.005)
            await anyio.sleep(0.03)  # let the source close the file and go back to polling
            tg.cancel_scope.cancel()
    await source.aclose()
    return ctx, source


@hostile
@given(spool_inputs())
def test_spool_files_of_any_bytes(case: tuple[str, str, bytes]) -> None:
    fmt, name, body = case
    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp)
        ctx, _ = anyio.run(_read_spool, spool, name, body, {"format": fmt})
        events = [e for b in ctx.batches for e in b.expand()]
        account(events, EXAMPLE)
        last = ctx.batches[-1].token
        if last.get("bad"):
            # An unreadable input is reported with its reason and moved aside on ack.
            assert events[-1].error is not None
            assert events[-1].error.startswith("input rejected: ")


@hostile
@given(st.binary(max_size=2048), st.sampled_from(["", ".gz", ".zst"]))
def test_whole_files_of_any_bytes(body: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp)
        ctx, _ = anyio.run(
            _read_spool,
            spool,
            "x.png" + suffix,
            body,
            {"format": "whole-file", "max_file_bytes": 1024},
        )
        events = [e for b in ctx.batches for e in b.expand()]
        assert len(events) == 1
        account(events, IMAGE)


@hostile
@given(
    st.sampled_from(["lines", "length-prefixed"]),
    st.binary(max_size=600),
    st.lists(st.integers(0, 600), max_size=12),
)
def test_stream_framing_of_any_bytes_in_any_chunks(
    framing: str, data: bytes, cuts: list[int]
) -> None:
    """Frames do not depend on how TCP cut the bytes; over-long frames carry a reason."""

    def frames(chunks: list[bytes]) -> list[tuple[bytes, str | None]]:
        d = Deframer(framing, 64)
        out = [f for c in chunks for f in d.feed(c)]
        end = d.end("connection closed")
        if end is not None:
            out.append(end)
        return [(f.payload, f.error) for f in out]

    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points)]
    whole = frames([data])
    assert frames(chunks) == whole
    for payload, error in whole:
        assert error is None or error.strip()
        if error is None:
            assert len(payload) <= 64


def _as_read(entry_id: str, fields: dict[bytes, bytes] | None, field: bytes, cut: int) -> Entry:
    """An entry as the source's read script hands it over (its event cut inside Redis)."""
    if fields is None:
        return Entry(entry_id, 2, b"", 0, [], False)
    if field in fields:
        return Entry(entry_id, 0, fields[field][:cut], len(fields[field]), [], False)
    kept = [x[:256] for kv in list(fields.items())[:16] for x in kv]
    return Entry(entry_id, 1, b"", 0, kept, False)


@hostile
@given(
    st.dictionaries(st.binary(max_size=12), st.binary(max_size=300), max_size=5),
    st.sampled_from([None, "entry_id"]),
    st.one_of(st.none(), _json_ish()),
)
def test_redis_entries_of_any_fields(
    fields: dict[bytes, bytes], id_field: str | None, data: bytes | None
) -> None:
    if data is not None:
        fields = {**fields, b"data": data}
    cfg = {"name": "r", "encoder": "e", "stream": "s", "max_event_bytes": 128}
    source = RedisStreamSource(RedisStreamSourceConfig.model_validate(cfg | {"id_field": id_field}))
    event = source.event_of(_as_read("1700000000000-0", fields or None, b"data", 128))
    if not fields:
        assert event is None  # a deleted entry: counted and acked, not an event
        return
    assert event is not None
    account([event], EXAMPLE)


def test_decompression_bombs_are_rejected_with_a_reason(tmp_path: Path) -> None:
    zeros = b"\n" * (4 << 20)
    for suffix, body in ((".gz", gzip.compress(zeros)), (".zst", zstandard.compress(zeros))):
        spool = tmp_path / suffix.strip(".")
        spool.mkdir()
        ctx, _ = anyio.run(_read_spool, spool, "bomb.jsonl" + suffix, body, {})
        (event,) = [e for b in ctx.batches for e in b.expand() if e.error]
        assert "input rejected: decompresses to more than" in (event.error or ""), event.error
        assert ctx.batches[-1].token.get("bad") is True


_NAME = st.text(min_size=1, max_size=12).filter(lambda n: "/" not in n and n not in (".", ".."))


@hostile
@given(st.lists(_NAME, min_size=1, max_size=4), st.text(max_size=40))
@example(parts=["0"], forged="/")
@example(parts=["0"], forged="..%2F..")
def test_claim_names_stay_in_their_folder(parts: list[str], forged: str) -> None:
    """A claim name is the url-quoted spool-relative path: one path component, and decoding it
    gives the path back. Whatever a claim name says (one put there by hand, say), it decodes to
    a relative path without ``..``."""
    rel = "/".join(parts)
    claim = f"{1:020d}-{quote(rel, safe='')}"
    assert "/" not in claim
    assert original(claim) == rel
    decoded = original(f"{1:020d}-{forged}")
    assert not decoded.startswith("/")
    assert ".." not in decoded.split("/")


def test_a_forged_claim_cannot_move_a_file_out_of_done_dir(tmp_path: Path) -> None:
    """Anyone who can write into the spool can write into its claim folder: a claim named
    ``<n>-..%2F..%2Fx`` must not make ``on_done = "move"`` write outside ``done_dir``."""
    spool = tmp_path / "spool"
    claim_dir = spool / CLAIM_DIR
    claim_dir.mkdir(parents=True)
    forged = f"{1:020d}-{quote('../../escaped.jsonl', safe='')}"
    (claim_dir / forged).write_text('{"id": 1}\n')
    cfg = write_config(
        tmp_path,
        output={"max_shard_age": "100ms"},
        source={"on_done": "move", "done_dir": str(tmp_path / "done")},
    )

    async def run() -> None:
        daemon = Daemon(load_config(cfg), handle_signals=False)
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            with anyio.move_on_after(5):
                while claimed_files(spool):
                    await anyio.sleep(0.05)
            daemon.request_stop()

    anyio.run(run)
    escaped = tmp_path.parent / "escaped.jsonl"
    try:
        assert not escaped.exists(), "a forged claim moved a file out of done_dir"
    finally:
        escaped.unlink(missing_ok=True)


def test_device_files_and_symlinked_folders_are_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_or_fail("mknod of a device file needs root (as in CI)")
    spool = tmp_path / "spool"
    cfg = write_config(tmp_path, output={"max_shard_age": "100ms"}, source={"recursive": True})
    os.mknod(spool / "null.jsonl", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    outside = tmp_path / "outside"
    outside.mkdir()
    spool_file(outside, "secret.jsonl", [movie_event(999)])
    os.symlink(outside, spool / "linked")
    (spool / "sub").mkdir()
    spool_file(spool / "sub", "ok.jsonl", [movie_event(1)])

    async def run() -> Daemon:
        daemon = Daemon(load_config(cfg), handle_signals=False)
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            with anyio.fail_after(10):
                while (spool / "sub" / "ok.jsonl").exists() or claimed_files(spool):
                    await anyio.sleep(0.05)
            await anyio.sleep(0.5)  # a few more polls: nothing else may be read
            daemon.request_stop()
        return daemon

    daemon = anyio.run(run)
    assert read_ids(tmp_path / "shards") == {1: 1}
    assert stat.S_ISCHR((spool / "null.jsonl").lstat().st_mode), "left in place"
    assert (outside / "secret.jsonl").exists()
    refused = daemon.metrics.registry.get_sample_value(
        "tfrecordd_inputs_refused_total", {"source": "spool", "reason": "not_regular_file"}
    )
    assert refused == 1


def test_a_hostile_spool_through_the_daemon_dead_letters_every_bad_event(tmp_path: Path) -> None:
    """Bad lines of every kind, through the whole daemon: each good event is written once, each
    bad one is dead-lettered with its reason and raw bytes."""
    cfg = write_config(
        tmp_path,
        output={"max_shard_age": "100ms"},
        source={"max_line_bytes": 4096},
        features={"id": "int64"},
    )
    bad = [
        b"{broken",
        b"\xff\xfe\x00not utf-8",
        b"[1, 2, 3]",
        b'"just a string"',
        b'{"id": "not a number"}',
        b'{"id": 1e400}',
        b"x" * 5000,
        b'{"id": 99999999999999999999999}',
        b"\x00" * 10,
    ]
    lines: list[bytes] = []
    for i in range(100):
        lines.append(b'{"id": %d}' % i)
        lines.append(bad[i % len(bad)])
    spool_file(tmp_path / "spool", "hostile.jsonl", lines)

    async def run() -> None:
        daemon = Daemon(load_config(cfg), handle_signals=False)
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            with anyio.fail_after(20):
                while any((tmp_path / "spool").glob("*.jsonl")) or claimed_files(
                    tmp_path / "spool"
                ):
                    await anyio.sleep(0.05)
            daemon.request_stop()

    anyio.run(run)
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(100), 1)
    letters = dead_letters(tmp_path / "state")
    assert len(letters) == 100
    assert all(d["reason"] and d["where"].startswith("hostile.jsonl:") for d in letters)
    assert all("raw" in d or "raw_base64" in d for d in letters)
