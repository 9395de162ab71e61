"""What reading a long line or a whole file costs grows with its length, not with its length
times the reads it takes: counted (bytes allocated and scanned), never timed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import run_source_until
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.sources import spool_formats
from tfrecordd_plugins.sources.directory import DirectorySourceConfig

pytestmark = pytest.mark.anyio


async def _read(spool: Path, **options: Any) -> RecordingContext:
    config = DirectorySourceConfig(
        name="spool", type="directory", path=spool, encoder="e", poll_interval=0.02, **options
    )
    source = config.build()
    ctx = RecordingContext(name="spool", max_batch_events=100)
    await source.recover(None, [])
    await run_source_until(source, ctx, within=30)
    await source.aclose()
    return ctx


async def test_a_long_json_line_is_copied_a_few_times(tmp_path: Path, monkeypatch: Any) -> None:
    allocated = 0

    def counting(size: int = 0) -> bytearray:
        nonlocal allocated
        allocated += size
        return bytearray(size)

    monkeypatch.setattr(spool_formats, "bytearray", counting, raising=False)
    line = b'{"x": "' + b"y" * (1 << 20) + b'"}'
    (tmp_path / "a.jsonl").write_bytes(b'{"a": 1}\n' + line + b'\n{"b": 2}\n')
    ctx = await _read(tmp_path, read_size=4096, max_line_bytes=4 << 20)
    payloads = [p for b in ctx.batches if b.lines is not None for p in b.lines.split()[0]]
    assert payloads == [b'{"a": 1}', line, b'{"b": 2}']
    # 256 reads of 4 KiB: a buffer one read longer each time would allocate 128 MiB.
    assert allocated <= 8 * len(line)


class _CountingBuffer(bytearray):
    """A deframer's buffer that counts the bytes its newline searches look through."""

    scanned = 0

    def find(self, sub: Any, start: Any = 0, *args: Any) -> int:
        _CountingBuffer.scanned += len(self) - start
        return super().find(sub, start, *args)


def test_a_long_socket_line_in_small_reads_is_searched_once() -> None:
    """A 4 MiB line frame arriving in 4 KiB reads: its bytes are searched for a newline once,
    not once per read (which would be 2 GiB)."""
    from tfrecordd_plugins.sources.socket.framing import Deframer

    deframer = Deframer("lines", 8 << 20)
    deframer.buf = _CountingBuffer()
    _CountingBuffer.scanned = 0
    line = b"x" * (4 << 20)
    frames = []
    for at in range(0, len(line), 4096):
        frames += deframer.feed(line[at : at + 4096])
    frames += deframer.feed(b"\n{}\n")
    assert [f.payload for f in frames] == [line, b"{}"]
    assert _CountingBuffer.scanned <= 2 * len(line)
