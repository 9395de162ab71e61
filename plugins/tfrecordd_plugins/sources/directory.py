"""Spool-directory source: files claimed, read in batches, removed once their records are published.

Producers write a file under a temporary or hidden name and publish it by renaming it to a name
that matches ``pattern``. The source claims each new file by renaming it into
``<path>/.tfrecordd-claimed/`` (a unique, time-ordered claim name that encodes the file's path
relative to the spool), reads it in batches, and deletes it (or moves it into ``done_dir``) only
when every record from it is in a published shard. Each batch's token is the claim name and the
offset (in the decompressed stream) after its last record, so a file half-written into shards
resumes exactly where the last published shard stopped, after any crash: delivery is exactly
once.

Formats: ``jsonl`` (one JSON value per line), ``csv`` (a header row, then one event per record;
quoted fields may span lines) and ``whole-file`` (one file is one event, e.g. an image, with its
file name and the name of its parent folder as a label). Files ending in ``.gz`` or ``.zst`` are
decompressed as they are read, up to ``max_decompressed_bytes``. An input that cannot be read to
its end (a damaged or oversized compressed stream) is dead-lettered with the reason, and the file
is moved into ``<path>/.tfrecordd-rejected/`` rather than deleted.

Only regular files are read: a symlink, FIFO, device or directory matching the pattern is
refused (counted, logged once, left in place), and files are opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import csv
import fnmatch
import logging
import os
import stat
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import quote, unquote

import aiofiles
import anyio
from pydantic import Field, field_validator

from tfrecordd import crashpoints, speedups
from tfrecordd.compression import Compression, open_decompressed
from tfrecordd.errors import CompressionError
from tfrecordd.plugin import (
    DirectoryUse,
    Lines,
    RawBatch,
    RawEvent,
    Source,
    SourceConfig,
    SourceContext,
    Token,
)
from tfrecordd.units import Duration, Size
from tfrecordd_plugins.sources import csvrecords

log = logging.getLogger(__name__)

_cframe = speedups.load("_cframe")

CLAIM_DIR = ".tfrecordd-claimed"
REJECT_DIR = ".tfrecordd-rejected"
_TEMP_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".swp", "~")
_SUFFIX_COMPRESSION = {".gz": Compression.GZIP, ".zst": Compression.ZSTD, ".zstd": Compression.ZSTD}


class DirectorySourceConfig(SourceConfig):
    """``type = "directory"``: a spool directory of JSON-lines, CSV or whole files."""

    type: Literal["directory"] = "directory"
    path: Path
    """The spool directory to watch."""
    pattern: str = "*.jsonl"
    """Glob (``fnmatch``) that published files match; dotfiles and temporary names never do."""
    format: Literal["jsonl", "csv", "whole-file"] = "jsonl"
    """How a file splits into events: ``jsonl`` one JSON value per line; ``csv`` a header row,
    then one event per record (header name → text field); ``whole-file`` one event per file."""
    compression: Literal["auto", "none", "gzip", "zstd"] = "auto"
    """Compression of the input files; ``auto``: by suffix (``.gz``, ``.zst``/``.zstd``)."""
    max_decompressed_bytes: Size = Field(default=4 << 30, ge=1)
    """A compressed input that decompresses to more than this is rejected (dead-lettered and
    moved into ``.tfrecordd-rejected/``): the guard against decompression bombs."""
    recursive: bool = False
    """Also look in sub-folders (hidden ones, ``done_dir`` and symlinked folders excepted). With
    ``whole-file``, an event's label is the name of its parent folder (``cats/1.jpg`` → cats)."""
    on_done: Literal["delete", "move"] = "delete"
    """What happens to a file once all its records are published: deleted, or moved."""
    done_dir: Path | None = None
    """Where ``on_done = "move"`` puts finished files; default: ``done/`` inside ``path``."""
    poll_interval: Duration = Field(default=1.0, gt=0)
    """How often to look for new files when idle."""
    max_line_bytes: Size = Field(default=1 << 20, ge=16)
    """A longer line (or CSV record) is dead-lettered with its first ``max_line_bytes`` bytes,
    never split."""
    max_file_bytes: Size = Field(default=64 << 20, ge=1)
    """``whole-file``: a larger file is dead-lettered (its path kept) and moved into
    ``.tfrecordd-rejected/``."""
    csv_delimiter: str = Field(default=",", min_length=1, max_length=1)
    """``csv``: the field delimiter."""
    read_size: Size = Field(default=1 << 20, ge=4096)
    """Bytes read from a file per read call. ``jsonl`` files are read into one buffer the
    source keeps, of ``read_size`` plus ``min(max_line_bytes, read_size)`` bytes."""

    delivery: ClassVar[str] = "exactly-once"

    @field_validator("pattern")
    @classmethod
    def _no_separator(cls, v: str) -> str:
        if "/" in v:
            raise ValueError("pattern matches file names, not paths: use recursive = true")
        return v

    def build(self) -> DirectorySource:
        return DirectorySource(self)

    def directories(self) -> list[DirectoryUse]:
        uses = [DirectoryUse("path", self.path, "input", recursive=self.recursive)]
        if self.on_done == "move":
            done = self.done_dir or self.path / "done"
            uses.append(DirectoryUse("done_dir", done, "output", renamed_from="path"))
        return uses


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)


