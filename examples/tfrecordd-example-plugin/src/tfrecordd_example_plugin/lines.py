"""``type = "example-lines"``: the lines appended to one file, each an event, exactly once.

A token is the byte offset just past a batch's last line. The daemon journals tokens with the
shard holding their records and folds committed ones into the highest offset, where a restarted
source resumes. ``ack`` makes an offset final outside the daemon's state too: it records the
highest acked offset in ``<path>.acked`` (written aside, fsynced, renamed in, its directory
fsynced, all through the daemon's :class:`~tfrecordd.plugin.FileSystem`), so a source started
with no state (``state_dir`` lost) still skips what was acked. Only whole lines are read: a line
still being written is read once its newline is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import anyio
from pydantic import Field

from tfrecordd.plugin import (
    Duration,
    FileSystem,
    RawBatch,
    RawEvent,
    Size,
    Source,
    SourceConfig,
    SourceContext,
    Token,
    write_atomically,
)

AFTER_ACK = "example-lines-after-ack"
"""Crash point: the acked offset is durable, the ack not yet returned."""


class LineFileSourceConfig(SourceConfig):
    """Reads the lines appended to ``path``."""

    type: Literal["example-lines"] = "example-lines"
    path: Path
    """The file to read (it may not exist yet)."""
    poll_interval: Duration = Field(default=0.05, gt=0)
    """How often to look for new lines."""
    max_line_bytes: Size = Field(default=1 << 20, ge=16)
    """A longer line is an event with an error (dead-lettered with its first bytes)."""

    delivery: ClassVar[str] = "exactly-once"
    crash_points: ClassVar[tuple[str, ...]] = (AFTER_ACK,)
    sample_config: ClassVar[str] = """\
[[sources]]
name = "lines"
type = "example-lines"
path = {spool}                     # a file: each line appended to it is one event
encoder = "events"
"""
    sample_try: ClassVar[str] = "echo '{sample}' >> {spool_dir}"

    def build(self) -> LineFileSource:
        return LineFileSource(self)


class LineFileSource(Source):
    def __init__(self, config: LineFileSourceConfig) -> None:
        self.config = config
        self.path = str(config.path)
        self.acked_path = self.path + ".acked"
        self.start = 0
        """Where reading resumes: past everything committed or acked."""
        self._read_size = config.max_line_bytes * 4
        self.fs = FileSystem()
        self.ctx: SourceContext | None = None

    def attach(self, ctx: SourceContext) -> None:
        self.fs, self.ctx = ctx.fs, ctx

    @staticmethod
    def fold(state: Any, tokens: Sequence[Token]) -> Any:
        return max([state or 0, *tokens])

    @staticmethod
    def compact(tokens: list[Token]) -> list[Token]:
        return [max(tokens)] if tokens else []

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        await self.ack(pending)
        self.start = max(self.fold(state, pending), await anyio.to_thread.run_sync(self._acked))

    async def ack(self, tokens: Sequence[Token]) -> None:
        if tokens:
            await anyio.to_thread.run_sync(self._record_acked, max(tokens))

    async def run(self, ctx: SourceContext) -> None:
        at = self.start
        skipping = False  # inside a line too long to read whole: the rest of it is passed over
        limit = self.config.max_line_bytes
        while True:
            data = await anyio.to_thread.run_sync(self._read_from, at)
            whole_read = len(data) == self._read_size
            read: list[tuple[RawEvent, int]] = []  # each event, and where reading goes on after it
            passed = at
            if skipping:
                newline = data.find(b"\n")
                skipping = newline < 0
                cut = len(data) if skipping else newline + 1
                at, data, whole_read = at + cut, data[cut:], False
            end = data.rfind(b"\n") + 1
            if not end and whole_read:
                # No newline in a whole read: one line far over the limit, refused once.
                where = f"{self.path}:{at}"
                at += len(data)
                read.append((RawEvent(data[:limit], where, error="long"), at))
                skipping = True
            for line in data[:end].split(b"\n")[:-1]:
                where = f"{self.path}:{at}"
                at += len(line) + 1
                if len(line) > limit:
                    read.append((RawEvent(line[:limit], where, error="long"), at))
                else:
                    read.append((RawEvent(line, where), at))
            for i in range(0, len(read), ctx.max_batch_events):
                batch = read[i : i + ctx.max_batch_events]
                await ctx.send(RawBatch(ctx.name, [ev for ev, _ in batch], batch[-1][1]))
            if not read and at != passed:
                await ctx.send(RawBatch(ctx.name, [], at))  # the rest of a long line, passed
            await anyio.sleep(self.config.poll_interval)

    def _read_from(self, at: int) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(at)
                return f.read(self._read_size)
        except FileNotFoundError:
            return b""

    def _acked(self) -> int:
        try:
            with open(self.acked_path, "rb") as f:
                return int(f.read() or 0)
        except FileNotFoundError:
            return 0

    def _record_acked(self, offset: int) -> None:
        if offset <= self._acked():
            return  # acked already: acks are redone after a crash
        write_atomically(self.fs, self.acked_path, str(offset).encode())
        if self.ctx is not None:
            self.ctx.crash_point(AFTER_ACK)
