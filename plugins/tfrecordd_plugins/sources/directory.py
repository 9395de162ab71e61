"""Spool-directory source: files of JSON lines, claimed, read in batches, removed once published.

Producers write a file under a temporary or hidden name and publish it by renaming it to a name
that matches ``pattern``. The source claims each new file by renaming it into
``<path>/.tfrecordd-claimed/`` (a unique, time-ordered claim name), reads it in batches, and
deletes it (or moves it into ``done_dir``) only when every record from it is in a published
shard. Each batch's token is the claim name and the byte offset after its last line, so a file
half-written into shards resumes exactly where the last published shard stopped, after any
crash: delivery is exactly once.

Only regular files are read: a symlink, FIFO, device or directory matching the pattern is
refused (counted, logged once, left in place), and files are opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import aiofiles
import anyio
from pydantic import Field

from tfrecordd import crashpoints
from tfrecordd.plugin import RawBatch, RawEvent, Source, SourceConfig, SourceContext, Token
from tfrecordd.units import Duration, Size

log = logging.getLogger(__name__)

CLAIM_DIR = ".tfrecordd-claimed"
_TEMP_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".swp", "~")


class DirectorySourceConfig(SourceConfig):
    """``type = "directory"``: a spool directory of JSON-lines files."""

    type: Literal["directory"] = "directory"
    path: Path
    """The spool directory to watch."""
    pattern: str = "*.jsonl"
    """Glob (``fnmatch``) that published files match; dotfiles and temporary names never do."""
    format: Literal["jsonl"] = "jsonl"
    """How a file splits into events: ``jsonl`` is one JSON value per line."""
    on_done: Literal["delete", "move"] = "delete"
    """What happens to a file once all its records are published: deleted, or moved."""
    done_dir: Path | None = None
    """Where ``on_done = "move"`` puts finished files; default: ``done/`` inside ``path``."""
    poll_interval: Duration = Field(default=1.0, gt=0)
    """How often to look for new files when idle."""
    max_line_bytes: Size = Field(default=1 << 20, ge=16)
    """A longer line is dead-lettered (its first ``max_line_bytes`` bytes kept), never split."""
    read_size: Size = Field(default=1 << 20, ge=4096)
    """Bytes read from a file per read call."""

    delivery: ClassVar[str] = "exactly-once"

    def build(self) -> DirectorySource:
        return DirectorySource(self)


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))


class DirectorySource(Source):
    """Reads a spool directory; see the module docs for the protocol."""

    def __init__(self, config: DirectorySourceConfig) -> None:
        self.config = config
        self.spool = str(config.path)
        self.claim_dir = os.path.join(self.spool, CLAIM_DIR)
        self.done_dir = str(config.done_dir or os.path.join(self.spool, "done"))
        self.committed: dict[str, int] = {}
        self._sent_eof: set[str] = set()
        self._refused: set[str] = set()

    @staticmethod
    def fold(state: Any, tokens: Sequence[Token]) -> Any:
        """Committed offset per claimed file; a file whose end is committed is gone."""
        out: dict[str, int] = dict(state or {})
        for t in tokens:
            if t["eof"]:
                out.pop(t["f"], None)
            else:
                out[t["f"]] = max(out.get(t["f"], 0), int(t["o"]))
        return out

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        await anyio.to_thread.run_sync(self._prepare_dirs)
        for t in pending:
            if t["eof"]:
                await anyio.to_thread.run_sync(self._finish_file, t["f"])
        self.committed = self.fold(state, pending)

    def _prepare_dirs(self) -> None:
        os.makedirs(self.claim_dir, exist_ok=True)
        if self.config.on_done == "move":
            os.makedirs(self.done_dir, exist_ok=True)

    async def ack(self, tokens: Sequence[Token]) -> None:
        finished = [t["f"] for t in tokens if t["eof"]]
        for claim in finished:
            await anyio.to_thread.run_sync(self._finish_file, claim)
            self._sent_eof.discard(claim)
        for t in tokens:
            if not t["eof"]:
                self.committed[t["f"]] = max(self.committed.get(t["f"], 0), int(t["o"]))
        for claim in finished:
            self.committed.pop(claim, None)

    def _finish_file(self, claim: str) -> None:
        src = os.path.join(self.claim_dir, claim)
        if not os.path.lexists(src):
            return
        if self.config.on_done == "delete":
            os.unlink(src)
        else:
            original = claim.split("-", 1)[1]
            dst = os.path.join(self.done_dir, original)
            if os.path.lexists(dst):
                dst = os.path.join(self.done_dir, f"{original}.{claim.split('-', 1)[0]}")
            os.rename(src, dst)
            _fsync_dir(self.done_dir)
        _fsync_dir(self.claim_dir)
        crashpoints.reached("after-spool-ack")

    async def run(self, ctx: SourceContext) -> None:
        await anyio.to_thread.run_sync(self._prepare_dirs)
        while True:
            claims = await anyio.to_thread.run_sync(self._pending_claims)
            claims += await anyio.to_thread.run_sync(self._claim_new, ctx)
            for claim in claims:
                await self._read_file(ctx, claim)
            if not claims:
                await anyio.sleep(self.config.poll_interval)

    def _pending_claims(self) -> list[str]:
        return sorted(c for c in os.listdir(self.claim_dir) if c not in self._sent_eof)

    def _claim_new(self, ctx: SourceContext) -> list[str]:
        claimed = []
        for name in sorted(os.listdir(self.spool)):
            if (
                name.startswith(".")
                or name.endswith(_TEMP_SUFFIXES)
                or not fnmatch.fnmatchcase(name, self.config.pattern)
            ):
                continue
            path = os.path.join(self.spool, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                if name not in self._refused:
                    self._refused.add(name)
                    ctx.count_refused("not_regular_file")
                    log.warning("%s: %s is not a regular file; refused", ctx.name, path)
                continue
            claim = f"{time.time_ns():020d}-{name}"
            try:
                os.rename(path, os.path.join(self.claim_dir, claim))
            except FileNotFoundError:
                continue
            crashpoints.reached("after-claim")
            claimed.append(claim)
        if claimed:
            _fsync_dir(self.claim_dir)
            _fsync_dir(self.spool)
        return claimed

    async def _read_file(self, ctx: SourceContext, claim: str) -> None:
        path = os.path.join(self.claim_dir, claim)
        offset = self.committed.get(claim, 0)
        try:
            f = await aiofiles.open(path, "rb", opener=_nofollow)
        except FileNotFoundError:
            return
        except OSError as e:
            ctx.count_refused("unreadable")
            log.warning("%s: cannot open %s: %s", ctx.name, path, e)
            return
        try:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                ctx.count_refused("not_regular_file")
                return
            await f.seek(offset)
            offset = await self._read_lines(ctx, claim, f, offset)
        finally:
            await f.close()
        self._sent_eof.add(claim)

    async def _read_lines(self, ctx: SourceContext, claim: str, f: Any, offset: int) -> int:
        """Send the file's lines from ``offset`` in batches whose tokens sit on line ends."""
        max_line = self.config.max_line_bytes
        events: list[RawEvent] = []
        batch_bytes = 0
        buf = b""  # unread bytes, starting at file position `offset`
        head: bytes | None = None  # first bytes of an overlong line still being skipped
        head_at = 0
        while True:
            chunk = await f.read(self.config.read_size)
            buf += chunk
            # At the end of the file, what is left is the last line even without its newline.
            lines_end = buf.rfind(b"\n") + 1 if chunk else len(buf)
            pos = 0
            while pos < lines_end:
                nl = buf.find(b"\n", pos, lines_end)
                end = nl if nl >= 0 else lines_end
                line, at = buf[pos:end], offset + pos
                pos = end + 1 if nl >= 0 else lines_end
                if head is not None:
                    events.append(_too_long(claim, head_at, head, max_line))
                    head = None
                elif len(line) > max_line:
                    events.append(_too_long(claim, at, line[:max_line], max_line))
                elif line.strip():
                    events.append(RawEvent(line, f"{claim}:{at}"))
                    batch_bytes += len(line)
                if len(events) >= ctx.max_batch_events or batch_bytes >= ctx.max_batch_bytes:
                    await ctx.send(RawBatch(ctx.name, events, _token(claim, offset + pos, False)))
                    events, batch_bytes = [], 0
            buf, offset = buf[lines_end:], offset + lines_end
            if not chunk:
                if head is not None:
                    events.append(_too_long(claim, head_at, head, max_line))
                break
            if len(buf) > max_line:
                if head is None:
                    head, head_at = buf[:max_line], offset
                offset, buf = offset + len(buf), b""
        await ctx.send(RawBatch(ctx.name, events, _token(claim, offset, True)))
        return offset


def _token(claim: str, offset: int, eof: bool) -> Token:
    return {"f": claim, "o": offset, "eof": eof}


def _too_long(claim: str, at: int, head: bytes, limit: int) -> RawEvent:
    return RawEvent(
        head, f"{claim}:{at}", error=f"line longer than max_line_bytes ({limit}); first bytes kept"
    )


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