def _original(claim: str) -> str:
    """The spool-relative path a claim name encodes.

    Anyone who can write into the spool can put a file into its claim folder, so a name that
    would not decode to a plain relative path (``..``, an absolute path, empty parts) is kept
    as one path component (quoted again, so not even a name the caller was handed with a ``/``
    in it can leave the folder it is moved into)."""
    encoded = claim.split("-", 1)[-1]
    rel = unquote(encoded)
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        component = quote(encoded, safe="")
        return component if component not in ("", ".", "..") else f"_{component}"
    return rel


class _Rejected(Exception):
    """The rest of the input cannot be read; the file is moved aside."""


class DirectorySource(Source):
    """Reads a spool directory; see the module docs for the protocol."""

    def __init__(self, config: DirectorySourceConfig) -> None:
        self.config = config
        self.spool = str(config.path)
        self.claim_dir = os.path.join(self.spool, CLAIM_DIR)
        self.reject_dir = os.path.join(self.spool, REJECT_DIR)
        self.done_dir = str(config.done_dir or os.path.join(self.spool, "done"))
        self._spool_name = Path(self.spool).resolve().name
        self.committed: dict[str, int] = {}
        self._sent_eof: set[str] = set()
        self._refused: set[str] = set()
        self._work = bytearray(_work_size(config))

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
                await anyio.to_thread.run_sync(self._finish_file, t["f"], bool(t.get("bad")))
        self.committed = self.fold(state, pending)

    def _prepare_dirs(self) -> None:
        os.makedirs(self.claim_dir, exist_ok=True)
        if self.config.on_done == "move":
            os.makedirs(self.done_dir, exist_ok=True)

    async def ack(self, tokens: Sequence[Token]) -> None:
        for t in tokens:
            if t["eof"]:
                await anyio.to_thread.run_sync(self._finish_file, t["f"], bool(t.get("bad")))
                self._sent_eof.discard(t["f"])
                self.committed.pop(t["f"], None)
            else:
                self.committed[t["f"]] = max(self.committed.get(t["f"], 0), int(t["o"]))

    def _finish_file(self, claim: str, rejected: bool) -> None:
        src = os.path.join(self.claim_dir, claim)
        if not os.path.lexists(src):
            return
        if rejected:
            os.makedirs(self.reject_dir, exist_ok=True)
            os.rename(src, os.path.join(self.reject_dir, claim))
            _fsync_dir(self.reject_dir)
        elif self.config.on_done == "delete":
            os.unlink(src)
        else:
            dst = os.path.join(self.done_dir, _original(claim))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.lexists(dst):
                dst = f"{dst}.{claim.split('-', 1)[0]}"
            os.rename(src, dst)
            _fsync_dir(os.path.dirname(dst))
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

    def _candidates(self, ctx: SourceContext) -> list[str]:
        """Spool-relative paths of regular files that match, oldest first."""
        found: list[tuple[float, str]] = []
        folders = [""]
        done = os.path.realpath(self.done_dir)
        while folders:
            rel_dir = folders.pop()
            try:
                entries = list(os.scandir(os.path.join(self.spool, rel_dir)))
            except OSError as e:
                log.warning("%s: cannot list %s: %s", ctx.name, rel_dir or self.spool, e)
                continue
            for entry in entries:
                rel = os.path.join(rel_dir, entry.name)
                if entry.name.startswith("."):
                    continue
                if self.config.recursive and entry.is_dir(follow_symlinks=False):
                    if os.path.realpath(entry.path) != done:
                        folders.append(rel)
                    continue
                if entry.name.endswith(_TEMP_SUFFIXES) or not fnmatch.fnmatchcase(
                    entry.name, self.config.pattern
                ):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    if rel not in self._refused:
                        self._refused.add(rel)
                        ctx.count_refused("not_regular_file")
                        log.warning("%s: %s is not a regular file; refused", ctx.name, entry.path)
                    continue
                found.append((st.st_mtime, rel))
        return [rel for _, rel in sorted(found)]

    def _claim_new(self, ctx: SourceContext) -> list[str]:
        claimed = []
        for rel in self._candidates(ctx):
            claim = f"{time.time_ns():020d}-{quote(rel, safe='')}"
            try:
                os.rename(os.path.join(self.spool, rel), os.path.join(self.claim_dir, claim))
            except FileNotFoundError:
                continue
            crashpoints.reached("after-claim")
            claimed.append(claim)
        if claimed:
            _fsync_dir(self.claim_dir)
            for folder in {os.path.dirname(_original(c)) for c in claimed}:
                _fsync_dir(os.path.join(self.spool, folder))
        return claimed

    def _compression(self, name: str) -> Compression:
        if self.config.compression != "auto":
            return Compression(self.config.compression)
        return _SUFFIX_COMPRESSION.get(os.path.splitext(name)[1], Compression.NONE)

    async def _read_file(self, ctx: SourceContext, claim: str) -> None:
        path = os.path.join(self.claim_dir, claim)
        start = self.committed.get(claim, 0)
        rel = _original(claim)
        reader = _Reader(path, self._compression(rel), self.config)
        try:
            # Shielded, like the close below: an open finishing in its thread after a cancel
            # would leave its file object to the garbage collector.
            with anyio.CancelScope(shield=True):
                await reader.open()
        except FileNotFoundError:
            return
        except OSError as e:
            ctx.count_refused("unreadable")
            log.warning("%s: cannot open %s: %s", ctx.name, path, e)
            return
        except _Rejected:
            ctx.count_refused("not_regular_file")
            return
        try:
            if self.config.format == "whole-file":
                await self._read_whole(ctx, claim, rel, reader)
            elif self.config.format == "jsonl":
                await self._read_lines(ctx, claim, rel, reader, start)
            else:
                await self._read_csv(ctx, claim, rel, reader, start)
        finally:
            with anyio.CancelScope(shield=True):
                await reader.close()
        self._sent_eof.add(claim)

    async def _read_whole(self, ctx: SourceContext, claim: str, rel: str, reader: _Reader) -> None:
        limit = self.config.max_file_bytes
        data = b""
        try:
            async for chunk in reader.chunks(0):
                data += chunk
                if len(data) > limit:
                    raise _Rejected(f"file larger than max_file_bytes ({limit})")
        except _Rejected as e:
            await self._reject(ctx, claim, rel, str(e), len(data))
            return
        parts = Path(rel).parts
        label = parts[-2] if len(parts) > 1 else self._spool_name
        value = {"filename": parts[-1], "label": label, "path": rel}
        event = RawEvent(data, rel, value=value, format="file")
        await ctx.send(RawBatch(ctx.name, [event], _token(claim, len(data), True)))

    async def _reject(
        self, ctx: SourceContext, claim: str, rel: str, reason: str, offset: int
    ) -> None:
        log.warning("%s: %s rejected: %s", ctx.name, rel, reason)
        event = RawEvent(b"", f"{rel}:{offset}", error=f"input rejected: {reason}")
        await ctx.send(RawBatch(ctx.name, [event], _token(claim, offset, True, bad=True)))

    async def _read_lines(
        self, ctx: SourceContext, claim: str, rel: str, reader: _Reader, offset: int
    ) -> None:
        """Send the file's JSON lines from ``offset`` as :class:`Lines` batches of whole lines.

        Only whole buffers are handled here (a search for the last newline, a count of them): the
        lines are split where they are encoded. A line that outgrows ``max_line_bytes`` before
        its newline arrives is skipped as it is read, its first bytes kept for the dead letter.

        The file is read into one buffer, the source's own, over and over: a new buffer per read
        is fresh memory the kernel faults in page by page (with 64 MiB reads, a tenth of the
        daemon's CPU went to those faults). Only the batches are copied out of it.

        A buffer's last batch waits for the next read: when that read finds the end of the file,
        the batch carries the file's end, instead of a batch of its own after it (which would
        cost a commit of its own when it arrives between two shards).
        """
        max_line, read_size = self.config.max_line_bytes, self.config.read_size
        max_events, max_bytes = ctx.max_batch_events, ctx.max_batch_bytes
        work = self._work
        kept = 0  # bytes at work[:kept] (a line's start), from stream position `offset`
        head: bytes | None = None  # first bytes of an overlong line still being skipped
        head_at = 0
        eof = False
        lines = False  # whether the last buffer held whole lines: if not, the end goes alone
        held: tuple[Lines, int] | None = None  # the last batch cut, and the offset after it

        async def send_held(last: bool) -> None:
            nonlocal held
            if held is not None:
                batch, end = held
                held = None
                await ctx.send(RawBatch(ctx.name, [], _token(claim, end, last), batch))

        try:
            await reader.seek(offset)
            while not eof:
                if len(work) < kept + read_size:
                    # A new buffer, never a resize: a view of the old one may still be held by
                    # the thread that read into it.
                    grown = bytearray(kept + read_size)
                    grown[:kept] = work[:kept]
                    work = self._work = grown
                with memoryview(work) as view:
                    got = await reader.read_into(view[kept : kept + read_size])
                eof = not got
                if held is not None and eof and not kept and head is None:
                    await send_held(True)
                    return
                await send_held(False)
                n, at = kept + got, 0  # work[at:n] is unread, from stream position `offset`
                if head is not None:
                    nl = work.find(b"\n", 0, n)
                    if nl < 0 and not eof:
                        offset, kept = offset + n, 0
                        continue
                    at = nl + 1 if nl >= 0 else n
                    offset += at
                    event = _too_long(rel, head_at, head, max_line)
                    last = eof and at == n
                    await ctx.send(RawBatch(ctx.name, [event], _token(claim, offset, last)))
                    head = None
                    if last:
                        return
                whole = n if eof else work.rfind(b"\n", at, n) + 1 or at
                lines = whole > at
                start = at
                with memoryview(work) as view:
                    for end in _cuts(work, start, whole, max_events, max_bytes):
                        await send_held(False)
                        batch = Lines(bytes(view[start:end]), rel, offset + start - at, max_line)
                        held = batch, offset + end - at
                        start = end
                if eof:
                    await send_held(True)
                offset, kept = offset + whole - at, n - whole
                work[:kept] = work[whole:n]
                if kept > max_line:
                    head, head_at = bytes(work[:max_line]), offset
                    offset, kept = offset + kept, 0
        except _Rejected as e:
            await send_held(False)
            await self._reject(ctx, claim, rel, str(e), offset)
            return
        finally:
            if len(work) > _work_size(self.config):
                # A line longer than a read grew it: back to its usual size for the next file.
                self._work = bytearray(_work_size(self.config))
        if not lines:
            await ctx.send(RawBatch(ctx.name, [], _token(claim, offset, True)))

    async def _read_csv(
        self, ctx: SourceContext, claim: str, rel: str, reader: _Reader, offset: int
    ) -> None:
        """Send the file's CSV records from ``offset`` in batches whose tokens sit on record
        ends (the header row first, or read again when resuming past it). A record longer than
        ``max_line_bytes`` is dead-lettered whole (its first bytes kept) while the scanner reads
        on through it, so the next record starts exactly where the long one ends."""
        cfg = self.config
        header = await self._csv_header(claim, rel) if offset > 0 else None
        max_line = cfg.max_line_bytes
        max_events, max_bytes = ctx.max_batch_events, ctx.max_batch_bytes
        delimiter = cfg.csv_delimiter
        events: list[RawEvent] = []
        batch_bytes = 0
        buf = b""  # unread bytes, starting at stream position `offset`
        head: bytes | None = None  # first bytes of an overlong record still being skipped
        head_at = 0
        state = csvrecords.State.FIELD_START  # the scanner's, at buf[0]
        # The last full batch waits for the next one: if none comes, it carries the file's end
        # (as the JSON-lines reader's last batch does), not an empty batch of its own.
        held: RawBatch | None = None
        try:
            async with aclosing(reader.chunks(offset)) as chunks:
                while True:
                    chunk = await anext(chunks, b"")
                    buf += chunk
                    if offset == 0 and header is None:
                        if len(buf) < len(csvrecords.BOM) and chunk:
                            continue
                        if buf.startswith(csvrecords.BOM):
                            buf, offset = buf[len(csvrecords.BOM) :], len(csvrecords.BOM)
                    found = csvrecords.split(buf, not chunk, state, ord(delimiter))
                    at = offset
                    for record, nxt in zip(found.records, found.ends, strict=True):
                        n = len(record)
                        if head is not None:
                            events.append(_too_long(rel, head_at, head, max_line))
                            head = None
                        elif n > max_line:
                            events.append(_too_long(rel, at, record[:max_line], max_line))
                        elif not n or record.isspace():
                            pass
                        elif header is None:
                            header = csvrecords.row(record, delimiter)
                        else:
                            events.append(
                                csvrecords.event(record, f"{rel}:{at}", header, delimiter)
                            )
                            batch_bytes += n
                        at = offset + nxt
                        if len(events) >= max_events or batch_bytes >= max_bytes:
                            if held is not None:
                                await ctx.send(held)
                            held = RawBatch(ctx.name, events, _token(claim, at, False))
                            events, batch_bytes = [], 0
                    buf, offset = buf[found.consumed :], offset + found.consumed
                    state = csvrecords.State.FIELD_START if found.records else state
                    if not chunk:
                        break
                    if len(buf) > max_line:
                        # Over-long: keep its first bytes for the dead letter and drop the rest,
                        # carrying the scanner's state across so its end is found exactly.
                        if head is None:
                            head, head_at = buf[:max_line], offset
                        state = found.state
                        offset, buf = offset + len(buf), b""
        except _Rejected as e:
            if held is not None:
                await ctx.send(held)
            if events:
                await ctx.send(RawBatch(ctx.name, events, _token(claim, offset, False)))
            await self._reject(ctx, claim, rel, str(e), offset)
            return
        if held is not None and not events:
            events, held = held.events, None
        if held is not None:
            await ctx.send(held)
        await ctx.send(RawBatch(ctx.name, events, _token(claim, offset, True)))

    async def _csv_header(self, claim: str, rel: str) -> list[str] | None:
        """The header row of a CSV file being resumed past its start."""
        reader = _Reader(os.path.join(self.claim_dir, claim), self._compression(rel), self.config)
        with anyio.CancelScope(shield=True):
            await reader.open()
        delimiter = ord(self.config.csv_delimiter)
        try:
            buf = b""
            final = False
            async with aclosing(reader.chunks(0)) as chunks:
                while not final:
                    chunk = await anext(chunks, b"")
                    buf += chunk
                    final = not chunk
                    start = len(csvrecords.BOM) if buf.startswith(csvrecords.BOM) else 0
                    found = csvrecords.split(
                        buf[start:], final, csvrecords.State.FIELD_START, delimiter
                    )
                    for record in found.records:
                        if record.strip():
                            return csvrecords.row(record, self.config.csv_delimiter)
            return None
        finally:
            with anyio.CancelScope(shield=True):
                await reader.close()


