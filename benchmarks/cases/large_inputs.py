"""Case 6: one large input through the directory source's readers, against reading its bytes.

A 512 MiB ``whole-file`` input, a JSON line of 64 MiB and a CSV record of 64 MiB (a quoted
field holding newlines), each read by the source (claimed, read in ``read_size`` reads, its
batches sent; nothing encoded) and, as the baseline, by one ``read`` of the same file. A reader
whose work grows faster than its input (a buffer grown by each read, a record scanned again at
each read) falls far behind the baseline at these sizes; a linear one stays within a small
factor of it.
"""

from __future__ import annotations

import os
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.sources.directory import DirectorySourceConfig

from ..harness import Context, Row, best_of_pair, ratio_row

TARGET: float | None = None  # set once the full sizes have been measured on the reference machine
MIB = 1 << 20


def _write(path: Path, head: bytes, fill: bytes, size: int, tail: bytes) -> None:
    block = fill * (MIB // len(fill))
    with path.open("wb") as f:
        f.write(head)
        for _ in range(size // MIB):
            f.write(block)
        f.write(tail)


def _read_by_source(file: Path, spool: Path, **options: Any) -> None:
    """The source reads ``file`` (linked into a fresh ``spool``) to its end."""
    shutil.rmtree(spool, ignore_errors=True)
    spool.mkdir()
    os.link(file, spool / file.name)
    config = DirectorySourceConfig(
        name="bench",
        type="directory",
        path=spool,
        encoder="e",
        pattern=file.name,
        poll_interval=0.01,
        **options,
    )

    async def run() -> None:
        source = config.build()
        ctx = RecordingContext(name="bench")
        await source.recover(None, [])
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, ctx)
            # The recording context sets no event: polled, as the source tests do.
            while not any(b.token["eof"] for b in ctx.batches):  # noqa: ASYNC110
                await anyio.sleep(0.001)
            tg.cancel_scope.cancel()
        await source.aclose()
        if any(e.error for b in ctx.batches for e in b.expand()):
            raise RuntimeError(f"{file.name}: the source refused what it should read")

    anyio.run(run)


def _read_raw(file: Path) -> None:
    file.read_bytes()


def run(ctx: Context) -> list[Row]:
    big = 8 * MIB if ctx.quick else 512 * MIB
    long = 2 * MIB if ctx.quick else 64 * MIB
    rows = []
    with ctx.tmpdir("large") as tmp:
        inputs = [
            ("whole-file", "a.bin", (b"", b"\x00\x01\x02\x03", big, b""), {"format": "whole-file"}),
            (
                "JSON line",
                "a.jsonl",
                (b'{"a": 1}\n{"x": "', b"y" * 64, long, b'"}\n{"b": 2}\n'),
                {"format": "jsonl"},
            ),
            (
                "CSV record",
                "a.csv",
                (b'id,text\r\n1,a\r\n2,"', b"y" * 63 + b"\n", long, b'"\r\n3,c\r\n'),
                {"format": "csv"},
            ),
        ]
        for what, name, (head, fill, size, tail), options in inputs:
            file = tmp / name
            _write(file, head, fill, size, tail)
            mib = file.stat().st_size / MIB
            limits = {"max_file_bytes": 2 * big, "max_line_bytes": 2 * long}
            ours, base = best_of_pair(
                partial(_read_by_source, file, tmp / "spool", **options, **limits),
                partial(_read_raw, file),
                ctx.repeat,
            )
            assert base is not None
            rows.append(
                ratio_row(
                    "6 large inputs",
                    f"{what} of {size // MIB} MiB, MiB/s",
                    "MiB/s",
                    mib / ours,
                    mib / base,
                    "one read of the same file",
                    TARGET,
                    "read in 1 MiB reads (read_size), each batch sent; nothing encoded",
                )
            )
            file.unlink()
    return rows