class _Reader:
    """Decompressed bytes of one claimed file, read without blocking the event loop."""

    def __init__(self, path: str, compression: Compression, config: DirectorySourceConfig):
        self.path = path
        self.compression = compression
        self.config = config
        self._plain: Any = None
        self._raw: Any = None
        self._stream: Any = None
        self._at_end = False

    async def open(self) -> None:
        if self.compression is Compression.NONE:
            self._plain = await aiofiles.open(self.path, "rb", opener=_nofollow)
            fd = self._plain.fileno()
        else:
            self._raw = await anyio.to_thread.run_sync(_open_raw, self.path)
            fd = self._raw.fileno()
            self._stream = open_decompressed(
                self._raw,
                self.compression,
                path=self.path,
                max_bytes=self.config.max_decompressed_bytes,
            )
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            await self.close()
            raise _Rejected("not a regular file")

    async def seek(self, offset: int) -> None:
        """Read from ``offset`` (in the decompressed stream) on; a compressed stream is read up
        to it."""
        self._at_end = False
        if self._plain is not None:
            if offset:
                await self._plain.seek(offset)
            return
        size = self.config.read_size
        while offset > 0:
            skipped = await self._decompressed(min(size, offset))
            if not skipped:
                self._at_end = True
                return
            offset -= len(skipped)

    async def read(self) -> bytes:
        """The next bytes, up to ``read_size``; ``b""`` at the end."""
        size = self.config.read_size
        if self._at_end:
            return b""
        if self._plain is None:
            return await self._decompressed(size)
        chunk: bytes = await self._plain.read(size)
        # A buffered read returns less than asked only at the end of the file: no trip to a
        # thread to hear that again.
        self._at_end = len(chunk) < size
        return chunk

    async def read_into(self, target: memoryview) -> int:
        """Read the next bytes into ``target``; how many (``0`` at the end)."""
        if self._at_end:
            return 0
        if self._plain is None:
            chunk = await self._decompressed(len(target))
            target[: len(chunk)] = chunk
            return len(chunk)
        got: int = await self._plain.readinto(target)
        self._at_end = got < len(target)
        return got

    async def chunks(self, offset: int) -> AsyncGenerator[bytes, None]:
        """The bytes from ``offset`` (in the decompressed stream) to the end."""
        await self.seek(offset)
        while chunk := await self.read():
            yield chunk

    async def _decompressed(self, size: int) -> bytes:
        try:
            chunk: bytes = await anyio.to_thread.run_sync(self._stream.read, size)
        except CompressionError as e:
            raise _Rejected(e.detail) from e
        return chunk

    async def close(self) -> None:
        if self._plain is not None:
            await self._plain.close()
            self._plain = None
        if self._raw is not None:
            await anyio.to_thread.run_sync(self._raw.close)
            self._raw = self._stream = None


def _work_size(config: DirectorySourceConfig) -> int:
    """The read buffer's size: a read, after the start of a line left from the read before."""
    return config.read_size + min(config.max_line_bytes, config.read_size)


def _open_raw(path: str) -> Any:
    return open(path, "rb", buffering=0, opener=_nofollow)


def _cuts(
    buf: bytes | bytearray, start: int, whole: int, max_events: int, max_bytes: int
) -> Iterator[int]:
    """Where the batches of ``buf[start:whole]`` (whole lines) end: each holds
    ``max_events`` lines (the last may hold fewer) and, unless one line is longer, at most
    ``max_bytes`` bytes. Exact counts matter: a shard's record cap is filled by whole batches.
    One at a time: the source sends each batch (and lets the event loop run) before the next."""
    per_line = 0  # bytes per line in the batch before: where to look for this one's end
    while start < whole:
        bound = whole
        if bound - start > max_bytes:
            bound = (
                buf.rfind(b"\n", start, start + max_bytes) + 1
                or buf.find(b"\n", start + max_bytes, whole) + 1
                or whole
            )
        if _cframe is not None:
            end, _ = _cframe.line_end(buf, start, bound, max_events)
            yield end
            start = end
            continue
        end = bound
        # Counting newlines up to the end of a large buffer for every batch would cost more than
        # the batches: look about as far as the batch before suggests.
        if per_line and end - start > (reach := per_line * max_events * 5 // 4):
            end = buf.rfind(b"\n", start, start + reach) + 1 or bound
        lines = buf.count(b"\n", start, end) + (buf[end - 1] != 10)
        if lines > max_events:
            guess = start + (end - start) * max_events // lines
            end = buf.rfind(b"\n", start, guess) + 1 or buf.find(b"\n", start, end) + 1
            lines = buf.count(b"\n", start, end)
            while lines > max_events:
                end = buf.rfind(b"\n", start, end - 1) + 1
                lines -= 1
        while lines < max_events and end < bound:
            end = buf.find(b"\n", end, bound) + 1 or bound
            lines += 1
        yield end
        per_line = (end - start) // lines + 1
        start = end


def _token(claim: str, offset: int, eof: bool, *, bad: bool = False) -> Token:
    token: dict[str, Any] = {"f": claim, "o": offset, "eof": eof}
    if bad:
        token["bad"] = True
    return token


def _too_long(rel: str, at: int, head: bytes, limit: int) -> RawEvent:
    return RawEvent(
        head, f"{rel}:{at}", error=f"record longer than max_line_bytes ({limit}); first bytes kept"
    )


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
